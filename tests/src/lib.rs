//! Cross-crate tests of gradwire.
//!
//! It holds the tests that look at more than one crate at a time, in `tests/`;
//! the digits data set and the MLP they train come from `gradwire-cli`.
//!
//! - `tidy.rs`: repository hygiene checks over every workspace member (every
//!   crate root denies `missing_docs`, every source file starts with a `//!`
//!   module doc).
//! - `convergence.rs`: data-parallel training of the digits MLP on 4 ranks:
//!   dense averaging and AdaSum by delta weight against one worker.
//! - `conformance_local.rs`: the [`conformance`] suite on LocalComm, world
//!   sizes 1 to 4, in-process.
//! - `conformance_mpi.rs`: the same suite on MpiComm, as the
//!   `gradwire-mpi-conformance` binary (feature `mpi`) under
//!   `mpirun --oversubscribe -np W` for W = 1 to 4. Without MPI it prints a
//!   loud SKIP line; with `GRADWIRE_REQUIRE_MPI=1` a missing MPI fails.

#![deny(missing_docs)]

pub mod conformance;
