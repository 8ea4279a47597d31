//! gradwire-tests's integration tests, gathered into one test binary (one link
//! instead of one per file): each module is the file it was.

mod accumulate;
mod candle;
mod checkpoint_sets;
mod conformance_local;
mod conformance_mpi;
mod conformance_nccl_host;
mod convergence;
mod fault_matrix;
mod fuzz_corpus;
mod registry;
mod straggler;
mod uneven;
