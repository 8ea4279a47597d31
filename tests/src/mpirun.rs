//! Starting a binary under Open MPI's `mpirun` on this host only, for the
//! tests that run on MpiComm (`conformance_mpi.rs`, `mpi_faults.rs`): where
//! `mpirun` is, the loud SKIP (or, with `GRADWIRE_REQUIRE_MPI=1`, the
//! failure) when it cannot run, and one run with a time limit that kills a
//! hang.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `mpirun` on the PATH, if any.
pub fn mpirun() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("mpirun"))
            .find(|p| p.is_file())
    })
}

/// Whether MPI tests must run (`GRADWIRE_REQUIRE_MPI=1`, as CI sets).
pub fn required() -> bool {
    std::env::var("GRADWIRE_REQUIRE_MPI").is_ok_and(|v| v == "1")
}

/// Prints a SKIP banner for `what` straight to stderr (a test harness
/// captures `eprintln!` of passing tests, and a skip must be seen); `run`
/// says how to run it. Returns whether the skip is allowed (MPI not
/// required).
pub fn skip(what: &str, why: &str, run: &str) -> bool {
    let banner = format!(
        "\n==================== SKIP ====================\n\
         {what} NOT RUN: {why}\n\
         ({run} with Open MPI installed; GRADWIRE_REQUIRE_MPI=1 makes this a failure)\n\
         ==============================================\n"
    );
    let _ = std::io::stderr().write_all(banner.as_bytes());
    if required() {
        eprintln!("GRADWIRE_REQUIRE_MPI=1 but {what} cannot run: {why}");
        return false;
    }
    true
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let uids = s.lines().find_map(|l| l.strip_prefix("Uid:"))?;
            Some(uids.split_whitespace().nth(1)? == "0")
        })
        .unwrap_or(false)
}

/// How one mpirun ended.
#[derive(Debug)]
pub struct Run {
    /// Exited with status 0 (false when killed at the limit).
    pub ok: bool,
    /// Its stdout then its stderr (and a line saying so if it was killed).
    pub output: String,
    /// How long it took.
    pub took: Duration,
}

/// Runs `binary args` as `world` ranks on this host (shared memory only,
/// the single-copy mechanism off: containers often forbid the
/// cross-process reads it uses), killed after `limit`, with the options
/// of ranks that share the cores
/// ([`gradwire_experiments::network::OPEN_MPI_SHARED_CORES`]). The ranks
/// yield while they wait: with fewer ranks than cores Open MPI would busy-poll
/// in every blocking call, and `cargo xtask test` runs another test
/// binary beside this one (run beside gradwire-cli's tests, the two took
/// 7 % less CPU, one run each).
pub fn run(mpirun: &Path, binary: &Path, args: &[&str], world: usize, limit: Duration) -> Run {
    let mut command = Command::new(mpirun);
    if is_root() {
        command.arg("--allow-run-as-root");
    }
    command
        .args(["--oversubscribe", "-np", &world.to_string()])
        .args(["--mca", "btl", "self,vader"])
        .args(["--mca", "btl_vader_single_copy_mechanism", "none"])
        .args(gradwire_experiments::network::OPEN_MPI_SHARED_CORES)
        .arg(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = command.spawn().expect("mpirun starts");
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        text
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for mpirun") {
            break Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = start.elapsed();
    let output = format!(
        "{}{}",
        reader.join().unwrap_or_default(),
        err_reader.join().unwrap_or_default()
    );
    match status {
        Some(status) => Run {
            ok: status.success(),
            output,
            took,
        },
        None => Run {
            ok: false,
            output: format!("{output}\n(killed after {limit:?})"),
            took,
        },
    }
}
