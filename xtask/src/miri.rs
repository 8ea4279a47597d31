//! `cargo xtask miri`: the tests of the code whose `unsafe` runs on the CPU,
//! under Miri, which checks every access against Rust's aliasing rules
//! (Stacked Borrows), for data races between threads, for reads of
//! uninitialised or freed memory and for out-of-bounds pointers. A plain test
//! run cannot see these: the compiled code may well do what the test expects
//! and still be undefined behaviour that a later compiler turns into a wrong
//! result. Miri found one (LocalComm's broadcast, where the root reborrowed
//! its buffer while its peers read it through the posted pointer).
//!
//! Miri needs a nightly toolchain with the `miri` and `rust-src` components,
//! which CI's machines do not have and cannot fetch, so this is a task of its
//! own, not a step of `cargo xtask test`; it says how to install them when
//! they are missing. Miri interprets the program, a hundred times slower or
//! more: each suite runs a chosen part of its tests, with two cases per
//! property test (`PROPTEST_CASES`); the AVX2 forms of the block reductions
//! and the quantizers run in a build of their own with AVX2 enabled. No
//! suite takes the f16 conversions: their `unsafe` is F16C's, which Miri
//! cannot run.

use crate::{Result, run, step, workspace_root};
use std::process::Command;

/// Flags for Miri: the tests read clocks and make temporary files
/// (isolation off); NcclComm's host transport addresses its buffers by
/// integer, as NCCL's device pointers are (permissive provenance).
const MIRIFLAGS: &str = "-Zmiri-disable-isolation -Zmiri-permissive-provenance";

/// One `cargo miri test` run.
struct Suite {
    /// What it checks, for the step's name.
    what: &'static str,
    /// The package.
    package: &'static str,
    /// Its features, if any.
    features: &'static str,
    /// `--lib`, or `--test <name>`.
    target: &'static [&'static str],
    /// The tests to run (name filters; every test matching one).
    filters: &'static [&'static str],
    /// Tests left out, and why in the comment beside each.
    skip: &'static [&'static str],
    /// Whether to build with AVX2 enabled (its own target directory).
    avx2: bool,
}

/// The suites, in order.
const SUITES: &[Suite] = &[
    Suite {
        what: "LocalComm's collectives (rank threads reading and writing each other's buffers)",
        package: "gradwire-comm",
        features: "",
        target: &["--test", "it"],
        filters: &["collectives::"],
        // 4,096 queued jobs: hours under Miri, and no unsafe code of its own.
        skip: &["thousands_of_queued_jobs"],
        avx2: false,
    },
    Suite {
        what: "the block reductions (reads through the ranks' posted pointers)",
        package: "gradwire-comm",
        features: "",
        target: &["--lib"],
        // The f16 conversions' unsafe is F16C's, which Miri cannot run.
        filters: &["local::data::tests::dispatched"],
        skip: &[],
        avx2: false,
    },
    Suite {
        what: "NcclComm's host transport (copies at posted addresses)",
        package: "gradwire-comm",
        features: "nccl",
        target: &["--lib"],
        // The fabric's two copy paths with data between rank threads, and
        // the stream and transport beneath NcclComm. (The conformance
        // cases on NcclComm over it take 13 to 30 minutes each under Miri:
        // broadcast and all_gather passed on 2026-11-29.)
        filters: &["nccl::host::"],
        skip: &[],
        avx2: false,
    },
    Suite {
        what: "the AVX2 block reductions",
        package: "gradwire-comm",
        features: "",
        target: &["--lib"],
        filters: &["local::data::tests::dispatched"],
        skip: &[],
        avx2: true,
    },
    Suite {
        what: "the AVX2 quantizers",
        package: "gradwire-compress",
        features: "",
        target: &["--test", "it"],
        filters: &["quant::"],
        // 6,000 encodings of 700 entries: a statistical test, whose
        // encoding the others run too.
        skip: &["qsgd_is_unbiased_over_seeds"],
        avx2: true,
    },
];

/// Runs every suite under Miri (`args`: more arguments for the test
/// binaries).
pub(crate) fn miri(args: &[String]) -> Result {
    step("Miri available", || {
        run(nightly_cargo().args(["miri", "--version"])).map_err(|e| {
            format!(
                "{e}: Miri needs a nightly toolchain with two components: `rustup toolchain \
                 install nightly --component miri,rust-src`"
            )
        })
    })?;
    for suite in SUITES {
        step(&format!("Miri: {}", suite.what), || {
            let mut command = nightly_cargo();
            command.args(["miri", "test", "-p", suite.package]);
            if !suite.features.is_empty() {
                command.args(["--features", suite.features]);
            }
            command.args(suite.target);
            if suite.avx2 {
                let dir = workspace_root().join("target").join("miri-avx2");
                command
                    .arg("--target-dir")
                    .arg(dir)
                    .env("RUSTFLAGS", "-C target-feature=+avx,+avx2");
            }
            command.arg("--").args(suite.filters);
            for skipped in suite.skip {
                command.args(["--skip", skipped]);
            }
            command
                .args(args)
                .env("MIRIFLAGS", MIRIFLAGS)
                .env("PROPTEST_CASES", "2");
            run(&mut command)
        })?;
    }
    Ok(())
}

/// The nightly toolchain's `cargo`, through rustup (the `cargo` running
/// this task is the workspace's stable one), in the workspace root.
fn nightly_cargo() -> Command {
    let mut command = Command::new("rustup");
    command
        .args(["run", "nightly", "cargo"])
        .current_dir(workspace_root());
    command
}
