//! The GPU suites' skips, counted: `cargo xtask test` runs its test step
//! with stderr through a pipe, passes every byte on to its own stderr, and
//! counts the `SKIP GPU` lines the GPU tests print when they skip their GPU
//! part (gradwire-tensor's `testing::device_or_skip`, gradwire-tests' NCCL
//! gate; both write past the test harness's capture). At its end it prints
//! the count per package, so a CI log says how much of the GPU code did not
//! run. The line's format is `skip_line`, compiled from gradwire-tensor's
//! source (`#[path]`), so the writer and this counter cannot drift apart.

#[path = "../../crates/gradwire-tensor/src/cuda_backend/testing/skip_line.rs"]
#[allow(dead_code)] // `format` is for the writer, here only for the tests.
mod skip_line;

use crate::gpu::GPU_SUITES;
use crate::{Result, describe};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread;
use std::time::Duration;

/// How long to wait for the end of the output once the command exited: a
/// process a test left running may hold the pipe open.
const DRAIN: Duration = Duration::from_secs(30);

/// How many distinct reasons the summary quotes.
const SHOWN_REASONS: usize = 3;

/// The skip lines seen, by package.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Skips {
    /// Skipped tests per package.
    by_package: BTreeMap<String, usize>,
    /// The reasons given, each once, in the order first seen.
    reasons: Vec<String>,
}

impl Skips {
    /// Counts `line` if it is a skip line.
    fn record(&mut self, line: &str) {
        if let Some(skip) = skip_line::parse(line) {
            *self.by_package.entry(skip.package.to_string()).or_default() += 1;
            if !self.reasons.iter().any(|r| r == skip.why) {
                self.reasons.push(skip.why.to_string());
            }
        }
    }

    /// The number of skip lines seen.
    pub(crate) fn total(&self) -> usize {
        self.by_package.values().sum()
    }

    /// The summary line: the total, then the count of every package (the
    /// GPU suites' first, in [`GPU_SUITES`]' order), then the reasons.
    pub(crate) fn summary(&self) -> String {
        let total = self.total();
        if total == 0 {
            return "GPU suites: 0 tests skipped (every GPU test ran its GPU part)".into();
        }
        let rank = |package: &str| {
            GPU_SUITES
                .iter()
                .position(|s| s.package == package)
                .unwrap_or(GPU_SUITES.len())
        };
        let mut packages: Vec<(&String, &usize)> = self.by_package.iter().collect();
        packages.sort_by_key(|(package, _)| rank(package));
        let counts: Vec<String> = packages.iter().map(|(p, n)| format!("{p} {n}")).collect();
        let mut line = format!(
            "GPU suites: {total} test{} skipped their GPU part: {}",
            if total == 1 { "" } else { "s" },
            counts.join(", ")
        );
        let shown = &self.reasons[..self.reasons.len().min(SHOWN_REASONS)];
        let more = self.reasons.len() - shown.len();
        line.push_str(&format!(" ({}", shown.join("; ")));
        if more > 0 {
            line.push_str(&format!(
                "; {more} more reason{}",
                if more == 1 { "" } else { "s" }
            ));
        }
        line.push(')');
        line
    }
}

/// Checks that `skips` can be true of this machine: no skip at all while
/// the test step ran every test (`filtered` false) means a CUDA device ran
/// them, which takes the driver's `/dev/nvidiactl`. Without it the skip
/// lines were lost (printed in another form, or captured) and the count
/// would claim GPU coverage that CI does not have.
pub(crate) fn check(skips: &Skips, filtered: bool) -> Result {
    let device_nodes = Path::new("/dev/nvidiactl").exists();
    if skips.total() == 0 && !filtered && cfg!(target_os = "linux") && !device_nodes {
        return Err(
            "the GPU suites printed no `SKIP GPU` line, yet this machine has no \
                    NVIDIA driver (/dev/nvidiactl): their skips went uncounted"
                .into(),
        );
    }
    Ok(())
}

/// Runs `command` like [`crate::run`], with its stderr passed through this
/// process's and its skip lines counted.
pub(crate) fn run_counting(command: &mut Command) -> Result<Skips> {
    let shown = describe(command);
    println!("$ {shown}");
    let mut child = command
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start `{shown}`: {e}"))?;
    let from = child.stderr.take().expect("stderr is piped");
    let skips = Arc::new(Mutex::new(Skips::default()));
    let (done, drained) = mpsc::channel();
    let reader = {
        let skips = Arc::clone(&skips);
        thread::spawn(move || {
            pass_through(from, io::stderr(), &skips);
            let _ = done.send(());
        })
    };
    let status = child
        .wait()
        .map_err(|e| format!("could not wait for `{shown}`: {e}"))?;
    if drained.recv_timeout(DRAIN).is_ok() {
        let _ = reader.join();
    } else {
        println!(
            "warning: a process left by `{shown}` still holds its stderr; counted the skips \
             printed until now"
        );
    }
    let skips = skips.lock().unwrap_or_else(PoisonError::into_inner).clone();
    if status.success() {
        Ok(skips)
    } else {
        Err(format!("`{shown}` exited with {status}"))
    }
}

/// Copies `from` to `to` as it comes and records every complete line (and
/// a last one without a line break) in `skips`.
fn pass_through(mut from: impl Read, mut to: impl Write, skips: &Mutex<Skips>) {
    let mut buffer = [0u8; 8192];
    let mut line = Vec::new();
    let record = |line: &[u8]| {
        skips
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(&String::from_utf8_lossy(line));
    };
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let _ = to.write_all(&buffer[..n]);
        let _ = to.flush();
        for &byte in &buffer[..n] {
            if byte == b'\n' {
                record(&line);
                line.clear();
            } else {
                line.push(byte);
            }
        }
    }
    if !line.is_empty() {
        record(&line);
    }
}

#[cfg(test)]
mod tests {
    use super::{Skips, pass_through, skip_line};
    use std::sync::Mutex;

    #[test]
    fn skip_lines_are_counted_per_package_and_passed_through() {
        let mut output = String::from("   Running tests/cuda.rs (target/debug/deps/cuda-0)\n");
        for (package, test) in [
            ("gradwire-optim", "adam"),
            ("gradwire-tensor", "casts"),
            ("gradwire-optim", "sgd"),
        ] {
            output.push_str(&skip_line::format(package, test, "no CUDA device (none)"));
        }
        output.push_str("SKIP shaped network: not root\ntest result: ok");
        output.push_str(&skip_line::format(
            "gradwire-tests",
            "conform",
            "NCCL unavailable",
        ));
        let output = output.trim_end();
        let skips = Mutex::new(Skips::default());
        let mut copy = Vec::new();
        // Read in small pieces, so lines arrive split.
        pass_through(Pieces(output.as_bytes()), &mut copy, &skips);
        assert_eq!(copy, output.as_bytes());
        let skips = skips.into_inner().unwrap();
        assert_eq!(skips.total(), 4);
        assert_eq!(
            skips.summary(),
            "GPU suites: 4 tests skipped their GPU part: gradwire-tensor 1, gradwire-optim 2, \
             gradwire-tests 1 (no CUDA device (none); NCCL unavailable)"
        );
        assert!(super::check(&skips, false).is_ok());
    }

    #[test]
    fn no_skip_says_so() {
        let skips = Skips::default();
        assert_eq!(
            skips.summary(),
            "GPU suites: 0 tests skipped (every GPU test ran its GPU part)"
        );
        assert!(super::check(&skips, true).is_ok());
        let on_a_gpu_machine = std::path::Path::new("/dev/nvidiactl").exists();
        assert_eq!(
            super::check(&skips, false).is_ok(),
            on_a_gpu_machine || !cfg!(target_os = "linux")
        );
    }

    /// A reader that gives at most 5 bytes at a time.
    struct Pieces<'a>(&'a [u8]);

    impl std::io::Read for Pieces<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.len().min(buf.len()).min(5);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }
}
