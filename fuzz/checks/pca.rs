//! What fuzzing `gradwire_optim::checkpoint::pca_from_bytes` with arbitrary bytes checks.
//!
//! Loading a PCA file must never panic. Whatever it accepts must hold finite
//! components and round-trip: encoding it and decoding the encoding gives the
//! same components bit for bit.
//!
//! One function for `fuzz_targets/pca.rs` (libFuzzer) and for the
//! corpus replay of `cargo xtask test` (gradwire-tests' `fuzz_corpus`),
//! both including this file with `#[path]`.

use gradwire_optim::checkpoint::{pca_from_bytes, pca_to_bytes};

/// Checks one input; a failed check panics.
pub fn check(data: &[u8]) {
    let Ok(pca) = pca_from_bytes(data) else {
        return;
    };
    assert!(pca.components.iter().all(|v| v.is_finite()));
    let bytes = pca_to_bytes(&pca).expect("accepted components encode");
    let again = pca_from_bytes(&bytes).expect("encoded components decode");
    let bits = |p: &gradwire_algos::dimreduce::Pca| {
        p.components.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    assert!(bits(&again) == bits(&pca) && again.components.dim() == pca.components.dim());
}
