//! The launchers of the codec kernels, each beside the CPU form it matches:
//! sparse selection ([`select`], `select.cu`), error feedback, the cast
//! codec and scatter-add ([`feedback`], `feedback.cu` and `cast.cu`), the
//! quantizers ([`quant`], `quant.cu`) and PowerSGD's low-rank products
//! ([`lowrank`], `lowrank.cu`).
//!
//! Every launcher validates its operands (device, dtype, lengths, ranges)
//! with its own name before it queues the first of its kernels, then
//! launches through gradwire-tensor's typed launch, which checks each
//! launch against the kernel's signature: no `unsafe` here. Each launcher
//! documents the CPU function it matches and how (bitwise, or within a
//! stated bound).

pub mod feedback;
pub mod lowrank;
pub mod quant;
pub mod select;
