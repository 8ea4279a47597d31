//! The linear least-squares model the DistOpt tests train: y = sum_k X_k w_k
//! with weight blocks of uneven sizes, deterministic samples, gradients and
//! losses in f64; and parameters named by position ([`named_specs`]).

#![allow(dead_code)] // each test file uses its own part

use gradwire_optim::{DistOptConfig, ParamSpec, StrategyConfig};

/// A linear model y = sum_k X_k w_k whose weight blocks have these sizes.
pub const BLOCKS: &[usize] = &[5, 1, 13, 2, 31, 3];
/// Divisible by every world size 1..=8.
pub const BATCH: usize = 840;

pub fn features() -> usize {
    BLOCKS.iter().sum()
}

/// Sample i's features and target, deterministic.
pub fn sample(i: usize) -> (Vec<f64>, f64) {
    let d = features();
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
pub fn gradient(w: &[Vec<f32>], range: std::ops::Range<usize>) -> Vec<Vec<f64>> {
    let n = range.len() as f64;
    let mut g: Vec<Vec<f64>> = BLOCKS.iter().map(|&b| vec![0.0; b]).collect();
    for i in range {
        let (x, y) = sample(i);
        let flat: Vec<f64> = w.iter().flatten().map(|&v| f64::from(v)).collect();
        let err = x.iter().zip(&flat).map(|(a, b)| a * b).sum::<f64>() - y;
        let mut j = 0;
        for block in g.iter_mut() {
            for gj in block.iter_mut() {
                *gj += err * x[j] / n;
                j += 1;
            }
        }
    }
    g
}

pub fn specs() -> Vec<ParamSpec> {
    // Backward order: the last block first.
    (0..BLOCKS.len())
        .rev()
        .map(|k| ParamSpec::new(format!("w{k}"), vec![BLOCKS[k]]))
        .collect()
}

pub fn initial() -> Vec<Vec<f32>> {
    BLOCKS
        .iter()
        .enumerate()
        .map(|(k, &b)| (0..b).map(|j| ((k + j) % 3) as f32 * 0.1).collect())
        .collect()
}

/// The mean squared error / 2 over samples `range`.
pub fn loss(w: &[Vec<f32>], range: std::ops::Range<usize>) -> f64 {
    let n = range.len() as f64;
    let flat: Vec<f64> = w.iter().flatten().map(|&v| f64::from(v)).collect();
    range
        .map(|i| {
            let (x, y) = sample(i);
            let err = x.iter().zip(&flat).map(|(a, b)| a * b).sum::<f64>() - y;
            0.5 * err * err / n
        })
        .sum()
}

/// Parameters `p0`, `p1`, ... of `shapes`, declared in that order.
pub fn named_specs(shapes: &[&[usize]]) -> Vec<ParamSpec> {
    shapes
        .iter()
        .enumerate()
        .map(|(k, dims)| ParamSpec::new(format!("p{k}"), dims.to_vec()))
        .collect()
}

/// DistOpt's settings with `strategy`, `accumulate` micro-batches a step
/// and buckets of at most 16 elements (several buckets on the tests' small
/// parameters).
pub fn small_buckets(strategy: StrategyConfig, accumulate: u32) -> DistOptConfig {
    DistOptConfig {
        strategy,
        fusion_threshold: 16,
        accumulate,
        ..DistOptConfig::default()
    }
}
