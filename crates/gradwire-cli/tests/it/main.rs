//! gradwire-cli's integration tests, gathered into one test binary (one link
//! instead of one per file): each module is the file it was.

mod cli;
mod gpt;
#[cfg(feature = "mpi")]
mod shaped_network;
