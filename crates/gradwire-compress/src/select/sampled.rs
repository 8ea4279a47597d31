//! Sampled top-k (Deep Gradient Compression): a threshold estimated from a
//! strided sample, between k and 1.3 k entries kept.

use super::exact::{select_in_bracket, top_k_count_into};
use super::{
    NON_FINITE_KEY, SelectScratch, collect_at_least_bounded, count_for_ratio, key, non_finite_error,
};
use crate::error::Result;
use crate::sparse::{SparseVec, check_dense_len};

/// How far sampled top-k may overshoot: it keeps between k and
/// `SAMPLED_TOP_K_SLACK * k` entries (Deep Gradient Compression's 1.3).
pub const SAMPLED_TOP_K_SLACK: f64 = 1.3;

/// Sampled top-k takes the exact top k below this length (or for k = 0),
/// where sampling costs as much as the exact selection.
pub const SAMPLED_MIN_LEN: usize = 4096;

/// Sampled top-k's sample: every `SAMPLE_STRIDE`-th entry.
pub const SAMPLE_STRIDE: usize = 100;

/// Sampled top-k (Deep Gradient Compression): estimates the magnitude
/// threshold of the top `k = ceil(ratio * n)` from a strided sample of about
/// 1 % of the entries, counts the survivors, and
/// - keeps all of them when there are between k and 1.3 k,
/// - keeps the exact top k when there are more (they are the top k of the
///   survivors; found by [`top_k_count`](super::top_k_count) on the whole input, so that no
///   more than 1.3 k survivors are ever held),
/// - lowers the threshold (a higher order statistic of the sample) and
///   retries when there are fewer, ending with exact top-k if need be.
///
/// So the result has between `k` and `ceil(1.3 k)` entries: every entry kept
/// is at least as large as every entry dropped, but not always exactly `k` of
/// them. Deterministic: the sample is strided, not random.
pub fn sampled_top_k(x: &[f32], ratio: f64) -> Result<SparseVec> {
    let mut out = SparseVec::default();
    sampled_top_k_into(x, ratio, &mut out, &mut SelectScratch::default())?;
    Ok(out)
}

/// [`sampled_top_k`] into `out` (refilled), working in `scratch`.
pub(crate) fn sampled_top_k_into(
    x: &[f32],
    ratio: f64,
    out: &mut SparseVec,
    scratch: &mut SelectScratch,
) -> Result<()> {
    check_dense_len(x.len())?;
    let n = x.len();
    let k = count_for_ratio(ratio, n)?;
    let cap = ((k as f64 * SAMPLED_TOP_K_SLACK).ceil() as usize).max(k);
    scratch.reserve_top_k(k, cap, out);
    // Small inputs: the exact path is as cheap as sampling.
    if n < SAMPLED_MIN_LEN || k == 0 {
        return top_k_count_into(x, k, out, scratch);
    }
    let mut sample = std::mem::take(&mut scratch.sampled);
    sample.clear();
    sample.extend(x.iter().step_by(SAMPLE_STRIDE).map(|&v| key(v)));
    let result = sampled_top_k_from(x, ratio, k, cap, &mut sample, out, scratch);
    scratch.sampled = sample;
    result
}

/// The rest of [`sampled_top_k_into`], given the sample of keys.
fn sampled_top_k_from(
    x: &[f32],
    ratio: f64,
    k: usize,
    cap: usize,
    sample: &mut [u32],
    out: &mut SparseVec,
    scratch: &mut SelectScratch,
) -> Result<()> {
    if sample.iter().any(|&kv| kv >= NON_FINITE_KEY) {
        return Err(non_finite_error(x));
    }
    sample.sort_unstable();
    let len = sample.len();
    // Start at the sample's own k-th largest, then take twice, four times...
    // as many from the sample until enough entries survive.
    let mut take = ((ratio * len as f64).ceil() as usize).clamp(1, len);
    let mut last = None;
    loop {
        // One pass: collect the survivors of the estimated threshold, or
        // find that there are more than `cap` (then no more are kept, so
        // the memory stays O(k), and the exact top k of the whole input is
        // the answer: every survivor outranks every other entry).
        let threshold = sample[len - take];
        if !collect_at_least_bounded(x, threshold, cap, out)? {
            // The k-th key lies between this threshold and the last one
            // (which kept fewer than k): select within that bracket.
            let hi = match last {
                Some(t) => t - 1,
                None => NON_FINITE_KEY - 1,
            };
            if select_in_bracket(x, k, threshold, hi, out, scratch)? {
                return Ok(());
            }
            return top_k_count_into(x, k, out, scratch);
        }
        if out.nnz() >= k {
            return Ok(());
        }
        last = Some(threshold);
        if take == len {
            return top_k_count_into(x, k, out, scratch);
        }
        take = (take * 2).min(len);
    }
}
