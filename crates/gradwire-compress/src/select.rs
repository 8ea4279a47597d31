//! Sparse selection: which entries of a dense f32 buffer to send.
//!
//! Every selector returns a [`SparseVec`] whose indices are strictly
//! increasing, with the values exactly as they are in the input (random-k
//! optionally rescaled), and refuses an input holding a NaN or an infinity
//! with [`CompressError::NonFinite`] (see there for why).
//!
//! Magnitudes are compared through their bits: for finite floats,
//! `x.to_bits() & 0x7fff_ffff` orders like `|x|`, so exact top-k is a radix
//! select on those 31-bit keys (a histogram pass, two narrower ones among
//! one bucket's entries, then the collection) rather than a sort, and
//! non-finite values show up as keys at or above `0x7f80_0000` at no extra
//! cost. On large inputs a strided sample usually brackets the k-th key
//! first, so that one pass over the data collects the survivors and a few
//! candidates to select among.
//!
//! Each selector has an `_into` form behind [`crate::SparseCodec::select_into`]
//! that refills a caller's [`SparseVec`] and works in a [`SelectScratch`]:
//! the top-k family's memory is O(k) whatever the data (many ties, a
//! misleading sample), reserved on first use, so a caller selecting every
//! step allocates nothing after the first. (Threshold keeps what the data
//! holds above it: its output grows to the largest selection seen.)

use crate::error::{CompressError, Result};
use crate::sparse::{SparseVec, check_dense_len};
use rand::{Rng, SeedableRng};
use std::ops::ControlFlow::{self, Break, Continue};

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

/// The memory the selectors work in, kept by a caller that selects every
/// step (error feedback, DistOpt's buckets) so that a selection allocates
/// nothing once the buffers have grown: see [`crate::SparseCodec::select_into`].
/// `Default` is empty; the results do not depend on what it held before.
#[derive(Debug, Default, Clone)]
pub struct SelectScratch {
    /// Sampled keys of the bracketing.
    sample: Vec<u32>,
    /// Sampled keys of sampled top-k (which may bracket too).
    sampled: Vec<u32>,
    /// Indices kept for sure.
    sure: Vec<u32>,
    /// Candidates for the rest: (index, key).
    candidates: Vec<(u32, u32)>,
    /// The candidates' keys, for the exact selection among them.
    keys: Vec<u32>,
    /// The candidates chosen.
    chosen: Vec<u32>,
    /// The radix select's first histogram: four interleaved counts per
    /// bucket.
    hist: Vec<[u32; 4]>,
    /// Its finer histograms.
    fine: Vec<u32>,
    /// Random-k's drawn indices, one bit each.
    bits: Vec<u64>,
}

impl SelectScratch {
    /// Reserves everything the top-k family may use to select `k` entries
    /// (whichever path a later input takes), and room for `most` entries in
    /// `out`: after the first selection nothing grows.
    fn reserve_top_k(&mut self, k: usize, most: usize, out: &mut SparseVec) {
        let candidates = bracket_candidates(k);
        capacity_for(&mut self.sure, k);
        capacity_for(&mut self.candidates, candidates);
        capacity_for(&mut self.keys, candidates);
        capacity_for(&mut self.chosen, k);
        capacity_for(&mut self.hist, 1 << 11);
        capacity_for(&mut self.fine, 1 << 10);
        let (indices, values) = out.parts_mut();
        capacity_for(indices, most);
        capacity_for(values, most);
    }
}

/// Makes room for `n` elements in all (whatever `v` holds now).
fn capacity_for<T>(v: &mut Vec<T>, n: usize) {
    v.reserve(n.saturating_sub(v.len()));
}

/// The most candidates a bracketed selection of `k` entries keeps.
fn bracket_candidates(k: usize) -> usize {
    2 * k + 4096
}

/// Fills `out` with the entries of `x` at `out`'s indices (already set).
fn gather_values(x: &[f32], out: &mut SparseVec, scale: f32) {
    let (indices, values) = out.parts_mut();
    values.clear();
    values.extend(indices.iter().map(|&i| x[i as usize] * scale));
}

/// Keeps every `x_i` with `|x_i| >= threshold` (SINGA's threshold mode).
/// `threshold` must be finite and non-negative.
pub fn threshold(x: &[f32], threshold: f32) -> Result<SparseVec> {
    let mut out = SparseVec::default();
    threshold_into(x, threshold, &mut out)?;
    Ok(out)
}

/// [`threshold`] into `out` (refilled, its buffers reused).
pub(crate) fn threshold_into(x: &[f32], threshold: f32, out: &mut SparseVec) -> Result<()> {
    check_dense_len(x.len())?;
    check_threshold(threshold)?;
    collect_at_least(x, key(threshold), out)
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
    let mut out = SparseVec::default();
    top_k_count_into(x, k, &mut out, &mut SelectScratch::default())?;
    Ok(out)
}

/// [`top_k_count`] into `out` (refilled), working in `scratch`.
pub(crate) fn top_k_count_into(
    x: &[f32],
    k: usize,
    out: &mut SparseVec,
    scratch: &mut SelectScratch,
) -> Result<()> {
    check_dense_len(x.len())?;
    out.reset(x.len());
    let k = k.min(x.len());
    scratch.reserve_top_k(k, k, out);
    if k == 0 {
        // Still refuse non-finite input: the caller would otherwise park it.
        if x.iter().any(|v| !v.is_finite()) {
            return Err(non_finite_error(x));
        }
        return Ok(());
    }
    if x.len() >= SAMPLED_BRACKET_MIN_LEN && top_k_bracketed(x, k, out, scratch)? {
        return Ok(());
    }
    top_k_radix(x, k, out, scratch)
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
/// either way. `true` when `out` holds the selection.
fn top_k_bracketed(
    x: &[f32],
    k: usize,
    out: &mut SparseVec,
    scratch: &mut SelectScratch,
) -> Result<bool> {
    let n = x.len();
    let stride = (n / BRACKET_SAMPLE).max(1);
    let sample = &mut scratch.sample;
    sample.clear();
    sample.extend(x.iter().step_by(stride).map(|&v| key(v)));
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
        return Ok(false); // the candidates would be a large part of the input
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
    select_in_bracket(x, k, lo, hi, out, scratch)
}

/// Exact top-k when the k-th largest key lies in `[lo, hi]`: one pass
/// collects the entries above `hi` (kept for sure) and those in `[lo, hi]`
/// (candidates), then an exact selection among the candidates finishes.
/// `false` (and `out` unspecified) when the counts show the k-th key is not
/// in the bracket, or the lists would pass their bounds (k kept for sure,
/// 2k + 4096 candidates): the caller takes the radix path.
fn select_in_bracket(
    x: &[f32],
    k: usize,
    lo: u32,
    hi: u32,
    out: &mut SparseVec,
    scratch: &mut SelectScratch,
) -> Result<bool> {
    // The lists are bounded (k kept for sure, `most` candidates), so that
    // their memory is O(k) whatever the data: a sample that misleads, or
    // many ties at the k-th magnitude, send the radix path instead.
    // (Their room was reserved by `SelectScratch::reserve_top_k`.)
    let most = bracket_candidates(k);
    let sure = &mut scratch.sure;
    let candidates = &mut scratch.candidates;
    sure.clear();
    candidates.clear();
    let scan = scan_at_least(x, lo, |i, kv| {
        if kv > hi {
            if kv >= NON_FINITE_KEY {
                return Break(Err(non_finite_at(x, i)));
            }
            if sure.len() == k {
                return Break(Ok(false));
            }
            sure.push(i as u32);
        } else {
            if candidates.len() == most {
                return Break(Ok(false));
            }
            candidates.push((i as u32, kv));
        }
        Continue(())
    });
    if let Break(stopped) = scan {
        return stopped;
    }
    if sure.len() + candidates.len() < k {
        return Ok(false);
    }
    let need = k - sure.len();
    finish_top_k(x, need, out, scratch);
    Ok(true)
}

/// Exact top-k by a radix select on the magnitude keys, in O(k) memory: a
/// histogram of the top 11 key bits finds the bucket of the k-th largest
/// key, a histogram of the next 10 bits among that bucket's entries finds
/// its sub-bucket, one of the last 10 bits the key itself; a last pass
/// collects every entry above it and the first ties, in index order. Each
/// pass after the first skips, 16 entries at a time, what lies below.
fn top_k_radix(
    x: &[f32],
    k: usize,
    out: &mut SparseVec,
    scratch: &mut SelectScratch,
) -> Result<()> {
    // Pass 1: histogram of the top 11 key bits (8 buckets per binade).
    // Four interleaved histograms avoid stalls on runs of equal buckets.
    const SHIFT1: u32 = 20;
    // A table of 2048 buckets: keys have 31 bits, so `key >> 20` < 2048.
    let hist = &mut scratch.hist;
    hist.clear();
    hist.resize(1 << 11, [0u32; 4]);
    let hist = &mut hist[..1 << 11];
    for quad in x.chunks(4) {
        for (lane, &v) in quad.iter().enumerate() {
            hist[(key(v) >> SHIFT1) as usize & 0x7ff][lane] += 1;
        }
    }
    let count = |h: &[u32; 4]| h.iter().map(|&c| c as usize).sum::<usize>();
    if hist[(NON_FINITE_KEY >> SHIFT1) as usize..]
        .iter()
        .any(|h| count(h) > 0)
    {
        return Err(non_finite_error(x));
    }
    let (b1, above1) = bucket_of_kth(hist.iter().map(count), k);
    // Passes 2 and 3: the next 10 bits, then the last 10, among the
    // entries whose higher bits are those found so far.
    let prefix1 = (b1 as u32) << SHIFT1;
    let fine = &mut scratch.fine;
    fine.clear();
    fine.resize(1 << 10, 0);
    count_at_least(
        x,
        prefix1,
        |kv| (kv >> SHIFT1 == prefix1 >> SHIFT1).then_some((kv >> 10) as usize & 0x3ff),
        fine,
    );
    let (b2, above2) = bucket_of_kth(fine.iter().map(|&c| c as usize), k - above1);
    let prefix2 = prefix1 | (b2 as u32) << 10;
    fine.iter_mut().for_each(|c| *c = 0);
    count_at_least(
        x,
        prefix2,
        |kv| (kv >> 10 == prefix2 >> 10).then_some(kv as usize & 0x3ff),
        fine,
    );
    let (b3, above3) = bucket_of_kth(fine.iter().map(|&c| c as usize), k - above1 - above2);
    let kth = prefix2 | b3 as u32;
    // Pass 4: every key above the k-th, and as many equal to it as are
    // still needed, lowest indices first.
    let mut ties = k - above1 - above2 - above3;
    out.reset(x.len());
    let indices = out.parts_mut().0;
    let _ = scan_at_least::<()>(x, kth, |i, kv| {
        if kv > kth || ties > 0 {
            if kv == kth {
                ties -= 1;
            }
            indices.push(i as u32);
        }
        Continue(())
    });
    gather_values(x, out, 1.0);
    Ok(())
}

/// The bucket holding the `k`-th largest entry (`k >= 1`, at most the
/// total), given the buckets' counts in increasing key order, and how many
/// entries lie in the buckets above it.
fn bucket_of_kth(
    counts: impl DoubleEndedIterator<Item = usize> + ExactSizeIterator,
    k: usize,
) -> (usize, usize) {
    let mut above = 0usize;
    let last = counts.len().saturating_sub(1);
    for (from_top, c) in counts.rev().enumerate() {
        if above + c >= k {
            return (last - from_top, above);
        }
        above += c;
    }
    (0, above)
}

/// `f(index, key)` for every entry of `x` whose magnitude key is at least
/// `floor`, in index order, until `f` breaks. Most entries usually lie
/// below: blocks of 16 are tested branch-free and skipped whole. (Keys at or
/// above `NON_FINITE_KEY` are passed on: the caller refuses them.)
fn scan_at_least<B>(
    x: &[f32],
    floor: u32,
    mut f: impl FnMut(usize, u32) -> ControlFlow<B>,
) -> ControlFlow<B> {
    for (b, block) in x.chunks(16).enumerate() {
        if block.iter().fold(false, |acc, &v| acc | (key(v) >= floor)) {
            for (j, &v) in block.iter().enumerate() {
                let kv = key(v);
                if kv >= floor {
                    f(b * 16 + j, kv)?;
                }
            }
        }
    }
    Continue(())
}

/// Adds one to `counts[bin(key)]` for every entry with key at least `floor`
/// that `bin` places (a radix pass among one bucket's entries).
fn count_at_least(x: &[f32], floor: u32, bin: impl Fn(u32) -> Option<usize>, counts: &mut [u32]) {
    let _ = scan_at_least::<()>(x, floor, |_, kv| {
        if let Some(c) = bin(kv).and_then(|b| counts.get_mut(b)) {
            *c += 1;
        }
        Continue(())
    });
}

/// The error for the non-finite entry `i` of `x`.
fn non_finite_at(x: &[f32], i: usize) -> CompressError {
    CompressError::NonFinite {
        index: i,
        value: x[i],
    }
}

/// Given the indices kept for sure and the candidates (index, key) in index
/// order (in `scratch`), keeps the `need` candidates of largest key, ties to
/// the lower index, and writes the whole selection in index order to `out`.
fn finish_top_k(x: &[f32], need: usize, out: &mut SparseVec, scratch: &mut SelectScratch) {
    let SelectScratch {
        sure,
        candidates,
        keys,
        chosen,
        ..
    } = scratch;
    chosen.clear();
    if need > 0 {
        keys.clear();
        keys.extend(candidates.iter().map(|&(_, kv)| kv));
        let pivot = keys.len() - need;
        let (_, &mut kth, _) = keys.select_nth_unstable(pivot);
        let greater = candidates.iter().filter(|&&(_, kv)| kv > kth).count();
        let mut ties = need - greater;
        chosen.extend(
            candidates
                .iter()
                .filter(|&&(_, kv)| {
                    kv > kth
                        || (kv == kth && ties > 0 && {
                            ties -= 1;
                            true
                        })
                })
                .map(|&(i, _)| i),
        );
    }
    out.reset(x.len());
    merge_sorted(sure, chosen, out.parts_mut().0);
    gather_values(x, out, 1.0);
}

/// Merges two strictly increasing, disjoint index lists into `out`.
fn merge_sorted(a: &[u32], b: &[u32], out: &mut Vec<u32>) {
    out.clear();
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
}

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
///   survivors; found by [`top_k_count`] on the whole input, so that no
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

/// [`collect_at_least`] keeping at most `most` entries: `false` (and `out`
/// unspecified) as soon as there are more.
fn collect_at_least_bounded(x: &[f32], t: u32, most: usize, out: &mut SparseVec) -> Result<bool> {
    out.reset(x.len());
    let (indices, values) = out.parts_mut();
    let scan = scan_at_least(x, t, |i, kv| {
        if kv >= NON_FINITE_KEY {
            return Break(Err(non_finite_at(x, i)));
        }
        if indices.len() == most {
            return Break(Ok(false));
        }
        indices.push(i as u32);
        values.push(x[i]);
        Continue(())
    });
    match scan {
        Break(stopped) => stopped,
        Continue(()) => Ok(true),
    }
}

/// Every entry with magnitude key `>= t`, `t` a finite key, into `out`;
/// refuses a non-finite entry (its key exceeds every finite one, so it is
/// always seen).
fn collect_at_least(x: &[f32], t: u32, out: &mut SparseVec) -> Result<()> {
    collect_at_least_bounded(x, t, usize::MAX, out).map(|_| ())
}

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
