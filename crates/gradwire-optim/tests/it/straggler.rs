//! `StepStats::straggler`: the rank the others waited for at a step's
//! exchange, named alike on every rank, with one vote per step and one per
//! bucket, at W = 2 and 4; nobody at W = 1. And `StepStats::coordination`:
//! a wait in the per-step vote is counted there, outside the combining.

use crate::common::{named_specs, small_buckets};
use gradwire_comm::{Communicator, local};
use gradwire_optim::{GradSync, SkipVote, StepStats, StepStraggler, StrategyConfig};
use std::time::Duration;

const SHAPES: &[&[usize]] = &[&[1], &[13], &[4, 7]];

/// How long the late rank of a step dawdles before its gradients: far
/// beyond what a loaded machine's scheduler delays a rank by.
const DAWDLE: Duration = Duration::from_millis(250);

/// Each step's straggler as one rank saw it; rank `step % W` dawdles at
/// step `step`.
fn stragglers(world: usize, vote: SkipVote) -> Vec<Vec<Option<StepStraggler>>> {
    steps(world, vote)
        .into_iter()
        .map(|rank| rank.iter().map(|s| s.straggler).collect())
        .collect()
}

/// Each step's stats on each rank; rank `step % W` dawdles at step `step`.
fn steps(world: usize, vote: SkipVote) -> Vec<Vec<StepStats>> {
    local::run(world, |comm| {
        let rank = comm.rank();
        let config = gradwire_optim::DistOptConfig {
            vote,
            ..small_buckets(StrategyConfig::Dense, 1)
        };
        let mut sync = GradSync::new(comm, named_specs(SHAPES), config)?;
        let mut seen = Vec::new();
        let mut out: Vec<Vec<f32>> = SHAPES
            .iter()
            .map(|s| vec![0.0; s.iter().product()])
            .collect();
        for step in 0..2 {
            if rank == step % world {
                std::thread::sleep(DAWDLE);
            }
            for (k, g) in out.iter().enumerate().rev() {
                sync.push(k, &vec![rank as f32 + 1.0; g.len()])?;
            }
            let mut buffers: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            seen.push(sync.finish(&mut buffers)?);
        }
        Ok::<_, gradwire_optim::OptimError>(seen)
    })
    .unwrap()
    .into_iter()
    .map(Result::unwrap)
    .collect()
}

#[test]
fn the_rank_that_arrives_late_is_named_on_every_rank() {
    for vote in [SkipVote::PerStep, SkipVote::PerBucket] {
        for world in [2, 4] {
            let seen = stragglers(world, vote);
            for (step, s) in seen[0].iter().enumerate() {
                let s =
                    s.unwrap_or_else(|| panic!("{vote:?}, W = {world}: step {step} names nobody"));
                assert_eq!(s.rank, step % world, "{vote:?}, W = {world}, step {step}");
                // Its dawdling, less what the fastest rank took.
                assert!(s.late >= DAWDLE / 2, "{vote:?}, W = {world}: {s:?}");
            }
            assert!(
                seen.iter().all(|r| *r == seen[0]),
                "{vote:?}, W = {world}: {seen:?}"
            );
        }
    }
    // One rank waits for nobody.
    assert_eq!(stragglers(1, SkipVote::PerStep), vec![vec![None; 2]]);
}

/// With one vote per step, the ranks that did not dawdle wait for the late
/// one in the vote, before any bucket is combined: the wait is
/// coordination, not combining. (From the second step: the first one's
/// wait is in the broadcast that decides the bucket order.)
#[test]
fn a_wait_in_the_per_step_vote_is_coordination() {
    let world = 2;
    let seen = steps(world, SkipVote::PerStep);
    for (rank, stats) in seen.iter().enumerate() {
        for (step, s) in stats.iter().enumerate().skip(1) {
            if rank != step % world {
                assert!(
                    s.coordination >= DAWDLE / 2,
                    "rank {rank}, step {step}: {s:?}"
                );
            }
        }
    }
}
