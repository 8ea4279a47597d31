//! The generated PTX, manifest and table are fresh and consistent.
//!
//! `cargo xtask ptx` writes `kernels/ptx/*.ptx`, `kernels/ptx/manifest.txt`
//! and `kernels/src/generated.rs` from `kernels/cuda/`; CI cannot run NVRTC,
//! so these tests make sure what is committed is what the sources give.

use gradwire_kernels::{ALL, Grid, Kernel, LaunchShape, MODULES, Param, fnv::fnv1a_64, module};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

const REGENERATE: &str = "run `cargo xtask ptx` and commit the results";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file of `dir` whose name ends with one of `suffixes`, name -> FNV-1a 64.
fn hashes(dir: &Path, suffixes: &[&str]) -> BTreeMap<String, String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_string();
            suffixes.iter().any(|s| name.ends_with(s)).then(|| {
                let bytes = fs::read(&path).expect("readable file");
                (name, format!("{:016x}", fnv1a_64(&bytes)))
            })
        })
        .collect()
}

/// The manifest's lines of `kind` ("source" or "ptx"): name -> hash.
fn manifest(kind: &str) -> BTreeMap<String, String> {
    manifest_text()
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == kind).then_some(())?;
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect()
}

fn manifest_text() -> String {
    let path = root().join("ptx/manifest.txt");
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}; {REGENERATE}", path.display()))
}

/// What differs between the recorded and the current hashes, as a message.
fn differences(recorded: &BTreeMap<String, String>, now: &BTreeMap<String, String>) -> String {
    let mut out = Vec::new();
    for (name, hash) in now {
        match recorded.get(name) {
            None => out.push(format!("{name} is new")),
            Some(old) if old != hash => out.push(format!("{name} changed")),
            Some(_) => {}
        }
    }
    for name in recorded.keys().filter(|n| !now.contains_key(*n)) {
        out.push(format!("{name} was removed"));
    }
    out.join(", ")
}

#[test]
fn cuda_sources_have_not_changed_since_their_ptx_was_generated() {
    let now = hashes(&root().join("cuda"), &[".cu", ".cuh"]);
    assert!(
        now.keys().any(|n| n.ends_with(".cu")),
        "no CUDA source found"
    );
    let recorded = manifest("source");
    assert!(
        now == recorded,
        "CUDA sources differ from those the PTX was generated from ({}): {REGENERATE}",
        differences(&recorded, &now)
    );
}

#[test]
fn ptx_files_are_the_generated_ones() {
    let now = hashes(&root().join("ptx"), &[".ptx"]);
    let recorded = manifest("ptx");
    assert!(
        now == recorded,
        "PTX files differ from the generated ones ({}): {REGENERATE}",
        differences(&recorded, &now)
    );
    let sources: Vec<String> = hashes(&root().join("cuda"), &[".cu"])
        .into_keys()
        .map(|n| n.trim_end_matches(".cu").to_string())
        .collect();
    let ptx: Vec<String> = now
        .into_keys()
        .map(|n| n.trim_end_matches(".ptx").to_string())
        .collect();
    assert_eq!(ptx, sources, "one PTX file per .cu source: {REGENERATE}");
}

/// The `.visible .entry` names of a PTX text, in order.
fn visible_entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|line| line.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split('(').next().unwrap_or(rest).trim())
        .collect()
}

#[test]
fn every_kernel_of_the_table_is_a_visible_entry_of_its_ptx() {
    let mut names: Vec<&str> = MODULES.iter().map(|m| m.name).collect();
    let sources = hashes(&root().join("cuda"), &[".cu"]);
    let stems: Vec<&str> = sources.keys().map(|n| n.trim_end_matches(".cu")).collect();
    names.sort_unstable();
    assert_eq!(names, stems, "one table entry per source: {REGENERATE}");
    let mut total = 0;
    for m in MODULES {
        let on_disk = fs::read_to_string(root().join(format!("ptx/{}.ptx", m.name)))
            .expect("the module's PTX file");
        assert_eq!(m.ptx, on_disk, "{}: the table embeds another PTX", m.name);
        let entries = visible_entries(m.ptx);
        for kernel in m.entries {
            assert!(
                entries.contains(kernel),
                "{}: `{kernel}` is not a .visible .entry of its PTX: {REGENERATE}",
                m.name
            );
        }
        assert_eq!(
            m.entries.len(),
            entries.len(),
            "{}: the table lists {:?} but the PTX defines {:?}: {REGENERATE}",
            m.name,
            m.entries,
            entries
        );
        assert_eq!(module(m.name), Some(m));
        total += m.entries.len();
    }
    assert!(module("no_such_module").is_none());
    // The launchers name kernels by their signatures.
    assert_eq!(
        gradwire_kernels::select::RADIX_HISTOGRAM_F32.name(),
        "radix_histogram_f32"
    );
    assert!(total >= 70, "only {total} kernels");
}

/// NVRTC's options keep the CPU's float semantics: no contraction into
/// fused multiply-adds, subnormals kept (what the PTX holds instead is
/// `lint`'s business, `tests/lint.rs`). Also: the lowest architecture is
/// compute_70 and the PTX ISA is 8.2 (loadable by drivers from R535).
#[test]
fn ptx_targets_compute_70_with_isa_8_2_and_exact_float_options() {
    let text = manifest_text();
    assert!(text.starts_with("# generated by cargo xtask ptx, do not edit\n"));
    assert!(text.contains("\nhash fnv1a-64\n"));
    let options = text
        .lines()
        .find_map(|l| l.strip_prefix("options "))
        .expect("an options line");
    for flag in [
        "--gpu-architecture=compute_70",
        "--fmad=false",
        "--ftz=false",
    ] {
        assert!(options.split(' ').any(|o| o == flag), "{flag} missing");
    }
    for m in MODULES {
        assert!(m.ptx.contains("\n.version 8.2\n"), "{}: PTX ISA", m.name);
        assert!(m.ptx.contains("\n.target sm_70\n"), "{}: target", m.name);
    }
}

#[test]
fn generated_table_says_it_is_generated() {
    let table = fs::read_to_string(root().join("src/generated.rs")).expect("generated.rs");
    assert!(
        table.starts_with("//! The PTX table: generated by cargo xtask ptx, do not edit."),
        "generated.rs lost its header"
    );
}

/// The `.param` types of entry `name` in `ptx`, in order (`None` when the
/// PTX has no such entry).
fn entry_params(ptx: &str, name: &str) -> Option<Vec<String>> {
    let header = format!(".visible .entry {name}(");
    let start = ptx.find(&header)? + header.len();
    let list = &ptx[start..start + ptx[start..].find(')')?];
    Some(
        list.split(',')
            .filter_map(|p| p.split_whitespace().nth(1).map(str::to_string))
            .collect(),
    )
}

fn signatures() -> Vec<&'static Kernel> {
    ALL.iter().flat_map(|m| m.iter()).collect()
}

#[test]
fn every_entry_has_one_signature_and_every_signature_an_entry() {
    let declared = signatures();
    for m in MODULES {
        for entry in m.entries {
            let matching = declared
                .iter()
                .filter(|k| k.module() == m.name && k.name() == *entry)
                .count();
            assert_eq!(matching, 1, "{}.{entry}: {matching} signatures", m.name);
        }
    }
    for k in &declared {
        let m = module(k.module()).unwrap_or_else(|| panic!("{}: no such module", k.module()));
        assert!(
            m.entries.contains(&k.name()),
            "{}.{}: declared but not an entry of its PTX",
            k.module(),
            k.name()
        );
    }
    assert_eq!(
        declared.len(),
        MODULES.iter().map(|m| m.entries.len()).sum::<usize>()
    );
}

/// Count, order and width: a pointer and a `gw_u64` are `.u64`, `int` and
/// `gw_u32` `.u32`, `float` `.f32`.
#[test]
fn every_signature_matches_its_entrys_parameters() {
    for k in signatures() {
        let m = module(k.module()).expect("module");
        let params = entry_params(m.ptx, k.name())
            .unwrap_or_else(|| panic!("{}: no entry in the PTX", k.name()));
        let declared: Vec<&str> = k
            .params()
            .iter()
            .map(|p| match p {
                Param::Pointer { .. } => ".u64",
                Param::Value(ty) => ty.ptx_param(),
            })
            .collect();
        assert_eq!(declared, params, "{}.{}", k.module(), k.name());
    }
}

/// Every pointer's extent is computable for a plain launch (n = 1000 in
/// every integer, 4 blocks) and grows with the lengths, so a short buffer
/// is refused; a single-block kernel says so.
#[test]
fn extents_are_finite_and_grow_with_the_lengths() {
    for k in signatures() {
        let small: Vec<Option<u64>> = k
            .params()
            .iter()
            .map(|p| matches!(p, Param::Value(t) if t.ptx_param() != ".f32").then_some(1000))
            .collect();
        let large: Vec<Option<u64>> = small.iter().map(|v| v.map(|_| 5000)).collect();
        for (i, p) in k.params().iter().enumerate() {
            if let Param::Pointer { extent, .. } = p {
                let at = |values: &[Option<u64>]| extent(&LaunchShape::new(values, (4, 1)));
                let (a, b) = (at(&small), at(&large));
                assert!(
                    matches!((a, b), (Some(a), Some(b)) if a >= 1 && b >= a),
                    "{}.{} param {i}: extents {a:?} then {b:?}",
                    k.module(),
                    k.name()
                );
            }
        }
    }
    assert_eq!(
        gradwire_kernels::reduce::FINISH_SUM_F64.grid(),
        Grid::OneBlock
    );
    assert_eq!(gradwire_kernels::reduce::SUM_PARTIAL_F32.grid(), Grid::Any);
}

/// Overflow refuses: a length of 2^63 times a world of 4.
#[test]
fn an_extent_that_overflows_is_none() {
    let k = gradwire_kernels::comm::REDUCE_CHUNKS_F32;
    let Param::Pointer { extent, .. } = k.params()[1] else {
        panic!("stage is a pointer")
    };
    let values = [None, None, Some(1u64 << 63), Some(4), Some(0)];
    assert_eq!(extent(&LaunchShape::new(&values, (1, 1))), None);
    let values = [None, None, Some(10), Some(4), Some(0)];
    assert_eq!(extent(&LaunchShape::new(&values, (1, 1))), Some(40));
}

/// Every `.rs` file under `dir`, appended to `out`.
fn rust_sources(dir: &Path, out: &mut String) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&fs::read_to_string(&path).expect("readable source"));
        }
    }
}

/// Every kernel is launched: its signature's constant (the entry's name in
/// upper case) appears in the library sources of a crate of `crates/`, each
/// launcher beside the CPU form it matches. A kernel nobody launches is
/// dead code no GPU test would exercise.
#[test]
fn every_kernel_has_a_launcher() {
    let crates = root().join("../crates");
    let mut text = String::new();
    for member in fs::read_dir(&crates).expect("crates/") {
        let src = member.expect("entry").path().join("src");
        if src.is_dir() {
            rust_sources(&src, &mut text);
        }
    }
    let words: std::collections::HashSet<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    let missing: Vec<String> = signatures()
        .iter()
        .map(|k| k.name().to_ascii_uppercase())
        .filter(|constant| !words.contains(constant.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "kernels without a launcher: {missing:?}"
    );
}
