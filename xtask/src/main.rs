//! Project automation for gradwire, run as `cargo xtask <task>`.
//!
//! `cargo xtask test` is the one test command, locally and in CI (`.ci/run`):
//! it makes sure the Debian packages the crates link against are installed
//! (the `packages` module; most of them while clippy lints the default
//! build), runs fmt, clippy (the fuzz targets, a workspace member, are
//! linted with the rest), the workspace tests (the `runner` module), the
//! PTX assembly check and the docs, stopping at the first failing step, and
//! ends with the count of GPU tests that skipped (see the `skips` module).
//! `cargo xtask ptx` regenerates the kernels' PTX (see the `gpu` module);
//! `cargo xtask miri` runs the tests of the unsafe CPU code under Miri
//! (see the `miri` module).
//!
//! This crate deliberately uses only std, so it builds on a bare machine before
//! any system package is installed.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod artifacts;
mod bundle;
mod gpu;
mod miri;
mod packages;
mod runner;
mod skips;
#[cfg(test)]
mod tidy;
mod workspace;

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

/// The features that turn the MPI backend on in every crate that has one.
const MPI_FEATURES: &str = "gradwire-comm/mpi,gradwire-tests/mpi,gradwire/mpi,gradwire-cli/mpi";

/// The GPU features of every crate that has them: CUDA storage and kernels,
/// the device forms of the optimizers, codecs and AdaSum, NcclComm, and the
/// GPU test suites. They build on any machine (cudarc loads the driver and
/// NCCL at run time); without a GPU their tests skip their GPU part, each
/// with a `SKIP GPU` line, which `cargo xtask test` counts.
const GPU_FEATURES: &str = concat!(
    "gradwire-tensor/cuda,gradwire-optim/cuda,gradwire-compress/cuda,gradwire-algos/cuda,",
    "gradwire-comm/nccl,gradwire/cuda,gradwire/nccl,gradwire-tests/nccl,gradwire-cli/nccl,",
    "gradwire-cli/cuda"
);

/// The word in the name of every test of code that only a build without
/// features has (`cargo xtask test` runs just those without features).
const DEFAULT_ONLY_TESTS: &str = "built_without";

/// The command line help.
const USAGE: &str = "\
Usage: cargo xtask <task>

Tasks:
  test [-- <args>...]  the one test command (what CI runs): ensure system packages,
                       check the toolchain, cargo fmt --check, cargo clippy -D warnings
                       (default features, then mpi + cuda + nccl), cargo check with
                       cuda + nccl, cargo test --workspace with mpi + cuda + nccl (every
                       test; MpiComm's unit tests, the conformance suite and the MPI
                       fault tests under mpirun with GRADWIRE_REQUIRE_MPI=1, the
                       shaped-network run where namespaces can be made, the CUDA and
                       NCCL suites, which SKIP without a GPU; the test binaries run
                       two at a time, each one's output printed when it ends, logs in
                       target/xtask-test-logs), cargo test without
                       features of the packages with code of their own there (their
                       tests named built_without, at opt-level 0), ptxas on
                       every PTX file (sm_70, sm_80, sm_90),
                       cargo doc (every feature) with warnings denied; then the count of GPU tests
                       that skipped, per package.
                       <args> go to the test binaries, e.g. `-- --nocapture`.
  ptx                  compile kernels/cuda/*.cu to kernels/ptx/*.ptx with NVRTC 12.2
                       (compute_70; the pinned wheel is fetched with pip into target/
                       when missing) and regenerate kernels/ptx/manifest.txt and
                       kernels/src/generated.rs; commit the results.
  ptxas                the ptxas step of `test` alone: assemble every kernels/ptx/*.ptx
                       for sm_70, sm_80 and sm_90 with ptxas 12.9 (fetched with pip into
                       target/ when missing) and print registers and shared memory.
  gpu-bundle           build the GPU suites (test binaries with cuda / nccl) and the
                       gradwire binary (cuda + nccl), stripped, into target/gpu-bundle/
                       with gpu_suite.sh, which runs them on a machine with an NVIDIA
                       GPU and no Rust toolchain (suites with GRADWIRE_REQUIRE_GPU=1,
                       compute-sanitizer, the GPU benches).
  compare [-- <args>...]
                       the main job: build the CLI while the packages it runs with
                       (a font, fortunes) install, then run
                       `gradwire compare` (dev profile, hot crates at opt-level 3;
                       every strategy on the digits MLP, one table, plots in
                       target/gradwire-compare).
                       <args> go to `gradwire compare`, e.g. `-- --epochs 30`.
  miri [-- <args>...]  the tests of the code whose unsafe runs on the CPU (LocalComm's
                       data phase, NcclComm over its host transport, the block
                       reductions, the AVX2 quantizers) under Miri, which checks the
                       aliasing rules, data races and memory accesses; needs a nightly
                       toolchain with miri and rust-src (not on CI's machines, so not a
                       step of `test`). <args> go to the test binaries.
  help                 print this help
";

/// What a step or task returns: its failure is a message for the user.
type Result<T = ()> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (task.as_str(), rest),
        None => ("help", &[][..]),
    };
    let result = match task {
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        // Tasks that pass what follows `--` on to what they run.
        "test" | "miri" | "compare" => {
            let passed = match rest {
                [] => rest,
                [dashes, passed @ ..] if dashes == "--" => passed,
                [other, ..] => {
                    return usage_error(&format!("unexpected argument `{other}` to `{task}`"));
                }
            };
            match task {
                "test" => test(passed),
                "miri" => miri::miri(passed),
                _ => compare(passed),
            }
        }
        "ptx" | "ptxas" | "gpu-bundle" => {
            if let Some(other) = rest.first() {
                return usage_error(&format!("unexpected argument `{other}` to `{task}`"));
            }
            match task {
                "ptx" => step("cargo xtask ptx", gpu::ptx),
                "ptxas" => step("ptxas (sm_70, sm_80, sm_90)", gpu::ptxas),
                _ => step("cargo xtask gpu-bundle", bundle::gpu_bundle),
            }
        }
        other => return usage_error(&format!("unknown task `{other}`")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Reports a bad command line and returns exit code 2.
fn usage_error(message: &str) -> ExitCode {
    eprintln!("error: {message}\n\n{USAGE}");
    ExitCode::from(2)
}

/// `cargo xtask test`: every check CI runs, in order, stopping at the first failure.
fn test(test_args: &[String]) -> Result {
    step("system packages for the default build", || {
        packages::ensure(packages::FOR_THE_DEFAULT_BUILD)
    })?;
    // The others (MPI, libclang, ...) while the default build is linted,
    // which needs none of them; waited for before any other step.
    let installing = packages::Background::start(packages::REQUIRED);
    let default_lint = step("toolchain components", check_toolchain)
        .and_then(|()| {
            step("cargo fmt", || {
                run(cargo().args(["fmt", "--all", "--", "--check"]))
            })
        })
        .and_then(|()| {
            step("cargo clippy", || {
                run(cargo().args([
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ]))
            })
        });
    let installed = installing.finish("system packages");
    default_lint?;
    installed?;
    // Every feature at once: MPI and the GPU path (which compiles here
    // without a GPU, a toolkit or NCCL).
    let all_features = format!("{MPI_FEATURES},{GPU_FEATURES}");
    step("cargo clippy (features mpi, cuda, nccl)", || {
        run(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--features",
            &all_features,
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    step("cargo check (features cuda, nccl)", || {
        run(cargo().args([
            "check",
            "--workspace",
            "--all-targets",
            "--features",
            GPU_FEATURES,
        ]))
    })?;
    // Every test with every feature on, in one build: every package's
    // tests (the CPU paths are the same code with the features compiled in),
    // MpiComm's unit tests, the conformance suite under mpirun (W = 1..=4)
    // and MpiComm's failure model (`mpi_faults`, which starts itself under
    // mpirun), which must run here (GRADWIRE_REQUIRE_MPI=1: a missing MPI
    // fails instead of skipping); the shaped-network run (two ranks in
    // namespaces, 1 Gbit/s links, Open MPI over TCP), required wherever this
    // process may make network namespaces and skipped loudly elsewhere (not
    // root, a container without CAP_NET_ADMIN); and the GPU suites, which
    // without a GPU skip their GPU part, each test with a `SKIP GPU` line on
    // stderr, counted here and reported at the end (on a GPU machine
    // GRADWIRE_REQUIRE_GPU=1 makes a missing GPU a failure). Cargo builds
    // the binaries; the `runner` module runs them, two at a time.
    let mut gpu_skips = skips::Skips::default();
    step(
        "cargo test (features mpi, cuda, nccl; MPI suites under mpirun)",
        || {
            let mut build = cargo();
            build.args(["test", "--workspace", "--features", &all_features]);
            let started = Instant::now();
            let binaries = runner::build(&mut build)?;
            println!(
                "built {} test binaries in {:.1}s; running them {} at a time",
                binaries.len(),
                started.elapsed().as_secs_f64(),
                runner::JOBS
            );
            let mut env = vec![("GRADWIRE_REQUIRE_MPI".to_string(), "1".to_string())];
            match cannot_make_namespaces() {
                None => env.push(("GRADWIRE_REQUIRE_NETWORK".into(), "1".into())),
                Some(why) => println!("SKIP shaped network: {why}"),
            }
            env.extend(compute_threads());
            let mut doc = cargo();
            doc.args([
                "test",
                "--workspace",
                "--features",
                &all_features,
                "--doc",
                "--",
            ])
            .args(test_args);
            let logs = gpu::target_dir().join("xtask-test-logs");
            gpu_skips = runner::run(binaries, test_args, &env, doc, &logs)?;
            skips::check(&gpu_skips, !test_args.is_empty())
        },
    )?;
    // Then, without features, the packages whose own code differs without
    // them (a `not(feature = ...)` cfg in `src/`: the messages of a binary
    // built without MPI or NCCL, errors without CUDA), found by reading the
    // code: their tests of that code, which have `built_without` in their
    // names (the others ran above, on the same code with the features
    // compiled in, and clippy checked the default build). Every package the
    // manifest optimises, of the workspace or not, builds at opt-level 0
    // here (the others are at 0 already): nothing they run is hot, and
    // their default-feature build is this step's cost (candle-core at level
    // 3 alone took a fresh 2-core machine 60 s of this step, for tests of
    // messages). At least one
    // test must run, so that a renamed test cannot leave the step empty.
    let packages = workspace::packages_with_default_only_code(workspace_root());
    // With none, a bare `cargo test` would run the whole workspace again.
    if !packages.is_empty() {
        step(
            &format!(
                "cargo test (default features, tests named built_without: {})",
                packages.join(", ")
            ),
            || {
                let mut command = cargo();
                command.arg("test");
                let manifest = workspace::read(&workspace_root().join("Cargo.toml"));
                for name in workspace::packages_with_profile_settings(&manifest) {
                    command.args([
                        "--config",
                        &format!("profile.test.package.{name}.opt-level=0"),
                    ]);
                }
                for package in &packages {
                    command.args(["-p", package]);
                }
                command
                    .args(["--lib", "--tests", "--", DEFAULT_ONLY_TESTS])
                    .args(test_args);
                let passed = run_counting_passed(&mut command)?;
                if passed == 0 {
                    return Err(format!(
                        "no test named {DEFAULT_ONLY_TESTS} ran in {}: a test of the code a build \
                         without features has must carry it in its name",
                        packages.join(", ")
                    ));
                }
                Ok(())
            },
        )?;
    }
    step("ptxas (sm_70, sm_80, sm_90)", gpu::ptxas)?;
    // Broken intra-doc links are documentation that is no longer true. The
    // run with every feature documents every item but the public stub of a
    // build without CUDA (gradwire-tensor's `CudaStorage`), which the run of
    // that small crate alone covers; it goes first so that target/doc ends
    // with the fuller pages. The dependencies' check units are clippy's.
    step("cargo doc", || {
        run(cargo()
            .args(["doc", "-p", "gradwire-tensor", "--no-deps", "--quiet"])
            .env("RUSTDOCFLAGS", "-D warnings"))?;
        run(cargo()
            .args([
                "doc",
                "--workspace",
                "--no-deps",
                "--quiet",
                "--features",
                &all_features,
            ])
            .env("RUSTDOCFLAGS", "-D warnings"))
    })?;
    // Last, where a CI log ends: how much of the GPU code did not run.
    println!("==> {}", gpu_skips.summary());
    Ok(())
}

/// `cargo xtask compare`: the main job on a fresh machine. Built in the dev
/// profile with the workspace's opt-level 3 for the hot crates
/// (`[profile.dev.package]`): the same table bit for bit as a release
/// build, 15 s of training instead of 5, but a build from nothing about a
/// minute shorter on 2 cores (2 min 37 s against 3 min 32 s, measured on
/// the commit that set the profiles), and the build scripts and proc
/// macros that `cargo xtask test` leaves. As root, the packages it runs
/// with (a font, a text) install while the CLI builds, which needs none
/// of them; then the binary cargo reports runs from the workspace root,
/// as `cargo run` would.
fn compare(args: &[String]) -> Result {
    // As root the packages install while the CLI builds; otherwise nothing
    // can be installed, and a missing one is the error at once.
    let installing = if is_root() {
        Some(packages::Background::start(packages::FOR_THE_MAIN_JOB))
    } else {
        step("system packages", || {
            packages::ensure(packages::FOR_THE_MAIN_JOB)
        })?;
        None
    };
    let built = step("build gradwire (dev profile)", || {
        let mut command = cargo();
        // The main job builds once: without incremental caches (cargo's
        // default for the dev profile) a fresh build of the CLI took 136
        // to 139 s, with them about 151 (the step's 171 s less its 20 s of
        // training). A caller's own setting wins.
        if env::var_os("CARGO_INCREMENTAL").is_none() {
            command.env("CARGO_INCREMENTAL", "0");
        }
        command.args([
            "build",
            "--quiet",
            "-p",
            "gradwire-cli",
            "--bin",
            "gradwire",
        ]);
        // Where cargo put it, as it reports it (wherever the target
        // directory is configured).
        artifacts::built(&mut command)?
            .into_iter()
            .find(|e| e.target == "gradwire" && !e.test)
            .map(|e| e.path)
            .ok_or_else(|| "the build reported no gradwire binary".to_string())
    });
    // Waited for even when the build failed: dpkg must not be cut short.
    let installed = installing.map_or(Ok(()), |i| i.finish("system packages"));
    let binary = built?;
    installed?;
    step("gradwire compare", || {
        run(Command::new(&binary)
            .current_dir(workspace_root())
            .arg("compare")
            .args(args))
    })
}

/// Runs one named step: prints a `==> name` header, runs `body`, prints how
/// long it took, and names the step in the error if it failed.
fn step<T>(name: &str, body: impl FnOnce() -> Result<T>) -> Result<T> {
    println!("==> {name}");
    let start = Instant::now();
    let result = body();
    let outcome = if result.is_ok() { "ok" } else { "FAILED" };
    println!(
        "==> {name}: {outcome} in {:.1}s",
        start.elapsed().as_secs_f64()
    );
    result.map_err(|e| format!("step `{name}` failed: {e}"))
}

/// A `cargo` command (the one running this xtask) in the workspace root.
fn cargo() -> Command {
    let mut command = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(workspace_root());
    command
}

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in a directory of the workspace")
}

/// Prints `command`, runs it with inherited stdio, and fails unless it succeeds.
fn run(command: &mut Command) -> Result {
    let shown = describe(command);
    println!("$ {shown}");
    let status = command
        .status()
        .map_err(|e| format!("could not start `{shown}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{shown}` exited with {status}"))
    }
}

/// Like [`run`], then the number of tests the test binaries' summaries
/// (`test result: ok. N passed; ...`) say passed.
fn run_counting_passed(command: &mut Command) -> Result<usize> {
    let shown = describe(command);
    println!("$ {shown}");
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start `{shown}`: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    if !output.status.success() {
        return Err(format!("`{shown}` exited with {}", output.status));
    }
    Ok(passed_tests(&stdout))
}

/// The sum of `N` over the `test result: ok. N passed` lines of `stdout`.
fn passed_tests(stdout: &str) -> usize {
    stdout
        .lines()
        .filter_map(|line| line.trim().strip_prefix("test result: ok. "))
        .filter_map(|rest| rest.split_once(" passed")?.0.parse::<usize>().ok())
        .sum()
}

/// `command` as a shell-like line, for messages.
fn describe(command: &Command) -> String {
    let envs = command.get_envs().filter_map(|(key, value)| {
        value.map(|value| format!("{}={}", key.display(), value.display()))
    });
    let words = [command.get_program()]
        .into_iter()
        .chain(command.get_args());
    envs.chain(words.map(|word: &OsStr| word.display().to_string()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The compute threads to give the tests' candle, unless the caller chose:
/// without `RAYON_NUM_THREADS` (or `CANDLE_NUM_THREADS`), candle 0.11
/// counts the physical cores by parsing `/proc/cpuinfo` at every matrix
/// product, which took half the CPU time of the training conformance tests
/// (`perf`; 11.6 s against 4.9 s for LocalComm's). The value is rayon's own
/// default, the cores this process may use; the `gradwire` binary sets the
/// same for its runs itself.
fn compute_threads() -> Option<(String, String)> {
    let chosen = ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"]
        .iter()
        .any(|name| env::var_os(name).is_some());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (!chosen).then(|| ("RAYON_NUM_THREADS".to_string(), cores.to_string()))
}

/// Why this process cannot make a network namespace, if it cannot (tried
/// with a throwaway one).
fn cannot_make_namespaces() -> Option<String> {
    if !is_root() {
        return Some("not root".into());
    }
    let name = format!("gwprobe{}", std::process::id());
    match Command::new("ip").args(["netns", "add", &name]).output() {
        Ok(out) if out.status.success() => {
            let _ = Command::new("ip").args(["netns", "delete", &name]).output();
            None
        }
        Ok(out) => Some(format!(
            "`ip netns add` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!("`ip` could not start: {e}")),
    }
}

/// Whether this process runs as root (effective uid 0).
pub(crate) fn is_root() -> bool {
    let from_proc = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let uids = status.lines().find_map(|line| line.strip_prefix("Uid:"))?;
            // Real, effective, saved and filesystem uid: take the effective one.
            Some(uids.split_whitespace().nth(1)? == "0")
        });
    from_proc.unwrap_or_else(|| {
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|output| output.stdout.trim_ascii() == b"0")
    })
}

/// Fails with a clear message unless rustfmt and clippy are installed.
fn check_toolchain() -> Result {
    for (tool, component) in [("fmt", "rustfmt"), ("clippy", "clippy")] {
        let output = cargo()
            .args([tool, "--version"])
            .output()
            .map_err(|e| format!("could not run cargo: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "`cargo {tool}` is not available ({}); install it with `rustup component add {component}`",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        print!("{}", String::from_utf8_lossy(&output.stdout));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The passed counts of every binary's summary line are summed; other
    /// lines, failed summaries and a bare filter's zero count nothing.
    #[test]
    fn passed_tests_sum_the_summaries() {
        let stdout = "running 3 tests\n\
            test a::built_without_x ... ok\n\
            test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 5 filtered out; finished in 0.01s\n\
            \n\
            test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out; finished in 0.00s\n\
            test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.2s\n\
            test result: FAILED. 4 passed; 1 failed; 0 ignored\n\
            ok. 7 passed\n";
        assert_eq!(super::passed_tests(stdout), 15);
        assert_eq!(super::passed_tests(""), 0);
    }
}
