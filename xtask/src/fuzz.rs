//! The fuzz step of `cargo xtask test`: the cargo-fuzz targets of `fuzz/`
//! (a workspace of its own, which the main one excludes), built and run
//! over their corpus on the stable toolchain.
//!
//! libfuzzer-sys builds libFuzzer from its C++ sources with the stable
//! toolchain too; only the coverage instrumentation and the sanitizers that
//! make fuzzing effective need `cargo +nightly fuzz run`. So CI builds every
//! target (`fuzz/fuzz_targets/<name>.rs`) in the dev profile, in the main
//! target directory (unoptimised: a replay takes a fraction of a second),
//! and runs each binary over every input of `fuzz/corpus/<name>/`:
//! libFuzzer given files runs each once and stops, and a panic or a failed
//! check is a crash. The committed
//! inputs (seeds, a coverage-greedy pick of a fuzzing run's corpus, and the
//! input of any crash once fixed) make a regression test of the target
//! and the code under it; locally a fuzzing run's whole corpus is run too.

use crate::gpu::{output, target_dir};
use crate::{Result, cargo, run, workspace_root};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The step: build the targets, run each over its corpus.
pub(crate) fn build_and_replay() -> Result {
    let fuzz = workspace_root().join("fuzz");
    let targets = targets(&fuzz.join("fuzz_targets"))?;
    let target_dir = target_dir();
    run(cargo()
        .arg("build")
        .arg("--manifest-path")
        .arg(fuzz.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .arg("--bins"))?;
    for target in &targets {
        let inputs = files(&fuzz.join("corpus").join(target))?;
        if inputs.is_empty() {
            return Err(format!(
                "fuzz/corpus/{target} has no input: commit seeds for the `{target}` target"
            ));
        }
        // Where libFuzzer writes the input of a crash.
        let artifacts = target_dir.join("fuzz-artifacts").join(target);
        fs::create_dir_all(&artifacts)
            .map_err(|e| format!("could not create {}: {e}", artifacts.display()))?;
        let start = Instant::now();
        output(
            Command::new(target_dir.join("debug").join(target))
                .arg(format!("-artifact_prefix={}/", artifacts.display()))
                .args(&inputs),
        )?;
        println!(
            "{target}: {} inputs of fuzz/corpus/{target} run, no crash, in {:.2}s",
            inputs.len(),
            start.elapsed().as_secs_f64()
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
