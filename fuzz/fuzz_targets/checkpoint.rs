//! Fuzzes `gradwire_optim::checkpoint::from_bytes` with arbitrary bytes.
//!
//! Loading must never panic. Whatever it accepts must be a valid checkpoint:
//! `to_bytes` must encode it, the encoding must decode to an equal checkpoint
//! (bitwise equality of every buffer and tensor), and encoding that again
//! must give the same bytes (the canonical form is a fixed point).

#![no_main]

#[path = "../checks/checkpoint.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
