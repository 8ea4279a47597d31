//! Fuzzes `gradwire_compress::wire::decode` with arbitrary bytes.
//!
//! Decoding must never panic. Whatever it accepts must satisfy the format's
//! invariants: exact length, count at most the dense length, indices strictly
//! increasing and in range; `to_sparse` must round-trip through `encode` to
//! the same bytes (byte-identical for f32 values; for f16 / bf16 identical
//! except that a NaN may come back with another NaN bit pattern); and
//! `scatter_add` into a zeroed buffer must put each value at its index.

#![no_main]

#[path = "../checks/decode.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
