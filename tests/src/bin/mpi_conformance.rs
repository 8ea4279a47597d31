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
    match bootstrap(&comm) {
        Ok(failures) => {
            for f in &failures {
                eprintln!("rank {rank}: bootstrap: {f}");
            }
            // Agree on the outcome so that every rank exits alike.
            let mut any = [u8::from(!failures.is_empty())];
            match comm.all_reduce(&mut any, gradwire_comm::ReduceOp::Max) {
                Ok(()) if any[0] != 0 => failed += 1,
                Ok(()) => {
                    if rank == 0 {
                        println!("ok      bootstrap (local rank from a shared-memory split)");
                    }
                }
                Err(e) => fatal = Some(e),
            }
        }
        Err(e) => fatal = Some(e),
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
