//! Fuzzes `gradwire_optim::checkpoint::pca_from_bytes` with arbitrary bytes.
//!
//! Loading a PCA file must never panic. Whatever it accepts must hold finite
//! components and round-trip: encoding it and decoding the encoding gives the
//! same components bit for bit.

#![no_main]

#[path = "../checks/pca.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
