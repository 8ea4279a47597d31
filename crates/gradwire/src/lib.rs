//! gradwire: communication-efficient data-parallel training.
//!
//! The facade over the gradwire crates: depend on this one crate and pick the
//! layers with features, or depend on the layer crates directly.
//!
//! | module | crate | what |
//! |---|---|---|
//! | [`tensor`] | gradwire-tensor | tensors (f32/f16/bf16) with the lazy zeroed flag |
//! | [`comm`] | gradwire-comm (feature `comm`, default) | the `Communicator` trait and its backends |
//! | [`compress`] | gradwire-compress (feature `compress`, default) | casts, sparsifiers, error feedback, the sparse wire format |
//! | [`algos`] | gradwire-algos (feature `algos`, default) | dense, half and sparse all-reduce, AdaSum, DimReduce |
//! | [`optim`] | gradwire-optim (feature `optim`, default) | optimizers, schedules, checkpoints, the front ends (`DistOpt`, `LocalSteps`, `DimReduceOpt`, `AnyLoop`) |
//!
//! Feature `cuda` turns on the CUDA storage of gradwire-tensor; `mpi` adds
//! `comm::MpiComm` (Open MPI at build time) and `nccl` adds `comm::NcclComm`
//! (NCCL and the CUDA driver loaded at run time, so it builds anywhere).
//!
//! A whole data-parallel step: four workers (threads here; processes or GPUs
//! with another `Communicator`), each with the gradient of its shard of the
//! batch, averaged by `DistOpt` and applied by SGD, leaving every worker with
//! the same weights.
//!
//! ```
//! use gradwire::comm::local;
//! use gradwire::optim::{DistOpt, DistOptConfig, OptimError, ParamSpec, Sgd, SgdConfig};
//! use gradwire::{Communicator, Tensor};
//!
//! let weights = local::run(4, |comm| {
//!     let sgd = Sgd::new(SgdConfig::default().lr(0.1))?;
//!     let params = vec![ParamSpec::new("w", vec![3])]; // in backward order
//!     let mut dist = DistOpt::new(sgd, comm, params, DistOptConfig::default())?;
//!     let mut w = Tensor::from_vec(vec![1f32; 3], 3)?;
//!     // Backward: this worker's gradient; its bucket leaves as soon as it is full.
//!     let grad = vec![dist.rank() as f32; 3];
//!     dist.push("w", Tensor::from_vec(grad, 3)?)?;
//!     // Wait for every bucket, average, and step: w -= 0.1 x mean(0, 1, 2, 3).
//!     dist.finish([("w", &mut w)])?;
//!     Ok::<_, OptimError>(w.to_vec::<f32>()?)
//! })?;
//! for w in weights {
//!     assert!(w?.iter().all(|&x| (x - 0.85).abs() < 1e-6));
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Swap `DistOptConfig::default()` for another `StrategyConfig` to send fp16, a top-k
//! selection with error feedback, AdaSum-combined deltas or DimReduce steps;
//! the `gradwire` command line (crate gradwire-cli) runs them all side by side.

#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]
#![forbid(unsafe_code)]

pub use gradwire_tensor as tensor;
pub use gradwire_tensor::{DType, Device, Shape, Tensor};

#[cfg(feature = "comm")]
pub use gradwire_comm as comm;
#[cfg(feature = "comm")]
pub use gradwire_comm::{CommError, Communicator, Fault, FaultKind, LocalComm, ReduceOp};

#[cfg(feature = "compress")]
pub use gradwire_compress as compress;

#[cfg(feature = "algos")]
pub use gradwire_algos as algos;

#[cfg(feature = "optim")]
pub use gradwire_optim as optim;
/// The error every layer's error converts into with `?` (a tensor's, a
/// communicator's, a codec's, a strategy's, an optimizer's): one error type
/// for a training loop, matched by its [`Error::kind`] ([`ErrorKind`]:
/// `PeerLost`, `Timeout`, `Mismatch`, `Fault`, `InvalidArgument`, ...)
/// whichever layer it came from.
#[cfg(feature = "optim")]
pub use gradwire_optim::OptimError as Error;
#[cfg(feature = "optim")]
pub use gradwire_optim::{
    AnyLoop, DimReduceOpt, DistOpt, DistOptConfig, GradSync, LocalSteps, StrategyConfig,
    TrainingLoop,
};
/// What kind of failure an error is: the same vocabulary at every layer
/// (every crate's error has a `kind()`).
pub use gradwire_tensor::ErrorKind;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
