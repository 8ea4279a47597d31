//! Random-k: k distinct indices drawn uniformly from a seeded generator.

use super::{SelectScratch, count_for_ratio, gather_values, non_finite_error};
use crate::error::Result;
use crate::sparse::{SparseVec, check_dense_len};
use rand::{Rng, SeedableRng};

/// Random-k: `k = ceil(ratio * n)` distinct indices drawn uniformly with a
/// ChaCha8 generator seeded with `seed` (the same seed gives the same
/// indices on every machine): Floyd's algorithm, marking the draws in a
/// bitmap, read back in index order. With `unbiased`, the kept values are
/// scaled by `n / k`, so the decoded vector is an unbiased estimate of `x`;
/// without, they are sent as they are (what error feedback wants: the
/// residual keeps the rest).
pub fn random_k(x: &[f32], ratio: f64, seed: u64, unbiased: bool) -> Result<SparseVec> {
    let mut out = SparseVec::default();
    random_k_into(
        x,
        ratio,
        seed,
        unbiased,
        &mut out,
        &mut SelectScratch::default(),
    )?;
    Ok(out)
}

/// [`random_k`] into `out` (refilled), working in `scratch`.
pub(crate) fn random_k_into(
    x: &[f32],
    ratio: f64,
    seed: u64,
    unbiased: bool,
    out: &mut SparseVec,
    scratch: &mut SelectScratch,
) -> Result<()> {
    check_dense_len(x.len())?;
    let n = x.len();
    let k = count_for_ratio(ratio, n)?;
    if x.iter().any(|v| !v.is_finite()) {
        return Err(non_finite_error(x));
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let bits = &mut scratch.bits;
    bits.clear();
    bits.resize(n.div_ceil(64), 0);
    // Floyd: for j in n-k..n, draw t in 0..=j; take t, or j if t is taken.
    // Each k-subset comes out with the same probability.
    for j in n - k..n {
        let t = rng.random_range(0..=j);
        let pick = if bits[t / 64] >> (t % 64) & 1 == 1 {
            j
        } else {
            t
        };
        bits[pick / 64] |= 1 << (pick % 64);
    }
    out.reset(n);
    let indices = out.parts_mut().0;
    for (w, &word) in bits.iter().enumerate() {
        let mut word = word;
        while word != 0 {
            indices.push((w * 64) as u32 + word.trailing_zeros());
            word &= word - 1;
        }
    }
    let scale = if unbiased && k > 0 {
        n as f32 / k as f32
    } else {
        1.0
    };
    gather_values(x, out, scale);
    Ok(())
}
