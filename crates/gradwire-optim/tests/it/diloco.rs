//! DiLoCo (`StrategyConfig::DiLoCo` on `LocalSteps`) against an f64
//! reference written from the paper's rules (Douillard et al., 2023,
//! Algorithm 1), not from the code: every rank takes H inner SGD steps on
//! its shard from θ_global, Δ = mean_i (θ_global - θ_i), and the outer
//! optimizer (SGD with Nesterov momentum as PyTorch's, or Adam) applies Δ to
//! θ_global, from which every rank goes on. Worlds of 1 to 4 ranks, several
//! rounds, every rank within rounding of the reference after every step
//! and bitwise equal to the others after each round, with and without a
//! warm-up (one-step rounds applied as they are, or synchronous SGD steps
//! by gradients, an inner momentum telling the two apart); with H = 1,
//! dense and an outer SGD of lr 1 without momentum, the loop is
//! synchronous data-parallel SGD; with every codec, what a round did not
//! apply is owed by the residuals (no mass lost); a round, and the warm-up
//! by gradients, resume bitwise from a checkpoint; a non-finite inner
//! step, or warm-up step, is skipped alike.

use gradwire_comm::{Communicator, FaultKind, LocalComm, local};
use gradwire_optim::{
    DiLoCoConfig, DistOpt, DistOptConfig, LocalSteps, OptimError, OuterCodec, OuterOptimizer, Sgd,
    SgdConfig, StepStats, StrategyConfig, WarmupBy,
};
use gradwire_tensor::Tensor;

use crate::common::{BATCH, BLOCKS, initial, sample, specs};

pub(crate) const INNER_LR: f64 = 0.05;

/// The mean-squared-error gradient of `w` (f64, flat) over `range`.
pub(crate) fn gradient64(w: &[f64], range: std::ops::Range<usize>) -> Vec<f64> {
    let n = range.len() as f64;
    let mut g = vec![0.0; w.len()];
    for i in range {
        let (x, y) = sample(i);
        let err = x.iter().zip(w).map(|(a, b)| a * b).sum::<f64>() - y;
        for (gj, xj) in g.iter_mut().zip(&x) {
            *gj += err * xj / n;
        }
    }
    g
}

/// The reference: `warmup` rounds of one inner step each, then `rounds`
/// rounds of `h` inner steps with the outer optimizer (counting its steps
/// from its first round) on `world` ranks; every rank's parameters after
/// each step (at a round's end, θ_global). The inner optimizer is SGD with
/// momentum `inner_momentum` as PyTorch's (`b = μ b + g`, `w -= lr b`),
/// each rank's buffer its own and kept from round to round. A warm-up
/// round by parameters is one inner step on every rank whose mean Δ is
/// applied as it is (`θ_global -= Δ`: post-local SGD's start); by
/// gradients, one step of synchronous SGD: the mean gradient at θ_global,
/// the same on every rank, into every rank's buffer.
fn reference(
    world: usize,
    warmup: usize,
    by: WarmupBy,
    h: usize,
    rounds: usize,
    outer: OuterOptimizer,
    inner_momentum: f64,
) -> Vec<Vec<Vec<f64>>> {
    let mut global: Vec<f64> = initial().into_iter().flatten().map(f64::from).collect();
    let d = global.len();
    let (mut b, mut m, mut v) = (vec![0.0; d], vec![0.0; d], vec![0.0; d]);
    let mut buffers = vec![vec![0.0; d]; world];
    let shard = BATCH / world;
    let mut out: Vec<Vec<Vec<f64>>> = Vec::new();
    let mut outer_steps = 0;
    for warm in (0..warmup).map(|_| true).chain((0..rounds).map(|_| false)) {
        if warm && by == WarmupBy::Gradients {
            let mut mean = vec![0.0; d];
            for rank in 0..world {
                let g = gradient64(&global, rank * shard..(rank + 1) * shard);
                for (mj, gj) in mean.iter_mut().zip(g) {
                    *mj += gj / world as f64;
                }
            }
            for buffer in &mut buffers {
                for (bj, gj) in buffer.iter_mut().zip(&mean) {
                    *bj = inner_momentum * *bj + gj;
                }
            }
            for (wj, bj) in global.iter_mut().zip(&buffers[0]) {
                *wj -= INNER_LR * bj;
            }
            out.push(vec![global.clone(); world]);
            continue;
        }
        let steps = if warm { 1 } else { h };
        let mut ws = vec![global.clone(); world];
        for _ in 0..steps {
            for (rank, (w, buffer)) in ws.iter_mut().zip(&mut buffers).enumerate() {
                let g = gradient64(w, rank * shard..(rank + 1) * shard);
                for ((wj, bj), gj) in w.iter_mut().zip(buffer.iter_mut()).zip(g) {
                    *bj = inner_momentum * *bj + gj;
                    *wj -= INNER_LR * *bj;
                }
            }
            out.push(ws.clone());
        }
        let mut delta = vec![0.0; d];
        for w in &ws {
            for j in 0..d {
                delta[j] += (global[j] - w[j]) / world as f64;
            }
        }
        match outer {
            _ if warm => {
                for j in 0..d {
                    global[j] -= delta[j];
                }
            }
            OuterOptimizer::Nesterov { lr, momentum } => {
                let (lr, mu) = (f64::from(lr), f64::from(momentum));
                for j in 0..d {
                    b[j] = mu * b[j] + delta[j];
                    global[j] -= lr * (delta[j] + mu * b[j]);
                }
            }
            OuterOptimizer::Adam { lr } => {
                let (lr, b1, b2, eps) = (f64::from(lr), 0.9, 0.999, 1e-8);
                // The outer optimizer's step count, from its first round.
                outer_steps += 1;
                let t = outer_steps;
                for j in 0..d {
                    m[j] = b1 * m[j] + (1.0 - b1) * delta[j];
                    v[j] = b2 * v[j] + (1.0 - b2) * delta[j] * delta[j];
                    let mh = m[j] / (1.0 - b1.powi(t));
                    let vh = v[j] / (1.0 - b2.powi(t));
                    global[j] -= lr * mh / (vh.sqrt() + eps);
                }
            }
        }
        // Every rank goes on from θ_global.
        if let Some(last) = out.last_mut() {
            *last = vec![global.clone(); world];
        }
    }
    out
}

fn config(strategy: StrategyConfig) -> DistOptConfig {
    DistOptConfig {
        strategy,
        fusion_threshold: 16,
        ..DistOptConfig::default()
    }
}

fn diloco(h: u32, codec: OuterCodec, outer: OuterOptimizer) -> StrategyConfig {
    StrategyConfig::DiLoCo(DiLoCoConfig {
        sync_every: h,
        codec,
        outer,
        ..DiLoCoConfig::DEFAULT
    })
}

/// One rank's parameters as tensors, from flat values.
pub(crate) fn tensors(flat: &[f32]) -> Vec<Tensor> {
    let mut at = 0;
    BLOCKS
        .iter()
        .map(|&n| {
            let t = Tensor::from_vec(flat[at..at + n].to_vec(), n).unwrap();
            at += n;
            t
        })
        .collect()
}

pub(crate) fn flat(w: &[Tensor]) -> Vec<f32> {
    w.iter().flat_map(|t| t.to_vec::<f32>().unwrap()).collect()
}

/// One step of `dist` on this rank's shard (`poison`: a NaN in the
/// gradient).
pub(crate) fn step(
    dist: &mut LocalSteps<Sgd, LocalComm>,
    w: &mut [Tensor],
    world: usize,
    poison: bool,
) -> Result<StepStats, OptimError> {
    let grads = shard_gradients(w, world, dist.rank(), poison);
    let names = names();
    dist.step(items(&names, w, grads))
}

/// `dist` checkpointed after its parameters reached `w`, dropped, and a
/// loop of `config` with `inner` built on `comm` and restored from it:
/// the resumed loop and its parameters.
pub(crate) fn checkpoint_and_resume(
    dist: LocalSteps<Sgd, LocalComm>,
    w: &[Tensor],
    comm: LocalComm,
    config: DistOptConfig,
    inner: Sgd,
) -> Result<(LocalSteps<Sgd, LocalComm>, Vec<Tensor>), OptimError> {
    let ckpt = dist.checkpoint()?;
    let saved = flat(w);
    drop(dist);
    let mut again = LocalSteps::new(inner, comm, specs(), config)?;
    again.restore(&ckpt)?;
    Ok((again, tensors(&saved)))
}

/// One step of `dist` as the rank saw it: `Some(skipped)`, or `None` for
/// a fault, which must be rank 1's non-finite gradient.
pub(crate) fn outcome(
    dist: &mut LocalSteps<Sgd, LocalComm>,
    w: &mut [Tensor],
    world: usize,
    poison: bool,
    what: &str,
) -> Result<Option<bool>, OptimError> {
    match step(dist, w, world, poison) {
        Ok(stats) => Ok(Some(stats.non_finite)),
        Err(OptimError::Fault(fault)) => {
            assert_eq!(fault.kind, FaultKind::NonFinite, "{what}");
            assert_eq!(fault.rank, Some(1), "{what}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Rank `rank`'s gradients of `w` on its shard of the batch (`poison`: a
/// NaN in the first entry).
pub(crate) fn shard_gradients(
    w: &[Tensor],
    world: usize,
    rank: usize,
    poison: bool,
) -> Vec<Tensor> {
    let shard = BATCH / world;
    let values: Vec<f64> = flat(w).into_iter().map(f64::from).collect();
    let mut g = gradient64(&values, rank * shard..(rank + 1) * shard);
    if poison {
        g[0] = f64::NAN;
    }
    let g: Vec<f32> = g.iter().map(|&v| v as f32).collect();
    tensors(&g)
}

/// The blocks' names, in forward order.
pub(crate) fn names() -> Vec<String> {
    (0..BLOCKS.len()).map(|b| format!("w{b}")).collect()
}

/// A step's `(name, parameter, gradient)` items.
pub(crate) fn items<'a>(
    names: &'a [String],
    w: &'a mut [Tensor],
    grads: Vec<Tensor>,
) -> impl Iterator<Item = (&'a str, &'a mut Tensor, Option<Tensor>)> + 'a {
    names
        .iter()
        .map(String::as_str)
        .zip(w.iter_mut())
        .zip(grads.into_iter().map(Some))
        .map(|((n, p), g)| (n, p, g))
}

pub(crate) fn inner_sgd() -> Sgd {
    Sgd::new(SgdConfig::default().lr(INNER_LR)).unwrap()
}

/// `steps` steps of `strategy` on `world` ranks; every rank's flat
/// parameters after each step.
fn run(world: usize, strategy: StrategyConfig, steps: usize) -> Vec<Vec<Vec<f32>>> {
    run_with(world, config(strategy), steps)
}

/// [`run`] with the whole configuration given.
pub(crate) fn run_with(
    world: usize,
    dist_config: DistOptConfig,
    steps: usize,
) -> Vec<Vec<Vec<f32>>> {
    run_inner(world, dist_config, steps, 0.0)
}

/// [`run_with`] with an inner SGD of momentum `inner_momentum`.
fn run_inner(
    world: usize,
    dist_config: DistOptConfig,
    steps: usize,
    inner_momentum: f64,
) -> Vec<Vec<Vec<f32>>> {
    local::run(world, |comm: LocalComm| {
        let inner = Sgd::new(SgdConfig::default().lr(INNER_LR).momentum(inner_momentum))?;
        let mut dist = LocalSteps::new(inner, comm, specs(), dist_config.clone())?;
        let mut w = tensors(&initial().concat());
        let mut after = Vec::new();
        for _ in 0..steps {
            step(&mut dist, &mut w, world, false)?;
            after.push(flat(&w));
        }
        Ok::<_, OptimError>(after)
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

#[test]
fn diloco_follows_the_papers_rules_on_1_to_4_ranks() {
    follows_the_reference(0, WarmupBy::Parameters, 3, 4, 0.0);
}

#[test]
fn a_warm_up_of_one_step_rounds_then_the_papers_rules_on_1_to_4_ranks() {
    follows_the_reference(3, WarmupBy::Parameters, 2, 3, 0.0);
}

/// With an inner momentum, the warm-up by gradients (one buffer, the mean
/// gradient's, on every rank) and by parameters (each rank's own buffer)
/// part at the first inner step after the warm-up: each is checked
/// against its own reference, which differ there.
#[test]
fn a_warm_up_by_gradients_is_synchronous_sgd_then_the_papers_rules_on_1_to_4_ranks() {
    follows_the_reference(3, WarmupBy::Gradients, 2, 3, 0.9);
    follows_the_reference(3, WarmupBy::Parameters, 2, 3, 0.9);
    let outer = OuterOptimizer::Nesterov {
        lr: 0.7,
        momentum: 0.9,
    };
    let by = |by| reference(3, 3, by, 2, 3, outer, 0.9);
    let (gradients, parameters) = (by(WarmupBy::Gradients), by(WarmupBy::Parameters));
    // Rank 0 after the first inner step of the first round (step 3).
    let apart = gradients[3][0]
        .iter()
        .zip(&parameters[3][0])
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    // Ten times the tolerance `follows_the_reference` grants at step 3.
    let scale = gradients[3][0].iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let tol = 1e-5 * scale * 4.0;
    assert!(
        apart > 10.0 * tol,
        "the two warm-ups are {apart} apart (tolerance {tol}): the test would not tell them apart"
    );
}

/// `warmup` rounds of one step (combined as `by` says), then `rounds` of
/// `h`, with each outer optimizer on 1 to 4 ranks and an inner SGD of
/// momentum `inner_momentum`, against [`reference`]: every rank within
/// f32's rounding of the reference after every step, and bitwise equal to
/// the others at each round's end.
fn follows_the_reference(
    warmup: usize,
    by: WarmupBy,
    h: usize,
    rounds: usize,
    inner_momentum: f64,
) {
    for outer in [
        OuterOptimizer::Nesterov {
            lr: 0.7,
            momentum: 0.9,
        },
        OuterOptimizer::Adam { lr: 0.01 },
    ] {
        for world in 1..=4 {
            let what = format!("warm-up {warmup} by {by:?}, {outer:?}, W = {world}");
            let want = reference(world, warmup, by, h, rounds, outer, inner_momentum);
            let strategy = StrategyConfig::DiLoCo(DiLoCoConfig {
                sync_every: h as u32,
                outer,
                warmup: warmup as u32,
                warmup_by: by,
                ..DiLoCoConfig::DEFAULT
            });
            let got = run_inner(world, config(strategy), warmup + h * rounds, inner_momentum);
            assert_eq!(want.len(), warmup + h * rounds);
            // The warm-up's rounds end at every step, then every h steps.
            let mut ends = (0..warmup).chain((1..=rounds).map(|r| warmup + r * h - 1));
            for (step, want) in want.iter().enumerate() {
                for (rank, want) in want.iter().enumerate() {
                    // f32 arithmetic over the steps and the outer steps so far.
                    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                    let tol = 1e-5 * scale * (step + 1) as f64;
                    for (j, (g, w)) in got[rank][step].iter().zip(want).enumerate() {
                        assert!(
                            (f64::from(*g) - w).abs() <= tol,
                            "{what}, step {step}, rank {rank}, entry {j}: {g} against {w}"
                        );
                    }
                }
                // Every rank goes on from θ_global: equal at a round's end.
                if ends.clone().next() == Some(step) {
                    ends.next();
                    for rank in 1..world {
                        assert_eq!(got[rank][step], got[0][step], "{what}: rank {rank}");
                    }
                }
            }
        }
    }
}

#[test]
fn one_inner_step_with_an_outer_sgd_of_rate_one_is_synchronous_sgd() {
    let plain = OuterOptimizer::Nesterov {
        lr: 1.0,
        momentum: 0.0,
    };
    for world in 1..=4 {
        let outer_loop = run(world, diloco(1, OuterCodec::Dense, plain), 6);
        let synchronous: Vec<Vec<f32>> = local::run(world, |comm: LocalComm| {
            let mut dist = DistOpt::new(inner_sgd(), comm, specs(), config(StrategyConfig::Dense))?;
            let mut w = tensors(&initial().concat());
            let names = names();
            let mut after = Vec::new();
            for _ in 0..6 {
                let grads = shard_gradients(&w, world, dist.rank(), false);
                dist.step(items(&names, &mut w, grads))?;
                after.push(flat(&w));
            }
            Ok::<_, OptimError>(after)
        })
        .unwrap()
        .into_iter()
        .next()
        .unwrap()
        .unwrap();
        for (s, (a, b)) in outer_loop[0].iter().zip(&synchronous).enumerate() {
            for (j, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "W = {world}, step {s}, entry {j}: {x} against {y}"
                );
            }
        }
    }
}

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

/// What one rank saw at each step of a run in which some steps' gradients
/// hold a NaN: its parameters after the step, and whether the step was
/// skipped (`Some(true)`), taken (`Some(false)`) or failed (`None`, with
/// the fault naming the poisoned rank).
type Seen = Vec<(Vec<f32>, Option<bool>)>;

/// `steps` steps of `strategy` with an inner SGD of momentum 0.9 (state
/// that a skipped round must put back), `poison(rank, step)` deciding
/// which gradients hold a NaN.
fn run_poisoned(
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

/// One rank's round: its parameters before it, after its local step, and
/// its checkpoint after it.
type Round = (Vec<f32>, Vec<f32>, gradwire_optim::checkpoint::Checkpoint);

/// What the ranks still owe the model after a round, per entry of the one
/// bucket (every parameter, in declaration order), from their
/// checkpoints: `(1/W) sum_r residual_r`, plus the quantized all-reduce's
/// server residuals, which enter the average undivided.
fn owed(ckpts: &[gradwire_optim::checkpoint::Checkpoint], n: usize) -> Vec<f64> {
    let world = ckpts.len();
    let mut owed = vec![0f64; n];
    for (rank, ckpt) in ckpts.iter().enumerate() {
        let dict = &ckpt.state;
        let per_rank: Vec<Vec<f32>> = dict
            .tensors
            .keys()
            .filter(|k| {
                k.starts_with("residual/") || k.ends_with("/residual") || k.ends_with("/worker")
            })
            .map(|k| dict.f32s(k).unwrap())
            .collect();
        for residual in per_rank {
            if residual.len() == n {
                for (o, r) in owed.iter_mut().zip(residual) {
                    *o += f64::from(r) / world as f64;
                }
            }
        }
        if let Ok(server) = dict.f32s("quantized/0/server")
            && !server.is_empty()
        {
            let own = gradwire_comm::chunk_range(n, world, rank);
            for (o, s) in owed[own].iter_mut().zip(server) {
                *o += f64::from(s);
            }
        }
    }
    owed
}

#[test]
fn with_every_codec_what_the_round_did_not_apply_is_owed_by_the_residuals() {
    // One bucket, H = 1 and an outer SGD of rate 1: a round applies
    // avg = θ_global - θ_next, and error feedback keeps the rest:
    // (1/W) sum_i (Δ_i) + owed_before = avg + owed_after.
    let plain = OuterOptimizer::Nesterov {
        lr: 1.0,
        momentum: 0.0,
    };
    let n: usize = BLOCKS.iter().sum();
    for codec in [
        OuterCodec::TopK(0.2),
        OuterCodec::Quantized(gradwire_compress::Quantizer::Sign),
        OuterCodec::Quantized(gradwire_compress::Quantizer::MinMaxU8),
        // 4 bits an entry, as Streaming DiLoCo's pseudo-gradients.
        OuterCodec::Quantized(gradwire_compress::Quantizer::Qsgd {
            levels: gradwire_compress::quant::QSGD_NIBBLE_LEVELS,
            seed: 3,
            norm: gradwire_compress::QsgdNorm::L2,
        }),
        // Streaming DiLoCo's own 4-bit float.
        OuterCodec::Quantized(gradwire_compress::Quantizer::E3m0 { seed: 3 }),
        OuterCodec::PowerSgd(1),
    ] {
        let world = 3;
        let strategy = diloco(1, codec, plain);
        let rounds: Vec<Vec<Round>> = local::run(world, |comm: LocalComm| {
            let dist_config = DistOptConfig {
                fusion_threshold: 1 << 20,
                ..config(strategy)
            };
            let mut dist = LocalSteps::new(inner_sgd(), comm, specs(), dist_config)?;
            let mut w = tensors(&initial().concat());
            let mut out = Vec::new();
            for _ in 0..4 {
                let before = flat(&w);
                // This rank's local step, as the engine takes it: p - lr g.
                let g = flat(&shard_gradients(&w, world, dist.rank(), false));
                let local: Vec<f32> = before
                    .iter()
                    .zip(&g)
                    .map(|(&p, &g)| p - INNER_LR as f32 * g)
                    .collect();
                step(&mut dist, &mut w, world, false)?;
                out.push((before, local, dist.checkpoint()?));
            }
            Ok::<_, OptimError>(out)
        })
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
        // Declaration order (backward: the last block first) of a flat,
        // forward-ordered vector.
        let declared = |v: &[f32]| -> Vec<f32> {
            let mut starts = Vec::new();
            let mut at = 0;
            for &b in BLOCKS {
                starts.push(at);
                at += b;
            }
            (0..BLOCKS.len())
                .rev()
                .flat_map(|k| v[starts[k]..starts[k] + BLOCKS[k]].to_vec())
                .collect()
        };
        let mut owed_before = vec![0f64; n];
        for round in 0..4 {
            let what = format!("{codec:?}, round {round}");
            let global = declared(&rounds[0][round].0);
            let next = declared(&rounds[0][(round + 1).min(3)].0);
            let ckpts: Vec<_> = rounds.iter().map(|r| r[round].2.clone()).collect();
            let owed_after = owed(&ckpts, n);
            if round < 3 {
                let scale = global
                    .iter()
                    .fold(1e-3f64, |m, v| m.max(f64::from(v.abs())));
                for j in 0..n {
                    let sent: f64 = rounds
                        .iter()
                        .map(|r| f64::from(global[j] - declared(&r[round].1)[j]))
                        .sum::<f64>()
                        / world as f64;
                    let applied = f64::from(global[j]) - f64::from(next[j]);
                    let lhs = sent + owed_before[j];
                    let rhs = applied + owed_after[j];
                    assert!(
                        (lhs - rhs).abs() <= 1e-5 * scale,
                        "{what}, entry {j}: {lhs} sent and owed, {rhs} applied and owed"
                    );
                }
            }
            owed_before = owed_after;
        }
    }
}
