//! Error feedback: what a codec did not send is remembered and sent later.
//!
//! SINGA's `corr` memory, one per partition: `acc = residual + g`; select
//! from `acc`; `residual = acc - sent`. For the sparse codecs the sent values
//! are `acc`'s own entries, so `residual` is `acc` with the sent entries set
//! to zero and `sent + residual == acc` holds bitwise. For the casts,
//! `residual = acc - widen(sent) / scale`, exact up to one rounding.
//!
//! With momentum correction (Deep Gradient Compression), the memory also holds
//! a velocity `u`: `u = mu * u + g; v = v + u`; select from `v`; both `u` and
//! `v` are zeroed where entries were sent, so momentum does not push stale
//! directions into entries that were just applied.
//!
//! A gradient holding a NaN or an infinity is refused with
//! [`CompressError::NonFinite`] before anything changes; if adding a finite
//! gradient overflows the memory, the memory is reset to zero and the same
//! error is returned: a non-finite value never stays in the residual.

use crate::cast::{self, CastOptions};
use crate::error::{CompressError, Result};
use crate::select::{self, SelectScratch};
use crate::sparse::SparseVec;
use crate::wire::CodecId;
use gradwire_tensor::WithDType;
use std::ops::Range;

/// A sparse codec: which entries to send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SparseCodec {
    /// Every entry with `|x| >= threshold` ([`select::threshold`]).
    Threshold(f32),
    /// The `ceil(ratio * n)` largest magnitudes ([`select::top_k`]).
    TopK(f64),
    /// Between k and 1.3 k of the largest, estimated from a sample
    /// ([`select::sampled_top_k`]).
    SampledTopK(f64),
    /// `ceil(ratio * n)` uniformly random entries ([`select::random_k`]),
    /// drawn from `seed` mixed with the step number under error feedback.
    RandomK {
        /// Fraction of entries kept, in (0, 1].
        ratio: f64,
        /// The seed of the ChaCha8 generator.
        seed: u64,
    },
}

impl SparseCodec {
    /// The codec's id in the wire format.
    pub fn wire_id(&self) -> CodecId {
        match self {
            SparseCodec::Threshold(_) => CodecId::Threshold,
            SparseCodec::TopK(_) => CodecId::TopK,
            SparseCodec::SampledTopK(_) => CodecId::SampledTopK,
            SparseCodec::RandomK { .. } => CodecId::RandomK,
        }
    }

    /// Selects from `x` (random-k unscaled, with the seed as given).
    pub fn select(&self, x: &[f32]) -> Result<SparseVec> {
        let mut out = SparseVec::default();
        self.select_into(x, &mut out, &mut SelectScratch::default())?;
        Ok(out)
    }

    /// [`SparseCodec::select`] into `out` (refilled, its buffers reused),
    /// working in `scratch`: the same selection, and no allocation once the
    /// buffers have grown.
    pub fn select_into(
        &self,
        x: &[f32],
        out: &mut SparseVec,
        scratch: &mut SelectScratch,
    ) -> Result<()> {
        self.select_at_step(x, 0, out, scratch)
    }

    fn select_at_step(
        &self,
        x: &[f32],
        step: u64,
        out: &mut SparseVec,
        scratch: &mut SelectScratch,
    ) -> Result<()> {
        match *self {
            SparseCodec::Threshold(t) => select::threshold_into(x, t, out),
            SparseCodec::TopK(ratio) => {
                let k = select::count_for_ratio(ratio, x.len())?;
                select::top_k_count_into(x, k, out, scratch)
            }
            SparseCodec::SampledTopK(ratio) => select::sampled_top_k_into(x, ratio, out, scratch),
            SparseCodec::RandomK { ratio, seed } => {
                // A different draw every step, reproducible from (seed, step).
                let seed = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                select::random_k_into(x, ratio, seed, false, out, scratch)
            }
        }
    }
}

/// The error-feedback memory of one partition.
///
/// `clone_from` reuses the destination's buffers: a caller that keeps a
/// copy of the memory every step (to put back if the step fails) allocates
/// nothing once the copy exists.
#[derive(Debug, PartialEq)]
pub struct ErrorFeedback {
    residual: Vec<f32>,
    momentum: Option<Momentum>,
    steps: u64,
}

impl Clone for ErrorFeedback {
    fn clone(&self) -> Self {
        ErrorFeedback {
            residual: self.residual.clone(),
            momentum: self.momentum.clone(),
            steps: self.steps,
        }
    }

    fn clone_from(&mut self, source: &Self) {
        self.residual.clone_from(&source.residual);
        match (&mut self.momentum, &source.momentum) {
            (Some(mine), Some(theirs)) => mine.clone_from(theirs),
            (mine, theirs) => mine.clone_from(theirs),
        }
        self.steps = source.steps;
    }
}

/// DGC's momentum correction state.
#[derive(Debug, PartialEq)]
struct Momentum {
    mu: f32,
    velocity: Vec<f32>,
}

impl Clone for Momentum {
    fn clone(&self) -> Self {
        Momentum {
            mu: self.mu,
            velocity: self.velocity.clone(),
        }
    }

    fn clone_from(&mut self, source: &Self) {
        self.mu = source.mu;
        self.velocity.clone_from(&source.velocity);
    }
}

/// Everything an [`ErrorFeedback`] holds, for checkpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorFeedbackState {
    /// The residual (with momentum correction: the accumulated velocity `v`).
    pub residual: Vec<f32>,
    /// The momentum coefficient and velocity `u`, if momentum correction is on.
    pub momentum: Option<(f32, Vec<f32>)>,
    /// Steps taken (it seeds random-k).
    pub steps: u64,
}

impl ErrorFeedback {
    /// A zeroed memory for a partition of `len` elements.
    pub fn new(len: usize) -> ErrorFeedback {
        ErrorFeedback {
            residual: vec![0.0; len],
            momentum: None,
            steps: 0,
        }
    }

    /// A zeroed memory with DGC momentum correction, `mu` in [0, 1).
    pub fn with_momentum(len: usize, mu: f32) -> Result<ErrorFeedback> {
        if !(0.0..1.0).contains(&mu) {
            return Err(CompressError::InvalidArgument(format!(
                "momentum {mu} is outside [0, 1)"
            )));
        }
        Ok(ErrorFeedback {
            residual: vec![0.0; len],
            momentum: Some(Momentum {
                mu,
                velocity: vec![0.0; len],
            }),
            steps: 0,
        })
    }

    /// Number of elements of the partition.
    pub fn len(&self) -> usize {
        self.residual.len()
    }

    /// Whether the partition is empty.
    pub fn is_empty(&self) -> bool {
        self.residual.is_empty()
    }

    /// What has not been sent yet.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The state, for a checkpoint.
    pub fn state(&self) -> ErrorFeedbackState {
        ErrorFeedbackState {
            residual: self.residual.clone(),
            momentum: self.momentum.as_ref().map(|m| (m.mu, m.velocity.clone())),
            steps: self.steps,
        }
    }

    /// Restores a state saved by [`ErrorFeedback::state`]; errors on
    /// inconsistent lengths, a momentum outside [0, 1) or non-finite values.
    pub fn from_state(state: ErrorFeedbackState) -> Result<ErrorFeedback> {
        let len = state.residual.len();
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
        if !finite(&state.residual) {
            return Err(CompressError::InvalidArgument(
                "residual is not finite".into(),
            ));
        }
        let momentum = match state.momentum {
            None => None,
            Some((mu, velocity)) => {
                if !(0.0..1.0).contains(&mu) {
                    return Err(CompressError::InvalidArgument(format!(
                        "momentum {mu} is outside [0, 1)"
                    )));
                }
                if velocity.len() != len {
                    return Err(CompressError::LengthMismatch {
                        op: "ErrorFeedback::from_state",
                        expected: len,
                        got: velocity.len(),
                    });
                }
                if !finite(&velocity) {
                    return Err(CompressError::InvalidArgument(
                        "velocity is not finite".into(),
                    ));
                }
                Some(Momentum { mu, velocity })
            }
        };
        Ok(ErrorFeedback {
            residual: state.residual,
            momentum,
            steps: state.steps,
        })
    }

    /// Adds `grad` into the memory (refusing non-finite input, resetting on
    /// overflow). Afterwards `residual` holds the accumulator to select from.
    fn accumulate(&mut self, grad: &[f32]) -> Result<()> {
        self.accumulate_parts(std::iter::once(grad))
    }

    /// [`Self::accumulate`] of a gradient given as consecutive `parts`
    /// (read twice: checked whole before anything changes, then added).
    fn accumulate_parts<'g>(
        &mut self,
        parts: impl Iterator<Item = &'g [f32]> + Clone,
    ) -> Result<()> {
        let len: usize = parts.clone().map(<[f32]>::len).sum();
        if len != self.residual.len() {
            return Err(CompressError::LengthMismatch {
                op: "ErrorFeedback",
                expected: self.residual.len(),
                got: len,
            });
        }
        let mut offset = 0;
        for part in parts.clone() {
            if let Some(i) = first_non_finite(part) {
                return Err(CompressError::NonFinite {
                    index: offset + i,
                    value: part[i],
                });
            }
            offset += part.len();
        }
        let mut finite = true;
        let mut offset = 0;
        for part in parts {
            let range = offset..offset + part.len();
            offset = range.end;
            let acc = &mut self.residual[range.clone()];
            finite &= match &mut self.momentum {
                None => add_checked(acc, part),
                Some(m) => {
                    let u = &mut m.velocity[range];
                    for (u, &g) in u.iter_mut().zip(part) {
                        *u = m.mu * *u + g;
                    }
                    add_checked(acc, u)
                }
            };
        }
        if !finite {
            let index = first_non_finite(&self.residual).unwrap_or(0);
            let value = self.residual.get(index).copied().unwrap_or(f32::INFINITY);
            self.reset();
            return Err(CompressError::NonFinite { index, value });
        }
        Ok(())
    }

    /// Adds the whole residual into `dense` and zeroes the memory: for a step
    /// that sends everything (a dense fallback), after which nothing is owed.
    pub fn flush_into(&mut self, dense: &mut [f32]) -> Result<()> {
        if dense.len() != self.residual.len() {
            return Err(CompressError::LengthMismatch {
                op: "ErrorFeedback::flush_into",
                expected: self.residual.len(),
                got: dense.len(),
            });
        }
        for (d, r) in dense.iter_mut().zip(&self.residual) {
            *d += r;
        }
        self.reset();
        Ok(())
    }

    /// Makes this the memory of `parts` of `whole`: their residuals (and
    /// velocities, with `whole`'s momentum) back to back, and `whole`'s step
    /// count, in this memory's reused buffers. For a step that only some
    /// entries of a partition go through; [`ErrorFeedback::store_parts`]
    /// writes the result back. Errors, before anything changes: a range
    /// outside `whole`.
    pub fn load_parts(&mut self, whole: &ErrorFeedback, parts: &[Range<usize>]) -> Result<()> {
        check_parts("ErrorFeedback::load_parts", whole.len(), parts)?;
        let gather = |from: &[f32], to: &mut Vec<f32>| {
            to.clear();
            for r in parts {
                to.extend_from_slice(&from[r.clone()]);
            }
        };
        gather(&whole.residual, &mut self.residual);
        match (&whole.momentum, &mut self.momentum) {
            (None, mine) => *mine = None,
            (Some(theirs), Some(mine)) => {
                mine.mu = theirs.mu;
                gather(&theirs.velocity, &mut mine.velocity);
            }
            (Some(theirs), mine) => {
                let mut velocity = Vec::new();
                gather(&theirs.velocity, &mut velocity);
                *mine = Some(Momentum {
                    mu: theirs.mu,
                    velocity,
                });
            }
        }
        self.steps = whole.steps;
        Ok(())
    }

    /// Writes this memory back into `parts` of `whole` (the inverse of
    /// [`ErrorFeedback::load_parts`]), with this memory's step count; the
    /// rest of `whole` stays as it is. Errors, before anything changes: a
    /// range outside `whole`, parts that do not add up to this memory's
    /// length, or a momentum on one side only.
    pub fn store_parts(&self, whole: &mut ErrorFeedback, parts: &[Range<usize>]) -> Result<()> {
        check_parts("ErrorFeedback::store_parts", whole.len(), parts)?;
        let total: usize = parts.iter().map(|r| r.len()).sum();
        if total != self.len() {
            return Err(CompressError::LengthMismatch {
                op: "ErrorFeedback::store_parts",
                expected: self.len(),
                got: total,
            });
        }
        if self.momentum.is_some() != whole.momentum.is_some() {
            return Err(CompressError::InvalidArgument(
                "ErrorFeedback::store_parts: a momentum on one side only".into(),
            ));
        }
        let scatter = |from: &[f32], to: &mut [f32]| {
            let mut offset = 0;
            for r in parts {
                to[r.clone()].copy_from_slice(&from[offset..offset + r.len()]);
                offset += r.len();
            }
        };
        scatter(&self.residual, &mut whole.residual);
        if let (Some(mine), Some(theirs)) = (&self.momentum, &mut whole.momentum) {
            scatter(&mine.velocity, &mut theirs.velocity);
        }
        whole.steps = self.steps;
        Ok(())
    }

    /// Zeroes the memory (residual and velocity).
    pub fn reset(&mut self) {
        self.residual.iter_mut().for_each(|r| *r = 0.0);
        if let Some(m) = &mut self.momentum {
            m.velocity.iter_mut().for_each(|u| *u = 0.0);
        }
    }

    /// One step with a sparse codec: accumulates `grad`, selects, and keeps
    /// what was not selected. Returns what to send.
    pub fn compress(&mut self, grad: &[f32], codec: &SparseCodec) -> Result<SparseVec> {
        let mut sent = SparseVec::default();
        self.compress_into(grad, codec, &mut sent, &mut SelectScratch::default())?;
        Ok(sent)
    }

    /// [`ErrorFeedback::compress`] into `sent` (refilled, its buffers
    /// reused), selecting in `scratch`: no allocation once they have grown.
    pub fn compress_into(
        &mut self,
        grad: &[f32],
        codec: &SparseCodec,
        sent: &mut SparseVec,
        scratch: &mut SelectScratch,
    ) -> Result<()> {
        self.compress_parts_into(std::iter::once(grad), codec, sent, scratch)
    }

    /// [`ErrorFeedback::compress_into`] of a gradient given as consecutive
    /// `parts` (a bucket's tensors, back to back), without gathering them
    /// into one buffer: the same memory and selection, bit for bit, and a
    /// non-finite entry's index counted across the parts.
    pub fn compress_parts_into<'g>(
        &mut self,
        parts: impl Iterator<Item = &'g [f32]> + Clone,
        codec: &SparseCodec,
        sent: &mut SparseVec,
        scratch: &mut SelectScratch,
    ) -> Result<()> {
        self.accumulate_parts(parts)?;
        codec.select_at_step(&self.residual, self.steps, sent, scratch)?;
        for &i in sent.indices() {
            let i = i as usize;
            if let Some(r) = self.residual.get_mut(i) {
                *r = 0.0;
            }
            if let Some(u) = self.momentum.as_mut().and_then(|m| m.velocity.get_mut(i)) {
                *u = 0.0;
            }
        }
        self.steps += 1;
        Ok(())
    }

    /// One step with a cast: accumulates `grad`, rounds the accumulator into
    /// `dst` (per `opts`), and keeps the rounding error (and what the clamp
    /// cut off) for the next step.
    pub fn compress_cast<H: WithDType>(
        &mut self,
        grad: &[f32],
        dst: &mut [H],
        opts: &CastOptions,
    ) -> Result<()> {
        if dst.len() != self.residual.len() {
            return Err(CompressError::LengthMismatch {
                op: "ErrorFeedback::compress_cast",
                expected: self.residual.len(),
                got: dst.len(),
            });
        }
        self.accumulate(grad)?;
        cast::encode(&self.residual, dst, opts)?;
        let inverse = 1.0 / opts.scale;
        let mut wide = [0f32; 1024];
        for (acc, sent) in self.residual.chunks_mut(1024).zip(dst.chunks(1024)) {
            let wide = &mut wide[..acc.len()];
            cast::decode(sent, wide)?;
            for (a, &w) in acc.iter_mut().zip(wide.iter()) {
                *a -= w * inverse;
            }
        }
        self.steps += 1;
        Ok(())
    }
}

/// Every range lies within `len` (a reversed range is refused too).
fn check_parts(op: &'static str, len: usize, parts: &[Range<usize>]) -> Result<()> {
    match parts.iter().find(|r| r.start > r.end || r.end > len) {
        Some(bad) => Err(CompressError::InvalidArgument(format!(
            "{op}: range {bad:?} outside a memory of {len} entries"
        ))),
        None => Ok(()),
    }
}

fn first_non_finite(x: &[f32]) -> Option<usize> {
    x.iter().position(|v| !v.is_finite())
}

/// `acc += x`; whether every result is finite.
fn add_checked(acc: &mut [f32], x: &[f32]) -> bool {
    let mut finite = true;
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += v;
        finite &= a.is_finite();
    }
    finite
}
