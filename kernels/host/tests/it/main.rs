//! gradwire's CUDA kernels executed on the CPU against gradwire's CPU code,
//! and the execution layer's own tests.

mod common;
mod coverage;
mod execution;

mod adasum;
mod cast;
mod comm;
mod elementwise;
mod feedback;
mod lowrank;
mod optim;
mod quant;
mod reduce;
mod select;
