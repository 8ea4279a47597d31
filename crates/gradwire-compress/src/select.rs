//! Sparse selection: which entries of a dense f32 buffer to send.
//!
//! Every selector returns a [`SparseVec`] whose indices are strictly
//! increasing, with the values exactly as they are in the input (random-k
//! optionally rescaled), and refuses an input holding a NaN or an infinity
//! with [`CompressError::NonFinite`] (see there for why).
//!
//! Magnitudes are compared through their bits: for finite floats,
//! `x.to_bits() & 0x7fff_ffff` orders like `|x|`, so exact top-k is a radix
//! select on those 31-bit keys (one histogram pass, then work on one bucket's
//! candidates, then merging) rather than a sort, and non-finite values show up
//! as keys at or above `0x7f80_0000` at no extra cost.

use crate::error::{CompressError, Result};
use crate::sparse::{SparseVec, check_dense_len};
use rand::SeedableRng;

/// The magnitude key of a float: ordered like `|x|` for finite values.
#[inline(always)]
fn key(x: f32) -> u32 {
    x.to_bits() & 0x7fff_ffff
}

/// Keys at or above this are infinities and NaNs.
const NON_FINITE_KEY: u32 = 0x7f80_0000;

/// How many entries a ratio keeps of `n`: `ceil(ratio * n)`, at most `n`.
/// The ratio must lie in (0, 1].
pub fn count_for_ratio(ratio: f64, n: usize) -> Result<usize> {
    if !(ratio > 0.0 && ratio <= 1.0) {
        return Err(CompressError::InvalidArgument(format!("ratio {ratio} is outside (0, 1]")));
    }
    Ok(((ratio * n as f64).ceil() as usize).min(n))
}

fn non_finite_error(x: &[f32]) -> CompressError {
    let index = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
    CompressError::NonFinite { index, value: x.get(index).copied().unwrap_or(f32::NAN) }
}

fn gather(x: &[f32], indices: Vec<u32>) -> SparseVec {
    let values = indices.iter().map(|&i| x[i as usize]).collect();
    SparseVec::from_parts_unchecked(x.len(), indices, values)
}

/// Keeps every `x_i` with `|x_i| >= threshold` (SINGA's threshold mode).
/// `threshold` must be finite and non-negative.
pub fn threshold(x: &[f32], threshold: f32) -> Result<SparseVec> {
    check_dense_len(x.len())?;
    if !(threshold >= 0.0 && threshold.is_finite()) {
        return Err(CompressError::InvalidArgument(format!(
            "threshold {threshold} must be finite and non-negative"
        )));
    }
    let t = key(threshold);
    let mut indices = Vec::new();
    let mut values = Vec::new();
    // Blocks of 16: a branch-free test per block (vectorised), the scalar
    // path only for the few blocks that hold a survivor (or a non-finite).
    let mut base = 0usize;
    for block in x.chunks(16) {
        let hit = block.iter().fold(false, |acc, &v| acc | (key(v) >= t));
        if hit {
            for (j, &v) in block.iter().enumerate() {
                let k = key(v);
                if k >= t {
                    if k >= NON_FINITE_KEY {
                        return Err(CompressError::NonFinite { index: base + j, value: v });
                    }
                    indices.push((base + j) as u32);
                    values.push(v);
                }
            }
        }
        // A finite threshold's key is below every non-finite key, so a block
        // holding a NaN or an infinity always takes the scalar path above.
        base += block.len();
    }
    Ok(SparseVec::from_parts_unchecked(x.len(), indices, values))
}

/// Counts the entries with `|x_i| >= threshold` without selecting them, and
/// whether a non-finite value is present.
fn count_at_least(x: &[f32], t: u32) -> (usize, bool) {
    let mut count = 0usize;
    let mut non_finite = false;
    for block in x.chunks(1024) {
        let mut c = 0u32;
        let mut nf = false;
        for &v in block {
            let k = key(v);
            c += u32::from(k >= t);
            nf |= k >= NON_FINITE_KEY;
        }
        count += c as usize;
        non_finite |= nf;
    }
    (count, non_finite)
}

/// Keeps the `k = ceil(ratio * n)` entries of largest magnitude (SINGA's
/// top-K mode, by true magnitude). Ties at the k-th magnitude go to the lower
/// indices, so the result is deterministic. O(n): a radix select on the
/// magnitude bits, no sort.
pub fn top_k(x: &[f32], ratio: f64) -> Result<SparseVec> {
    check_dense_len(x.len())?;
    let k = count_for_ratio(ratio, x.len())?;
    top_k_count(x, k)
}

/// [`top_k`] with the count given.
pub fn top_k_count(x: &[f32], k: usize) -> Result<SparseVec> {
    check_dense_len(x.len())?;
    let k = k.min(x.len());
    if k == 0 {
        // Still refuse non-finite input: the caller would otherwise park it.
        if x.iter().any(|v| !v.is_finite()) {
            return Err(non_finite_error(x));
        }
        return Ok(SparseVec::from_parts_unchecked(x.len(), Vec::new(), Vec::new()));
    }

    // Pass 1: histogram of the top 11 key bits (8 buckets per binade).
    // Four interleaved histograms avoid stalls on runs of equal buckets.
    const SHIFT1: u32 = 20;
    let mut hist = vec![[0u32; 4]; 1 << 11];
    for quad in x.chunks(4) {
        for (lane, &v) in quad.iter().enumerate() {
            hist[(key(v) >> SHIFT1) as usize][lane] += 1;
        }
    }
    let counts: Vec<usize> = hist.iter().map(|h| h.iter().map(|&c| c as usize).sum()).collect();
    if counts[(NON_FINITE_KEY >> SHIFT1) as usize..].iter().any(|&c| c > 0) {
        return Err(non_finite_error(x));
    }
    // The bucket holding the k-th largest key, and how many lie above it.
    let mut above = 0usize;
    let mut bucket = 0usize;
    for b in (0..counts.len()).rev() {
        if above + counts[b] >= k {
            bucket = b;
            break;
        }
        above += counts[b];
    }

    // Pass 2: indices above the bucket are kept for sure; the bucket's
    // entries are the candidates for the rest.
    let bucket = bucket as u32;
    let mut sure: Vec<u32> = Vec::with_capacity(above);
    let mut candidates: Vec<(u32, u32)> = Vec::with_capacity(counts[bucket as usize]);
    for (i, &v) in x.iter().enumerate() {
        let kv = key(v);
        let b = kv >> SHIFT1;
        if b > bucket {
            sure.push(i as u32);
        } else if b == bucket {
            candidates.push((i as u32, kv));
        }
    }

    // Among the candidates (in index order), the exact k-th key.
    let need = k - above;
    let mut keys: Vec<u32> = candidates.iter().map(|&(_, kv)| kv).collect();
    let pivot = keys.len() - need;
    let (_, &mut kth, _) = keys.select_nth_unstable(pivot);
    let greater = candidates.iter().filter(|&&(_, kv)| kv > kth).count();
    let mut ties = need - greater;
    let chosen: Vec<u32> = candidates
        .iter()
        .filter(|&&(_, kv)| {
            kv > kth
                || (kv == kth && ties > 0 && {
                    ties -= 1;
                    true
                })
        })
        .map(|&(i, _)| i)
        .collect();

    Ok(gather(x, merge_sorted(&sure, &chosen)))
}

/// Merges two strictly increasing, disjoint index lists.
fn merge_sorted(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] < b[j] {
            out.push(a[i]);
            i += 1;
        } else {
            out.push(b[j]);
            j += 1;
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

/// How far sampled top-k may overshoot: it keeps between k and
/// `SAMPLED_TOP_K_SLACK * k` entries (Deep Gradient Compression's 1.3).
pub const SAMPLED_TOP_K_SLACK: f64 = 1.3;

/// Sampled top-k (Deep Gradient Compression): estimates the magnitude
/// threshold of the top `k = ceil(ratio * n)` from a strided sample of about
/// 1 % of the entries, counts the survivors, and
/// - keeps all of them when there are between k and 1.3 k,
/// - keeps the exact top k among them when there are more,
/// - lowers the threshold (a higher order statistic of the sample) and
///   retries when there are fewer, ending with exact top-k if need be.
///
/// So the result has between `k` and `ceil(1.3 k)` entries: every entry kept
/// is at least as large as every entry dropped, but not always exactly `k` of
/// them. Deterministic: the sample is strided, not random.
pub fn sampled_top_k(x: &[f32], ratio: f64) -> Result<SparseVec> {
    check_dense_len(x.len())?;
    let n = x.len();
    let k = count_for_ratio(ratio, n)?;
    let cap = ((k as f64 * SAMPLED_TOP_K_SLACK).ceil() as usize).max(k);
    // Small inputs: the exact path is as cheap as sampling.
    if n < 4096 || k == 0 {
        return top_k_count(x, k);
    }
    let stride = 100usize;
    let mut sample: Vec<u32> = x.iter().step_by(stride).map(|&v| key(v)).collect();
    if sample.iter().any(|&kv| kv >= NON_FINITE_KEY) {
        return Err(non_finite_error(x));
    }
    sample.sort_unstable();
    let len = sample.len();
    // Start at the sample's own k-th largest, then take twice, four times...
    // as many from the sample until enough entries survive.
    let mut take = ((ratio * len as f64).ceil() as usize).clamp(1, len);
    loop {
        let t = sample[len - take];
        let (count, non_finite) = count_at_least(x, t);
        if non_finite {
            return Err(non_finite_error(x));
        }
        if count >= k {
            let survivors = collect_at_least(x, t);
            if survivors.nnz() <= cap {
                return Ok(survivors);
            }
            // Too many: the exact top k among the survivors.
            let (_, idx, vals) = survivors.into_parts();
            let best = top_k_count(&vals, k)?;
            let indices = best.indices().iter().map(|&j| idx[j as usize]).collect();
            return Ok(SparseVec::from_parts_unchecked(n, indices, best.values().to_vec()));
        }
        if take == len {
            return top_k_count(x, k);
        }
        take = (take * 2).min(len);
    }
}

/// Every entry with magnitude key `>= t` (finite input assumed).
fn collect_at_least(x: &[f32], t: u32) -> SparseVec {
    let mut indices = Vec::new();
    let mut values = Vec::new();
    let mut base = 0usize;
    for block in x.chunks(16) {
        if block.iter().fold(false, |acc, &v| acc | (key(v) >= t)) {
            for (j, &v) in block.iter().enumerate() {
                if key(v) >= t {
                    indices.push((base + j) as u32);
                    values.push(v);
                }
            }
        }
        base += block.len();
    }
    SparseVec::from_parts_unchecked(x.len(), indices, values)
}

/// Random-k: `k = ceil(ratio * n)` distinct indices drawn uniformly with a
/// ChaCha8 generator seeded with `seed` (the same seed gives the same
/// indices on every machine). With `unbiased`, the kept values are scaled by
/// `n / k`, so the decoded vector is an unbiased estimate of `x`; without, they
/// are sent as they are (what error feedback wants: the residual keeps the rest).
pub fn random_k(x: &[f32], ratio: f64, seed: u64, unbiased: bool) -> Result<SparseVec> {
    check_dense_len(x.len())?;
    let n = x.len();
    let k = count_for_ratio(ratio, n)?;
    if x.iter().any(|v| !v.is_finite()) {
        return Err(non_finite_error(x));
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut indices: Vec<u32> =
        rand::seq::index::sample(&mut rng, n, k).into_iter().map(|i| i as u32).collect();
    indices.sort_unstable();
    let scale = if unbiased && k > 0 { n as f32 / k as f32 } else { 1.0 };
    let values = indices.iter().map(|&i| x[i as usize] * scale).collect();
    Ok(SparseVec::from_parts_unchecked(n, indices, values))
}
