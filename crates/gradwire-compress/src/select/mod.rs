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
//!
//! The selectors, a file each: [`threshold`] here, exact top-k in
//! `exact.rs`, sampled top-k in `sampled.rs`, random-k in `random.rs`; the
//! magnitude keys, the scan they share and [`SelectScratch`] here.

use crate::error::{CompressError, Result};
use crate::sparse::{SparseVec, check_dense_len};
use std::ops::ControlFlow::{self, Break, Continue};

mod exact;
mod random;
mod sampled;

use exact::bracket_candidates;
pub(crate) use exact::top_k_count_into;
pub use exact::{top_k, top_k_count};
pub use random::random_k;
pub(crate) use random::random_k_into;
pub(crate) use sampled::sampled_top_k_into;
pub use sampled::{SAMPLE_STRIDE, SAMPLED_MIN_LEN, SAMPLED_TOP_K_SLACK, sampled_top_k};

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

/// The error for the non-finite entry `i` of `x`.
fn non_finite_at(x: &[f32], i: usize) -> CompressError {
    CompressError::NonFinite {
        index: i,
        value: x[i],
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
