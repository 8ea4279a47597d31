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

mod codecs;
mod faults;
mod resume;

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
