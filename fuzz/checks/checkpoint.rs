//! What fuzzing `gradwire_optim::checkpoint::from_bytes` with arbitrary bytes checks.
//!
//! Loading must never panic. Whatever it accepts must be a valid checkpoint:
//! `to_bytes` must encode it, the encoding must decode to an equal checkpoint
//! (bitwise equality of every buffer and tensor), and encoding that again
//! must give the same bytes (the canonical form is a fixed point).
//!
//! One function for `fuzz_targets/checkpoint.rs` (libFuzzer) and for the
//! corpus replay of `cargo xtask test` (gradwire-tests' `fuzz_corpus`),
//! both including this file with `#[path]`.

use gradwire_optim::checkpoint::{from_bytes, to_bytes};

/// Checks one input; a failed check panics.
pub fn check(data: &[u8]) {
    let Ok(ckpt) = from_bytes(data) else {
        return;
    };
    let bytes = to_bytes(&ckpt).expect("an accepted checkpoint encodes");
    let again = from_bytes(&bytes).expect("an encoded checkpoint decodes");
    assert!(again == ckpt, "decode(encode(c)) != c");
    let bytes2 = to_bytes(&again).expect("an accepted checkpoint encodes");
    assert!(bytes2 == bytes, "encoding is not canonical");
}
