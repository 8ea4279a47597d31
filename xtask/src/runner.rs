//! The test step's runner: the test binaries of one build run two at a
//! time instead of cargo's one after another.
//!
//! `cargo test` runs its binaries in sequence, and each runs its tests on
//! as many threads as there are cores; on the 2-core CI machine the step
//! used 1.6 cores on average (`/usr/bin/time` over every binary), because
//! a binary's last long tests run alone and some tests wait (for mpirun, a
//! deadline, a departed peer). Here cargo builds every test binary once
//! (`--no-run`, its JSON messages naming the executables), then a pool of
//! [`JOBS`] runs them, longest first ([`SLOWEST`]), each with the
//! environment and working directory cargo gives it, and the doc tests
//! (`--doc`) as one more job. A binary's output goes to a file in
//! `target/xtask-test-logs/` and is printed whole when it ends, so the log
//! stays readable; the `SKIP GPU` lines are counted from it. Every binary
//! runs even when one fails, and the step fails naming each that did.

use crate::artifacts::{self, Executable};
use crate::skips::Skips;
use crate::{Result, describe};
use std::collections::VecDeque;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::Instant;

/// How many test binaries run at once.
pub(crate) const JOBS: usize = 2;

/// The binaries that took longest in a CI run (package, source of the
/// target), started first so that none of them runs alone at the end.
/// Only the order depends on it: a binary not named here runs after these,
/// in cargo's order.
const SLOWEST: &[(&str, &str)] = &[
    ("gradwire-tests", "tests/it/main.rs"),
    ("gradwire-cli", "tests/it/main.rs"),
    ("gradwire-experiments", "src/lib.rs"),
    ("gradwire-compress", "tests/it/main.rs"),
    ("gradwire-kernels-host", "tests/it/main.rs"),
    ("gradwire-tests", "tests/mpi_faults.rs"),
];

/// One test binary of the build (cargo's variables other than these two,
/// `CARGO` among them, it inherits from `cargo xtask`).
#[derive(Debug)]
pub(crate) struct TestBinary {
    /// Its package's name (`CARGO_PKG_NAME`).
    package: String,
    /// The directory of the package's manifest: the working directory and
    /// `CARGO_MANIFEST_DIR`.
    manifest_dir: PathBuf,
    /// The target's root source, relative to `manifest_dir`.
    source: String,
    /// The executable.
    executable: PathBuf,
}

impl TestBinary {
    /// The test binary `executable` is, with its package read from its
    /// manifest.
    fn of(executable: Executable) -> Option<TestBinary> {
        let manifest_dir = executable.manifest_path.parent()?.to_path_buf();
        let source = executable
            .src_path
            .strip_prefix(&manifest_dir)
            .unwrap_or(&executable.src_path)
            .display()
            .to_string();
        Some(TestBinary {
            package: crate::workspace::package_name(&manifest_dir)?,
            manifest_dir,
            source,
            executable: executable.path,
        })
    }

    /// How the log names it: package and source, as cargo's `Running` line.
    fn label(&self) -> String {
        format!("{} {}", self.package, self.source)
    }

    /// Its place in [`SLOWEST`], or after all of them.
    fn rank(&self) -> usize {
        SLOWEST
            .iter()
            .position(|&(package, source)| package == self.package && source == self.source)
            .unwrap_or(SLOWEST.len())
    }
}

/// One job of the pool: a test binary, or the doc tests' cargo command.
enum Job {
    Binary(TestBinary),
    Command { label: String, command: Command },
}

/// Builds every test binary with `build` (a `cargo test` command, to
/// which this adds `--no-run`) and returns them in the order they should
/// start.
pub(crate) fn build(build: &mut Command) -> Result<Vec<TestBinary>> {
    build.arg("--no-run");
    let mut binaries: Vec<TestBinary> = artifacts::built(build)?
        .into_iter()
        .filter(|e| e.test)
        .filter_map(TestBinary::of)
        .collect();
    if binaries.is_empty() {
        return Err(format!("`{}` built no test binary", describe(build)));
    }
    // Stable: cargo's order among equals.
    binaries.sort_by_key(TestBinary::rank);
    Ok(binaries)
}

/// Runs `binaries` with `args` and the environment `env`, [`JOBS`] at a
/// time, and `doc` (the doc tests' cargo command, `args` on it already)
/// as one more job, each one's output in a file of `logs`; prints each
/// one's output when it ends; returns the skip lines counted, or the jobs
/// that failed.
pub(crate) fn run(
    binaries: Vec<TestBinary>,
    args: &[String],
    env: &[(String, String)],
    doc: Command,
    logs: &Path,
) -> Result<Skips> {
    fs::create_dir_all(logs).map_err(|e| format!("could not create {}: {e}", logs.display()))?;
    // The doc tests (mostly their compilation) right after the slowest
    // binaries, so that they do not end the step alone either.
    let slowest = binaries.iter().filter(|b| b.rank() < SLOWEST.len()).count();
    let mut queue: VecDeque<Job> = binaries.into_iter().map(Job::Binary).collect();
    queue.insert(
        slowest,
        Job::Command {
            label: "doc tests".into(),
            command: doc,
        },
    );
    let total = queue.len();
    let queue = Mutex::new(queue.into_iter().enumerate().collect::<VecDeque<_>>());
    let outcome = Mutex::new((Skips::default(), Vec::<String>::new()));
    let start = Instant::now();
    thread::scope(|scope| {
        for _ in 0..JOBS {
            scope.spawn(|| {
                loop {
                    let next = queue
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .pop_front();
                    let Some((index, job)) = next else { break };
                    let log = logs.join(format!("{index:03}.log"));
                    let (label, passed, text) = run_job(job, args, env, &log);
                    let mut outcome = outcome.lock().unwrap_or_else(PoisonError::into_inner);
                    print!("{text}");
                    for line in text.lines() {
                        outcome.0.record(line);
                    }
                    let verdict = if passed { "ok" } else { "FAILED" };
                    println!(
                        "==> [{}/{total}] {label}: {verdict} ({:.0} s into the step)",
                        index + 1,
                        start.elapsed().as_secs_f64()
                    );
                    if !passed {
                        outcome.1.push(label);
                    }
                }
            });
        }
    });
    let (skips, failed) = outcome.into_inner().unwrap_or_else(PoisonError::into_inner);
    if failed.is_empty() {
        Ok(skips)
    } else {
        Err(format!("failed: {}", failed.join("; ")))
    }
}

/// Runs one job with its output in the file `log`; returns its label,
/// whether it passed, and its output (headed by the command, as cargo's
/// `Running` line).
fn run_job(
    job: Job,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
) -> (String, bool, String) {
    let (label, mut command) = match job {
        Job::Binary(binary) => {
            let mut command = Command::new(&binary.executable);
            command
                .args(args)
                .current_dir(&binary.manifest_dir)
                .env("CARGO_MANIFEST_DIR", &binary.manifest_dir)
                .env("CARGO_PKG_NAME", &binary.package);
            (binary.label(), command)
        }
        Job::Command { label, command } => (label, command),
    };
    let shown = describe(&command);
    for (key, value) in env {
        command.env(key, value);
    }
    let started = Instant::now();
    let status = File::create(log)
        .and_then(|file| Ok((file.try_clone()?, file)))
        .and_then(|(out, err)| {
            command
                .stdout(out)
                .stderr(err)
                .stdin(Stdio::null())
                .status()
        });
    let mut text = format!("     Running {label}\n$ {shown}\n");
    // The file, not a pipe: a process a test leaves behind cannot hold it
    // open and stall the step.
    text.push_str(&String::from_utf8_lossy(&fs::read(log).unwrap_or_default()));
    let passed = match status {
        Ok(status) if status.success() => true,
        Ok(status) => {
            text.push_str(&format!("`{shown}` exited with {status}\n"));
            false
        }
        Err(e) => {
            text.push_str(&format!("could not run `{shown}`: {e}\n"));
            false
        }
    };
    text.push_str(&format!(
        "     {label}: {:.1} s\n",
        started.elapsed().as_secs_f64()
    ));
    (label, passed, text)
}

#[cfg(test)]
mod tests {
    use super::{TestBinary, run};
    use std::path::PathBuf;
    use std::process::Command;

    /// Every job runs, in its package's directory with cargo's variables;
    /// the step fails naming each job that failed, and only those.
    #[test]
    fn every_job_runs_and_the_failures_are_named() {
        let logs = std::env::temp_dir().join(format!("xtask-runner-{}", std::process::id()));
        let dir = std::env::temp_dir();
        let binary = |package: &str| TestBinary {
            package: package.into(),
            manifest_dir: dir.clone(),
            source: "tests/it/main.rs".into(),
            executable: PathBuf::from("/bin/sh"),
        };
        // Passes where it runs in its manifest's directory, with the
        // environment given, as a package not named `bad`.
        let script = "test \"$(pwd -P)\" = \"$(cd \"$CARGO_MANIFEST_DIR\" && pwd -P)\" \
                      && test \"$GIVEN\" = yes && test \"$CARGO_PKG_NAME\" != bad";
        let args = ["-c".to_string(), script.to_string()];
        let env = [("GIVEN".to_string(), "yes".to_string())];
        let doc = || {
            let mut doc = Command::new("/bin/sh");
            doc.args(["-c", "exit 0"]);
            doc
        };
        let passed = run(vec![binary("a"), binary("b")], &args, &env, doc(), &logs);
        assert!(passed.is_ok(), "{passed:?}");
        let failed = run(
            vec![binary("a"), binary("bad"), binary("c")],
            &args,
            &env,
            doc(),
            &logs,
        );
        assert_eq!(failed.unwrap_err(), "failed: bad tests/it/main.rs");
        let mut failing_doc = Command::new("/bin/sh");
        failing_doc.args(["-c", "exit 3"]);
        let failed = run(vec![binary("a")], &args, &env, failing_doc, &logs);
        assert_eq!(failed.unwrap_err(), "failed: doc tests");
        let _ = std::fs::remove_dir_all(&logs);
    }
}
