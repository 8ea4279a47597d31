//! Fuzzes the quantizers' decoders (`gradwire_compress::Quantizer`) with
//! arbitrary payloads.
//!
//! Decoding must never panic; a refused payload is corrupt and leaves the
//! output as it was; an accepted one decodes to finite values, and
//! `decode_add` into zeros gives the same.

#![no_main]

#[path = "../checks/quant.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
