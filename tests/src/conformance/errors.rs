//! The cases of errors: mismatches, invalid arguments and posted faults
//! reported the same on every rank, the fault matrix, and the communicator
//! usable afterwards.

use super::{CaseError, Checks};
use gradwire_comm::{CommError, Communicator, Fault, FaultKind, ReduceOp, chunk_range};

/// Whether `result` is a mismatch on this rank; records a failure otherwise.
fn expect_mismatch(checks: &mut Checks, what: &str, result: Result<(), CommError>) {
    checks.check(matches!(result, Err(CommError::Mismatch { .. })), || {
        format!("{what}: expected Mismatch, got {result:?}")
    });
}

fn expect_invalid(checks: &mut Checks, what: &str, result: Result<(), CommError>) {
    checks.check(
        matches!(
            result,
            Err(CommError::InvalidArgument(_) | CommError::InvalidRank { .. })
        ),
        || format!("{what}: expected an invalid-argument error, got {result:?}"),
    );
}

/// Checks that the communicator still works: an all-reduce and a
/// point-to-point exchange give the right answers.
pub(super) fn still_works<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
    after: &str,
) -> Result<(), CaseError> {
    let w = comm.world_size();
    let mut v = [comm.rank() as f32; 3];
    comm.all_reduce(&mut v, ReduceOp::Sum)?;
    let want = (0..w).map(|r| r as f32).sum::<f32>();
    checks.check(v == [want; 3], || {
        format!("after {after}: all_reduce gave {v:?}")
    });
    Ok(())
}

pub(super) fn mismatches<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    if w == 1 {
        // One rank cannot disagree with itself; the group must simply work.
        return still_works(comm, checks, "nothing");
    }
    let odd = rank == w - 1;
    // Length: every rank learns which rank differed and how.
    let len = if odd { 5 } else { 4 };
    let result = comm.all_reduce(&mut vec![1f32; len], ReduceOp::Sum);
    checks.check(
        matches!(&result, Err(CommError::Mismatch { detail })
            if detail.contains(&format!("rank {}", w - 1)) && detail.contains('5')),
        || format!("length mismatch: {result:?}"),
    );
    still_works(comm, checks, "a length mismatch")?;
    let kind = if odd {
        comm.barrier()
    } else {
        comm.all_reduce(&mut [0f32; 2], ReduceOp::Sum)
    };
    expect_mismatch(checks, "kind", kind);
    still_works(comm, checks, "a kind mismatch")?;
    let dtype = if odd {
        comm.all_reduce(&mut [0f64; 2], ReduceOp::Sum)
    } else {
        comm.all_reduce(&mut [0f32; 2], ReduceOp::Sum)
    };
    expect_mismatch(checks, "dtype", dtype);
    let op = comm.all_reduce(
        &mut [0f32; 2],
        if odd { ReduceOp::Max } else { ReduceOp::Sum },
    );
    expect_mismatch(checks, "op", op);
    let root = comm.broadcast(&mut [0f32; 2], usize::from(odd));
    expect_mismatch(checks, "root", root);
    let gather = if odd {
        comm.all_gather(&[0u8; 3], &mut vec![0u8; 3 * w])
    } else {
        comm.all_gather(&[0u8; 2], &mut vec![0u8; 2 * w])
    };
    expect_mismatch(checks, "all_gather length", gather);
    let scatter = comm.reduce_scatter(
        &vec![1i32; if odd { 9 } else { 8 }],
        &mut [0i32; 0],
        ReduceOp::Sum,
    );
    expect_mismatch(checks, "reduce_scatter length", scatter);
    // Asynchronous collectives are checked the same way.
    let pending = comm.all_reduce_async(vec![0f32; len], ReduceOp::Sum)?;
    expect_mismatch(checks, "async length", pending.wait().map(|_| ()));
    still_works(comm, checks, "the mismatches")?;
    // A message of the wrong type or length is a mismatch for its receiver,
    // and is consumed: the next message is received normally.
    let next = (rank + 1) % w;
    let prev = (rank + w - 1) % w;
    // Sends before receives only where messages are eager (see
    // `point_to_point`).
    let send_first = comm.eager_messages() || rank % 2 == 0;
    let send_all = || -> Result<(), CommError> {
        comm.send(&[1f64, 2.0], next)?;
        comm.send(&[3f32; 4], next)?;
        comm.send(&[5f32; 2], next)
    };
    if send_first {
        send_all()?;
    }
    let wrong_type = comm.recv(&mut [0f32; 2], prev);
    expect_mismatch(checks, "recv of another type", wrong_type);
    let wrong_len = comm.recv(&mut [0f32; 3], prev);
    expect_mismatch(checks, "recv of another length", wrong_len);
    let mut right = [0f32; 2];
    comm.recv(&mut right, prev)?;
    if !send_first {
        send_all()?;
    }
    checks.check(right == [5.0; 2], || {
        format!("recv after mismatches: {right:?}")
    });
    still_works(comm, checks, "point-to-point mismatches")
}

pub(super) fn invalid_arguments<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    expect_invalid(
        checks,
        "root out of range",
        comm.broadcast(&mut [0f32; 2], w),
    );
    expect_invalid(
        checks,
        "Avg of integers",
        comm.all_reduce(&mut [1i32; 2], ReduceOp::Avg),
    );
    // One rank's receive buffer is wrong: every rank fails.
    let recv_len = if rank == 0 { 2 * w + 1 } else { 2 * w };
    expect_invalid(
        checks,
        "all_gather receive length",
        comm.all_gather(&[0f32; 2], &mut vec![0f32; recv_len]),
    );
    let chunk = chunk_range(10, w, rank).len() + usize::from(rank == w - 1);
    expect_invalid(
        checks,
        "reduce_scatter receive length",
        comm.reduce_scatter(&[1f32; 10], &mut vec![0f32; chunk], ReduceOp::Sum),
    );
    // Local checks, no collective involved.
    expect_invalid(checks, "send to a rank out of range", comm.send(&[0u8], w));
    expect_invalid(
        checks,
        "recv from a rank out of range",
        comm.recv(&mut [0u8], w + 3),
    );
    still_works(comm, checks, "invalid arguments")
}

/// A rank that posts a fault in place of its next collective ends that
/// collective on every rank, whatever the others called, with the same
/// `Fault` (the lowest faulting rank and its code); the group stays usable,
/// every rank at the same point of its sequence.
pub(super) fn posted_faults<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    let expect = |checks: &mut Checks, what: &str, got: Result<(), CommError>, want: CommError| {
        checks.check(got.as_ref().err() == Some(&want), || {
            format!("{what}: expected {want:?}, got {got:?}")
        });
    };
    // The last rank faults while the others all-reduce, gather or wait.
    let faulty = w - 1;
    let want = CommError::Fault(Fault::posted(faulty, FaultKind::Code(7)));
    let calls: [&dyn Fn() -> Result<(), CommError>; 3] = [
        &|| comm.all_reduce(&mut [1f32; 5], ReduceOp::Sum),
        &|| comm.all_gather_varied(&vec![2u8; rank + 1]).map(|_| ()),
        &|| comm.barrier(),
    ];
    for (i, call) in calls.iter().enumerate() {
        let got = if rank == faulty {
            Err(comm.post_fault(FaultKind::Code(7)))
        } else {
            call()
        };
        expect(checks, &format!("fault during call {i}"), got, want.clone());
        still_works(comm, checks, "a posted fault")?;
    }
    // Several ranks fault at once: the lowest one is named, with its code.
    let got = if rank % 2 == 1 || w == 1 {
        Err(comm.post_fault(FaultKind::Code(100 + rank as u32)))
    } else {
        comm.all_reduce(&mut [0f64; 3], ReduceOp::Max)
    };
    let first = if w == 1 { 0 } else { 1 };
    expect(
        checks,
        "faults on several ranks",
        got,
        CommError::Fault(Fault::posted(first, FaultKind::Code(100 + first as u32))),
    );
    // On the asynchronous lane too.
    let got = if rank == faulty {
        comm.run_async(move |comm| Err::<(), _>(comm.post_fault(FaultKind::Code(300))))?
            .wait()
    } else {
        comm.all_reduce_async(vec![1f32; 4], ReduceOp::Sum)?
            .wait()
            .map(|_| ())
    };
    expect(
        checks,
        "an asynchronous fault",
        got,
        CommError::Fault(Fault::posted(faulty, FaultKind::Code(300))),
    );
    let pending = comm.all_reduce_async(vec![1f32; 2], ReduceOp::Sum)?;
    let sum = pending.wait()?;
    checks.check(sum == vec![w as f32; 2], || {
        format!("the asynchronous lane after a fault: {sum:?}")
    });
    still_works(comm, checks, "the posted faults")
}

/// The fault matrix of `gradwire_experiments::faults` on this backend: for every
/// mode and fault, every rank sees the same outcome at every step, the
/// steps after the fault complete, and the ranks end bitwise equal (each
/// scenario on its own duplicate; the records compared after an
/// all-gather, `faults::run_share_on`). `GRADWIRE_FAULT_SHARE=i/n` runs
/// the i-th of n shares of the scenarios only (`gpu_suite.sh` runs the
/// shares side by side on a GPU machine, where each scenario's fresh
/// communicators take half a second).
pub(super) fn fault_matrix<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    use gradwire_experiments::faults::{Share, run_share_on};
    let share = match std::env::var("GRADWIRE_FAULT_SHARE") {
        Ok(text) => Share::parse(&text)?,
        Err(_) => Share::WHOLE,
    };
    for report in run_share_on(comm, share)? {
        checks.check(report.holds(), || {
            format!(
                "{} / {} / skip {}: at the fault step {:?}, agreed {}, recovered {}, equal {:?}",
                report.mode.name(),
                report.fault.name(),
                report.skip_non_finite,
                report.at_fault,
                report.agreed,
                report.recovered,
                report.equal
            )
        });
    }
    Ok(())
}
