//! A test binary of its own: it is an MPI program (its own `main`, no
//! harness) that starts itself under `mpirun`.
//!
//! MpiComm's failure model under `mpirun` (feature `mpi`): every wait has a
//! deadline, and a fault is an error on every rank, never a hang. (A
//! panicking asynchronous job is the conformance suite's
//! `panicking_async_job`, which runs on MpiComm under mpirun too.)
//!
//! One binary, two roles. Run by `cargo test` (no argument), it starts
//! itself under `mpirun --oversubscribe -np W` for W = 1..=4 with
//! `--mpi-faults-rank`, and fails unless every run exits 0 with rank 0's
//! pass line. Under mpirun, each rank runs the scenarios and checks what it
//! sees; the ranks gather their failures over a healthy communicator, so
//! all agree on the verdict and the exit code:
//!
//! - `recv_timeout` (W >= 2): rank 0 receives from rank 1, which never
//!   sends. At a short deadline rank 0 gets `Timeout` naming rank 1, and
//!   every later call of every rank returns that same error, promptly.
//! - `collective_timeout` (W >= 2): the last rank does not enter an
//!   all-reduce until well after the deadline. The others get `Timeout` at
//!   the deadline; the late rank fails at once when it arrives (it never
//!   blocks in a data phase nobody else enters).
//! - `departure` (W >= 2): the last rank sends rank 0 a message and drops
//!   its communicator (returns early); rank 0 receives the message, then
//!   the others' calls fail with `PeerLost` naming it, from the notice the
//!   drop sent, not at the deadline.
//!
//! - `sigkill` (its own mpirun, W = 3): the last rank kills itself with
//!   SIGKILL in the middle of a loop of all-reduces. No rank may hang: the
//!   job must end within [`KILL_LIMIT`] with a failure status (Open MPI's
//!   runtime sees the process die and terminates the others), and no
//!   surviving rank may report the loop completed.
//!
//! Without MPI (`mpirun` not on the PATH) it prints a loud SKIP and passes;
//! with `GRADWIRE_REQUIRE_MPI=1` that is a failure.

use gradwire_comm::{
    CommError, Communicator, Fault, FaultKind, FlightPhase, MpiComm, MpiConfig, ReduceOp,
};
use gradwire_tests::mpirun;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// The argument that makes this binary a rank.
const RANK_FLAG: &str = "--mpi-faults-rank";
/// The argument that makes this binary a rank of the SIGKILL run.
const KILL_FLAG: &str = "--mpi-faults-sigkill";
/// How long the job may take to end once a rank was killed.
const KILL_LIMIT: Duration = Duration::from_secs(60);
/// The short deadline of the timeout scenarios: long enough that a loaded
/// machine keeps the one order they take from time (a rank that sleeps
/// half of it still arrives a second before the deadline); the others are
/// signalled.
const SHORT: Duration = Duration::from_secs(2);
/// How soon a fault must be reported once it happened (the default
/// deadline, 10 minutes, is far longer).
const PROMPT: Duration = Duration::from_secs(10);
/// How soon a call on a poisoned communicator must fail: no wait on a
/// peer, and half the deadline it would otherwise wait out.
const AT_ONCE: Duration = Duration::from_secs(1);
/// One mpirun's limit: a hang is a failure, not a stuck test.
const RUN_LIMIT: Duration = Duration::from_secs(300);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == RANK_FLAG) {
        return rank_main();
    }
    if args.iter().any(|a| a == KILL_FLAG) {
        return sigkill_main();
    }
    if args.iter().any(|a| a == "--list") {
        println!("mpi_faults: test");
        return ExitCode::SUCCESS;
    }
    launch()
}

// ---------------------------------------------------------------- launcher

/// The SKIP (or the failure, when MPI is required).
fn unavailable(why: &str) -> ExitCode {
    let run = "run `cargo test -p gradwire-tests --features mpi --test mpi_faults`";
    if mpirun::skip("MpiComm fault tests", why, run) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn launch() -> ExitCode {
    let Some(mpirun) = mpirun::mpirun() else {
        return unavailable("`mpirun` is not on the PATH (Debian: apt-get install openmpi-bin)");
    };
    let binary = match std::env::current_exe() {
        Ok(path) => path,
        Err(e) => return unavailable(&format!("cannot find this test binary: {e}")),
    };
    let mut failed = false;
    for world in 1..=4 {
        let mpirun::Run { ok, output, took } =
            mpirun::run(&mpirun, &binary, &[RANK_FLAG], world, RUN_LIMIT);
        let passed = format!("mpi_faults: every scenario passed on {world} rank(s)");
        let ok = ok && output.contains(&passed);
        println!(
            "--- mpirun -np {world} ({:.1}s): {} ---\n{output}",
            took.as_secs_f64(),
            if ok { "ok" } else { "FAILED" }
        );
        failed |= !ok;
    }
    // SIGKILL: the job ends, promptly and as a failure, on every rank.
    let mpirun::Run { ok, output, took } =
        mpirun::run(&mpirun, &binary, &[KILL_FLAG], 3, KILL_LIMIT);
    let completed = output.contains("sigkill: loop completed");
    let prompt = took < KILL_LIMIT;
    let good = !ok && !completed && prompt;
    println!(
        "--- mpirun -np 3, rank 2 killed with SIGKILL ({:.1}s): {} ---\n{output}",
        took.as_secs_f64(),
        if good {
            "ok (the job ended as a failure)"
        } else {
            "FAILED"
        }
    );
    failed |= !good;
    if failed {
        println!("test mpi_faults ... FAILED");
        ExitCode::FAILURE
    } else {
        println!("test mpi_faults ... ok");
        ExitCode::SUCCESS
    }
}

// ------------------------------------------------------------------- ranks

/// What a scenario found wrong on this rank.
type Failures = Vec<String>;

fn check(failures: &mut Failures, ok: bool, message: impl FnOnce() -> String) {
    if !ok {
        failures.push(message());
    }
}

/// A communicator of every rank with the short deadline.
fn short() -> Result<MpiComm, CommError> {
    MpiComm::world_with(&MpiConfig::with_timeout(Some(SHORT)))
}

/// A communicator of every rank beside the one a scenario breaks, on
/// which one rank tells another that something has happened (an event,
/// not a sleep, orders the two).
fn signals() -> Result<MpiComm, CommError> {
    MpiComm::world_with(&MpiConfig::with_timeout(Some(RUN_LIMIT / 2)))
}

/// Rank 0 waits for a message rank 1 never sends.
fn recv_timeout(failures: &mut Failures) -> Result<(), CommError> {
    let comm = short()?;
    let signals = signals()?;
    let rank = comm.rank();
    let want = CommError::Timeout {
        op: "recv",
        waited: SHORT,
        missing: vec![1],
    };
    let start = Instant::now();
    match rank {
        0 => {
            let got = comm.recv(&mut [0f32; 4], 1);
            let took = start.elapsed();
            check(failures, got.as_ref().err() == Some(&want), || {
                format!("recv with no sender: {got:?}")
            });
            check(failures, took >= SHORT && took < SHORT + PROMPT, || {
                format!("recv with no sender returned after {took:?}")
            });
            // Rank 1 goes on once rank 0 has given up.
            signals.send(&[1u8], 1)?;
        }
        // Rank 1 is alive but busy until rank 0 gave up; the others arrive
        // at a barrier before rank 0's deadline.
        1 => signals.recv(&mut [0u8], 0)?,
        _ => std::thread::sleep(SHORT / 2),
    }
    // Every later call of every rank returns rank 0's error, at once for
    // the ranks that arrive after it gave up (not after their own deadline).
    let asked = Instant::now();
    let later = comm.barrier();
    let took = asked.elapsed();
    check(failures, later.as_ref().err() == Some(&want), || {
        format!("barrier after rank 0's timeout: {later:?}")
    });
    let bound = if rank >= 2 { SHORT } else { AT_ONCE };
    check(failures, took < bound, || {
        format!("barrier after rank 0's timeout took {took:?}")
    });
    let again = comm.all_reduce(&mut [1u32; 3], ReduceOp::Sum);
    check(failures, again.as_ref().err() == Some(&want), || {
        format!("the communicator stays failed: {again:?}")
    });
    // No rank leaves the signals' communicator (a departure its peers
    // would see) before every signal was taken.
    signals.barrier()
}

/// The last rank enters an all-reduce long after the deadline.
fn collective_timeout(failures: &mut Failures) -> Result<(), CommError> {
    let comm = short()?;
    let signals = signals()?;
    let (rank, w) = (comm.rank(), comm.world_size());
    let late = rank == w - 1;
    // MPI cannot tell who is missing from a collective: `missing` is empty,
    // and every rank (the first to give up told the others) has this error.
    let want = CommError::Timeout {
        op: "all_reduce",
        waited: SHORT,
        missing: vec![],
    };
    if late {
        // In only once rank 0 has given up.
        signals.recv(&mut [0u8], 0)?;
    }
    let start = Instant::now();
    let mut buf = [1f32; 1000];
    let got = comm.all_reduce(&mut buf, ReduceOp::Sum);
    let took = start.elapsed();
    if rank == 0 {
        signals.send(&[1u8], w - 1)?;
    }
    check(failures, got.as_ref().err() == Some(&want), || {
        format!("all_reduce that the last rank missed: {got:?}")
    });
    // The flight recorder (the protocol's, which NcclComm shares): the
    // all-reduce is every rank's last record, failed with that error, at
    // the same sequence number on every rank.
    let records = comm.flight_records();
    let last = records.last();
    check(
        failures,
        last.is_some_and(|r| {
            r.op == "all_reduce"
                && r.phase == FlightPhase::Failed
                && r.error.as_deref() == got.as_ref().err().map(|e| e.to_string()).as_deref()
                && r.seq + 1 == records.len() as u64
        }),
        || format!("flight records after the timeout: {records:?}"),
    );
    if late {
        check(failures, took < AT_ONCE, || {
            format!("the late rank waited {took:?} to learn the others gave up")
        });
    } else {
        // The first rank to reach its deadline tells the others, who may
        // have entered a little later.
        check(failures, took >= SHORT / 2 && took < SHORT + PROMPT, || {
            format!("all_reduce returned after {took:?}")
        });
    }
    let asked = Instant::now();
    let later = comm.barrier();
    let took = asked.elapsed();
    check(
        failures,
        later.as_ref().err() == Some(&want) && took < AT_ONCE,
        || format!("barrier after the timeout, {took:?}: {later:?}"),
    );
    // As in `recv_timeout`: every signal taken before any rank leaves.
    signals.barrier()
}

/// The last rank sends rank 0 a message, then drops its communicator
/// without another call on it (a rank that returns early, on an error):
/// rank 0 still receives the message; then every other rank's calls on it,
/// collective and point-to-point, fail with `PeerLost` naming that rank,
/// from the notice its drop sent, whichever comes first, the drop or the
/// call. The deadline is long: reaching it would be a `Timeout`. Run twice,
/// so the second communicator may reuse the first's MPI context with the
/// first's notices still about.
fn departure(failures: &mut Failures) -> Result<(), CommError> {
    for _ in 0..2 {
        let comm = MpiComm::world_with(&MpiConfig::with_timeout(Some(RUN_LIMIT / 2)))?;
        let (rank, w) = (comm.rank(), comm.world_size());
        if rank == w - 1 {
            comm.send(&[7f32; 4], 0)?;
            drop(comm);
            continue;
        }
        if rank == 0 {
            let mut sent = [0f32; 4];
            let got = comm.recv(&mut sent, w - 1);
            check(failures, got.is_ok() && sent == [7.0; 4], || {
                format!("the message sent before leaving: {got:?}, {sent:?}")
            });
        }
        let want = CommError::PeerLost {
            op: "drop",
            ranks: vec![w - 1],
        };
        let got = comm.all_reduce(&mut [1f32; 1000], ReduceOp::Sum);
        check(failures, got.as_ref().err() == Some(&want), || {
            format!("all_reduce after the last rank left: {got:?}")
        });
        let got = comm.recv(&mut [0f32; 4], w - 1);
        check(failures, got.as_ref().err() == Some(&want), || {
            format!("recv from the rank that left: {got:?}")
        });
        let got = comm.barrier();
        check(failures, got.as_ref().err() == Some(&want), || {
            format!("barrier after the last rank left: {got:?}")
        });
    }
    Ok(())
}

/// The 16-bit sum of `len` small integers (rank `r` holds `(r + i) % 5` at
/// `i`) through `MPI_Allreduce` and the user-defined operation: exact in
/// either format whatever MPI's order, so known bit for bit.
fn half_sum<H: gradwire_comm::Element + PartialEq + std::fmt::Debug>(
    comm: &MpiComm,
    failures: &mut Failures,
    len: usize,
    name: &str,
    from_f32: fn(f32) -> H,
) -> Result<(), CommError> {
    let (rank, w) = (comm.rank(), comm.world_size());
    let want = |i: usize| from_f32((0..w).map(|r| ((r + i) % 5) as f32).sum::<f32>());
    let mut buf: Vec<H> = (0..len)
        .map(|i| from_f32(((rank + i) % 5) as f32))
        .collect();
    comm.library_all_reduce(&mut buf, ReduceOp::Sum)?;
    let wrong = (0..len).find(|&i| buf[i] != want(i));
    check(failures, wrong.is_none(), || {
        format!("{name} sum, len {len}: [{wrong:?}] wrong")
    });
    Ok(())
}

/// `MpiComm::library_all_reduce` (MPI's own algorithm): sums against an
/// f64 reference at lengths 0, 1 and primes, the same result on every rank,
/// 16-bit sums (exact on small integers), and every refusal (a mismatched
/// length, `Avg`, the maximum of f16, a posted fault) on every rank alike,
/// the communicator usable after each.
fn library_all_reduce(failures: &mut Failures) -> Result<(), CommError> {
    use gradwire_comm::CallTime;
    let comm = MpiComm::world()?;
    let (rank, w) = (comm.rank(), comm.world_size());
    let value = |r: usize, i: usize| ((r * 7919 + i * 104_729) % 2003) as f32 / 97.0 - 10.0;
    let before = comm.time_in_calls();
    for len in [0usize, 1, 2, 13, 1021, 65_537] {
        let mut buf: Vec<f32> = (0..len).map(|i| value(rank, i)).collect();
        comm.library_all_reduce(&mut buf, ReduceOp::Sum)?;
        for (i, &got) in buf.iter().enumerate() {
            let want: f64 = (0..w).map(|r| f64::from(value(r, i))).sum();
            // W terms of magnitude <= 11 each, any order: W ulps of 11 W.
            let bound = (w * w) as f64 * 11.0 * f64::from(f32::EPSILON);
            if (f64::from(got) - want).abs() > bound {
                failures.push(format!("len {len}: [{i}] = {got}, want {want}"));
                break;
            }
        }
        // MPI's sum is the same on every rank.
        let bits: Vec<u32> = buf.iter().map(|x| x.to_bits()).collect();
        let mut root = bits.clone();
        comm.broadcast(&mut root, 0)?;
        check(failures, root == bits, || {
            format!("len {len}: this rank's sum differs from rank 0's")
        });
    }
    let mut ints = vec![rank as i64; 5];
    comm.library_all_reduce(&mut ints, ReduceOp::Max)?;
    check(failures, ints == vec![w as i64 - 1; 5], || {
        format!("max of ranks: {ints:?}")
    });
    // The refusals: every rank gets the same error, and the next call works.
    let unsupported = |got: &Result<(), CommError>| matches!(got, Err(CommError::Unsupported(_)));
    let got = comm.library_all_reduce(&mut [1f32; 4], ReduceOp::Avg);
    check(failures, unsupported(&got), || format!("Avg: {got:?}"));
    // 16-bit sums through the user-defined operation: small integers add
    // exactly in either format, whatever MPI's order, so the sum is known
    // bit for bit; at lengths 0, 1 and primes, on every rank alike.
    for len in [0usize, 1, 13, 1021] {
        half_sum(&comm, failures, len, "f16", half::f16::from_f32)?;
        half_sum(&comm, failures, len, "bf16", half::bf16::from_f32)?;
    }
    let got = comm.library_all_reduce(&mut [half::f16::ONE; 4], ReduceOp::Max);
    check(failures, unsupported(&got), || format!("f16 max: {got:?}"));
    if w > 1 {
        let mut buf = vec![1f32; if rank == 0 { 3 } else { 4 }];
        let got = comm.library_all_reduce(&mut buf, ReduceOp::Sum);
        check(
            failures,
            matches!(got, Err(CommError::Mismatch { .. })),
            || format!("mismatched lengths: {got:?}"),
        );
        // A gradwire all-reduce never pairs with MPI's.
        let mut buf = [1f32; 4];
        let got = if rank == 0 {
            comm.all_reduce(&mut buf, ReduceOp::Sum)
        } else {
            comm.library_all_reduce(&mut buf, ReduceOp::Sum)
        };
        check(
            failures,
            matches!(got, Err(CommError::Mismatch { .. })),
            || format!("all_reduce beside library_all_reduce: {got:?}"),
        );
        let got = if rank == w - 1 {
            Err(comm.post_fault(FaultKind::Code(7)))
        } else {
            comm.library_all_reduce(&mut [1f32; 4], ReduceOp::Sum)
        };
        check(
            failures,
            got == Err(CommError::Fault(Fault::posted(w - 1, FaultKind::Code(7)))),
            || format!("a posted fault: {got:?}"),
        );
    }
    let mut buf = [1f32; 3];
    comm.library_all_reduce(&mut buf, ReduceOp::Sum)?;
    check(failures, buf == [w as f32; 3], || {
        format!("after the refusals: {buf:?}")
    });
    let after: CallTime = comm.time_in_calls();
    check(failures, after.caller > before.caller, || {
        format!("time in calls did not grow: {before:?} -> {after:?}")
    });
    Ok(())
}

/// A rank of the SIGKILL run: all-reduces in a loop; the last rank kills
/// itself in the middle. A survivor that got out of the loop says so, which
/// the launcher counts as a failure (it should have been terminated or
/// failed).
fn sigkill_main() -> ExitCode {
    let world = match MpiComm::world() {
        Ok(comm) => comm,
        Err(e) => {
            eprintln!("sigkill: cannot start MPI: {e}");
            return ExitCode::from(2);
        }
    };
    let (rank, w) = (world.rank(), world.world_size());
    for step in 0..200 {
        if step == 20 && rank == w - 1 {
            let pid = std::process::id().to_string();
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            std::thread::sleep(Duration::from_secs(30));
        }
        let mut v = [1f32; 1024];
        if let Err(e) = world.all_reduce(&mut v, ReduceOp::Sum) {
            println!("sigkill: rank {rank} failed at step {step}: {e}");
            return ExitCode::FAILURE;
        }
    }
    println!("sigkill: loop completed on rank {rank}");
    ExitCode::SUCCESS
}

fn rank_main() -> ExitCode {
    // The verdict travels on a communicator no scenario breaks (its
    // deadline is the default: the scenarios' bounds are far shorter).
    let world = match MpiComm::world() {
        Ok(comm) => comm,
        Err(e) => {
            eprintln!("mpi_faults: cannot start MPI: {e}");
            return ExitCode::from(2);
        }
    };
    let (rank, w) = (world.rank(), world.world_size());
    type Scenario = fn(&mut Failures) -> Result<(), CommError>;
    let scenarios: [(&str, Scenario, usize); 4] = [
        ("recv_timeout", recv_timeout, 2),
        ("collective_timeout", collective_timeout, 2),
        ("departure", departure, 2),
        ("library_all_reduce", library_all_reduce, 1),
    ];
    let mut failed = 0;
    for (name, scenario, least) in scenarios {
        if w < least {
            continue;
        }
        let start = Instant::now();
        let mut failures = Failures::new();
        if let Err(e) = scenario(&mut failures) {
            failures.push(format!("stopped with an error: {e}"));
        }
        let text = failures.join("\n");
        let gathered = match world.all_gather_varied(text.as_bytes()) {
            Ok(gathered) => gathered,
            Err(e) => {
                eprintln!("rank {rank}: cannot gather the verdict of {name}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let lines: Vec<(usize, String)> = (0..w)
            .flat_map(|r| {
                String::from_utf8_lossy(gathered.part(r))
                    .lines()
                    .map(|l| (r, l.to_string()))
                    .collect::<Vec<_>>()
            })
            .collect();
        if lines.is_empty() {
            if rank == 0 {
                println!("ok      {name} ({:.2}s)", start.elapsed().as_secs_f64());
            }
        } else {
            failed += 1;
            if rank == 0 {
                println!("FAILED  {name}");
                for (r, line) in lines {
                    println!("          rank {r}: {line}");
                }
            }
        }
    }
    drop(world);
    if failed > 0 {
        return ExitCode::FAILURE;
    }
    if rank == 0 {
        println!("mpi_faults: every scenario passed on {w} rank(s)");
    }
    ExitCode::SUCCESS
}
