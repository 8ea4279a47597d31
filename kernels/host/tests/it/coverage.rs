//! Every kernel of gradwire-kernels' table is run by one of these suites:
//! its constant (the entry's name in upper case, e.g. `RADIX_HISTOGRAM_F32`)
//! appears in a suite's source, outside this file.

use std::fs;
use std::path::Path;

#[test]
fn every_kernel_runs_in_a_suite() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let mut sources = String::new();
    for entry in fs::read_dir(&dir).expect("the suites' directory") {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with(".rs") && name != "coverage.rs" {
            sources.push_str(&fs::read_to_string(&path).expect("a suite's source"));
        }
    }
    let missing: Vec<&str> = gradwire_kernels::ALL
        .iter()
        .flat_map(|module| module.iter())
        .map(|kernel| kernel.name())
        .filter(|name| {
            let constant = name.to_uppercase();
            !sources.match_indices(&constant).any(|(at, _)| {
                !sources[at + constant.len()..]
                    .starts_with(|c: char| c == '_' || c.is_ascii_alphanumeric())
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "kernels no suite of gradwire-kernels-host runs: {missing:?}"
    );
}
