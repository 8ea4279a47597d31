//! gradwire-tensor's integration tests, gathered into one test binary (one link
//! instead of one per file): each module is the file it was.

mod cast;
mod common;
mod errors;
mod flat;
mod ops;
mod zeroed;
