//! Cross-crate tests of gradwire.
//!
//! It holds the tests that look at more than one crate at a time, in `tests/`;
//! the digits data set and the MLP they train come from `gradwire-experiments`.
//!
//! - `convergence.rs`: data-parallel training of the digits MLP on 4 ranks:
//!   dense averaging and AdaSum by delta weight against one worker.
//! - `conformance_local.rs`: the [`conformance`] suite on LocalComm, world
//!   sizes 1 to 4, in-process.
//! - `conformance_mpi.rs`: the same suite on MpiComm, as the
//!   `gradwire-mpi-conformance` binary (feature `mpi`) under
//!   `mpirun --oversubscribe -np W` for W = 1 to 4. Without MPI it prints a
//!   loud SKIP line; with `GRADWIRE_REQUIRE_MPI=1` a missing MPI fails.

//! - `candle.rs`: a candle MLP through gradwire-candle ([`candle_model`])
//!   on 1 to 8 workers against one process; the conformance suite's
//!   `candle_training` case runs it on every backend.
//! - `fault_matrix.rs`: DistOpt under injected faults (gradwire-experiments'
//!   fault matrix), every mode, 1 to 8 ranks, random fault schedules, and
//!   checkpoints restored between any two steps of them.
//! - `fuzz_corpus.rs`: the fuzz targets' committed corpus through their
//!   checks (`fuzz/checks/`).
//! - `mpi_faults.rs` (feature `mpi`): MpiComm's failure model under
//!   `mpirun` (deadlines, a killed rank); [`mpirun`] starts it and
//!   `conformance_mpi.rs`.
//! - `conformance_nccl.rs` and `distopt_nccl.rs` (feature `nccl`): the
//!   suite on NcclComm, and DistOpt with its parameters on the GPUs against
//!   DistOpt on LocalComm with host parameters; `gpu` (feature `nccl`)
//!   gates them.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod candle_model;
pub mod conformance;
#[cfg(feature = "nccl")]
pub mod gpu;
pub mod mpirun;
