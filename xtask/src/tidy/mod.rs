//! Tidy checks over the whole repository, in the style of rust-analyzer's
//! tidy test; `cargo test -p xtask` runs them (and so `cargo xtask test`,
//! through `cargo test --workspace`).
//!
//! For every workspace member (the `members` of the root `Cargo.toml`):
//!
//! - every `.rs` file under its `src/`, `benches/`, `examples/` and `tests/`
//!   directories starts with a `//!` module doc comment (blank lines and
//!   `// generated ...` header lines may come first);
//! - its crate roots (`src/lib.rs`, `src/main.rs`) contain
//!   `#![deny(missing_docs)]`, and `#![forbid(unsafe_code)]` unless
//!   [`POLICY`] lists the crate as one that holds unsafe code (each with its
//!   reason); a listed crate must still hold some, so the list stays true;
//! - the crate roots under `crates/` deny `unwrap`, `expect`, `panic!` and
//!   `unreachable!` outside tests ([`DENY_PANICS`], which clippy enforces);
//! - only the files of [`POLICY`]'s FFI list name raw foreign bindings
//!   (rsmpi's `mpi::ffi`, `mpi_sys`, cudarc's `sys` and `result` modules);
//!   everything else calls the checked wrappers of the FFI layer.
//!
//! - only the files of [`POLICY`]'s launch list queue CUDA kernels
//!   (cudarc's `launch_builder`): every other launch goes through
//!   gradwire-tensor's typed launch, checked against the kernel's signature;
//! - a strategy is implemented where the strategies live: outside
//!   gradwire-algos, only the files of [`POLICY`]'s strategy list
//!   implement its `Strategy` trait in a `src/` directory (tests, benches
//!   and examples may), so no crate above grows adapters again.
//!
//! Over the whole repository (every `.rs`, `.md` and `.toml` file): no
//! reference to a specification or design file that lives outside it.
//! `ARCHITECTURE.md` exists, is at most [`ARCHITECTURE_MAX_BYTES`] bytes,
//! states its invariants (lines starting with `**Architecture Invariant:**`),
//! names only paths that exist (every backticked path: a file or folder of
//! the repository is it or ends with it) and names every file of
//! [`POLICY`]'s FFI, launch and device-allocation lists, so the map follows
//! the code and the lists its invariants state.
//!
//! `target/` (and `.git/`) directories are skipped. A failure lists every
//! offending file with the rule it breaks.
//!
//! The walk and the rules are here; what a file's text is searched for, in
//! `detect.rs`; the checks of `ARCHITECTURE.md`, in `architecture.rs`.

use crate::workspace::{
    code_of, files_with_extensions, is_ident_char, member_patterns, read, repository_paths,
    workspace_members,
};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

mod architecture;
mod detect;

use architecture::*;
use detect::*;

/// Rule for crate roots: documentation is required.
const RULE_DENY_MISSING_DOCS: &str = "crate root must contain `#![deny(missing_docs)]`";
/// Rule for every Rust file of a member.
const RULE_MODULE_DOC: &str = "file must start with a `//!` module doc comment";
/// Rule for crate roots of crates that hold no unsafe code.
const RULE_FORBID_UNSAFE: &str = "crate root must contain `#![forbid(unsafe_code)]` (or list the \
     crate in tidy's POLICY.may_hold_unsafe, saying why)";
/// Rule for crate roots of the crates that deny rather than forbid.
const RULE_DENY_UNSAFE: &str = "crate root must contain `#![deny(unsafe_code)]`";
/// Rule for the crates listed as holding unsafe code.
const RULE_STALE_UNSAFE: &str = "crate is listed in tidy's POLICY.may_hold_unsafe but its sources \
     hold no `unsafe`: remove it from the list and forbid unsafe code";
/// Rule for the crate roots of the libraries and the binary (tidy's
/// POLICY.deny_panics_under).
const RULE_DENY_PANICS: &str = "crate root must contain `#![cfg_attr(not(test), deny(clippy::unwrap_used, \
     clippy::expect_used, clippy::panic, clippy::unreachable))]`: a library reports bad input as an \
     error, never by panicking";
/// The attribute of [`RULE_DENY_PANICS`].
const DENY_PANICS: &str = "#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, \
     clippy::panic, clippy::unreachable))]";
/// Rule for library code outside gradwire-algos.
const RULE_STRATEGY_IMPL: &str = "only gradwire-algos (and tidy's POLICY.strategy_impls) may \
     implement `Strategy` in library code: a strategy is a module of gradwire-algos, not an \
     adapter above it";

/// Rule for the files of the strategy list.
const RULE_STALE_STRATEGY_IMPL: &str =
    "file is listed in tidy's POLICY.strategy_impls but implements no `Strategy`";

/// Rule for files outside the FFI layer.
const RULE_FFI: &str = "only the FFI layer may name raw foreign bindings (`mpi::ffi`, `mpi_sys`, \
     cudarc's `sys` / `result`): call the checked wrappers, or add the file to tidy's \
     POLICY.ffi_files with its reason";
/// Rule for the files of the FFI list.
const RULE_STALE_FFI: &str = "file is listed in tidy's POLICY.ffi_files but names no raw foreign \
     binding (or does not exist): remove it from the list";
/// Rule for files outside the typed launch.
const RULE_KERNEL_LAUNCH: &str = "only gradwire-tensor's typed launch (tidy's POLICY.launch_files) \
     may queue a kernel with cudarc's `launch_builder`: launch through \
     `gradwire_tensor::cuda_backend::launch::Launch`";
/// Rule for the files of the launch list.
const RULE_STALE_KERNEL_LAUNCH: &str =
    "file is listed in tidy's POLICY.launch_files but queues no kernel: remove it from the list";
/// Rule for files outside the counted allocation sites.
const RULE_DEVICE_ALLOCATION: &str = "only the counted allocation sites (tidy's \
     POLICY.device_alloc_files) may allocate device memory with cudarc (`alloc_zeros::<`, \
     `clone_htod`, `clone_dtod`, `alloc::<`, `memcpy_stod`): allocate through `CudaStorage` or \
     `DeviceVec`, or note the allocation (`note_device_allocation`) and list the file";
/// Rule for the files of the allocation list.
const RULE_STALE_DEVICE_ALLOCATION: &str = "file is listed in tidy's POLICY.device_alloc_files \
     but allocates no device memory with cudarc: remove it from the list";
/// Rule for every text file of the repository.
const RULE_OUTSIDE_REFERENCE: &str = "file refers to a file outside the repository: state the fact itself, or point inside the repository";
/// Rule for `ARCHITECTURE.md`'s size.
const RULE_ARCHITECTURE_SIZE: &str =
    "ARCHITECTURE.md must be at most 25,000 bytes: a map, not a retelling";
/// Rule for `ARCHITECTURE.md`'s invariants.
const RULE_ARCHITECTURE_INVARIANTS: &str =
    "ARCHITECTURE.md must state its invariants (lines starting with `**Architecture Invariant:**`)";
/// Rule for `ARCHITECTURE.md`'s existence.
const RULE_ARCHITECTURE_MISSING: &str = "ARCHITECTURE.md must exist";
/// Rule for the paths `ARCHITECTURE.md` names.
const RULE_ARCHITECTURE_PATH: &str = "ARCHITECTURE.md names a path that no file or folder of the \
     repository is or ends with: a map must show what is there";
/// Rule for the files of tidy's lists that `ARCHITECTURE.md` must name.
const RULE_ARCHITECTURE_POLICY: &str = "ARCHITECTURE.md must name every file of tidy's \
     POLICY.ffi_files, launch_files and device_alloc_files (its path below `src/`): its \
     invariants state those lists";
/// The extensions that make a backticked token of `ARCHITECTURE.md` a file
/// name even without a folder.
const ARCHITECTURE_FILE_EXTENSIONS: &[&str] = &[
    ".rs", ".cu", ".cuh", ".h", ".toml", ".md", ".sh", ".py", ".txt",
];
/// Rule for the workspace manifest's test profile.
const RULE_TEST_PROFILE: &str = "the test profile may set package levels only (`[profile.test.package.<name>]`): \
     a setting of its own makes the test build compile again the build scripts and proc macros \
     that clippy, check and doc compiled in the dev profile; set it in `[profile.dev]`, which the test profile inherits";

/// The largest `ARCHITECTURE.md` allowed, in bytes.
const ARCHITECTURE_MAX_BYTES: usize = 25_000;
/// How an invariant line of `ARCHITECTURE.md` starts (rust-analyzer's spelling).
const INVARIANT_MARKER: &str = "**Architecture Invariant:**";

/// The directories of a member whose `.rs` files the rules apply to.
const CHECKED_DIRS: &[&str] = &["src", "benches", "examples", "tests"];
/// The crate roots of a member, relative to its directory.
const CRATE_ROOTS: &[&str] = &["src/lib.rs", "src/main.rs"];
/// The extensions of the files the outside-reference rule reads.
const TEXT_EXTENSIONS: &[&str] = &["rs", "md", "toml"];

/// Texts that point at files outside the repository (the specification and
/// design notes a checkout does not have). Split with `concat!` so that this
/// file does not match itself.
const OUTSIDE_REFERENCES: &[&str] = &[
    concat!("SPEC", " §"),
    concat!("SPEC", ".md"),
    concat!("DESIGN", ".md"),
    concat!("..", "/shared"),
];

/// Which files and crates may do what the rules otherwise refuse, as paths
/// relative to the workspace root.
struct Policy<'a> {
    /// The files that may name raw foreign bindings.
    ffi_files: &'a [&'a str],
    /// The files that may queue kernels with cudarc's `launch_builder`.
    launch_files: &'a [&'a str],
    /// The files that may allocate device memory with cudarc (each
    /// allocation counted by `note_device_allocation`).
    device_alloc_files: &'a [&'a str],
    /// The members that hold unsafe code, so cannot forbid it.
    may_hold_unsafe: &'a [&'a str],
    /// The members with no unsafe code of their own that cannot take
    /// `forbid(unsafe_code)` and deny it instead.
    deny_unsafe: &'a [&'a str],
    /// The member whose library implements the strategies.
    strategy_home: &'a str,
    /// The other library files that may implement `Strategy`.
    strategy_impls: &'a [&'a str],
    /// The folder whose members' crate roots deny panicking calls outside
    /// tests ([`RULE_DENY_PANICS`]).
    deny_panics_under: &'a str,
}

/// This workspace's policy.
const POLICY: Policy<'static> = Policy {
    ffi_files: &[
        // The MPI FFI layer: checked wrappers over rsmpi's raw bindings.
        "crates/gradwire-comm/src/mpi/sys.rs",
        // The NCCL FFI layer: checked wrappers over cudarc's NCCL bindings.
        "crates/gradwire-comm/src/nccl/sys.rs",
        // The CUDA transport: names the raw stream handle type
        // (`CUstream`) that its queued NCCL calls take across threads;
        // calls no foreign function (`sys.rs` does).
        "crates/gradwire-comm/src/nccl/cuda.rs",
        // The CUDA driver probe (`is_culib_present`, a dlopen only), made
        // before any driver call so that a missing driver is an error value.
        "crates/gradwire-tensor/src/cuda_backend/driver.rs",
    ],
    launch_files: &[
        // The typed launch: every launch checked against the kernel's
        // signature in gradwire-kernels, then queued.
        "crates/gradwire-tensor/src/cuda_backend/launch.rs",
    ],
    device_alloc_files: &[
        // CudaStorage's constructors and copy on write.
        "crates/gradwire-tensor/src/cuda_backend/driver.rs",
        // DeviceVec's constructors.
        "crates/gradwire-tensor/src/cuda_backend/device_vec.rs",
        // NcclComm's scratch and staged sends (CudaTransport::alloc_zeros).
        "crates/gradwire-comm/src/nccl/cuda.rs",
    ],
    may_hold_unsafe: &[
        // LocalComm's buffers shared between rank threads, rank_order.rs's
        // AVX2 dispatch, f16_convert.rs's F16C loops, the MPI and NCCL FFI
        // and NCCL's queued calls.
        "crates/gradwire-comm",
        // main's one `env::set_var`, before any thread starts: candle's
        // compute threads shared among in-process ranks.
        "crates/gradwire-cli",
        // The streaming-store f16 casts (x86-64 intrinsics) in cast.rs and
        // quant/mod.rs's AVX2 dispatch.
        "crates/gradwire-compress",
        // With the `cuda` feature: the driver probe, byte views of device
        // buffers and kernel launches in cuda_backend/; its root forbids
        // unsafe code without that feature.
        "crates/gradwire-tensor",
        // The calls into the CUDA kernels compiled for the CPU (their
        // generated launchers, C ABI) with staged buffers; tests only.
        "kernels/host",
    ],
    deny_unsafe: &[
        // No unsafe code of its own, but ndarray's `s!` expands to an
        // `unsafe` block under `#[allow(unsafe_code)]`, which `forbid`
        // rejects (E0453).
        "crates/gradwire-algos",
    ],
    strategy_home: "crates/gradwire-algos",
    strategy_impls: &[
        // DistOpt's mechanism, not strategies: the one strategy a user
        // gives, shared by every bucket, and the one that refuses.
        "crates/gradwire-optim/src/distopt/strategies.rs",
        // The fault matrix's injected fault: a strategy that panics.
        "crates/gradwire-experiments/src/faults/scenario.rs",
    ],
    // The libraries and the binary; not xtask, the test harness, the
    // kernels' host build or the fuzz checks, whose failures are panics.
    deny_panics_under: "crates/",
};

#[test]
fn workspace_is_tidy() {
    let root = super::workspace_root();
    let members = workspace_members(root);
    for expected in ["tests", "xtask"] {
        assert!(
            members.contains(&root.join(expected)),
            "workspace members not parsed from Cargo.toml: got {members:?}"
        );
    }
    let problems = check_workspace(root, &POLICY);
    assert!(
        problems.is_empty(),
        "tidy found {} problem(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

/// Every broken rule in the repository at `root`, as `path: rule` lines,
/// with paths relative to `root`.
fn check_workspace(root: &Path, policy: &Policy<'_>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut named_raw_bindings = Vec::new();
    let mut launching = Vec::new();
    let mut allocating = Vec::new();
    let mut implemented_strategies = Vec::new();
    for member in workspace_members(root) {
        let member_name = relative(root, &member);
        let mut files = Vec::new();
        for dir in CHECKED_DIRS {
            files_with_extensions(&member.join(dir), &["rs"], &mut files);
        }
        files.sort();
        let mut sources_hold_unsafe = false;
        for file in &files {
            let text = read(file);
            let shown = relative(root, file);
            let mut broken = check_file(&text, CRATE_ROOTS.iter().any(|r| *file == member.join(r)));
            if file.starts_with(member.join("src")) {
                sources_hold_unsafe |= holds_unsafe_code(&text);
            }
            if names_raw_bindings(&text) {
                named_raw_bindings.push(shown.clone());
                if !policy.ffi_files.contains(&shown.as_str()) {
                    broken.push(RULE_FFI);
                }
            }
            if queues_kernels(&text) {
                launching.push(shown.clone());
                if !policy.launch_files.contains(&shown.as_str()) {
                    broken.push(RULE_KERNEL_LAUNCH);
                }
            }
            if allocates_device_memory(&text) {
                allocating.push(shown.clone());
                if !policy.device_alloc_files.contains(&shown.as_str()) {
                    broken.push(RULE_DEVICE_ALLOCATION);
                }
            }
            if member_name != policy.strategy_home
                && file.starts_with(member.join("src"))
                && implements_strategy(&text)
            {
                implemented_strategies.push(shown.clone());
                if !policy.strategy_impls.contains(&shown.as_str()) {
                    broken.push(RULE_STRATEGY_IMPL);
                }
            }
            problems.extend(broken.into_iter().map(|rule| format!("{shown}: {rule}")));
        }
        let required = if policy.may_hold_unsafe.contains(&member_name.as_str()) {
            if !sources_hold_unsafe {
                problems.push(format!("{member_name}: {RULE_STALE_UNSAFE}"));
            }
            None
        } else if policy.deny_unsafe.contains(&member_name.as_str()) {
            Some(("#![deny(unsafe_code)]", RULE_DENY_UNSAFE))
        } else {
            Some(("#![forbid(unsafe_code)]", RULE_FORBID_UNSAFE))
        };
        let denies_panics = member_name
            .starts_with(policy.deny_panics_under)
            .then_some((DENY_PANICS, RULE_DENY_PANICS));
        for (attribute, rule) in required.into_iter().chain(denies_panics) {
            for crate_root in CRATE_ROOTS.iter().map(|r| member.join(r)) {
                if crate_root.is_file() && !has_attribute(&read(&crate_root), attribute) {
                    problems.push(format!("{}: {rule}", relative(root, &crate_root)));
                }
            }
        }
    }
    for listed in policy.ffi_files {
        if !named_raw_bindings.iter().any(|file| file == listed) {
            problems.push(format!("{listed}: {RULE_STALE_FFI}"));
        }
    }
    for listed in policy.launch_files {
        if !launching.iter().any(|file| file == listed) {
            problems.push(format!("{listed}: {RULE_STALE_KERNEL_LAUNCH}"));
        }
    }
    for listed in policy.device_alloc_files {
        if !allocating.iter().any(|file| file == listed) {
            problems.push(format!("{listed}: {RULE_STALE_DEVICE_ALLOCATION}"));
        }
    }
    for listed in policy.strategy_impls {
        if !implemented_strategies.iter().any(|file| file == listed) {
            problems.push(format!("{listed}: {RULE_STALE_STRATEGY_IMPL}"));
        }
    }
    // One walk of the repository serves the text files' rule and the
    // paths ARCHITECTURE.md may name.
    let paths = repository_paths(root);
    let text_files = paths.iter().filter(|path| {
        !path.ends_with('/')
            && path
                .rsplit_once('.')
                .is_some_and(|(_, ext)| TEXT_EXTENSIONS.contains(&ext))
    });
    for shown in text_files {
        if let Some(found) = outside_reference(&read(&root.join(shown))) {
            problems.push(format!("{shown}: {RULE_OUTSIDE_REFERENCE} (`{found}`)"));
        }
    }
    problems.extend(
        check_profiles(&read(&root.join("Cargo.toml")))
            .into_iter()
            .map(|rule| format!("Cargo.toml: {rule}")),
    );
    match fs::read_to_string(root.join("ARCHITECTURE.md")) {
        Ok(text) => {
            problems.extend(
                check_architecture(&text)
                    .into_iter()
                    .map(|rule| format!("ARCHITECTURE.md: {rule}")),
            );
            for named in architecture_paths(&text) {
                if !paths.iter().any(|path| names_path(path, &named)) {
                    problems.push(format!(
                        "ARCHITECTURE.md: {RULE_ARCHITECTURE_PATH} (`{named}`)"
                    ));
                }
            }
            let listed = policy
                .ffi_files
                .iter()
                .chain(policy.launch_files)
                .chain(policy.device_alloc_files);
            for file in listed {
                let below_src = file.split_once("/src/").map_or(*file, |(_, rest)| rest);
                if !text.contains(below_src) {
                    problems.push(format!(
                        "ARCHITECTURE.md: {RULE_ARCHITECTURE_POLICY} (`{below_src}`)"
                    ));
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            problems.push(format!("ARCHITECTURE.md: {RULE_ARCHITECTURE_MISSING}"));
        }
        Err(e) => panic!("cannot read ARCHITECTURE.md: {e}"),
    }
    problems
}

/// The rules the workspace manifest with contents `manifest` breaks: a
/// setting in a `[profile.test]` table other than a package's.
fn check_profiles(manifest: &str) -> Vec<&'static str> {
    let mut in_test_table = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_test_table = line.starts_with("[profile.test]")
                || (line.starts_with("[profile.test.")
                    && !line.starts_with("[profile.test.package."));
        } else if in_test_table && !line.is_empty() && !line.starts_with('#') {
            return vec![RULE_TEST_PROFILE];
        }
    }
    Vec::new()
}

/// `path` relative to `root`, with `/` separators.
fn relative(root: &Path, path: &Path) -> String {
    let path = path.strip_prefix(root).unwrap_or(path);
    let parts: Vec<_> = path.iter().map(|part| part.to_string_lossy()).collect();
    parts.join("/")
}

/// A directory under the system's temporary directory, removed on drop.
struct TempTree(PathBuf);

impl TempTree {
    /// A fresh, empty directory named after `name` and this process.
    fn new(name: &str) -> TempTree {
        let dir = std::env::temp_dir().join(format!("xtask-tidy-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create a temporary directory");
        TempTree(dir)
    }

    /// Writes `text` to `path` (relative to the tree), making its directories.
    fn write(&self, path: &str, text: &str) {
        let path = self.0.join(path);
        fs::create_dir_all(path.parent().expect("a file has a parent"))
            .expect("create directories");
        fs::write(path, text).expect("write a file");
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod self_tests;
