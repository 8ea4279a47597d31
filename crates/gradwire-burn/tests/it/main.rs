//! gradwire-burn's integration tests, gathered into one test binary (one
//! link instead of one per file): each module is the file it was.

mod data_parallel;
mod errors;
mod support;
