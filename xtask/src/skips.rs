//! The GPU suites' skips, counted: `cargo xtask test` counts the `SKIP GPU`
//! lines in the output of its test binaries (the `runner` module), which
//! the GPU tests print when they skip their GPU part (gradwire-tensor's
//! `testing::device_or_skip`, gradwire-tests' NCCL gate; both write past
//! the test harness's capture). At its end it prints
//! the count per package, so a CI log says how much of the GPU code did not
//! run. The line's format is `skip_line`, compiled from gradwire-tensor's
//! source (`#[path]`), so the writer and this counter cannot drift apart.

#[path = "../../crates/gradwire-tensor/src/cuda_backend/testing/skip_line.rs"]
#[allow(dead_code)] // `format` is for the writer, here only for the tests.
mod skip_line;

use crate::Result;
use crate::gpu::GPU_SUITES;
use std::collections::BTreeMap;
use std::path::Path;

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
    pub(crate) fn record(&mut self, line: &str) {
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

#[cfg(test)]
mod tests {
    use super::{Skips, skip_line};

    #[test]
    fn skip_lines_are_counted_per_package() {
        let mut output = String::from("   Running tests/cuda.rs (target/debug/deps/cuda-0)\n");
        for (package, test) in [
            ("gradwire-optim", "adam"),
            ("gradwire-tensor", "casts"),
            ("gradwire-optim", "sgd"),
        ] {
            output.push_str(&skip_line::format(package, test, "no CUDA device (none)"));
        }
        output.push_str("SKIP shaped network: not root\ntest result: ok\n");
        output.push_str(&skip_line::format(
            "gradwire-tests",
            "conform",
            "NCCL unavailable",
        ));
        let mut skips = Skips::default();
        for line in output.lines() {
            skips.record(line);
        }
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
}
