//! gradwire-compress's integration tests, gathered into one test binary (one link
//! instead of one per file): each module is the file it was.

mod codecs;
mod e3m0;
mod lowrank;
mod quant;
mod wire;
