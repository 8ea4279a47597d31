//! The pairwise rule on host slices, per tensor range, with its f64
//! partials, and the sequential reference the collective must match.

use crate::error::{AlgoError, Result};
use std::ops::Range;

/// Below this a squared norm counts as zero: its coefficient stays 1.
fn tiny() -> f64 {
    f64::MIN_POSITIVE.sqrt()
}

/// The two coefficients of the pairwise rule from the f64 partials.
fn coefficients(dot: f64, aa: f64, bb: f64) -> (f64, f64) {
    let ca = if aa < tiny() {
        1.0
    } else {
        1.0 - dot / (2.0 * aa)
    };
    let cb = if bb < tiny() {
        1.0
    } else {
        1.0 - dot / (2.0 * bb)
    };
    (ca, cb)
}

/// Partial (dot, |a|^2, |b|^2) of each tensor over `piece`, three values per
/// tensor, in f64, into `out` (refilled).
pub(super) fn partials(
    a: &[f32],
    b: &[f32],
    tensors: &[Range<usize>],
    piece: &Range<usize>,
    out: &mut Vec<f64>,
) {
    out.clear();
    for t in tensors {
        let (lo, hi) = (t.start.max(piece.start), t.end.min(piece.end));
        let (mut dot, mut aa, mut bb) = (0f64, 0f64, 0f64);
        if lo < hi {
            for (&x, &y) in a[lo..hi].iter().zip(&b[lo..hi]) {
                let (x, y) = (f64::from(x), f64::from(y));
                dot += x * y;
                aa += x * x;
                bb += y * y;
            }
        }
        out.extend([dot, aa, bb]);
    }
}

/// `a = ca a + cb b` per tensor over `piece`, from the summed partials.
pub(super) fn apply(
    a: &mut [f32],
    b: &[f32],
    tensors: &[Range<usize>],
    piece: &Range<usize>,
    sums: &[f64],
) {
    for (t, s) in tensors.iter().zip(sums.chunks_exact(3)) {
        let (lo, hi) = (t.start.max(piece.start), t.end.min(piece.end));
        if lo >= hi {
            continue;
        }
        let (ca, cb) = coefficients(s[0], s[1], s[2]);
        for (x, &y) in a[lo..hi].iter_mut().zip(&b[lo..hi]) {
            *x = (ca * f64::from(*x) + cb * f64::from(y)) as f32;
        }
    }
}

/// The pairwise rule on whole vectors: `a = adasum(a, b)`, per tensor range.
pub fn pairwise(a: &mut [f32], b: &[f32], tensors: &[Range<usize>]) -> Result<()> {
    if a.len() != b.len() || tensors.iter().any(|t| t.end > a.len() || t.start > t.end) {
        return Err(AlgoError::InvalidArgument(format!(
            "pairwise: vectors of {} and {} elements, tensor ranges {tensors:?}",
            a.len(),
            b.len()
        )));
    }
    pairwise_in(a, b, tensors, &mut Vec::with_capacity(3 * tensors.len()));
    Ok(())
}

/// [`pairwise`] of checked inputs, with the partials in `sums`.
pub(super) fn pairwise_in(a: &mut [f32], b: &[f32], tensors: &[Range<usize>], sums: &mut Vec<f64>) {
    let all = 0..a.len();
    partials(a, b, tensors, &all, sums);
    apply(a, b, tensors, &all, sums);
}

/// The sequential reference: the binary tree of [`pairwise`] combinations
/// that [`AdaSum::combine`](super::AdaSum::combine) computes, over `vectors` (one per rank).
pub fn reference(mut vectors: Vec<Vec<f32>>, tensors: &[Range<usize>]) -> Result<Vec<f32>> {
    let w = vectors.len();
    if w == 0 {
        return Ok(Vec::new());
    }
    let p = largest_power_of_two(w);
    for r in p..w {
        let b = vectors[r].clone();
        pairwise(&mut vectors[r - p], &b, tensors)?;
    }
    let mut d = 1;
    while d < p {
        for r in (0..p).step_by(2 * d) {
            let b = vectors[r + d].clone();
            pairwise(&mut vectors[r], &b, tensors)?;
        }
        d *= 2;
    }
    Ok(vectors.swap_remove(0))
}

pub(super) fn largest_power_of_two(w: usize) -> usize {
    if w == 0 {
        0
    } else {
        1 << (usize::BITS - 1 - w.leading_zeros())
    }
}
