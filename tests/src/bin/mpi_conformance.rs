//! The conformance suite on MpiComm: run under `mpirun -np W`, every rank
//! runs every case of [`gradwire_tests::conformance`] with its MpiComm, and
//! rank 0 prints one line per case. The exit status is the same on every
//! rank: 0 when every case passed everywhere, 1 otherwise (2 when MPI could
//! not start). `tests/it/conformance_mpi.rs` launches it for W = 1..=4.
//!
//! `mpirun --oversubscribe -np 3 gradwire-mpi-conformance [name-filter]`

use gradwire_comm::{CommError, Communicator, LaunchEnv, MpiComm, MpiConfig};
use gradwire_tests::conformance::{cases, run_case};
use std::process::ExitCode;
use std::time::Instant;

/// What only MPI has: the node-local rank from a shared-memory split agrees
/// with what the launcher announced, and with the host's process count.
fn bootstrap(comm: &MpiComm) -> Result<Vec<String>, CommError> {
    let mut failures = Vec::new();
    let (local_rank, local_size) = comm.local_rank()?;
    match LaunchEnv::from_env()? {
        Some(env) => {
            if env.rank != comm.rank() || env.world_size != comm.world_size() {
                failures.push(format!(
                    "launcher says rank {} of {}, MPI says {} of {}",
                    env.rank,
                    env.world_size,
                    comm.rank(),
                    comm.world_size()
                ));
            }
            if env.local_rank.is_some_and(|l| l != local_rank)
                || env.local_size.is_some_and(|l| l != local_size)
            {
                failures.push(format!(
                    "launcher says local {:?} of {:?}, MPI says {local_rank} of {local_size}",
                    env.local_rank, env.local_size
                ));
            }
        }
        None => failures.push("no launcher environment found under mpirun".into()),
    }
    // Every process of a loopback run shares this host.
    if local_size != comm.world_size() || local_rank != comm.rank() {
        failures.push(format!(
            "one host, yet local rank {local_rank} of {local_size} for rank {} of {}",
            comm.rank(),
            comm.world_size()
        ));
    }
    Ok(failures)
}

/// What only MpiComm counts: the time a rank waits in a collective for
/// the last rank to arrive ([`gradwire_comm::CallTime::waiting`]), read
/// off the headers' times away. The last rank arrives at a barrier
/// `LATE` after the others: each of them waits most of that, and the
/// last rank less than any of them (at W = 1 nobody waits).
fn waits(comm: &MpiComm) -> Result<Vec<String>, CommError> {
    const LATE: std::time::Duration = std::time::Duration::from_millis(400);
    let (rank, world) = (comm.rank(), comm.world_size());
    let last = world - 1;
    // Every rank leaves this barrier together: the times away start alike.
    comm.barrier()?;
    let before = comm.time_in_calls().waiting;
    if rank == last && world > 1 {
        std::thread::sleep(LATE);
    }
    comm.barrier()?;
    let waited = comm.time_in_calls().waiting.saturating_sub(before);
    let mut all = vec![0f64; world];
    comm.all_gather(&[waited.as_secs_f64()], &mut all)?;
    let mut failures = Vec::new();
    let others = &all[..last];
    if world == 1 && all[0] != 0.0 {
        failures.push(format!("alone, yet waited {:.3} s", all[0]));
    }
    if let Some(least) = others.iter().copied().reduce(f64::min) {
        // Most of LATE: the planted delay, less a rank's own time away.
        if least < 0.25 {
            failures.push(format!(
                "a rank waited {least:.3} s for one {LATE:?} late: {all:?}"
            ));
        }
        if all[last] >= least {
            failures.push(format!(
                "the late rank waited as long as the others: {all:?}"
            ));
        }
    }
    Ok(failures)
}

fn main() -> ExitCode {
    let filter = std::env::args().nth(1);
    // With the timeline on, as every harness (the case `timeline` reads it).
    let config = MpiConfig {
        timeline: true,
        ..MpiConfig::default()
    };
    let comm = match MpiComm::world_with(&config) {
        Ok(comm) => comm,
        Err(e) => {
            eprintln!("gradwire-mpi-conformance: cannot start MPI: {e}");
            return ExitCode::from(2);
        }
    };
    let (rank, world) = (comm.rank(), comm.world_size());
    if rank == 0 {
        println!(
            "conformance: MpiComm on {world} rank(s), threading {:?}",
            comm.threading()
        );
    }
    let mut failed = 0usize;
    let mut ran = 0usize;
    let mut fatal = None;
    type Check = fn(&MpiComm) -> Result<Vec<String>, CommError>;
    let checks: [(&str, &str, Check); 2] = [
        (
            "bootstrap",
            "local rank from a shared-memory split",
            bootstrap,
        ),
        (
            "waits",
            "the wait for the last rank, from the headers",
            waits,
        ),
    ];
    for (name, what, check) in checks {
        if fatal.is_some() {
            break;
        }
        match check(&comm) {
            Ok(failures) => {
                for f in &failures {
                    eprintln!("rank {rank}: {name}: {f}");
                }
                // Agree on the outcome so that every rank exits alike.
                let mut any = [u8::from(!failures.is_empty())];
                match comm.all_reduce(&mut any, gradwire_comm::ReduceOp::Max) {
                    Ok(()) if any[0] != 0 => failed += 1,
                    Ok(()) => {
                        if rank == 0 {
                            println!("ok      {name} ({what})");
                        }
                    }
                    Err(e) => fatal = Some(e),
                }
            }
            Err(e) => fatal = Some(e),
        }
    }
    for case in cases::<MpiComm>() {
        if fatal.is_some() {
            break;
        }
        if filter.as_deref().is_some_and(|f| !case.name.contains(f)) {
            continue;
        }
        let start = Instant::now();
        ran += 1;
        match run_case(&comm, &case) {
            Ok(verdict) if verdict.is_empty() => {
                if rank == 0 {
                    println!(
                        "ok      {} ({:.2}s)",
                        case.name,
                        start.elapsed().as_secs_f64()
                    );
                }
            }
            Ok(verdict) => {
                failed += 1;
                if rank == 0 {
                    println!("FAILED  {}", case.name);
                    for (r, message) in verdict.iter().take(40) {
                        println!("          rank {r}: {message}");
                    }
                }
            }
            // Gathering the verdict itself failed: the communicator cannot be
            // trusted for the remaining cases.
            Err(e) => fatal = Some(e),
        }
    }
    drop(comm);
    if let Some(e) = fatal {
        eprintln!("rank {rank}: conformance stopped: {e}");
        return ExitCode::from(1);
    }
    if failed > 0 {
        if rank == 0 {
            println!("conformance: {failed} case(s) FAILED on {world} rank(s)");
        }
        return ExitCode::from(1);
    }
    if rank == 0 {
        println!("conformance: all {ran} cases passed on {world} rank(s)");
    }
    ExitCode::SUCCESS
}
