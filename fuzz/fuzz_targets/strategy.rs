//! Fuzzes the strategy registry (`StrategyConfig`'s `FromStr`) with
//! arbitrary text.
//!
//! Parsing must never panic; whatever parses prints back to itself, and its
//! training loop, made on one rank, takes two steps or refuses with a typed
//! error.

#![no_main]

#[path = "../checks/strategy.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
