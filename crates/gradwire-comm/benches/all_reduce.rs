//! all-reduce benchmark (being written).
fn main() {}
