//! Codec benchmarks (being written).
fn main() {}
