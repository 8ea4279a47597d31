//! Inputs shared by the AdaSum suites (CPU and CUDA): tensor ranges from
//! sizes, and deterministic per-rank vectors.

use std::ops::Range;

/// Back-to-back ranges of the given sizes.
#[allow(dead_code)] // not every suite uses every input
pub fn ranges(sizes: &[usize]) -> Vec<Range<usize>> {
    let mut start = 0;
    sizes
        .iter()
        .map(|&n| {
            let r = start..start + n;
            start += n;
            r
        })
        .collect()
}

/// A deterministic vector for `rank` (xorshift), values in [-0.5, 0.5).
pub fn vector(seed: u64, rank: usize, n: usize) -> Vec<f32> {
    let mut s = seed ^ (rank as u64 + 7).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}
