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

/// One test binary of the build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TestBinary {
    /// Its package's name.
    pub(crate) package: String,
    /// The directory of the package's manifest: the working directory.
    pub(crate) manifest_dir: PathBuf,
    /// The target's root source, relative to `manifest_dir`.
    pub(crate) source: String,
    /// The executable.
    pub(crate) executable: PathBuf,
}

impl TestBinary {
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

/// Builds every test binary with `build` (a `cargo test ... --no-run`
/// command, to which this adds the JSON message format) and returns them
/// in the order they should start.
pub(crate) fn build(build: &mut Command) -> Result<Vec<TestBinary>> {
    build.args(["--no-run", "--message-format=json-render-diagnostics"]);
    let shown = describe(build);
    println!("$ {shown}");
    let output = build
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start `{shown}`: {e}"))?;
    if !output.status.success() {
        return Err(format!("`{shown}` exited with {}", output.status));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut binaries: Vec<TestBinary> = stdout.lines().filter_map(test_binary).collect();
    if binaries.is_empty() {
        return Err(format!("`{shown}` built no test binary"));
    }
    // Stable: cargo's order among equals.
    binaries.sort_by_key(TestBinary::rank);
    Ok(binaries)
}

/// The test binary a line of cargo's JSON messages reports, if it reports
/// one: a `compiler-artifact` of the test profile with an executable.
fn test_binary(line: &str) -> Option<TestBinary> {
    if string_field(line, "reason")? != "compiler-artifact" {
        return None;
    }
    let profile = line.split_once("\"profile\":{")?.1.split_once('}')?.0;
    if !profile.contains("\"test\":true") {
        return None;
    }
    let executable = PathBuf::from(string_field(line, "executable")?);
    let manifest = PathBuf::from(string_field(line, "manifest_path")?);
    let manifest_dir = manifest.parent()?.to_path_buf();
    let src_path = PathBuf::from(string_field(line, "src_path")?);
    let source = src_path
        .strip_prefix(&manifest_dir)
        .unwrap_or(&src_path)
        .display()
        .to_string();
    let package = crate::workspace::package_name(&manifest_dir)?;
    Some(TestBinary {
        package,
        manifest_dir,
        source,
        executable,
    })
}

/// The string value of the first `"key":"..."` in the JSON text `line`,
/// its escapes decoded (`None` where the key is absent or not a string).
fn string_field(line: &str, key: &str) -> Option<String> {
    let rest = line.split_once(&format!("\"{key}\":\""))?.1;
    let mut value = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(value),
            '\\' => match chars.next()? {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                'r' => value.push('\r'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    value.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
                other => value.push(other),
            },
            c => value.push(c),
        }
    }
    None
}

/// Runs `binaries` with `args` and the environment `env`, [`JOBS`] at a
/// time, and `doc` (the doc tests' cargo command, `args` on it already)
/// as one more job; prints
/// each one's output when it ends; returns the skip lines counted, or the
/// jobs that failed.
pub(crate) fn run(
    binaries: Vec<TestBinary>,
    args: &[String],
    env: &[(String, String)],
    doc: Command,
) -> Result<Skips> {
    let logs = crate::gpu::target_dir().join("xtask-test-logs");
    fs::create_dir_all(&logs).map_err(|e| format!("could not create {}: {e}", logs.display()))?;
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
                    let ran = run_job(job, args, env, &log);
                    let mut outcome = outcome.lock().unwrap_or_else(PoisonError::into_inner);
                    let (label, passed, text) = ran;
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
            if let Some(cargo) = std::env::var_os("CARGO") {
                command.env("CARGO", cargo);
            }
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
    use super::{TestBinary, string_field, test_binary};

    /// A test artifact names its package, source and executable; other
    /// artifacts and messages name none.
    #[test]
    fn cargo_messages_name_the_test_binaries() {
        let root = crate::workspace_root().display().to_string();
        let artifact = |test: bool, executable: &str| {
            format!(
                "{{\"reason\":\"compiler-artifact\",\"package_id\":\"path+file://{root}/tests#gradwire-tests@0.1.0\",\
                 \"manifest_path\":\"{root}/tests/Cargo.toml\",\"target\":{{\"kind\":[\"test\"],\
                 \"crate_types\":[\"bin\"],\"name\":\"it\",\"src_path\":\"{root}/tests/tests/it/main.rs\",\
                 \"edition\":\"2024\",\"doctest\":false,\"test\":true}},\"profile\":{{\"opt_level\":\"0\",\
                 \"debuginfo\":1,\"debug_assertions\":true,\"overflow_checks\":true,\"test\":{test}}},\
                 \"features\":[],\"filenames\":[\"/t/it-1\"],\"executable\":{executable},\"fresh\":true}}"
            )
        };
        assert_eq!(
            test_binary(&artifact(true, "\"/t/debug/deps/it-1\"")),
            Some(TestBinary {
                package: "gradwire-tests".into(),
                manifest_dir: crate::workspace_root().join("tests"),
                source: "tests/it/main.rs".into(),
                executable: "/t/debug/deps/it-1".into(),
            })
        );
        // A binary built for the tests to run, not a test; a library.
        assert_eq!(test_binary(&artifact(false, "\"/t/debug/gradwire\"")), None);
        assert_eq!(test_binary(&artifact(true, "null")), None);
        assert_eq!(
            test_binary("{\"reason\":\"build-finished\",\"success\":true}"),
            None
        );
        assert_eq!(test_binary("not json"), None);
    }

    #[test]
    fn string_fields_decode_their_escapes() {
        let line = r#"{"a":1,"path":"/x/a \"b\"\\c\u00e9","n":null}"#;
        assert_eq!(
            string_field(line, "path").as_deref(),
            Some("/x/a \"b\"\\cé")
        );
        assert_eq!(string_field(line, "n"), None);
        assert_eq!(string_field(line, "missing"), None);
        assert_eq!(string_field(r#"{"path":"unterminated"#, "path"), None);
    }
}
