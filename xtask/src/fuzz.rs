//! The fuzz step of `cargo xtask test`: the cargo-fuzz targets of `fuzz/`
//! (a workspace of its own, which the main one excludes) checked on the
//! stable toolchain.
//!
//! A target's checks are a function in `fuzz/checks/<name>.rs`, which
//! `fuzz/fuzz_targets/<name>.rs` hands libFuzzer and gradwire-tests'
//! `fuzz_corpus` test replays over every input of `fuzz/corpus/<name>/`
//! (seeds, a coverage-greedy pick of a fuzzing run's corpus, the input of
//! any crash once fixed) in the test step; that test also fails for a
//! target without a check or without inputs. So this step only checks
//! that the targets compile, without libFuzzer (the `link-libfuzzer`
//! feature off: its C++ build took 18 s of the 39 s this step took when it
//! built and ran the binaries), in the main target directory; `cargo fuzz
//! run <name>` builds them with it.

use crate::gpu::target_dir;
use crate::{Result, cargo, run, workspace_root};

/// The step: check the targets.
pub(crate) fn check() -> Result {
    run(cargo()
        .arg("check")
        .arg("--manifest-path")
        .arg(workspace_root().join("fuzz/Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir())
        .args(["--bins", "--no-default-features"]))
}
