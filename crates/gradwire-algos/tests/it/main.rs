//! gradwire-algos's integration tests, gathered into one test binary (one link
//! instead of one per file): each module is the file it was.

mod adasum;
mod common;
mod dimreduce;
mod powersgd;
mod quantized;
mod reshard;
mod strategies;
