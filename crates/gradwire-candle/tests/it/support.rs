//! What the test files share: the variables, their shapes and
//! deterministic values.

use candle_core::{Device, Tensor, Var};

/// Lengths 1, a prime and a matrix.
pub const SHAPES: [&[usize]; 3] = [&[1], &[13], &[4, 7]];
/// Steps of each run.
pub const STEPS: usize = 5;

/// `n` deterministic values in [-0.7, 0.7], different for each `seed`.
pub fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 37 + seed * 101) % 97) as f32 / 48.5 - 1.0) * 0.7)
        .collect()
}

/// Variables `p0`, `p1`, `p2` of [`SHAPES`], with [`values`] of seeds 0, 1, 2.
pub fn vars() -> Vec<(String, Var)> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(k, shape)| {
            let n = shape.iter().product();
            let t = Tensor::from_vec(values(n, k), *shape, &Device::Cpu).unwrap();
            (format!("p{k}"), Var::from_tensor(&t).unwrap())
        })
        .collect()
}
