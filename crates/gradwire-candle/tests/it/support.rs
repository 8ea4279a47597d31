//! What the test files share: the variables' shapes and deterministic
//! values.

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
