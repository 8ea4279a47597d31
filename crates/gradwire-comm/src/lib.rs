//! gradwire-comm: how gradwire ranks exchange data.
//!
//! One small trait, [`Communicator`], with the collectives data-parallel
//! training needs (all-reduce, broadcast, all-gather of equal and of varied
//! lengths, reduce-scatter, point-to-point, barrier, split) and asynchronous
//! forms that return a [`Pending`] handle, so communication overlaps compute.
//! Backends:
//!
//! - [`local::LocalComm`]: ranks as threads of one process over shared memory.
//!   Always built; the embedded default and what tests run on.
//! - `mpi::MpiComm` (feature `mpi`): one rank per MPI process, started by
//!   `mpirun`; the same checks and the same reduction bits as LocalComm.
//!   [`LaunchEnv`] reads a launcher's rank and node placement without MPI.
//! - `nccl::NcclComm` (feature `nccl`): one rank per GPU over NCCL, on host
//!   slices and on CUDA tensors in device memory.
//!
//! This crate knows nothing of compression or optimizers: it moves and reduces
//! buffers of [`Element`]s, and tensors through the provided `_tensor` methods.
//!
//! Failures are errors on every rank, never hangs, and alike on every
//! backend: a disagreement is [`CommError::Mismatch`] before any data moves;
//! every wait has a deadline ([`CommError::Timeout`]); a rank that fails
//! before a collective posts a fault ([`Communicator::post_fault`]); and an
//! asynchronous job that panics loses the asynchronous lane of every rank at
//! once ([`FaultKind::LaneLost`], see [`Communicator::run_async`]). The one worker that
//! runs every backend's jobs is `worker.rs`.
//!
//! ```
//! use gradwire_comm::{Communicator, ReduceOp, local};
//!
//! // Three ranks: average a gradient, then overlap an all-gather with work.
//! let results = local::run(3, |comm| {
//!     let mut grad = vec![comm.rank() as f32; 4];
//!     comm.all_reduce(&mut grad, ReduceOp::Avg)?;
//!     let pending = comm.all_gather_async(vec![comm.rank() as u32])?;
//!     let everyone = pending.wait()?; // ... compute here meanwhile ...
//!     Ok::<_, gradwire_comm::CommError>((grad, everyone))
//! })?;
//! for r in results {
//!     let (grad, everyone) = r?;
//!     assert_eq!(grad, vec![1.0; 4]);
//!     assert_eq!(everyone, vec![0, 1, 2]);
//! }
//! # Ok::<(), gradwire_comm::CommError>(())
//! ```

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

mod call;
mod communicator;
mod element;
mod error;
mod f16_convert;
mod fault;
mod flight;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod header;
mod job_slot;
mod launch;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;
mod op;
mod pending;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod protocol;
#[cfg(any(feature = "mpi", feature = "nccl"))]
mod rank_order;
mod rank_threads;
pub mod timeline;
mod worker;

pub use communicator::{Communicator, Gathered, chunk_range};
pub use element::{ElemType, Element};
pub use error::{CommError, Result};
pub use fault::{FIRST_RESERVED_CODE, Fault, FaultKind};
pub use flight::{
    FLIGHT_RECORDER_ENV, FLIGHT_RECORDS, FlightPhase, FlightRecord, flight_dir_from_env,
};
pub use job_slot::{AsyncJob, JobSlot};
pub use launch::LaunchEnv;
pub use local::{LocalComm, LocalConfig};
#[cfg(feature = "mpi")]
pub use mpi::{CallTime, MpiComm, MpiConfig};
#[cfg(feature = "nccl")]
pub use nccl::{NcclComm, NcclConfig, NcclReduction};
pub use op::ReduceOp;
pub use pending::{Completion, Pending};
pub use timeline::{TimelineTrack, Trace, gather_trace};
