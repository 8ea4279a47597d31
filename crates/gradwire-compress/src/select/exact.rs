//! Exact top-k: a sample brackets the k-th magnitude on large inputs (one
//! pass collects the survivors and a few candidates), else a radix select on
//! the magnitude keys; either way in O(k) memory, ties to the lower index.

use super::{
    NON_FINITE_KEY, SelectScratch, count_for_ratio, gather_values, key, non_finite_at,
    non_finite_error, scan_at_least,
};
use crate::error::Result;
use crate::sparse::{SparseVec, check_dense_len};
use std::ops::ControlFlow::{Break, Continue};

/// The most candidates a bracketed selection of `k` entries keeps.
pub(super) fn bracket_candidates(k: usize) -> usize {
    2 * k + 4096
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
pub(super) fn select_in_bracket(
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
