//! The fuzz step of `cargo xtask test`: the cargo-fuzz targets of `fuzz/`
//! (a workspace of its own, which the main one excludes) checked on the
//! stable toolchain, and their corpus found.
//!
//! A target's checks are a function in `fuzz/checks/<name>.rs`, which
//! `fuzz/fuzz_targets/<name>.rs` hands libFuzzer and gradwire-tests'
//! `fuzz_corpus` test replays over every input of `fuzz/corpus/<name>/`
//! (seeds, a coverage-greedy pick of a fuzzing run's corpus, the input of
//! any crash once fixed) in the test step: a regression test of the target
//! and the code under it. So this step only checks that the targets
//! compile, without libFuzzer (the `link-libfuzzer` feature off: its C++
//! build took 18 s of the 39 s this step took when it built and ran the
//! binaries), in the main target directory, where the dependencies' check
//! units are clippy's; `cargo fuzz run <name>` builds them with it.

use crate::gpu::target_dir;
use crate::{Result, cargo, run, workspace_root};
use std::fs;
use std::path::{Path, PathBuf};

/// The step: check the targets, and find every one's corpus.
pub(crate) fn check() -> Result {
    let fuzz = workspace_root().join("fuzz");
    run(cargo()
        .arg("check")
        .arg("--manifest-path")
        .arg(fuzz.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir())
        .args(["--bins", "--no-default-features"]))?;
    for target in &targets(&fuzz.join("fuzz_targets"))? {
        let inputs = files(&fuzz.join("corpus").join(target))?;
        if inputs.is_empty() {
            return Err(format!(
                "fuzz/corpus/{target} has no input: commit seeds for the `{target}` target"
            ));
        }
        println!(
            "{target}: {} inputs in fuzz/corpus/{target} (replayed by gradwire-tests' fuzz_corpus)",
            inputs.len()
        );
    }
    Ok(())
}

/// The targets: the stems of the `.rs` files in `dir`, sorted.
fn targets(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = files(dir)?
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_string()))
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(format!("no fuzz target in {}", dir.display()));
    }
    Ok(names)
}

/// The files of `dir` (not hidden ones), sorted; none if it does not exist.
fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("could not list {}: {e}", dir.display())),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("could not list {}: {e}", dir.display()))?;
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if !hidden && entry.file_type().is_ok_and(|t| t.is_file()) {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::{files, targets};
    use crate::workspace_root;

    /// Every target has seeds in the repository (a fresh checkout, as CI's,
    /// has nothing else), and the step finds them.
    #[test]
    fn every_target_has_a_corpus() {
        let fuzz = workspace_root().join("fuzz");
        for target in &targets(&fuzz.join("fuzz_targets")).unwrap() {
            let inputs = files(&fuzz.join("corpus").join(target)).unwrap();
            assert!(!inputs.is_empty(), "fuzz/corpus/{target} is empty");
        }
    }
}
