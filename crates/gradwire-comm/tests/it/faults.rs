//! Fault tests of the in-process backend: every fault ends with the right
//! error on every surviving rank, within a bound, and never with a hang.
//!
//! Each test sets a deadline far longer than the bound it checks, so that a
//! result that arrives in time cannot be the deadline firing by accident
//! (except in the timeout tests, which check the deadline itself).

use gradwire_comm::{
    CommError, Communicator, Fault, FaultKind, LocalComm, LocalConfig, Pending, ReduceOp, local,
};
use std::time::{Duration, Instant};

/// Long enough never to fire in a passing test.
const LONG: Duration = Duration::from_secs(120);
/// How soon a fault must be reported once it happened: well before the
/// deadline, so a fault found only by the deadline fails, yet far above
/// what a loaded two-core machine takes to pass the word.
const PROMPT: Duration = Duration::from_secs(30);

fn config(timeout: Duration) -> LocalConfig {
    LocalConfig::with_timeout(Some(timeout))
}

/// A count-down latch: `wait` returns once `count_down` was called as many
/// times as the latch was made with. Orders the ranks' events without
/// sleeps.
struct Latch {
    left: std::sync::Mutex<usize>,
    zero: std::sync::Condvar,
}

impl Latch {
    fn new(count: usize) -> Latch {
        Latch {
            left: std::sync::Mutex::new(count),
            zero: std::sync::Condvar::new(),
        }
    }

    fn count_down(&self) {
        let mut left = self.left.lock().unwrap();
        *left = left.saturating_sub(1);
        self.zero.notify_all();
    }

    fn wait(&self) {
        let mut left = self.left.lock().unwrap();
        while *left > 0 {
            left = self.zero.wait(left).unwrap();
        }
    }
}

#[test]
fn mismatched_lengths_fail_on_every_rank_and_the_group_recovers() {
    let results = local::run_with(4, &config(LONG), |comm| {
        let len = if comm.rank() == 2 { 5 } else { 4 };
        let mut buf = vec![1f32; len];
        let first = comm.all_reduce(&mut buf, ReduceOp::Sum);
        // Same call everywhere afterwards: the group still works.
        let mut ok = vec![1f32; 3];
        let second = comm.all_reduce(&mut ok, ReduceOp::Sum).map(|()| ok);
        (first, second)
    })
    .unwrap();
    for r in results {
        let (first, second) = r.unwrap();
        match first {
            Err(CommError::Mismatch { detail }) => {
                assert!(
                    detail.contains("rank 2") && detail.contains('5'),
                    "{detail}"
                )
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
        assert_eq!(second.unwrap(), vec![4.0; 3]);
    }
}

#[test]
fn mismatched_kind_dtype_op_and_root_fail_on_every_rank() {
    let results = local::run_with(3, &config(LONG), |comm| {
        let odd = comm.rank() == 1;
        let kind = if odd {
            comm.barrier()
        } else {
            comm.all_reduce(&mut [0f32; 2], ReduceOp::Sum)
        };
        let dtype = if odd {
            comm.all_reduce(&mut [0f64; 2], ReduceOp::Sum)
        } else {
            comm.all_reduce(&mut [0f32; 2], ReduceOp::Sum)
        };
        let op = comm.all_reduce(
            &mut [0f32; 2],
            if odd { ReduceOp::Max } else { ReduceOp::Sum },
        );
        let root = comm.broadcast(&mut [0f32; 2], if odd { 1 } else { 0 });
        [kind, dtype, op, root]
    })
    .unwrap();
    for r in results {
        for (what, result) in ["kind", "dtype", "op", "root"].iter().zip(r.unwrap()) {
            assert!(
                matches!(result, Err(CommError::Mismatch { .. })),
                "{what}: {result:?}"
            );
        }
    }
}

#[test]
fn invalid_arguments_fail_on_every_rank() {
    let results = local::run_with(3, &config(LONG), |comm| {
        let avg_of_ints = comm.all_reduce(&mut [1u32; 4], ReduceOp::Avg);
        let root_out_of_range = comm.broadcast(&mut [0f32; 2], 3);
        // Only rank 0 passes a receive buffer of the wrong size.
        let mut recv = vec![0f32; if comm.rank() == 0 { 5 } else { 6 }];
        let gather = comm.all_gather(&[1f32, 2.0], &mut recv);
        let mut chunk = vec![0f32; 1];
        let scatter = comm.reduce_scatter(&[1f32; 7], &mut chunk, ReduceOp::Sum);
        let send = comm.send(&[1f32], 3);
        [avg_of_ints, root_out_of_range, gather, scatter, send]
    })
    .unwrap();
    for r in results {
        let [avg, root, gather, scatter, send] = r.unwrap();
        assert!(matches!(avg, Err(CommError::InvalidArgument(_))), "{avg:?}");
        assert!(
            matches!(root, Err(CommError::InvalidArgument(_))),
            "{root:?}"
        );
        assert!(
            matches!(gather, Err(CommError::InvalidArgument(_))),
            "{gather:?}"
        );
        // 7 elements over 3 ranks: chunks of 3, 2, 2, and every rank passed 1.
        assert!(
            matches!(scatter, Err(CommError::InvalidArgument(_))),
            "{scatter:?}"
        );
        assert!(
            matches!(
                send,
                Err(CommError::InvalidRank {
                    rank: 3,
                    world_size: 3
                })
            ),
            "{send:?}"
        );
    }
    assert!(matches!(
        LocalComm::create(0),
        Err(CommError::InvalidArgument(_))
    ));
}

fn assert_peer_lost(result: &gradwire_comm::Result<()>, lost: usize) {
    match result {
        Err(CommError::PeerLost { ranks, .. }) => assert!(ranks.contains(&lost), "{ranks:?}"),
        other => panic!("expected PeerLost({lost}), got {other:?}"),
    }
}

#[test]
fn a_panicking_rank_makes_the_others_fail_promptly() {
    let start = Instant::now();
    let results = local::run_with(4, &config(LONG), |comm| {
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(50));
            panic!("rank 1 fails in its backward pass");
        }
        let mut buf = vec![1f32; 1000];
        comm.all_reduce(&mut buf, ReduceOp::Sum)
    })
    .unwrap();
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    for (rank, r) in results.into_iter().enumerate() {
        if rank == 1 {
            match r {
                Err(CommError::RankPanicked { rank: 1, message }) => {
                    assert!(message.contains("backward"), "{message}")
                }
                other => panic!("expected RankPanicked, got {other:?}"),
            }
        } else {
            assert_peer_lost(&r.unwrap(), 1);
        }
    }
}

#[test]
fn a_dropped_rank_makes_the_others_fail_and_stay_failed() {
    let start = Instant::now();
    let results = local::run_with(3, &config(LONG), |comm| {
        if comm.rank() == 2 {
            drop(comm);
            return Vec::new();
        }
        // The first call may even start before rank 2 leaves: it must fail
        // either way, and so must every later call.
        vec![
            comm.barrier(),
            comm.all_reduce(&mut [0f32; 3], ReduceOp::Sum),
            comm.recv(&mut [0f32; 1], 2),
        ]
    })
    .unwrap();
    assert!(start.elapsed() < PROMPT, "took {:?}", start.elapsed());
    for r in &results[..2] {
        for result in r.as_ref().unwrap() {
            assert_peer_lost(result, 2);
        }
    }
}

#[test]
fn a_late_rank_times_out_everyone_naming_it() {
    let timeout = Duration::from_millis(200);
    // Rank 2 arrives only once both others have given up (a latch, not a
    // sleep: however slow the machine, it is late).
    let gave_up = Latch::new(2);
    let results = local::run_with(3, &config(timeout), |comm| {
        if comm.rank() == 2 {
            gave_up.wait();
        }
        let start = Instant::now();
        let result = comm.all_reduce(&mut [1f32; 8], ReduceOp::Sum);
        let waited = start.elapsed();
        if comm.rank() != 2 {
            gave_up.count_down();
        }
        let later = comm.barrier();
        (result, later, waited)
    })
    .unwrap();
    let mut longest = Duration::ZERO;
    for (rank, r) in results.into_iter().enumerate() {
        let (result, later, waited) = r.unwrap();
        match result {
            Err(CommError::Timeout {
                missing, waited: w, ..
            }) => {
                assert_eq!(missing, vec![2]);
                assert_eq!(w, timeout);
            }
            other => panic!("rank {rank}: expected a timeout, got {other:?}"),
        }
        assert!(
            matches!(later, Err(CommError::Timeout { .. })),
            "the group stays failed: {later:?}"
        );
        if rank != 2 {
            // The first rank to reach its deadline fails the round for all, so
            // a rank that arrived later may have waited a little less.
            assert!(waited < timeout + PROMPT, "rank {rank} waited {waited:?}");
            longest = longest.max(waited);
        }
    }
    assert!(
        longest >= timeout,
        "nobody waited for the deadline: {longest:?}"
    );
}

#[test]
fn recv_reports_timeouts_lost_senders_and_mismatched_messages() {
    let results = local::run_with(2, &config(Duration::from_millis(150)), |comm| {
        if comm.rank() == 1 {
            comm.send(&[1f32, 2.0, 3.0], 0)?;
            return Ok(None);
        }
        let mut two = [0f32; 2];
        let wrong_len = comm.recv(&mut two, 1);
        let start = Instant::now();
        let nothing = comm.recv(&mut two, 1);
        Ok::<_, CommError>(Some((wrong_len, nothing, start.elapsed())))
    })
    .unwrap();
    let (wrong_len, nothing, waited) = results[0].clone().unwrap().unwrap().unwrap();
    assert!(
        matches!(wrong_len, Err(CommError::Mismatch { .. })),
        "{wrong_len:?}"
    );
    // Rank 1 has left by now (PeerLost) unless the receive timed out first.
    assert!(
        matches!(
            nothing,
            Err(CommError::PeerLost { .. }) | Err(CommError::Timeout { .. })
        ),
        "{nothing:?}"
    );
    assert!(waited < PROMPT);

    // A sender that is alive but silent: the deadline fires.
    let gave_up = Latch::new(1);
    let results = local::run_with(2, &config(Duration::from_millis(150)), |comm| {
        if comm.rank() == 1 {
            // Alive, but busy until rank 0 gave up: then every call fails
            // with the error that poisoned the group.
            gave_up.wait();
            return comm.barrier();
        }
        let result = comm.recv(&mut [0f32; 1], 1);
        gave_up.count_down();
        result
    })
    .unwrap();
    assert!(
        matches!(&results[0], Ok(Err(CommError::Timeout { missing, .. })) if missing == &vec![1]),
        "{:?}",
        results[0]
    );
    assert!(
        matches!(&results[1], Ok(Err(CommError::Timeout { .. }))),
        "{:?}",
        results[1]
    );
}

#[test]
fn async_jobs_see_a_lost_peer() {
    let results = local::run_with(3, &config(LONG), |comm| {
        if comm.rank() == 0 {
            panic!("rank 0 leaves before the asynchronous all-reduce");
        }
        let pending = comm.all_reduce_async(vec![1f32; 100], ReduceOp::Sum);
        pending.and_then(|p| p.wait()).map(|_| ())
    })
    .unwrap();
    for r in &results[1..] {
        assert_peer_lost(r.as_ref().unwrap(), 0);
    }
}

#[test]
fn a_fault_in_one_sub_group_leaves_the_other_working() {
    let results = local::run_with(4, &config(LONG), |comm| {
        let color = (comm.rank() % 2) as u32;
        let sub = comm.split(Some(color), 0)?.expect("every rank has a color");
        if color == 0 {
            // Group {0, 2}: a mismatch, then a lost peer.
            let mismatch = sub.all_reduce(&mut vec![0f32; 1 + sub.rank()], ReduceOp::Sum);
            assert!(
                matches!(mismatch, Err(CommError::Mismatch { .. })),
                "{mismatch:?}"
            );
            if sub.rank() == 1 {
                drop(sub);
                return Ok(0.0);
            }
            let lost = sub.barrier();
            assert!(matches!(lost, Err(CommError::PeerLost { .. })), "{lost:?}");
            Ok(0.0)
        } else {
            // Group {1, 3} goes on undisturbed.
            let mut total = 0.0;
            for step in 0..50 {
                let mut v = vec![step as f64];
                sub.all_reduce(&mut v, ReduceOp::Sum)?;
                total += v[0];
            }
            Ok::<_, CommError>(total)
        }
    })
    .unwrap();
    let expected: f64 = (0..50).map(|s| 2.0 * s as f64).sum();
    assert_eq!(results[1].clone().unwrap().unwrap(), expected);
    assert_eq!(results[3].clone().unwrap().unwrap(), expected);
}

#[test]
fn run_reports_the_first_panic() {
    let result = local::run(3, |comm| {
        if comm.rank() == 2 {
            panic!("boom");
        }
        comm.barrier()
    });
    assert!(
        matches!(result, Err(CommError::RankPanicked { rank: 2, .. })),
        "{result:?}"
    );
}

// A single rank's panicking job (every rank in turn, before, between and
// after the job's collectives, and a peer receiving from it) is the
// conformance suite's `panicking_async_job`, run on every backend.

#[test]
fn jobs_panicking_on_every_rank_end_every_lane() {
    for world in 1..=4 {
        let results = local::run_with(world, &config(LONG), |comm| {
            let first = comm
                .run_async(|lane| -> gradwire_comm::Result<()> {
                    panic!("rank {} fails too", lane.rank())
                })
                .and_then(Pending::wait);
            let later = comm.run_async(|_| Ok(())).and_then(Pending::wait);
            (first, later)
        })
        .unwrap();
        let mut panicked = 0;
        for (rank, r) in results.into_iter().enumerate() {
            let (first, later) = r.unwrap();
            // A job that had not started when a peer's lane was lost does
            // not run: it fails with the loss instead of panicking.
            match first {
                Err(CommError::RankPanicked { rank: r, .. }) if r == rank => panicked += 1,
                Err(CommError::Fault(Fault {
                    rank: Some(r),
                    kind: FaultKind::LaneLost,
                    ..
                })) if r != rank && r < world => {}
                other => panic!("rank {rank}: {other:?}"),
            }
            // Whichever loss reached this lane first: a lost lane, by name.
            assert!(
                matches!(later, Err(CommError::Fault(Fault { rank: Some(r), kind: FaultKind::LaneLost, .. })) if r < world),
                "{later:?}"
            );
        }
        assert!(panicked >= 1, "world {world}: no job panicked");
    }
}

#[test]
fn dropping_a_communicator_lets_its_queued_jobs_finish() {
    let results = local::run_with(3, &config(LONG), |comm| {
        let rank = comm.rank();
        let pending: Vec<_> = (0..8)
            .map(|i| comm.all_reduce_async(vec![(rank + i) as u64; 5], ReduceOp::Sum))
            .collect::<Result<_, _>>()?;
        drop(comm);
        pending
            .into_iter()
            .map(|p| p.wait().map(|v| v[0]))
            .collect::<Result<Vec<_>, _>>()
    })
    .unwrap();
    for r in results {
        assert_eq!(
            r.unwrap().unwrap(),
            (0..8).map(|i| 3 + 3 * i).collect::<Vec<u64>>()
        );
    }
}

#[test]
fn asynchronous_jobs_cannot_start_further_asynchronous_jobs() {
    let results = local::run(2, |comm| {
        comm.run_async(|lane| lane.run_async(|_| Ok(())).map(|_| ()))?
            .wait()
    })
    .unwrap();
    for r in results {
        assert!(matches!(r, Err(CommError::InvalidArgument(_))), "{r:?}");
    }
}
