//! The fuzz targets' committed corpus (`fuzz/corpus/<target>/`: seeds, a
//! coverage-greedy pick of fuzzing runs, every crash once fixed) replayed
//! through the targets' own checks (`fuzz/checks/<target>.rs`, the function
//! `fuzz/fuzz_targets/<target>.rs` hands libFuzzer), as a regression test of
//! the decoders under them. `cargo xtask test` checks that the targets
//! compile; `cargo fuzz run <target>` fuzzes them.

use std::path::{Path, PathBuf};

#[path = "../../../fuzz/checks/checkpoint.rs"]
mod checkpoint;
#[path = "../../../fuzz/checks/decode.rs"]
mod decode;
#[path = "../../../fuzz/checks/pca.rs"]
mod pca;
#[path = "../../../fuzz/checks/quant.rs"]
mod quant;
#[path = "../../../fuzz/checks/strategy.rs"]
mod strategy;

/// A target's checks of one input (a failed check panics).
type Check = fn(&[u8]);

/// Every fuzz target by name, with its check.
const TARGETS: [(&str, Check); 5] = [
    ("checkpoint", checkpoint::check),
    ("decode", decode::check),
    ("pca", pca::check),
    ("quant", quant::check),
    ("strategy", strategy::check),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files of `dir`, sorted, hidden ones aside.
fn files(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .filter(|path| {
            !path
                .file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with('.'))
        })
        .collect();
    files.sort();
    files
}

/// Every input of every target's corpus passes the target's checks; every
/// target of `fuzz/fuzz_targets/` is replayed here and has inputs.
#[test]
fn every_fuzz_target_passes_its_corpus() {
    let mut targets: Vec<String> = files(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_string()))
        .collect();
    targets.sort();
    let replayed: Vec<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        targets, replayed,
        "every fuzz target needs its check here (fuzz/checks/<target>.rs)"
    );
    for (name, check) in TARGETS {
        let inputs = files(&fuzz_dir().join("corpus").join(name));
        assert!(
            !inputs.is_empty(),
            "fuzz/corpus/{name} has no input: commit seeds for the `{name}` target"
        );
        for input in &inputs {
            let data = std::fs::read(input).unwrap_or_else(|e| panic!("{}: {e}", input.display()));
            if std::panic::catch_unwind(|| check(&data)).is_err() {
                panic!("fuzz target {name} fails on {}", input.display());
            }
        }
    }
}
