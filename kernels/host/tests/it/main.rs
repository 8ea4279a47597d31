//! gradwire's CUDA kernels executed on the CPU against gradwire's CPU code,
//! and the execution layer's own tests.

mod common;
mod execution;
