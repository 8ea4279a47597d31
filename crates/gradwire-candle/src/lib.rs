//! gradwire-candle: data-parallel training for [candle] models.
//!
//! Candle trains on one device; [`DataParallel`] wraps any
//! [`candle_nn::Optimizer`] (SGD, AdamW, ...) so that every worker computes
//! gradients on its shard of the batch, gradwire combines them across the
//! workers (dense, fp16/bf16, sparse with error feedback, or any
//! [`gradwire_optim::Strategy`] such as AdaSum; over any gradwire
//! [`Communicator`](gradwire_comm::Communicator): threads, MPI processes), and the optimizer steps with
//! the combined gradients on every worker alike.
//!
//! A whole data-parallel step (4 workers as threads here; under `mpirun`,
//! `MpiComm::world()` instead):
//!
//! ```
//! use candle_core::{DType, Device, Module, Tensor};
//! use candle_nn::{VarBuilder, VarMap, linear};
//! use gradwire_candle::DataParallel;
//! use gradwire_comm::{Communicator, local};
//! use gradwire_optim::DistOptConfig;
//!
//! let losses = local::run(4, |comm| -> candle_core::Result<f32> {
//!     let rank = comm.rank();
//!     let varmap = VarMap::new();
//!     let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
//!     let model = linear(3, 1, vb.pp("fc"))?;
//!     // Wrap the optimizer; rank 0's initial weights go to every worker.
//!     let mut dp = DataParallel::<candle_nn::SGD, _>::new(&varmap, 0.1, comm, DistOptConfig::default())?;
//!     dp.broadcast_parameters(0)?;
//!     // This worker's shard of the batch.
//!     let x = Tensor::new(&[[1f32, 2.0, 3.0]], &Device::Cpu)?.affine(1.0 + rank as f64, 0.0)?;
//!     let loss = model.forward(&x)?.sqr()?.mean_all()?;
//!     dp.backward_step(&loss)?; // backward, combine, step
//!     loss.to_scalar::<f32>()
//! })
//! .unwrap();
//! assert_eq!(losses.len(), 4);
//! ```
//!
//! The pieces:
//! - [`DataParallel`]: any candle optimizer made data-parallel (the
//!   example above), on gradwire's [`gradwire_optim::GradSync`], in the
//!   training loop its configuration names: its gradients combined before
//!   it steps (dense, fp16/bf16, sparse with error feedback, PowerSGD,
//!   quantized, AdaSum by gradient); its step taken locally and then the
//!   parameters averaged a bucket at a time (`partial`, with the
//!   optimizer's state for `partial:state`) or the weight changes combined
//!   (`adasum-delta`); or DimReduce (dense steps, then
//!   [`DataParallel::start_dimreduce`] and
//!   [`DataParallel::step_dimreduce`], whose line search calls your loss);
//! - [`optim`]: gradwire's optimizers as candle optimizers ([`Sgd`] with
//!   momentum, which candle-nn lacks, [`Adam`], [`AdamW`], [`RmsProp`],
//!   [`AdaGrad`], with gradwire's schedules), updating the variables in
//!   place, their state in DataParallel's checkpoints
//!   ([`DataParallelOptimizer`]: what DataParallel asks of an optimizer
//!   beyond candle's trait, implemented for candle's `SGD` and `AdamW`);
//! - [`named_vars`], [`specs_of`], [`with_values`], [`write_values`],
//!   [`update_in_place`]: the variables in declaration order and their
//!   values read and written in place.
//!
//! Copies: a gradient is read from candle's CPU storage in place and copied
//! once into gradwire's buffer for that parameter (reused every step); the
//! combined gradient is written into a candle tensor DataParallel keeps
//! per variable, the same every step, and replaces the worker's own in the
//! `GradStore` (candle's backward tensors are not written: one storage may
//! back several of them); a lone worker with the dense strategy, whose
//! combination is its gradient, keeps candle's own. Parameters are updated
//! in place by [`optim`]'s optimizers. In the local-step and DimReduce
//! loops the parameters are copied into gradwire's buffers before and
//! after the step and written back once (the combination works on
//! gradwire tensors); no copy is kept between steps. Parameters must be
//! f32 on the CPU in this version (a typed error otherwise).
//!
//! Compute threads: set `RAYON_NUM_THREADS` (the cores shared out among
//! the workers of one machine, as the `gradwire` binary does). Without it,
//! candle 0.11 counts the physical cores by parsing `/proc/cpuinfo` at
//! every matrix product, which took half the CPU time of a 4-worker
//! training in gradwire's tests.
//!
//! Allocator: candle's backward allocates every gradient afresh each step
//! (a zeroed tensor per parameter, then the sum into another), and glibc's
//! allocator gives memory of a large layer's size back to the kernel when
//! it is freed, so each step page-faults it in again: 38 % of a step of a
//! 4.35 M-parameter MLP (4 workers, 2 cores). A global allocator that keeps
//! freed memory for reuse removes it; the `gradwire` binary links
//! [mimalloc](https://docs.rs/mimalloc) (epochs 1.2 to 1.8 times faster
//! there, the same bits).
//!
//! Errors come back as gradwire-candle's [`Error`]: gradwire's typed error
//! ([`Error::Gradwire`], matched by its kind: a lost peer, a timeout, a
//! mismatch), candle's ([`Error::Candle`]), or a variable this version cannot
//! train. It converts into [`candle_core::Error`] with `?`, so a candle
//! training loop keeps its `candle_core::Result` (as in the example above).
//!
//! [candle]: https://github.com/huggingface/candle

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

mod accumulate;
mod data_parallel;
mod error;
pub mod optim;
mod vars;

pub use data_parallel::DataParallel;
pub use error::{Error, Result};
pub use optim::{AdaGrad, Adam, AdamW, CandleOptim, DataParallelOptimizer, RmsProp, Sgd};
pub use vars::{
    named_vars, parameters_in, parameters_of, specs_of, update_in_place, with_values, write_values,
};
