//! A test binary of its own: a GPU suite, which `cargo xtask gpu-bundle`
//! ships alone to a machine with a GPU.
//!
//! The device codecs (feature `cuda`) against the CPU codecs: the same
//! selections (indices and value bits), the same error-feedback memories
//! step after step, the same casts and scatter-adds (`sparse.rs`), the same
//! quantized payloads (bytes) and decoded values (bits, `quant.rs`), the
//! same low-rank products (`lowrank.rs`), the same refusals.
//!
//! Without a CUDA device each test prints `SKIP`; `GRADWIRE_REQUIRE_GPU=1`
//! makes a missing device a failure.

#![cfg(feature = "cuda")]

mod lowrank;
mod quant;
mod sparse;
mod support;
