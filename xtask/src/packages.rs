//! The Debian packages the workspace needs, installed with apt-get where
//! they are missing (as root; otherwise the command to run is the error).
//!
//! A fresh CI machine spends tens of seconds in apt-get, mostly waiting
//! for the mirror and the disk. Only [`FOR_THE_DEFAULT_BUILD`] is needed
//! before the first build (a build script's C++ compiler); `cargo xtask
//! test` installs the rest in the background while clippy lints the
//! default build, which needs none of it ([`Background`]).

use crate::{Result, describe, is_root};
use std::io;
use std::process::Command;
use std::thread::{self, JoinHandle};
use std::time::Instant;

/// Debian packages the workspace needs to build and test. Add new ones here.
/// Open MPI (the library, `mpirun`) and libclang (rsmpi's bindgen) are for
/// the `mpi` feature, which CI builds and runs; fonts-dejavu-core is the font
/// `gradwire compare` draws its PNG plots with; g++ builds
/// gradwire-kernels-host's CUDA kernels for the CPU (and libFuzzer, for
/// `cargo fuzz run --features link-libfuzzer`); fortunes is the corpus of the transformer's tests.
pub(crate) const REQUIRED: &[&str] = &[
    "pkg-config",
    "libopenmpi-dev",
    "openmpi-bin",
    "libclang-dev",
    "fonts-dejavu-core",
    "g++",
    // ip and tc, for the shaped-network step.
    "iproute2",
    // The text the transformer (`--model gpt`) learns by default.
    "fortunes",
];

/// The packages of [`REQUIRED`] that the main job (`cargo xtask compare`)
/// runs with: the font of its plots and the transformer's text (for
/// `-- --model gpt`). Its build needs none of them, so they install while
/// the CLI builds (on a fresh machine, [`REQUIRED`] before the build took
/// tens of seconds of apt-get, Open MPI and libclang the most of it).
pub(crate) const FOR_THE_MAIN_JOB: &[&str] = &["fonts-dejavu-core", "fortunes"];

/// The packages of [`REQUIRED`] that a build with default features needs:
/// gradwire-kernels-host's build script compiles the CUDA kernels with the
/// host's C++ compiler.
pub(crate) const FOR_THE_DEFAULT_BUILD: &[&str] = &["g++"];

/// Where the output of apt-get goes.
enum Log<'a> {
    /// Printed as it comes.
    Shown,
    /// Kept, to be printed once the installation is over.
    Kept(&'a mut String),
}

impl Log<'_> {
    fn say(&mut self, line: &str) {
        match self {
            Log::Shown => println!("{line}"),
            Log::Kept(text) => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }

    fn run(&mut self, command: &mut Command) -> Result {
        let shown = describe(command);
        match self {
            Log::Shown => crate::run(command),
            Log::Kept(text) => {
                text.push_str(&format!("$ {shown}\n"));
                // A failure's message holds the output.
                let (stdout, stderr) = crate::gpu::output(command)?;
                text.push_str(&stdout);
                text.push_str(&stderr);
                Ok(())
            }
        }
    }
}

/// Makes sure every one of `packages` is installed, printing as it goes.
pub(crate) fn ensure(packages: &[&'static str]) -> Result {
    ensure_with(packages, &mut Log::Shown)
}

/// An installation running on a thread of its own, its output kept.
pub(crate) struct Background {
    /// The result, the output and the seconds the installation took.
    thread: JoinHandle<(Result, String, f64)>,
}

impl Background {
    /// Starts installing the missing ones of `packages`.
    pub(crate) fn start(packages: &'static [&'static str]) -> Background {
        let thread = thread::spawn(move || {
            let started = Instant::now();
            let mut text = String::new();
            let result = ensure_with(packages, &mut Log::Kept(&mut text));
            (result, text, started.elapsed().as_secs_f64())
        });
        Background { thread }
    }

    /// Waits for the installation (a step must not end the process while
    /// dpkg runs), then prints its output under `name` as a step of its
    /// own and returns its result.
    pub(crate) fn finish(self, name: &str) -> Result {
        let (result, text, seconds) = self.thread.join().unwrap_or_else(|_| {
            let panicked = Err("the installing thread panicked".to_string());
            (panicked, String::new(), 0.0)
        });
        println!("==> {name}");
        print!("{text}");
        let outcome = if result.is_ok() { "ok" } else { "FAILED" };
        println!("==> {name}: {outcome} in {seconds:.1}s, in the background");
        result.map_err(|e| format!("step `{name}` failed: {e}"))
    }
}

/// Makes sure every one of `packages` is installed: installs the missing
/// ones with apt-get when running as root, otherwise says the command to
/// run. On a system without dpkg it only warns.
fn ensure_with(packages: &[&'static str], log: &mut Log<'_>) -> Result {
    let missing = match missing(packages) {
        Ok(missing) => missing,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            log.say(&format!(
                "warning: dpkg-query not found (not Debian?); make sure these are installed: {}",
                packages.join(" ")
            ));
            return Ok(());
        }
        Err(e) => return Err(format!("could not run dpkg-query: {e}")),
    };
    if missing.is_empty() {
        log.say(&format!("installed: {}", packages.join(" ")));
        return Ok(());
    }
    let mut install = Command::new("apt-get");
    install
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing);
    if !is_root() {
        return Err(format!(
            "missing Debian packages: {}; install them with:\n    sudo {}",
            missing.join(" "),
            describe(&install)
        ));
    }
    log.run(Command::new("apt-get").arg("update"))?;
    log.run(&mut install)?;
    let still_missing = self::missing(packages).map_err(|e| e.to_string())?;
    if still_missing.is_empty() {
        Ok(())
    } else {
        Err(format!("still not installed: {}", still_missing.join(" ")))
    }
}

/// The ones of `packages` that dpkg does not report as installed.
fn missing(packages: &[&'static str]) -> io::Result<Vec<&'static str>> {
    let mut missing = Vec::new();
    for &package in packages {
        let output = Command::new("dpkg-query")
            .args(["-W", "-f=${Status}\n", package])
            .output()?;
        let status = String::from_utf8_lossy(&output.stdout);
        if !(output.status.success() && status.lines().any(|s| s == "install ok installed")) {
            missing.push(package);
        }
    }
    Ok(missing)
}

#[cfg(test)]
mod tests {
    /// What the default build needs first, and what the main job runs
    /// with, are part of what is required.
    #[test]
    fn the_default_build_s_and_the_main_job_s_packages_are_required() {
        for package in super::FOR_THE_DEFAULT_BUILD
            .iter()
            .chain(super::FOR_THE_MAIN_JOB)
        {
            assert!(super::REQUIRED.contains(package), "{package}");
        }
    }
}
