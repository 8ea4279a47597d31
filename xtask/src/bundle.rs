//! `cargo xtask gpu-bundle`: the GPU suites built here, to run on a machine
//! with an NVIDIA GPU and no Rust toolchain.
//!
//! It builds every GPU test binary (`cargo test --no-run` of
//! [`GPU_SUITES`], the suites `cargo xtask test` runs) and the `gradwire`
//! binary with both features, strips them, and puts them in
//! `target/gpu-bundle/` beside `xtask/gpu_suite.sh`, which runs them there: every suite with `GRADWIRE_REQUIRE_GPU=1`, compute-sanitizer
//! over the kernel suites, and the GPU benches; `target/gpu-bundle.tar.gz`
//! is the same folder in one file to carry. The PTX is inside the
//! binaries (`include_str!`) and the CUDA driver and NCCL are loaded at run
//! time, so the folder is all the other machine needs (NCCL from its
//! PyTorch installation; the script finds it).
//!
//! Cargo's JSON messages name the binaries (the `artifacts` module).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::artifacts;
use crate::gpu::GPU_SUITES;
use crate::{Result, cargo, run, workspace_root};

fn bundle_dir() -> PathBuf {
    crate::gpu::target_dir().join("gpu-bundle")
}

/// Copies `from` to `to` without its debug information and symbol table
/// (`strip` when present, else a plain copy), executable: the bundle must
/// travel in a few tens of MiB, and panics still name their file and line.
fn copy_stripped(from: &Path, to: &Path) -> Result {
    let stripped = Command::new("strip")
        .args(["--strip-all", "-o"])
        .arg(to)
        .arg(from)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        fs::copy(from, to).map_err(|e| format!("could not copy {}: {e}", from.display()))?;
    }
    crate::gpu::make_executable(to)
}

/// `cargo xtask gpu-bundle`.
pub fn gpu_bundle() -> Result {
    let dir = bundle_dir();
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("could not clear {}: {e}", dir.display()))?;
    }
    let tests_dir = dir.join("tests");
    fs::create_dir_all(&tests_dir)
        .map_err(|e| format!("could not create {}: {e}", tests_dir.display()))?;
    for suite in GPU_SUITES {
        let mut command = cargo();
        command.args(["test", "--no-run"]).args(suite.cargo_args());
        for exe in artifacts::built(&mut command)? {
            let name = format!("{}--{}", suite.package, exe.target.replace('-', "_"));
            copy_stripped(&exe.path, &tests_dir.join(&name))?;
            println!("  {name}");
        }
    }
    let mut command = cargo();
    command.args([
        "build",
        "--release",
        "-p",
        "gradwire-cli",
        "--features",
        "gradwire-cli/cuda,gradwire-cli/nccl",
    ]);
    let cli = artifacts::built(&mut command)?
        .into_iter()
        .find(|exe| exe.target == "gradwire")
        .ok_or("cargo reported no `gradwire` binary")?;
    copy_stripped(&cli.path, &dir.join("gradwire"))?;
    let script = dir.join("gpu_suite.sh");
    fs::copy(workspace_root().join("xtask/gpu_suite.sh"), &script)
        .map_err(|e| format!("could not copy gpu_suite.sh: {e}"))?;
    crate::gpu::make_executable(&script)?;
    for script in ["torch_bench.py", "torch_ddp_bench.py"] {
        fs::copy(
            workspace_root().join("xtask").join(script),
            dir.join(script),
        )
        .map_err(|e| format!("could not copy {script}: {e}"))?;
    }
    let size: u64 = fs::read_dir(&tests_dir)
        .map_err(|e| e.to_string())?
        .chain(fs::read_dir(&dir).map_err(|e| e.to_string())?)
        .filter_map(|e| e.ok()?.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    run(Command::new("ls").arg("-l").arg(&tests_dir))?;
    // One compressed file to carry to the GPU machine.
    let tarball = dir.with_extension("tar.gz");
    run(Command::new("tar")
        .arg("-czf")
        .arg(&tarball)
        .arg("-C")
        .arg(dir.parent().ok_or("the bundle has no parent folder")?)
        .arg("gpu-bundle"))?;
    let packed = fs::metadata(&tarball).map_err(|e| e.to_string())?.len();
    println!(
        "wrote {} ({:.1} MiB) and {} ({:.1} MiB); on a GPU machine: \
         tar -xzf gpu-bundle.tar.gz && gpu-bundle/gpu_suite.sh",
        dir.display(),
        size as f64 / (1 << 20) as f64,
        tarball.display(),
        packed as f64 / (1 << 20) as f64,
    );
    Ok(())
}
