//! gradwire-burn: data-parallel training for [burn] models.
//!
//! burn trains a module on one device; [`DataParallel`] wraps any burn
//! optimizer (a [`burn::optim::ModuleOptimizer`]: SGD, Adam, AdamW, ...,
//! or one of your own rule) so that every worker computes gradients on
//! its shard of the batch, gradwire combines them across the workers
//! (dense, fp16/bf16, sparse with error feedback, PowerSGD, quantized, or
//! any [`gradwire_optim::Strategy`] such as AdaSum; over any gradwire
//! [`Communicator`](gradwire_comm::Communicator): threads, MPI processes),
//! and the optimizer steps with the combined gradients on every worker
//! alike.
//!
//! A whole data-parallel step (4 workers as threads here; under `mpirun`,
//! `MpiComm::world()` instead):
//!
//! ```
//! use burn::nn::{Linear, LinearConfig};
//! use burn::optim::SgdConfig;
//! use burn::tensor::{Device, Tensor, TensorData};
//! use gradwire_burn::DataParallel;
//! use gradwire_comm::{Communicator, local};
//! use gradwire_optim::DistOptConfig;
//!
//! let losses = local::run(4, |comm| -> gradwire_burn::Result<f32> {
//!     let rank = comm.rank();
//!     let device = Device::flex().autodiff();
//!     let mut model: Linear = LinearConfig::new(3, 1).init(&device);
//!     // Wrap the optimizer; rank 0's initial weights go to every worker.
//!     let mut dp = DataParallel::new(&model, SgdConfig::new().init(), comm, DistOptConfig::default())?;
//!     dp.broadcast_parameters(&mut model, 0)?;
//!     // This worker's shard of the batch.
//!     let x = Tensor::<2>::from_data(TensorData::new(vec![1.0f32 + rank as f32, 2.0, 3.0], [1, 3]), &device);
//!     let loss = model.forward(x).powi_scalar(2).mean();
//!     dp.backward_step(0.1, &mut model, &loss)?; // backward, combine, step
//!     Ok(loss.into_scalar::<f32>())
//! })
//! .unwrap();
//! assert_eq!(losses.len(), 4);
//! ```
//!
//! The pieces:
//! - [`DataParallel`]: any burn optimizer made data-parallel, on
//!   gradwire's [`gradwire_optim::GradSync`], in the training loop its
//!   configuration names: its gradients combined before it steps (every
//!   gradient strategy of the registry; [`DataParallel::reduce`] for a
//!   loop that steps itself); its step taken locally and then the
//!   parameters averaged a bucket at a time (`partial`) or the weight
//!   changes combined (`adasum-delta`, DiLoCo's outer step); or DimReduce
//!   (dense steps, then [`DataParallel::start_dimreduce`] and
//!   [`DataParallel::step_dimreduce`], whose line search calls your
//!   loss). Accumulation (`DistOptConfig::accumulate`), uneven inputs
//!   ([`DataParallel::set_samples`], [`DataParallel::join`]) and the
//!   failure model are gradwire's, as in every front end.
//! - [`parameters_of`]: a module's float parameters as gradwire declares
//!   them: their module paths (`fc1.weight`, the names burn's records
//!   use), ids and shapes, in the order burn visits them.
//!
//! The module is passed as `&mut M` and replaced by its next state only
//! when a step completes: a step that fails on any worker (a lost peer, a
//! timeout, a gradient with the wrong shape) leaves it, and the optimizer,
//! as they were in the gradient strategies. Checkpoints: gradwire's state
//! ([`DataParallel::checkpoint`]: residuals, counters, configuration) goes
//! beside burn's records of the module and of the optimizer
//! (`dp.optimizer().save(path)`).
//!
//! Copies: burn lends no view of a tensor's memory, so each gradient is
//! read out of burn as f32 (`try_into_vec_as`: converted from its dtype,
//! so f16 and bf16 parameters train too) and then copied into gradwire's
//! buffer for it; each combined gradient becomes a new burn tensor of the
//! parameter's dtype on its device. A lone worker with the dense strategy
//! steps with burn's own gradients. Any burn backend works
//! (the tests run flex, burn's pure-Rust CPU backend); values cross
//! between the device and gradwire's host buffers.
//!
//! Errors come back as gradwire-burn's [`Error`]: gradwire's typed error
//! ([`Error::Gradwire`], matched by its kind: a lost peer, a timeout, a
//! mismatch) or a tensor burn could not read ([`Error::Burn`]).
//!
//! [burn]: https://github.com/tracel-ai/burn

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

mod access;
mod accumulate;
mod data_parallel;
mod error;
mod params;

pub use data_parallel::DataParallel;
pub use error::{Error, Result};
pub use params::{ParamEntry, parameters_of, specs_of};
