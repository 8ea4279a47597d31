//! The failure model, measured on LocalComm: DistOpt under injected faults
//! (a NaN, an infinity, a bad push, a bad parameter, an optimizer error on
//! one rank) in every mode, on 1 to 8 ranks, and under random fault
//! schedules. Every rank must see the same outcome at every step, the steps
//! after a fault must complete, and the ranks must end bitwise equal
//! (`gradwire_experiments::faults`; `gradwire faults` prints the same matrix);
//! a checkpoint restored between any two steps of such a schedule changes
//! nothing.

use gradwire_comm::{LocalConfig, local};
use gradwire_experiments::faults::{self, Fault, Outcome};
use gradwire_optim::StrategyConfig;
use std::time::Duration;

/// A deadline no passing scenario comes near (a hang would fail here).
const DEADLINE: Duration = Duration::from_secs(120);
/// How long the fault step may take on the slowest rank: the fault is
/// carried by the step's own collectives, not found by a deadline (a
/// quarter of it, far above what a loaded two-core machine needs).
const PROMPT: Duration = Duration::from_secs(30);

#[test]
fn every_scenario_keeps_the_failure_model_on_1_to_8_ranks() {
    for world in 1..=8 {
        let reports = faults::run_local(world, DEADLINE).expect("the matrix ran");
        let broken: Vec<_> = reports.iter().filter(|r| !r.holds()).cloned().collect();
        assert!(
            broken.is_empty(),
            "W = {world}:\n{}",
            faults::table(&broken, "local", world)
        );
        for r in &reports {
            assert!(
                r.time_to_outcome < PROMPT,
                "W = {world}, {} / {}: {:?}",
                r.mode.name(),
                r.fault.name(),
                r.time_to_outcome
            );
        }
    }
}

/// xorshift64*: a seeded generator for the schedules (no dependency).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }
}

/// Steps of each scheduled scenario.
const SCHEDULE_STEPS: usize = 6;

/// Up to `count` random faults `mode` takes (the draws of the others are
/// dropped), each at a step below `steps` on a rank below `world`.
fn random_faults(
    rng: &mut Rng,
    mode: StrategyConfig,
    world: usize,
    count: usize,
    steps: usize,
) -> Vec<(usize, usize, Fault)> {
    let mut schedule = Vec::new();
    for _ in 0..count {
        let fault = Fault::ALL[1 + rng.below(Fault::ALL.len() - 1)];
        if fault.injectable_in(mode) {
            schedule.push((rng.below(steps), rng.below(world), fault));
        }
    }
    schedule
}

#[test]
fn random_fault_schedules_keep_ranks_in_step_and_change_nothing_when_they_fail() {
    let mut rng = Rng(0x5EED_F00D_0BAD_CAFE);
    for case in 0..48 {
        let world = 1 + rng.below(8);
        let examples = StrategyConfig::examples();
        let mode = examples[rng.below(examples.len())];
        let skip = rng.below(2) == 0;
        // Up to three faults at any step but the last.
        let count = rng.below(4);
        let schedule = random_faults(&mut rng, mode, world, count, SCHEDULE_STEPS - 1);
        keeps_ranks_in_step(&format!("case {case}"), world, mode, skip, &schedule);
    }
}

/// A bad call at the outer loops' very first step, before `θ_global` was
/// ever taken (a parameter of the wrong shape, on the first rank or the
/// last), is one fault, carried by its round or fragment: `θ_global` is
/// taken at the next good call and every later step completes (once, a
/// streaming rank took the bad call's parameter as its `θ_global` and
/// failed every later exchange of that fragment).
#[test]
fn a_bad_first_call_in_the_outer_loops_is_one_fault() {
    for text in [
        "diloco:2:uint8",
        "streaming-diloco:4:2:tau=1:uint8",
        "streaming-diloco:4:2:e3m0",
    ] {
        let mode: StrategyConfig = text.parse().expect("a registry form");
        for world in 1..=4 {
            for rank in [0, world - 1] {
                let schedule = [(0, rank, Fault::WrongShape)];
                let outcomes =
                    keeps_ranks_in_step("a bad first call", world, mode, false, &schedule);
                let carried = faults::reported_at(mode, 0);
                assert_ne!(
                    outcomes[carried],
                    Outcome::Done,
                    "{text}, W = {world}: the fault is carried at step {carried}"
                );
            }
        }
    }
}

/// A push under an unknown name at the gradient loop's first step on rank
/// 0, whose pushes give the bucket order, decides no order: the step fails
/// on every rank and the next one decides, so stateful codecs, whose
/// chunks follow the buckets, end bitwise as a run that never took the
/// failed step (once, the failed step's order, the unknown push's
/// parameter last, stayed for the run).
#[test]
fn a_failed_first_step_decides_no_bucket_order() {
    for text in ["e3m0", "topk:0.3", "powersgd:1:start=1:min-rate=1"] {
        let mode: StrategyConfig = text.parse().expect("a registry form");
        for world in 1..=4 {
            let schedule = [(0, 0, Fault::UnknownName)];
            let outcomes =
                keeps_ranks_in_step("a failed first step", world, mode, false, &schedule);
            assert_ne!(outcomes[0], Outcome::Done, "{text}, W = {world}");
        }
    }
}

/// Runs `schedule` (step, rank, fault) on `world` ranks in `mode` and
/// checks the failure model: every rank sees the same outcomes, a step is
/// done unless a fault is reported at it, and a failed step changed
/// nothing. Returns the outcomes.
fn keeps_ranks_in_step(
    case: &str,
    world: usize,
    mode: StrategyConfig,
    skip: bool,
    schedule: &[(usize, usize, Fault)],
) -> Vec<Outcome> {
    const STEPS: usize = SCHEDULE_STEPS;
    let results = local::run_with(world, &LocalConfig::with_timeout(Some(DEADLINE)), |comm| {
        faults::run_schedule(comm, mode, schedule, skip, STEPS)
    })
    .expect("ranks ran");
    let mut records: Vec<_> = results
        .into_iter()
        .map(|r| r.expect("no panic").expect("the scenario ran"))
        .collect();
    let what = format!("{case}: W = {world}, {mode}, skip {skip}, {schedule:?}");
    for (rank, r) in records.iter().enumerate() {
        assert_eq!(
            r.outcomes, records[0].outcomes,
            "{what}: rank {rank} differs"
        );
    }
    // A step is done unless a fault is reported at it (the step it was
    // injected at, or in the outer loops the exchange that carries it).
    for step in 0..STEPS {
        if !schedule
            .iter()
            .any(|(s, _, _)| faults::reported_at(mode, *s) == step)
        {
            assert_eq!(
                records[0].outcomes[step],
                Outcome::Done,
                "{what}: step {step}"
            );
        }
    }
    let partial_update = schedule.iter().any(|(_, _, f)| !f.passes());
    let restored = schedule.iter().all(|(s, _, f)| f.restores(mode, *s));
    // Partial averaging and DiLoCo's inner steps keep ranks apart.
    let apart = matches!(
        mode,
        StrategyConfig::Partial { .. } | StrategyConfig::DiLoCo(_)
    );
    if !apart && !partial_update {
        for (rank, r) in records.iter().enumerate() {
            assert!(
                r.params == records[0].params,
                "{what}: rank {rank}'s parameters differ"
            );
        }
    }
    // A failed or skipped step changed nothing: every rank ends as in a
    // run that never took those steps (partial mode too; in DiLoCo the
    // failed round's steps).
    if restored {
        let omitted: Vec<usize> = (0..STEPS)
            .filter(|&s| {
                (0..STEPS).any(|f| {
                    records[0].outcomes[f] != Outcome::Done
                        && faults::steps_lost(mode, f).contains(&s)
                })
            })
            .collect();
        let clean = local::run_with(world, &LocalConfig::with_timeout(Some(DEADLINE)), |comm| {
            faults::run_without(comm, mode, skip, &omitted, STEPS)
        })
        .expect("ranks ran");
        for (rank, (r, c)) in records.iter().zip(clean).enumerate() {
            let c = c.expect("no panic").expect("the clean run ran");
            assert!(
                r.params == c.params,
                "{what}: rank {rank} differs from a run without steps {omitted:?}"
            );
        }
    }
    records.swap_remove(0).outcomes
}

/// A rank that panics, drops its communicator, or whose strategy panics is
/// lost: every other rank's step fails naming it, promptly, never a hang.
#[test]
fn a_rank_that_panics_or_leaves_is_lost_on_every_other_rank_promptly() {
    for world in 1..=8 {
        let reports = faults::run_local_terminal(world, DEADLINE).expect("the matrix ran");
        for r in &reports {
            assert!(
                r.holds() && r.time_to_outcome < PROMPT,
                "W = {world}:\n{}",
                faults::terminal_table(std::slice::from_ref(r), "local", world)
            );
        }
    }
}

/// A checkpoint taken between two steps of a faulty schedule and restored
/// into a new front end on the same communicator changes nothing: every
/// rank's outcomes and parameters are bitwise the run's without it,
/// whatever the schedule left pending there (a fault kept for a round's
/// end, a fragment in flight, a bucket order not yet decided).
#[test]
fn a_checkpoint_between_any_two_steps_of_a_faulty_run_resumes_bitwise() {
    let mut rng = Rng(0x0C4E_C4B0_1A7E_5EED);
    let mut case = 0;
    for mode in StrategyConfig::examples() {
        for _ in 0..4 {
            case += 1;
            resumes_bitwise(case, &mut rng, mode);
        }
    }
}

/// One case of the test above: a random world, schedule and step to
/// restore before (in half the cases the step after a fault, where a
/// fault may be pending).
fn resumes_bitwise(case: usize, rng: &mut Rng, mode: StrategyConfig) {
    let world = 1 + rng.below(6);
    let skip = rng.below(2) == 0;
    let count = 1 + rng.below(3);
    let schedule = random_faults(rng, mode, world, count, SCHEDULE_STEPS);
    let resume_at = match schedule.first() {
        Some(&(step, _, _)) if rng.below(2) == 0 => (step + 1) % SCHEDULE_STEPS,
        _ => rng.below(SCHEDULE_STEPS),
    };
    let what = format!(
        "case {case}: W = {world}, {mode}, skip {skip}, {schedule:?}, restored before step {resume_at}"
    );
    let config = LocalConfig::with_timeout(Some(DEADLINE));
    let straight = local::run_with(world, &config, |comm| {
        faults::run_schedule(comm, mode, &schedule, skip, SCHEDULE_STEPS)
    })
    .expect("ranks ran");
    let resumed = local::run_with(world, &config, |comm| {
        faults::run_schedule_resumed(comm, mode, &schedule, skip, SCHEDULE_STEPS, resume_at)
    })
    .expect("ranks ran");
    for (rank, (s, r)) in straight.into_iter().zip(resumed).enumerate() {
        let s = s.expect("no panic").expect("the run ran");
        let r = r
            .expect("no panic")
            .unwrap_or_else(|e| panic!("{what}: rank {rank}'s restore: {e}"));
        assert_eq!(r.outcomes, s.outcomes, "{what}: rank {rank}'s outcomes");
        assert!(r.params == s.params, "{what}: rank {rank}'s parameters");
    }
}
