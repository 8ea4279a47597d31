//! Fuzzes `gradwire_optim::checkpoint::pca_from_bytes` with arbitrary bytes.
//!
//! Loading a PCA file must never panic. Whatever it accepts must hold finite
//! components and round-trip: encoding it and decoding the encoding gives the
//! same components bit for bit.

#![no_main]

use gradwire_optim::checkpoint::{pca_from_bytes, pca_to_bytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
});
