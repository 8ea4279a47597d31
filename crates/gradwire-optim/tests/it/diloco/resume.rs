//! DiLoCo's checkpoints: a round, the warm-up by gradients and a round
//! with a pending fault resume bitwise, and a pending fault of any rank
//! survives a resume at another world size.

use super::faults::{Seen, run_poisoned};
use super::*;

#[test]
fn a_round_resumes_bitwise_from_a_checkpoint_taken_mid_round() {
    let strategy = diloco(
        4,
        OuterCodec::TopK(0.3),
        OuterOptimizer::Nesterov {
            lr: 0.7,
            momentum: 0.9,
        },
    );
    resumes_bitwise(strategy, 0.0, 6, 10);
}

/// In the warm-up by gradients (top-k's residuals and the inner momentum
/// carried across it), and at its last step (θ_global not yet taken
/// again), a checkpoint resumes bitwise.
#[test]
fn the_warm_up_by_gradients_resumes_bitwise_from_a_checkpoint() {
    let strategy = StrategyConfig::DiLoCo(DiLoCoConfig {
        sync_every: 2,
        codec: OuterCodec::TopK(0.3),
        warmup: 3,
        warmup_by: WarmupBy::Gradients,
        ..DiLoCoConfig::DEFAULT
    });
    for at in [1, 3] {
        resumes_bitwise(strategy, 0.9, at, 8);
    }
}

/// `steps` steps of `strategy` (an inner SGD of momentum `inner_momentum`)
/// on 3 ranks, checkpointed after step `at` and resumed on a loop made
/// afresh: every rank's parameters after each later step bitwise those of
/// the run without the resume.
fn resumes_bitwise(strategy: StrategyConfig, inner_momentum: f64, at: usize, steps: usize) {
    let world = 3;
    let inner = || Sgd::new(SgdConfig::default().lr(INNER_LR).momentum(inner_momentum));
    let straight = run_inner(world, config(strategy), steps, inner_momentum);
    let resumed = local::run(world, |comm: LocalComm| {
        let comm2 = comm.split(Some(0), comm.rank() as i64)?.expect("a member");
        let mut dist = LocalSteps::new(inner()?, comm, specs(), config(strategy))?;
        let mut w = tensors(&initial().concat());
        for _ in 0..at {
            step(&mut dist, &mut w, world, false)?;
        }
        let (mut again, mut w) =
            checkpoint_and_resume(dist, &w, comm2, config(strategy), inner()?)?;
        let mut after = Vec::new();
        for _ in at..steps {
            step(&mut again, &mut w, world, false)?;
            after.push(flat(&w));
        }
        Ok::<_, OptimError>(after)
    })
    .unwrap();
    for (rank, resumed) in resumed.into_iter().enumerate() {
        assert_eq!(
            resumed.unwrap(),
            straight[rank][at..steps].to_vec(),
            "{strategy}, resumed after step {at}, rank {rank}"
        );
    }
}

/// A checkpoint taken in the middle of a round in which rank 1 already
/// failed holds that fault and the inner optimizer's state at the round's
/// start: the resumed run skips the round exactly as the straight one.
#[test]
fn a_round_with_a_pending_fault_resumes_bitwise() {
    let strategy = diloco(
        4,
        OuterCodec::Dense,
        OuterOptimizer::Nesterov {
            lr: 0.7,
            momentum: 0.9,
        },
    );
    let world = 3;
    let poisoned = |rank: usize, s: usize| rank == 1 && s == 5;
    let straight = run_poisoned(world, strategy, true, 12, poisoned);
    let resumed: Vec<Seen> = local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let comm2 = comm.split(Some(0), rank as i64)?.expect("a member");
        let dist_config = DistOptConfig {
            skip_non_finite: true,
            ..config(strategy)
        };
        let inner = || Sgd::new(SgdConfig::default().lr(INNER_LR).momentum(0.9)).unwrap();
        let mut dist = LocalSteps::new(inner(), comm, specs(), dist_config.clone())?;
        let mut w = tensors(&initial().concat());
        for s in 0..6 {
            step(&mut dist, &mut w, world, poisoned(rank, s))?;
        }
        let (mut again, mut w) = checkpoint_and_resume(dist, &w, comm2, dist_config, inner())?;
        let mut seen = Vec::new();
        for s in 6..12 {
            let stats = step(&mut again, &mut w, world, poisoned(rank, s))?;
            seen.push((flat(&w), Some(stats.non_finite)));
        }
        Ok::<_, OptimError>(seen)
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    for rank in 0..world {
        assert_eq!(resumed[rank], straight[rank][6..12].to_vec(), "rank {rank}");
        // Step 7 ended the poisoned round: skipped on every rank.
        assert_eq!(resumed[rank][1].1, Some(true), "rank {rank}");
    }
}

/// A checkpoint set taken in the middle of a round in which rank 2 (not
/// rank 0) already failed, resumed at another world size: the resumed
/// round carries that fault on every new rank and is skipped alike, the
/// parameters back to the round's start (the initial values), as the run
/// that saved it would have skipped it (once, rank 0's checkpoint alone
/// decided, and the round completed with rank 2's stalled parameters in
/// the mean).
#[test]
fn a_pending_fault_of_any_rank_survives_a_resume_at_another_size() {
    let strategy = diloco(
        4,
        OuterCodec::Dense,
        OuterOptimizer::Nesterov {
            lr: 0.7,
            momentum: 0.9,
        },
    );
    let dist_config = DistOptConfig {
        skip_non_finite: true,
        ..config(strategy)
    };
    let inner = || Sgd::new(SgdConfig::default().lr(INNER_LR).momentum(0.9)).unwrap();
    let old = 3;
    let saved: Vec<gradwire_optim::checkpoint::Checkpoint> = local::run(old, |comm: LocalComm| {
        let rank = comm.rank();
        let mut dist = LocalSteps::new(inner(), comm, specs(), dist_config.clone())?;
        let mut w = tensors(&initial().concat());
        for s in 0..2 {
            step(&mut dist, &mut w, old, rank == 2 && s == 1)?;
        }
        let mut ckpt = dist.checkpoint()?;
        let names = names();
        ckpt.set_parameters(names.iter().map(String::as_str).zip(w.iter()));
        Ok::<_, OptimError>(ckpt)
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    let pending =
        |c: &gradwire_optim::checkpoint::Checkpoint| c.state.values.contains_key("outer/fault");
    assert!(
        !pending(&saved[0]) && pending(&saved[2]),
        "only rank 2 holds the fault"
    );
    let start = initial().concat();
    for new in [1, 2, 4] {
        let seen = local::run(new, |comm: LocalComm| {
            let mut dist = LocalSteps::new(inner(), comm, specs(), dist_config.clone())?;
            let own = dist.resharded(&saved)?;
            dist.restore(&own)?;
            let names = names();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut w = tensors(&own.flat_parameters(&names)?);
            let mut skipped = Vec::new();
            for _ in 2..4 {
                skipped.push(step(&mut dist, &mut w, new, false)?.non_finite);
            }
            Ok::<_, OptimError>((skipped, flat(&w)))
        })
        .unwrap();
        for (rank, r) in seen.into_iter().enumerate() {
            let (skipped, w) = r.unwrap_or_else(|e| panic!("W = {old} -> {new}, rank {rank}: {e}"));
            assert_eq!(skipped, [false, true], "W = {old} -> {new}, rank {rank}");
            assert_eq!(
                w, start,
                "W = {old} -> {new}, rank {rank}: the skipped round's start"
            );
        }
    }
}
