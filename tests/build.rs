//! Does nothing: it exists so that the build dependency on syn (see
//! `Cargo.toml`) takes part in feature resolution.

fn main() {}
