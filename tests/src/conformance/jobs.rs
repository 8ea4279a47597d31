//! The cases of asynchronous jobs: a job slot reused, and a job that
//! panics on one rank, which loses the lane of every rank.

use super::errors::still_works;
use super::{CaseError, Checks};
use gradwire_comm::{AsyncJob, CommError, Communicator, JobSlot, Pending, ReduceOp};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The job of `reused_job_slots`: an all-reduce of `value` on every rank,
/// panicking first on rank `panicker` if one is named.
struct SumJob {
    value: f32,
    panicker: Option<usize>,
}

impl<C: Communicator> AsyncJob<C> for SumJob {
    type Output = f32;

    fn run(self, comm: &C) -> gradwire_comm::Result<f32> {
        if self.panicker == Some(comm.rank()) {
            panic!("the slot's job of rank {} fails", comm.rank());
        }
        let mut sum = [self.value];
        comm.all_reduce(&mut sum, ReduceOp::Sum)?;
        Ok(sum[0])
    }
}

/// `run_job` through one slot, reused: every result right (waited, polled,
/// or after a handle dropped unwaited, which leaves the slot to a new
/// cell); a job that panics on one rank fails as `run_async`'s does (its
/// own handle `RankPanicked`, the others a `LaneLost` fault) and later jobs fail
/// at once.
pub(super) fn reused_job_slots<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let w = comm.world_size();
    let lane = comm
        .split(Some(0), 0)?
        .ok_or_else(|| CommError::InvalidArgument("split left a rank out".into()))?;
    let rank = lane.rank();
    let mut slot = JobSlot::default();
    let expected = |step: usize| (0..w).map(|r| (r + step) as f32).sum::<f32>();
    for step in 0..6 {
        let job = SumJob {
            value: (rank + step) as f32,
            panicker: None,
        };
        let mut pending = lane.run_job(&mut slot, job)?;
        let got = if step % 2 == 0 {
            pending.wait()
        } else {
            while !pending.is_ready() {
                std::thread::yield_now();
            }
            pending.wait()
        };
        checks.check(got == Ok(expected(step)), || {
            format!("step {step}: the slot's job gave {got:?}")
        });
        if step == 3 {
            // A handle dropped unwaited: the job still runs with the peers.
            let dropped = lane.run_job(
                &mut slot,
                SumJob {
                    value: 1.0,
                    panicker: None,
                },
            )?;
            drop(dropped);
            let after = lane.all_gather_async(vec![rank as u32])?.wait()?;
            checks.check(after.len() == w, || "a job after a dropped handle".into());
        }
    }
    // A panicking job on the last rank. A rank that submits after the loss
    // reached its lane is refused at once, with the same error.
    let panicker = w - 1;
    let failed = lane
        .run_job(
            &mut slot,
            SumJob {
                value: 1.0,
                panicker: Some(panicker),
            },
        )
        .and_then(Pending::wait);
    let lost = CommError::lane_lost(panicker);
    if rank == panicker {
        checks.check(
            matches!(&failed, Err(CommError::RankPanicked { rank: r, .. }) if *r == rank),
            || format!("the panicking slot's job gave {failed:?}"),
        );
    } else {
        checks.check(failed.as_ref().err() == Some(&lost), || {
            format!("the job the panicking rank left gave {failed:?}")
        });
    }
    let later = lane
        .run_job(
            &mut slot,
            SumJob {
                value: 1.0,
                panicker: None,
            },
        )
        .and_then(Pending::wait);
    checks.check(later.as_ref().err() == Some(&lost), || {
        format!("a later slot job gave {later:?}")
    });
    // The parent communicator is untouched.
    let mut one = [1u32];
    comm.all_reduce(&mut one, ReduceOp::Sum)?;
    checks.check(one == [w as u32], || {
        format!("the parent after the loss: {one:?}")
    });
    Ok(())
}

/// A job that panics on one rank loses the asynchronous lane of every rank,
/// promptly (the backends' deadlines are minutes): its own handle is
/// `RankPanicked`; a peer's job waiting in (or later reaching) a collective
/// of the lane fails with `Fault` of kind `LaneLost`; every later job
/// fails at once without running; the blocking lane goes on. Every rank in
/// turn panics before, between and after the job's two collectives, each
/// time on a fresh lane (a split of the whole group has its own); then a
/// peer waiting to receive from a rank whose job panicked fails the same
/// way. (The one implementation of this scenario: it runs on LocalComm,
/// on MpiComm under mpirun and on NcclComm.)
pub(super) fn panicking_async_job<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    const PROMPT: Duration = Duration::from_secs(5);
    const AT_ONCE: Duration = Duration::from_millis(500);
    let w = comm.world_size();
    let fresh_lane = || -> Result<C, CaseError> {
        Ok(comm
            .split(Some(0), 0)?
            .ok_or_else(|| CommError::InvalidArgument("split left a rank out".into()))?)
    };
    let points = ["before", "between", "after"];
    for (panicker, at) in (0..w).flat_map(|p| points.map(|at| (p, at))) {
        let lane = fresh_lane()?;
        let rank = lane.rank();
        let case = format!("rank {panicker} panics {at} its job's collectives");
        let start = Instant::now();
        let first = lane.run_async(move |c| {
            let fail_at = |here: &str| {
                if rank == panicker && at == here {
                    panic!("the job of rank {rank} fails {here}");
                }
            };
            fail_at("before");
            let mut sum = vec![1f32; 17];
            c.all_reduce(&mut sum, ReduceOp::Sum)?;
            fail_at("between");
            c.barrier()?;
            fail_at("after");
            Ok(sum[0])
        })?;
        let second = lane.all_gather_async(vec![rank as u32]);
        let first = first.wait();
        let second = second.and_then(Pending::wait);
        let took = start.elapsed();
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        let asked = Instant::now();
        let third = lane
            .run_async(move |_| {
                flag.store(true, Ordering::SeqCst);
                Ok(())
            })
            .and_then(Pending::wait);
        let third_took = asked.elapsed();
        let lost = CommError::lane_lost(panicker);
        if rank == panicker {
            checks.check(
                matches!(&first, Err(CommError::RankPanicked { rank: r, message })
                    if *r == rank && message.contains("fails")),
                || format!("{case}: the panicking job gave {first:?}"),
            );
        } else if at == "after" {
            checks.check(first == Ok(w as f32), || {
                format!("{case}: a job done before the panic gave {first:?}")
            });
        } else {
            checks.check(first.as_ref().err() == Some(&lost), || {
                format!("{case}: the job the panicking rank left gave {first:?}")
            });
        }
        checks.check(second.as_ref().err() == Some(&lost), || {
            format!("{case}: the job queued behind gave {second:?}")
        });
        checks.check(took < PROMPT, || format!("{case}: the jobs took {took:?}"));
        checks.check(
            third.as_ref().err() == Some(&lost) && !ran.load(Ordering::SeqCst),
            || format!("{case}: a later job gave {third:?}"),
        );
        checks.check(third_took < AT_ONCE, || {
            format!("{case}: a later job took {third_took:?} to fail")
        });
        // The lane's blocking calls, and the parent, are untouched.
        let mut one = [1u32];
        lane.all_reduce(&mut one, ReduceOp::Sum)?;
        checks.check(one == [w as u32], || {
            format!("{case}: blocking calls: {one:?}")
        });
        still_works(comm, checks, &case)?;
    }
    // A receive hears of the sender's lost lane only where messages are
    // eager: on NCCL it waits for its deadline (`Communicator::eager_messages`).
    if w >= 2 && comm.eager_messages() {
        let lane = fresh_lane()?;
        let start = Instant::now();
        let got = lane
            .run_async(|lane| {
                if lane.rank() == 0 {
                    panic!("rank 0 fails before it sends");
                }
                lane.recv(&mut [0f32; 4], 0)
            })
            .and_then(Pending::wait);
        let took = start.elapsed();
        let ok = if lane.rank() == 0 {
            matches!(got, Err(CommError::RankPanicked { rank: 0, .. }))
        } else {
            got == Err(CommError::lane_lost(0))
        };
        checks.check(ok && took < PROMPT, || {
            format!("recv from a rank whose job panicked, after {took:?}: {got:?}")
        });
    }
    Ok(())
}
