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
//! as keys at or above `0x7f80_0000` at no extra cost. On large inputs a
//! strided sample usually brackets the k-th key first, so that one pass over
//! the data collects the survivors and a few candidates to select among.

use crate::error::{CompressError, Result};
use crate::sparse::{SparseVec, check_dense_len};
use rand::SeedableRng;

/// The magnitude key of a float: ordered like `|x|` for finite values.
#[inline(always)]
pub(crate) fn key(x: f32) -> u32 {
    x.to_bits() & 0x7fff_ffff
}

/// Keys at or above this are infinities and NaNs.
const NON_FINITE_KEY: u32 = 0x7f80_0000;

/// How many entries a ratio keeps of `n`: `ceil(ratio * n)`, at most `n`.
/// The ratio must lie in (0, 1].
pub fn count_for_ratio(ratio: f64, n: usize) -> Result<usize> {
    if !(ratio > 0.0 && ratio <= 1.0) {
        return Err(CompressError::InvalidArgument(format!(
            "ratio {ratio} is outside (0, 1]"
        )));
    }
    Ok(((ratio * n as f64).ceil() as usize).min(n))
}

fn non_finite_error(x: &[f32]) -> CompressError {
    let index = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
    CompressError::NonFinite {
        index,
        value: x.get(index).copied().unwrap_or(f32::NAN),
    }
}

fn gather(x: &[f32], indices: Vec<u32>) -> SparseVec {
    let values = indices.iter().map(|&i| x[i as usize]).collect();
    SparseVec::from_parts_unchecked(x.len(), indices, values)
}

/// Keeps every `x_i` with `|x_i| >= threshold` (SINGA's threshold mode).
/// `threshold` must be finite and non-negative.
pub fn threshold(x: &[f32], threshold: f32) -> Result<SparseVec> {
    check_dense_len(x.len())?;
    check_threshold(threshold)?;
    collect_at_least(x, key(threshold))
}

/// A threshold must be finite and non-negative.
pub(crate) fn check_threshold(threshold: f32) -> Result<()> {
    if threshold >= 0.0 && threshold.is_finite() {
        Ok(())
    } else {
        Err(CompressError::InvalidArgument(format!(
            "threshold {threshold} must be finite and non-negative"
        )))
    }
}

/// Keeps the `k = ceil(ratio * n)` entries of largest magnitude (SINGA's
/// top-K mode, by true magnitude). Ties at the k-th magnitude go to the lower
/// indices, so the result is deterministic. O(n), no sort: on large inputs
/// one pass over the data, bracketing the k-th magnitude from a sample (see
/// `top_k_bracketed`), and a radix select on the magnitude bits when the
/// sample misleads or the input is small.
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
        return Ok(SparseVec::from_parts_unchecked(
            x.len(),
            Vec::new(),
            Vec::new(),
        ));
    }
    if x.len() >= SAMPLED_BRACKET_MIN_LEN
        && let Some(found) = top_k_bracketed(x, k)?
    {
        return Ok(found);
    }
    top_k_radix(x, k)
}

/// Below this length the radix path is as cheap as sampling.
const SAMPLED_BRACKET_MIN_LEN: usize = 1 << 15;

/// Elements in the sample that brackets the k-th magnitude.
const BRACKET_SAMPLE: usize = 1 << 16;

/// Exact top-k in one pass over the data, when a sample brackets the k-th
/// largest key: from a strided sample, two keys `lo <= hi` such that the k-th
/// largest key very probably lies in `[lo, hi]` (the sample's order statistic
/// plus and minus four standard deviations). One pass collects the entries
/// above `hi` (kept for sure) and those in `[lo, hi]` (candidates); if the
/// counts show the k-th key is indeed among the candidates, an exact
/// selection among them finishes. Otherwise (an unlucky or adversarial
/// sample) `None`, and the caller takes the radix path: the result is exact
/// either way.
fn top_k_bracketed(x: &[f32], k: usize) -> Result<Option<SparseVec>> {
    let n = x.len();
    let stride = (n / BRACKET_SAMPLE).max(1);
    let mut sample: Vec<u32> = x.iter().step_by(stride).map(|&v| key(v)).collect();
    if sample.iter().any(|&kv| kv >= NON_FINITE_KEY) {
        return Err(non_finite_error(x));
    }
    sample.sort_unstable();
    let m = sample.len();
    let p = k as f64 / n as f64;
    let center = p * m as f64;
    let margin = 4.0 * (m as f64 * p * (1.0 - p)).sqrt() + 8.0;
    // Ranks from the top, 1-based: the r-th largest sample key is sample[m - r].
    let rank_hi = (center - margin).floor();
    let rank_lo = (center + margin).ceil();
    if (rank_lo - rank_hi.max(0.0)) / m as f64 > 0.25 {
        return Ok(None); // the candidates would be a large part of the input
    }
    let hi = if rank_hi < 1.0 {
        NON_FINITE_KEY - 1
    } else {
        sample[m - rank_hi as usize]
    };
    let lo = if rank_lo >= m as f64 {
        0
    } else {
        sample[m - rank_lo as usize]
    };

    let mut sure: Vec<u32> = Vec::new();
    let mut candidates: Vec<(u32, u32)> = Vec::new();
    let mut base = 0usize;
    for block in x.chunks(16) {
        // Most entries lie below `lo`: 16 at a time, branch-free.
        if block.iter().fold(false, |acc, &v| acc | (key(v) >= lo)) {
            for (j, &v) in block.iter().enumerate() {
                let kv = key(v);
                if kv > hi {
                    if kv >= NON_FINITE_KEY {
                        return Err(CompressError::NonFinite {
                            index: base + j,
                            value: v,
                        });
                    }
                    sure.push((base + j) as u32);
                } else if kv >= lo {
                    candidates.push(((base + j) as u32, kv));
                }
            }
        }
        base += block.len();
    }
    if sure.len() > k || sure.len() + candidates.len() < k {
        return Ok(None);
    }
    let need = k - sure.len();
    Ok(Some(finish_top_k(x, &sure, &candidates, need)))
}

/// Exact top-k by a radix select on the magnitude keys: a histogram of the
/// top 11 bits finds the bucket of the k-th largest key, then one more pass
/// collects the entries above that bucket and the bucket's candidates.
fn top_k_radix(x: &[f32], k: usize) -> Result<SparseVec> {
    // Pass 1: histogram of the top 11 key bits (8 buckets per binade).
    // Four interleaved histograms avoid stalls on runs of equal buckets.
    const SHIFT1: u32 = 20;
    // A fixed-size table: keys have 31 bits, so `key >> 20` < 2048 and the
    // index needs no bounds check.
    let mut hist: Box<[[u32; 4]; 1 << 11]> = Box::new([[0u32; 4]; 1 << 11]);
    for quad in x.chunks(4) {
        for (lane, &v) in quad.iter().enumerate() {
            hist[(key(v) >> SHIFT1) as usize & 0x7ff][lane] += 1;
        }
    }
    let counts: Vec<usize> = hist
        .iter()
        .map(|h| h.iter().map(|&c| c as usize).sum())
        .collect();
    if counts[(NON_FINITE_KEY >> SHIFT1) as usize..]
        .iter()
        .any(|&c| c > 0)
    {
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
    // Most entries lie below the bucket: test 16 at a time, branch-free.
    let floor = bucket << SHIFT1;
    let mut base = 0usize;
    for block in x.chunks(16) {
        if block.iter().fold(false, |acc, &v| acc | (key(v) >= floor)) {
            for (j, &v) in block.iter().enumerate() {
                let kv = key(v);
                let b = kv >> SHIFT1;
                if b > bucket {
                    sure.push((base + j) as u32);
                } else if b == bucket {
                    candidates.push(((base + j) as u32, kv));
                }
            }
        }
        base += block.len();
    }
    Ok(finish_top_k(x, &sure, &candidates, k - above))
}

/// Given the indices kept for sure and the candidates (index, key) in index
/// order, keeps the `need` candidates of largest key, ties to the lower index,
/// and returns the whole selection in index order.
fn finish_top_k(x: &[f32], sure: &[u32], candidates: &[(u32, u32)], need: usize) -> SparseVec {
    if need == 0 {
        return gather(x, sure.to_vec());
    }
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
    gather(x, merge_sorted(sure, &chosen))
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
        // One pass: collect the survivors of the estimated threshold.
        let survivors = collect_at_least(x, sample[len - take])?;
        if survivors.nnz() >= k {
            if survivors.nnz() <= cap {
                return Ok(survivors);
            }
            // Too many: the exact top k among the survivors.
            let (_, idx, vals) = survivors.into_parts();
            let best = top_k_count(&vals, k)?;
            let indices = best.indices().iter().map(|&j| idx[j as usize]).collect();
            return Ok(SparseVec::from_parts_unchecked(
                n,
                indices,
                best.values().to_vec(),
            ));
        }
        if take == len {
            return top_k_count(x, k);
        }
        take = (take * 2).min(len);
    }
}

/// Every entry with magnitude key `>= t`, `t` a finite key; refuses a
/// non-finite entry (its key exceeds every finite one, so it is always seen).
fn collect_at_least(x: &[f32], t: u32) -> Result<SparseVec> {
    let mut indices = Vec::new();
    let mut values = Vec::new();
    let mut base = 0usize;
    for block in x.chunks(16) {
        if block.iter().fold(false, |acc, &v| acc | (key(v) >= t)) {
            for (j, &v) in block.iter().enumerate() {
                let kv = key(v);
                if kv >= t {
                    if kv >= NON_FINITE_KEY {
                        return Err(CompressError::NonFinite {
                            index: base + j,
                            value: v,
                        });
                    }
                    indices.push((base + j) as u32);
                    values.push(v);
                }
            }
        }
        base += block.len();
    }
    Ok(SparseVec::from_parts_unchecked(x.len(), indices, values))
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
    let mut indices: Vec<u32> = rand::seq::index::sample(&mut rng, n, k)
        .into_iter()
        .map(|i| i as u32)
        .collect();
    indices.sort_unstable();
    let scale = if unbiased && k > 0 {
        n as f32 / k as f32
    } else {
        1.0
    };
    let values = indices.iter().map(|&i| x[i as usize] * scale).collect();
    Ok(SparseVec::from_parts_unchecked(n, indices, values))
}
