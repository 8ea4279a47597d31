//! DiLoCo's failure model: a non-finite inner step, or warm-up step, is
//! skipped alike on every rank (or fails alike) and changes nothing.

use super::*;

/// What one rank saw at each step of a run in which some steps' gradients
/// hold a NaN: its parameters after the step, and whether the step was
/// skipped (`Some(true)`), taken (`Some(false)`) or failed (`None`, with
/// the fault naming the poisoned rank).
pub(super) type Seen = Vec<(Vec<f32>, Option<bool>)>;

/// `steps` steps of `strategy` with an inner SGD of momentum 0.9 (state
/// that a skipped round must put back), `poison(rank, step)` deciding
/// which gradients hold a NaN.
pub(super) fn run_poisoned(
    world: usize,
    strategy: StrategyConfig,
    skip_non_finite: bool,
    steps: usize,
    poison: impl Fn(usize, usize) -> bool + Sync,
) -> Vec<Seen> {
    local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let dist_config = DistOptConfig {
            skip_non_finite,
            ..config(strategy)
        };
        let inner = Sgd::new(SgdConfig::default().lr(INNER_LR).momentum(0.9)).unwrap();
        let mut dist = LocalSteps::new(inner, comm, specs(), dist_config)?;
        let mut w = tensors(&initial().concat());
        let mut seen = Vec::new();
        for s in 0..steps {
            let what = format!("rank {rank}, step {s}");
            let outcome = outcome(&mut dist, &mut w, world, poison(rank, s), &what)?;
            seen.push((flat(&w), outcome));
        }
        Ok::<_, OptimError>(seen)
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

/// Rank 1's gradient holds a NaN at an inner step of the first round (1)
/// and at the second round's last step (5). Inner steps make no
/// collective, so step 1 goes on everywhere; each round's end carries the
/// fault, and every rank skips (or fails) that round alike: its
/// parameters back to the round's start, its inner optimizer (momentum
/// 0.9) too, nothing else changed. The two rounds after them are then
/// bitwise the first two rounds of a run without faults.
#[test]
fn a_non_finite_inner_step_skips_its_round_alike_and_changes_nothing() {
    let strategy = diloco(
        3,
        OuterCodec::Quantized(gradwire_compress::Quantizer::MinMaxU8),
        OuterOptimizer::Nesterov {
            lr: 0.7,
            momentum: 0.9,
        },
    );
    let world = 3;
    let poisoned = |rank: usize, s: usize| rank == 1 && (s == 1 || s == 5);
    let clean = run_poisoned(world, strategy, true, 6, |_, _| false);
    let start = initial().concat();
    for skip in [true, false] {
        let seen = run_poisoned(world, strategy, skip, 12, poisoned);
        for rank in 0..world {
            for (s, (w, outcome)) in seen[rank].iter().enumerate() {
                let what = format!("skip_non_finite {skip}, rank {rank}, step {s}");
                let round_end = s % 3 == 2;
                let lost = s == 2 || s == 5;
                let wanted = match (lost, skip) {
                    (true, true) => Some(true),
                    (true, false) => None,
                    (false, _) => Some(false),
                };
                assert_eq!(*outcome, wanted, "{what}");
                if lost {
                    // Both lost rounds began at the initial values.
                    assert_eq!(*w, start, "{what}: a skipped round changed the parameters");
                } else if s >= 6 {
                    assert_eq!(*w, clean[rank][s - 6].0, "{what}");
                } else if round_end {
                    unreachable!("{what}");
                }
            }
        }
    }
}

/// Rank 1's gradient holds a NaN at the second step of a warm-up by
/// gradients (3 steps, then rounds of 2, an inner momentum of 0.9):
/// every rank skips (or fails) that step alike before anything changes
/// (the parameters, the inner momentum, the codec's residuals, the steps
/// counted), so the run goes on as one without it: after it, step `s` is
/// step `s - 1` of a run without faults.
#[test]
fn a_non_finite_gradient_in_the_warm_up_by_gradients_is_skipped_alike_and_changes_nothing() {
    let strategy = StrategyConfig::DiLoCo(DiLoCoConfig {
        sync_every: 2,
        warmup: 3,
        warmup_by: WarmupBy::Gradients,
        codec: OuterCodec::Quantized(gradwire_compress::Quantizer::MinMaxU8),
        ..DiLoCoConfig::DEFAULT
    });
    let world = 3;
    let clean = run_poisoned(world, strategy, true, 8, |_, _| false);
    for skip in [true, false] {
        let seen = run_poisoned(world, strategy, skip, 9, |rank, s| rank == 1 && s == 1);
        for rank in 0..world {
            for (s, (w, outcome)) in seen[rank].iter().enumerate() {
                let what = format!("skip_non_finite {skip}, rank {rank}, step {s}");
                let (want_w, want_outcome) = match s {
                    0 => (&clean[rank][0].0, Some(false)),
                    1 => (&clean[rank][0].0, if skip { Some(true) } else { None }),
                    _ => (&clean[rank][s - 1].0, clean[rank][s - 1].1),
                };
                assert_eq!(*outcome, want_outcome, "{what}");
                assert_eq!(w, want_w, "{what}");
            }
        }
    }
}
