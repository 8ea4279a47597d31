//! The sparse strategy (SINGA's `backward_and_sparse_update`, done right):
//! each rank sends what its codec selects, with an error-feedback residual
//! per bucket when asked (SINGA's `corr`); a bucket not sparse enough for
//! the world size travels dense. The sum is divided by the world size.
//! Buckets of CUDA tensors (feature `cuda`) select and keep their residual
//! on the device (`device.rs`).

use super::{BeforeStep, BucketView, Combined, Combiner};
use crate::checkpoint::Checkpoint;
use crate::error::{OptimError, Result};
use gradwire_algos::fault::prepare;
use gradwire_algos::{FusionBuffers, sparse_exchange_with};
use gradwire_comm::Communicator;
use gradwire_compress::{ErrorFeedback, ErrorFeedbackState, SparseCodec};
use gradwire_tensor::Tensor;
use std::ops::Range;

#[cfg(feature = "cuda")]
mod device;

/// A codec's selection, exchanged, with an optional error-feedback
/// residual that a failed or skipped step puts back.
#[derive(Debug)]
pub struct SparseSelect {
    codec: SparseCodec,
    /// The residual (with error feedback), as the last kept step left it.
    residual: Option<ErrorFeedback>,
    /// The residual as it was before this step's combination.
    before: BeforeStep<Option<ErrorFeedback>>,
    /// When only some of the bucket's parameters were written: their
    /// ranges of the residual, and the residual of those ranges that goes
    /// through the step.
    written_ranges: Vec<Range<usize>>,
    written_residual: ErrorFeedback,
    fusion: FusionBuffers,
    /// The residual in device memory, for buckets of CUDA tensors.
    #[cfg(feature = "cuda")]
    device: device::DeviceResidual,
}

impl SparseSelect {
    /// `codec`'s selections, with an error-feedback residual of
    /// `feedback_len` elements (the bucket's) when given.
    pub fn new(codec: SparseCodec, feedback_len: Option<usize>) -> Self {
        SparseSelect {
            codec,
            residual: feedback_len.map(ErrorFeedback::new),
            before: BeforeStep::default(),
            written_ranges: Vec::new(),
            written_residual: ErrorFeedback::new(0),
            fusion: FusionBuffers::default(),
            #[cfg(feature = "cuda")]
            device: Default::default(),
        }
    }

    /// The codec of this step: without error feedback nothing counts the
    /// steps for random-k, so the optimizer's step is mixed into its seed
    /// (else every step would draw the same indices, alike on every rank).
    fn codec_at(&self, step: u64) -> SparseCodec {
        match self.codec {
            SparseCodec::RandomK { ratio, seed } if self.residual.is_none() => {
                SparseCodec::RandomK {
                    ratio,
                    seed: seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                }
            }
            codec => codec,
        }
    }
}

impl<C: Communicator + 'static> Combiner<C> for SparseSelect {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        let codec = self.codec_at(bucket.step);
        // A bucket of CUDA tensors keeps its residual (and its copy from
        // before the step) on the device.
        #[cfg(feature = "cuda")]
        if let Some(gradwire_tensor::Device::Cuda(ordinal)) = tensors.first().map(Tensor::device) {
            return self.combine_on_device(comm, bucket, tensors, &codec, ordinal);
        }
        // The residual as it was (none without error feedback), in memory
        // kept from step to step; the exchange need not keep a copy of its
        // own.
        self.before.keep(&self.residual);
        let Some(memory) = self.residual.as_mut() else {
            let traffic = sparse_exchange_with(comm, tensors, &codec, None, &mut self.fusion)?;
            return Ok(Combined {
                traffic,
                averaged: false,
            });
        };
        let traffic = if bucket.written.iter().all(|&w| w) {
            sparse_exchange_with(comm, tensors, &codec, Some(memory), &mut self.fusion)?
        } else {
            // Only the written parameters take part: their part of the
            // residual goes through the step, the rest stays as it is.
            self.written_ranges.clear();
            let mut offset = 0;
            for (&n, &w) in bucket.lens.iter().zip(bucket.written) {
                if w {
                    self.written_ranges.push(offset..offset + n);
                }
                offset += n;
            }
            let (ranges, sub) = (&self.written_ranges, &mut self.written_residual);
            prepare(comm, || Ok(sub.load_parts(memory, ranges)?))?;
            let traffic = sparse_exchange_with(comm, tensors, &codec, Some(sub), &mut self.fusion)?;
            // Cannot fail: the same ranges, and `sub` was loaded from `memory`.
            sub.store_parts(memory, ranges)?;
            traffic
        };
        Ok(Combined {
            traffic,
            averaged: false,
        })
    }

    fn end_step(&mut self, _bucket: usize, kept: bool) {
        self.before.end(&mut self.residual, kept);
        #[cfg(feature = "cuda")]
        self.device.end_step(kept);
    }

    /// The residual as tensor `residual/<bucket>` and its step count as
    /// value `residual_steps/<bucket>`.
    fn save_state(&self, bucket: usize, ckpt: &mut Checkpoint) -> Result<()> {
        #[cfg(feature = "cuda")]
        let on_device = self.device.host_copy()?;
        #[cfg(feature = "cuda")]
        let residual = on_device.as_ref().or(self.residual.as_ref());
        #[cfg(not(feature = "cuda"))]
        let residual = self.residual.as_ref();
        if let Some(memory) = residual {
            let residual = memory.residual().to_vec();
            let n = residual.len();
            ckpt.tensors
                .insert(format!("residual/{bucket}"), Tensor::from_vec(residual, n)?);
            ckpt.values
                .insert(format!("residual_steps/{bucket}"), memory.steps().into());
        }
        Ok(())
    }

    fn load_state(&mut self, bucket: usize, ckpt: &Checkpoint, apply: bool) -> Result<()> {
        let mismatch = |what: String| OptimError::StateMismatch(what);
        let saved = ckpt.tensors.get(&format!("residual/{bucket}"));
        let restored = match (&self.residual, saved) {
            (None, None) => None,
            (Some(memory), Some(t)) if t.len() == memory.len() => {
                let steps = ckpt
                    .values
                    .get(&format!("residual_steps/{bucket}"))
                    .and_then(|v| v.as_u64())
                    .ok_or_else(|| mismatch(format!("no residual_steps/{bucket}")))?;
                Some(
                    ErrorFeedback::from_state(ErrorFeedbackState {
                        residual: t.to_vec::<f32>()?,
                        momentum: None,
                        steps,
                    })
                    .map_err(|e| mismatch(format!("residual {bucket}: {e}")))?,
                )
            }
            _ => {
                return Err(mismatch(format!(
                    "residual of bucket {bucket} does not match"
                )));
            }
        };
        if apply {
            self.residual = restored;
            self.before.forget();
            #[cfg(feature = "cuda")]
            self.device.forget();
        }
        Ok(())
    }
}
