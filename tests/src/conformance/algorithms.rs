//! The cases of gradwire's algorithms end to end on a small linear model:
//! DistOpt against one process, AdaSum against its sequential reference,
//! sparse all-reduce, and the skipping of unwritten gradients.

use super::reference::{bytes_of, check_within_library_bound, input, same_on_every_rank};
use super::{CaseError, Checks};
use gradwire_algos::adasum::{self, AdaSum};
use gradwire_comm::{CommError, Communicator, ReduceOp};
use gradwire_compress::SparseCodec;
use gradwire_optim::{
    Adam, AdamConfig, DistOpt, DistOptConfig, Optimizer, ParamSpec, Sgd, SgdConfig, SkipVote,
};
use gradwire_tensor::Tensor;
use std::ops::Range;

/// A linear model y = sum_k X_k w_k whose weight blocks have these sizes.
const BLOCKS: &[usize] = &[5, 1, 13, 2, 31, 3];
/// Divisible by every world size 1..=4.
const BATCH: usize = 120;

fn sample(i: usize) -> (Vec<f64>, f64) {
    let d: usize = BLOCKS.iter().sum();
    let x: Vec<f64> = (0..d)
        .map(|j| (((i * 31 + j * 17) % 23) as f64 - 11.0) / 11.0)
        .collect();
    let y = x
        .iter()
        .enumerate()
        .map(|(j, v)| v * ((j % 5) as f64 - 2.0))
        .sum::<f64>()
        + 0.1;
    (x, y)
}

/// The mean-squared-error gradient over samples `range`, per block, in f64.
fn gradient(w: &[Vec<f32>], range: Range<usize>) -> Vec<Vec<f32>> {
    let n = range.len() as f64;
    let mut g: Vec<Vec<f64>> = BLOCKS.iter().map(|&b| vec![0.0; b]).collect();
    let flat: Vec<f64> = w.iter().flatten().map(|&v| f64::from(v)).collect();
    for i in range {
        let (x, y) = sample(i);
        let err = x.iter().zip(&flat).map(|(a, b)| a * b).sum::<f64>() - y;
        let mut j = 0;
        for block in g.iter_mut() {
            for gj in block.iter_mut() {
                *gj += err * x[j] / n;
                j += 1;
            }
        }
    }
    g.iter()
        .map(|b| b.iter().map(|&v| v as f32).collect())
        .collect()
}

fn initial() -> Vec<Vec<f32>> {
    BLOCKS
        .iter()
        .enumerate()
        .map(|(k, &b)| (0..b).map(|j| ((k + j) % 3) as f32 * 0.1).collect())
        .collect()
}

fn tensors(values: &[Vec<f32>]) -> Result<Vec<Tensor>, CaseError> {
    Ok(values
        .iter()
        .map(|v| Tensor::from_vec(v.clone(), v.len()))
        .collect::<Result<_, _>>()?)
}

fn values(tensors: &[Tensor]) -> Result<Vec<Vec<f32>>, CaseError> {
    Ok(tensors
        .iter()
        .map(|t| t.to_vec::<f32>())
        .collect::<Result<_, _>>()?)
}

/// `steps` data-parallel steps of DistOpt over an owned copy of `comm` (a
/// split with one color: the same ranks, in the same order).
fn train_distributed<C: Communicator + 'static, O: Optimizer + 'static>(
    comm: &C,
    optimizer: O,
    steps: usize,
) -> Result<Vec<Vec<f32>>, CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    let owned = comm
        .split(Some(0), rank as i64)?
        .ok_or_else(|| CommError::InvalidArgument("split left this rank out".into()))?;
    let specs = (0..BLOCKS.len())
        .rev()
        .map(|k| ParamSpec::new(format!("w{k}"), vec![BLOCKS[k]]))
        .collect();
    let config = DistOptConfig {
        fusion_threshold: 16,
        ..DistOptConfig::default()
    };
    let mut dist = DistOpt::new(optimizer, owned, specs, config)?;
    let mut w_t = tensors(&initial())?;
    let shard = BATCH / w;
    let names: Vec<String> = (0..BLOCKS.len()).map(|k| format!("w{k}")).collect();
    for _ in 0..steps {
        let g = gradient(&values(&w_t)?, rank * shard..(rank + 1) * shard);
        // Backward order, pushed one by one: buckets start as they fill.
        for k in (0..BLOCKS.len()).rev() {
            dist.push(&names[k], Tensor::from_vec(g[k].clone(), BLOCKS[k])?)?;
        }
        dist.finish(names.iter().map(String::as_str).zip(w_t.iter_mut()))?;
    }
    values(&w_t)
}

/// The same steps in one process on the whole batch.
fn train_single<O: Optimizer>(mut opt: O, steps: usize) -> Result<Vec<Vec<f32>>, CaseError> {
    let mut w_t = tensors(&initial())?;
    for _ in 0..steps {
        let g = gradient(&values(&w_t)?, 0..BATCH);
        for (k, t) in w_t.iter_mut().enumerate() {
            opt.update(
                &format!("w{k}"),
                t,
                &Tensor::from_vec(g[k].clone(), BLOCKS[k])?,
            )?;
        }
        opt.step();
    }
    values(&w_t)
}

pub(super) fn distopt_equals_single_process<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let w = comm.world_size();
    let sgd = || Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9));
    let adam = || Adam::new(AdamConfig::default().lr(0.01));
    // The shard means, averaged, are the batch mean up to the f32 rounding
    // of W partial gradients; Adam normalises the step, which amplifies the
    // relative error of tiny gradients.
    for (name, got, want, scale) in [
        (
            "sgd",
            train_distributed(comm, sgd()?, 5)?,
            train_single(sgd()?, 5)?,
            1.0,
        ),
        (
            "adam",
            train_distributed(comm, adam()?, 5)?,
            train_single(adam()?, 5)?,
            20.0,
        ),
    ] {
        let tol = 2e-6 * w as f32 * scale;
        let diff = got
            .iter()
            .flatten()
            .zip(want.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        checks.check(diff <= tol, || format!("DistOpt {name}: {diff} > {tol}"));
        let flat: Vec<f32> = got.into_iter().flatten().collect();
        same_on_every_rank(comm, checks, &bytes_of(&flat), name)?;
    }
    Ok(())
}

pub(super) fn adasum_matches_reference<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let w = comm.world_size();
    let sizes = [17usize, 1, 31, 4];
    let mut tensor_ranges = Vec::new();
    let mut start = 0;
    for s in sizes {
        tensor_ranges.push(start..start + s);
        start += s;
    }
    let n = start;
    let vector =
        |r: usize| -> Vec<f32> { input(31, r, n).iter().map(|&v| (v / 1e3) as f32).collect() };
    let ada = AdaSum::new(comm)?;
    let mut v = vector(comm.rank());
    ada.combine_flat(comm, &mut v, &tensor_ranges)?;
    let want = adasum::reference((0..w).map(vector).collect(), &tensor_ranges)?;
    // The same tree; only the order of f64 partial sums and the f32
    // rounding at each level differ: a few ulps per level.
    let levels = (usize::BITS - w.leading_zeros()) as f32 + 1.0;
    for (i, (g, x)) in v.iter().zip(&want).enumerate() {
        let bound = 4.0 * levels * f32::EPSILON * (1.0 + x.abs());
        checks.check((g - x).abs() <= bound, || {
            format!("AdaSum at {i}: {g} vs the sequential {x}")
        });
    }
    same_on_every_rank(comm, checks, &bytes_of(&v), "AdaSum")?;
    Ok(())
}

pub(super) fn sparse_all_reduce<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let w = comm.world_size();
    let sizes = [1031usize, 7];
    let n: usize = sizes.iter().sum();
    let mine = |r: usize| -> Vec<f32> { input(37, r, n).iter().map(|&v| v as f32).collect() };
    // A threshold that keeps about a sixth (sent sparse), then one that
    // keeps everything (the consistent dense fallback).
    for (threshold, dense) in [(500f32, false), (0.0, true)] {
        let own = mine(comm.rank());
        let mut ts = vec![
            Tensor::from_vec(own[..sizes[0]].to_vec(), sizes[0])?,
            Tensor::from_vec(own[sizes[0]..].to_vec(), sizes[1])?,
        ];
        gradwire_algos::sparse_all_reduce(comm, &mut ts, &SparseCodec::Threshold(threshold), None)?;
        let got: Vec<f32> = values(&ts)?.into_iter().flatten().collect();
        // The reference, in rank order: dense is a plain sum from rank 0's
        // value; sparse adds the selected entries into zeros.
        let inputs: Vec<Vec<f32>> = (0..w).map(mine).collect();
        let want: Vec<f32> = (0..n)
            .map(|i| {
                if dense {
                    inputs.iter().skip(1).fold(inputs[0][i], |a, x| a + x[i])
                } else {
                    inputs
                        .iter()
                        .filter(|x| x[i].abs() >= threshold)
                        .fold(0f32, |a, x| a + x[i])
                }
            })
            .collect();
        if dense && !checks.exact_sums() {
            // The dense fallback is the library's all-reduce.
            let exact: Vec<Vec<f64>> = inputs
                .iter()
                .map(|x| x.iter().map(|&v| f64::from(v)).collect())
                .collect();
            let what = format!("sparse all-reduce (threshold {threshold})");
            check_within_library_bound(checks, &what, &got, &exact, 0..n, ReduceOp::Sum);
            continue;
        }
        checks.check(bytes_of(&got) == bytes_of(&want), || {
            format!(
                "sparse all-reduce (threshold {threshold}) differs from its rank-order reference"
            )
        });
    }
    Ok(())
}

pub(super) fn skipping_unwritten_gradients<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    for vote in [SkipVote::PerBucket, SkipVote::PerStep] {
        let owned = comm
            .split(Some(0), rank as i64)?
            .ok_or_else(|| CommError::InvalidArgument("split left this rank out".into()))?;
        let specs = vec![
            ParamSpec::new("shared", vec![3]),
            ParamSpec::new("unused", vec![2]),
            ParamSpec::new("rank0only", vec![2]),
            ParamSpec::new("sometimes", vec![5]),
        ];
        let sgd = Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9).weight_decay(0.1))?;
        let config = DistOptConfig {
            fusion_threshold: 4,
            vote,
            ..DistOptConfig::default()
        };
        let mut dist = DistOpt::new(sgd, owned, specs, config)?;
        let mut shared = Tensor::from_vec(vec![1f32; 3], 3)?;
        let mut unused = Tensor::from_vec(vec![0.5f32, -0.5], 2)?;
        let mut only = Tensor::from_vec(vec![1f32; 2], 2)?;
        let mut sometimes = Tensor::from_vec(vec![1f32; 5], 5)?;
        let (mut skipped, mut want_skipped) = (0, 0);
        for step in 0..10 {
            let g = |v: f32, n: usize| Tensor::from_vec(vec![v; n], n).ok();
            let writes = |r: usize| (step + r).is_multiple_of(3);
            // Each rank writes a different subset: never a hang.
            let stats = dist.step([
                ("shared", &mut shared, g(1.0, 3)),
                ("unused", &mut unused, None),
                // Written on rank 0 only, W times as large: averaged over W
                // ranks it is the same gradient as "shared".
                (
                    "rank0only",
                    &mut only,
                    if rank == 0 { g(w as f32, 2) } else { None },
                ),
                (
                    "sometimes",
                    &mut sometimes,
                    if writes(rank) { g(2.0, 5) } else { None },
                ),
            ])?;
            skipped += stats.skipped;
            want_skipped += 1 + usize::from(!(0..w).any(writes));
        }
        let has_state = dist.optimizer().param_state("unused").is_some();
        let unused = unused.to_vec::<f32>()?;
        let only = only.to_vec::<f32>()?;
        let shared = shared.to_vec::<f32>()?;
        checks.check(unused == [0.5, -0.5], || {
            format!("{vote:?}: an unwritten parameter changed: {unused:?}")
        });
        checks.check(!has_state, || {
            format!("{vote:?}: state for an unwritten parameter")
        });
        checks.check(skipped == want_skipped, || {
            format!("{vote:?}: {skipped} skips, want {want_skipped}")
        });
        // A library's average may round W * (1/W) and 1/W + ... + 1/W
        // apart.
        let loose = !checks.exact_sums();
        let same = |a: f32, b: f32| {
            a == b || (loose && (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0))
        };
        let agree = only.len() == 2 && only.iter().zip(&shared).all(|(&a, &b)| same(a, b));
        checks.check(agree, || {
            format!("{vote:?}: rank0only {only:?} vs shared {shared:?}")
        });
        let all: Vec<f32> = [shared, only, sometimes.to_vec::<f32>()?].concat();
        same_on_every_rank(comm, checks, &bytes_of(&all), "skipping")?;
    }
    Ok(())
}
