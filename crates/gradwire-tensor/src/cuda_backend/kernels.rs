//! Safe launchers of the kernels the upper crates run on device buffers:
//! the optimizer updates ([`optim`]), sparse selection ([`select`]), error
//! feedback, the cast codec and scatter-add ([`feedback`]), the quantizers
//! ([`quant`]), PowerSGD's low-rank products ([`lowrank`]) and AdaSum's
//! pairwise rule ([`adasum`]).
//!
//! Every launcher validates its operands (device, dtype, lengths, ranges)
//! before it queues anything and then launches with the geometry its kernel
//! requires, so the `unsafe` of the GPU path stays in gradwire-tensor's
//! `cuda_backend` (here, `ops.rs`, `collective.rs`) and gradwire-comm's NCCL
//! bindings: gradwire-optim,
//! gradwire-compress and gradwire-algos compose these launchers into their
//! device forms without `unsafe` of their own. Each launcher documents the
//! CPU function it matches and how (bitwise, or within a stated bound).

pub mod adasum;
pub mod feedback;
pub mod lowrank;
pub mod optim;
pub mod quant;
pub mod select;
