//! Runs `gradwire` as W MPI ranks, one per namespace of a [`ShapedNetwork`],
//! under Open MPI over TCP only (`btl tcp,self`: no shared-memory
//! transport, so every byte between ranks crosses a shaped link).
//!
//! `mpirun` itself runs in rank 0's namespace and reaches the others
//! through an rsh agent script that maps each rank's address to
//! `ip netns exec <its namespace>`: Open MPI starts one daemon per "host"
//! as it would over ssh, and PMIx, the out-of-band channel and the data all
//! stay on the bridge. (An mpirun in the root namespace cannot reach
//! daemons inside namespaces: PMIx would be unreachable.)
//!
//! Ctrl-C and SIGTERM end the job (SIGTERM to mpirun, which stops its
//! ranks; SIGKILL after a grace period) and return an error, so that the
//! caller's [`ShapedNetwork`] drops and removes the namespaces.
//!
//! `--network RATE` ([`NetworkArgs`]) is the flag that asks for it:
//! [`run_shaped`] runs this command again that way.

use super::{Rate, SUBNET, ShapedNetwork};
use crate::config::{
    BackendKind, CHOSEN_THREADS_VARS, COMPUTE_THREADS_VAR, compute_threads_to_set,
};
use crate::error::{ExperimentError, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

/// Set by the Ctrl-C / SIGTERM handler.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How long mpirun gets to stop its ranks after SIGTERM.
const GRACE: Duration = Duration::from_secs(10);

/// What to start under mpirun.
#[derive(Debug, Clone)]
pub struct MpiLaunch {
    /// The program every rank runs (this `gradwire`).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Environment variables every rank gets (`-x NAME=value`).
    pub env: Vec<(String, String)>,
}

/// `--network`: the run's ranks as MPI processes on a shaped network.
#[derive(clap::Args, Debug, Clone)]
pub struct NetworkArgs {
    /// Run the --world ranks as MPI processes (Open MPI over TCP only), one
    /// per network namespace, each linked to a bridge at this rate in both
    /// directions (tc tbf): 100mbit to 100gbit. Needs root, iproute2, Open
    /// MPI and a build with --features mpi; the namespaces are removed on
    /// every exit.
    #[arg(long, value_name = "RATE")]
    pub network: Option<String>,
    /// Set by --network for the ranks it starts: the links' rate, bit/s.
    #[arg(long, hide = true)]
    pub link_rate: Option<u64>,
}

impl NetworkArgs {
    /// How many ranks a run on `backend` with `world` ranks puts in this
    /// process: `world` on `--backend local` without `--network` (threads
    /// sharing this machine's cores), none otherwise (MPI processes,
    /// shaped-network ranks, GPUs).
    pub(crate) fn in_process_ranks(&self, backend: BackendKind, world: usize) -> Option<usize> {
        (backend == BackendKind::Local && self.network.is_none()).then_some(world)
    }
}

/// The variables every one of `world` ranks gets (`get` reads this
/// process's environment; mpirun does not pass it to ranks in other
/// namespaces): the compute threads' count the user chose, with either
/// variable, or else this machine's `cores` shared out among the ranks,
/// which all run on it (`compute_threads_to_set`, torchrun's rule).
/// Candle's default, every core in every rank, left idle threads spinning
/// on the cores that the emulated network's packets and the other ranks
/// need: with 2 ranks at 1 Gbit/s `MPI_Allreduce` of 4.5 MB took 73 ms a
/// step in training against 49 ms with one thread a rank (README, the cost
/// model's validation).
fn forwarded_env(
    world: usize,
    cores: usize,
    get: impl Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = CHOSEN_THREADS_VARS
        .into_iter()
        .filter_map(|name| Some((name.to_string(), get(name)?)))
        .collect();
    if let Some(threads) =
        compute_threads_to_set(Some(world), cores, |name| get(name).map(Into::into))
    {
        env.push((COMPUTE_THREADS_VAR.to_string(), threads));
    }
    env
}

/// `--network RATE`: this command again (this program with this process's
/// arguments, `--backend mpi --link-rate <bits/s>` in place of `--network`,
/// `--backend` and `--link-rate`), as `world` MPI ranks on a shaped network
/// made for the run and removed after it (`out`, the `--out` directory,
/// made absolute: the ranks may start elsewhere).
pub fn run_shaped(rate: &str, world: usize, out: Option<&Path>) -> Result<()> {
    let rate = Rate::parse(rate)?;
    if cfg!(not(feature = "mpi")) {
        return Err(ExperimentError::Usage(
            "--network starts MPI ranks: build with --features mpi".into(),
        ));
    }
    let program = std::env::current_exe().map_err(|source| ExperimentError::Io {
        path: "(this program)".into(),
        source,
    })?;
    let mut args = Vec::new();
    let mut given = std::env::args_os().skip(1);
    while let Some(arg) = given.next() {
        let text = arg.to_string_lossy();
        if ["--network", "--backend", "--link-rate", "--out"].contains(&text.as_ref()) {
            given.next();
        } else if ["--network=", "--backend=", "--link-rate=", "--out="]
            .iter()
            .any(|p| text.starts_with(p))
        {
        } else {
            args.push(arg);
        }
    }
    args.extend(["--backend", "mpi", "--link-rate"].map(OsString::from));
    args.push(rate.bits_per_s.to_string().into());
    if let Some(out) = out {
        let out = std::path::absolute(out).map_err(|source| ExperimentError::Io {
            path: out.display().to_string(),
            source,
        })?;
        args.push("--out".into());
        args.push(out.into_os_string());
    }
    let net = ShapedNetwork::create(world, rate)?;
    eprintln!(
        "shaped network: {world} ranks, one namespace each, linked to a bridge at {rate} each way (tc tbf); Open MPI over TCP"
    );
    run_under_mpi(
        &net,
        &MpiLaunch {
            program,
            args,
            env: forwarded_env(
                world,
                std::thread::available_parallelism().map_or(1, |n| n.get()),
                |name| std::env::var(name).ok(),
            ),
        },
    )
}

/// The `mpirun` options of ranks that share this machine's cores (the
/// shaped runs' and the MPI test suites'): the ranks yield while they
/// wait, where Open MPI would busy-poll in every blocking call and take
/// the cores the others compute and send on; and no topology shared
/// through memory mapped at "the biggest hole" of the address space (a
/// daemon crashed in hwloc_shmem_topology_write, SIGSEGV at a stack
/// address, the hole having met its stack; once, 2026-11-28): each
/// process reads the topology itself instead.
pub const OPEN_MPI_SHARED_CORES: [&str; 6] = [
    "--mca",
    "mpi_yield_when_idle",
    "1",
    "--mca",
    "rtc_hwloc_vmhole",
    "none",
];

/// Runs `launch` as one rank per namespace of `net` and waits for it. Its
/// output (rank 0's progress and tables) goes to this process's stdout and
/// stderr as it comes. An error if mpirun is missing, the job fails, or
/// the run is interrupted.
pub fn run_under_mpi(net: &ShapedNetwork, launch: &MpiLaunch) -> Result<()> {
    let mpirun = find_on_path("mpirun").ok_or_else(|| {
        ExperimentError::Network(
            "`mpirun` is not on the PATH (Debian: apt-get install openmpi-bin libopenmpi-dev)"
                .into(),
        )
    })?;
    install_handler()?;
    let dir = tempfile::tempdir().map_err(|source| ExperimentError::Io {
        path: "(temporary directory)".into(),
        source,
    })?;
    // Open MPI's session directories: each "host" its own, as real hosts
    // have (the agent mounts a tmpfs over it in every other namespace).
    let sessions = dir.path().join("sessions");
    std::fs::create_dir(&sessions).map_err(|source| ExperimentError::Io {
        path: sessions.display().to_string(),
        source,
    })?;
    let agent = write_agent(net, dir.path(), &sessions)?;
    let hosts: Vec<String> = (0..net.world())
        .map(|r| format!("{}:1", net.address(r)))
        .collect();
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", &net.namespace(0)])
        .arg(mpirun)
        .arg("--allow-run-as-root")
        .args(["-np", &net.world().to_string()])
        .args(["--host", &hosts.join(",")])
        // One core per "host" would pin every rank to core 0.
        .args(["--bind-to", "none"])
        .arg("--mca")
        .arg("plm_rsh_agent")
        .arg(&agent)
        .args(["--mca", "btl", "tcp,self"])
        // Its own session directories, removed with `dir`: every daemon of
        // every run otherwise shares /tmp/ompi.<host>.<uid>, and one left
        // by an earlier run (or being removed by an ending one) failed a
        // daemon's start (`orte_session_dir failed`). The namespaces share
        // one host name, so the daemons of one run would share one too
        // (and about one run in eight of 4 ranks failed so): the agent
        // gives each its own.
        .arg("--mca")
        .arg("orte_tmpdir_base")
        .arg(&sessions)
        // Every "host" has one slot, so Open MPI does not see that the
        // ranks share this machine's cores.
        .args(OPEN_MPI_SHARED_CORES)
        .args(["--mca", "btl_tcp_if_include", SUBNET])
        .args(["--mca", "oob_tcp_if_include", SUBNET])
        // gradwire's all-reduce is an MPI_Alltoallv then an
        // MPI_Allgatherv. Open MPI's default for them starts every flow at
        // once, W - 1 TCP streams into each shaped link that overflow its
        // queue; pairwise and ring keep one stream per link and direction
        // (a 16 MiB all-reduce of 4 ranks at 100 Mbit/s: 4.05 s before,
        // 2.76 s after). MPI_Allreduce, the baseline's, keeps Open MPI's
        // own decision, as a Horovod user runs it.
        .args(["--mca", "coll_tuned_use_dynamic_rules", "1"])
        .args(["--mca", "coll_tuned_alltoallv_algorithm", "2"])
        .args(["--mca", "coll_tuned_allgatherv_algorithm", "3"]);
    for (name, value) in &launch.env {
        command.args(["-x", &format!("{name}={value}")]);
    }
    command.arg(&launch.program).args(&launch.args);
    let child = command.spawn().map_err(|e| {
        ExperimentError::Network(format!("cannot start mpirun in {}: {e}", net.namespace(0)))
    })?;
    let status = wait_or_stop(child)?;
    if status.success() {
        Ok(())
    } else {
        Err(ExperimentError::Network(format!(
            "the MPI job over the shaped network failed ({status}); its output is above"
        )))
    }
}

/// The rsh agent: Open MPI calls it as `agent <host> <command...>`; it runs
/// the command in the host's namespace, over a `sessions` of its own.
fn write_agent(net: &ShapedNetwork, dir: &Path, sessions: &Path) -> Result<PathBuf> {
    use std::fmt::Write as _;
    let mut script = String::from(
        "#!/bin/sh\n# gradwire: Open MPI's rsh agent into a shaped network's namespaces.\n\
         host=\"$1\"\nshift\ncase \"$host\" in\n",
    );
    for rank in 0..net.world() {
        let _ = writeln!(
            script,
            "  {}) ns={} ;;",
            net.address(rank),
            net.namespace(rank)
        );
    }
    script.push_str("  *) echo \"gradwire agent: unknown host $host\" >&2; exit 1 ;;\nesac\n");
    // `ip netns exec` runs in a mount namespace of its own: the tmpfs is
    // this daemon's alone, and goes with it. The command is a shell list
    // (Open MPI's `PATH=...; export PATH; ... orted ...`).
    let _ = writeln!(
        script,
        "exec ip netns exec \"$ns\" sh -c \"mount -t tmpfs gradwire-session '{}' || exit 1; $*\"",
        sessions.display()
    );
    let path = dir.join("netns-agent.sh");
    let io = |source| ExperimentError::Io {
        path: path.display().to_string(),
        source,
    };
    std::fs::write(&path, script).map_err(io)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).map_err(io)?;
    Ok(path)
}

/// Waits for mpirun; on Ctrl-C or SIGTERM, stops it (SIGTERM, then
/// SIGKILL after [`GRACE`]) and returns an error.
fn wait_or_stop(mut child: Child) -> Result<std::process::ExitStatus> {
    let io = |source| ExperimentError::Io {
        path: "mpirun".into(),
        source,
    };
    loop {
        if let Some(status) = child.try_wait().map_err(io)? {
            return Ok(status);
        }
        if INTERRUPTED.load(Ordering::SeqCst) {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let asked = Instant::now();
            while asked.elapsed() < GRACE {
                if child.try_wait().map_err(io)?.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(ExperimentError::Network(
                "interrupted: the MPI job was stopped and the namespaces removed".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Catches Ctrl-C and SIGTERM once per process (ctrlc allows one handler).
fn install_handler() -> Result<()> {
    static ONCE: Once = Once::new();
    static FAILED: OnceLock<String> = OnceLock::new();
    ONCE.call_once(|| {
        if let Err(e) = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst)) {
            let _ = FAILED.set(e.to_string());
        }
    });
    match FAILED.get() {
        Some(e) => Err(ExperimentError::Network(format!(
            "cannot catch Ctrl-C, so the namespaces could outlive an interrupted run: {e}"
        ))),
        None => Ok(()),
    }
}

/// `name` in a directory of `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CANDLE_THREADS_VAR;

    /// The ranks get the user's choice of compute threads (either
    /// variable) as it is, or else the cores shared out among them (one
    /// rank, every core).
    #[test]
    fn every_rank_gets_the_chosen_compute_threads_or_its_share_of_the_cores() {
        let pair = |name: &str, value: &str| (name.to_string(), value.to_string());
        assert_eq!(
            forwarded_env(4, 2, |_| None),
            vec![pair(COMPUTE_THREADS_VAR, "1")]
        );
        assert_eq!(
            forwarded_env(2, 16, |_| None),
            vec![pair(COMPUTE_THREADS_VAR, "8")]
        );
        assert_eq!(
            forwarded_env(1, 2, |_| None),
            vec![pair(COMPUTE_THREADS_VAR, "2")]
        );
        for chosen in CHOSEN_THREADS_VARS {
            let get = |name: &str| (name == chosen).then(|| "3".to_string());
            assert_eq!(
                forwarded_env(4, 2, get),
                vec![pair(chosen, "3")],
                "{chosen}"
            );
        }
        let both = forwarded_env(4, 2, |_| Some("5".into()));
        assert_eq!(
            both,
            vec![
                pair(COMPUTE_THREADS_VAR, "5"),
                pair(CANDLE_THREADS_VAR, "5")
            ]
        );
    }
}
