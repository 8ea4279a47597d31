//! 1-bit Adam's exchange (Tang et al., ICML 2021): dense gradient averages
//! during the warm-up, tracking Adam's first moment as the optimizer does;
//! from `freeze_step` on, each rank's moment with its own gradient folded
//! in, averaged through the 1-bit all-reduce with error feedback on both
//! sides ([`gradwire_algos::quantized`]); every rank continues from the
//! average. State (the moment, both residuals) is put back by a failed or
//! skipped step.

use super::quantized::{QuantizedAverage, written_ranges};
use super::{BucketView, Combined, Combiner};
use crate::checkpoint::Checkpoint;
use crate::error::Result;
use gradwire_algos::fault::prepare;
use gradwire_algos::quantized::QuantizedAllReduce;
use gradwire_algos::{AlgoError, FusionBuffers, fused_all_reduce_with};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_compress::Quantizer;
use gradwire_tensor::{DType, Tensor};

/// 1-bit Adam's exchange of one bucket: the warm-up here, the compressed
/// stage, the rollback and the checkpoints those of [`QuantizedAverage`]
/// (1-bit sign, error feedback, Adam's momentum).
#[derive(Debug)]
pub struct OneBitAdamMomentum {
    beta1: f32,
    freeze_step: u64,
    /// The compressed stage; its state's `momentum` is the bucket's first
    /// moment in both stages.
    quantized: QuantizedAverage,
    /// The warm-up's dense buffers.
    fusion: FusionBuffers,
}

impl OneBitAdamMomentum {
    /// The exchange for Adam's `beta1`, compressed from `freeze_step` on.
    pub fn new(beta1: f32, freeze_step: u64) -> gradwire_algos::Result<Self> {
        let inner = QuantizedAllReduce::new(Quantizer::Sign, true)?.with_adam_momentum(beta1)?;
        Ok(OneBitAdamMomentum {
            beta1,
            freeze_step,
            quantized: QuantizedAverage::around(inner),
            fusion: FusionBuffers::default(),
        })
    }

    /// The warm-up: the dense average, folded into the moment as Adam folds
    /// it (`m = beta1 m + (1 - beta1) g`, the same on every rank).
    fn warm_up<C: Communicator>(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<gradwire_algos::Traffic> {
        // Checked before the collective: the warm-up folds f32 host values.
        prepare(comm, || {
            match tensors
                .iter()
                .find(|t| t.dtype() != DType::F32 || !t.device().is_cpu())
            {
                Some(t) => Err(AlgoError::InvalidArgument(format!(
                    "1-bit Adam runs on f32 tensors in host memory, got {} on {:?}",
                    t.dtype(),
                    t.device()
                ))),
                None => Ok(()),
            }
        })?;
        let q = &mut self.quantized;
        q.before.keep(q.inner.state());
        let full_len = written_ranges(bucket, &mut q.ranges);
        let traffic = fused_all_reduce_with(
            comm,
            tensors,
            ReduceOp::Sum,
            bucket.capacity,
            &mut self.fusion,
        )?;
        let inverse = 1.0 / comm.world_size() as f32;
        let (beta1, gain) = (self.beta1, 1.0 - self.beta1);
        // The reduction is done: what follows is alike on every rank.
        let m = &mut q.inner.state_mut().momentum;
        if m.len() < full_len {
            m.resize(full_len, 0.0);
        }
        for (t, r) in tensors.iter_mut().zip(&q.ranges) {
            t.scale(inverse)?;
            for (m, g) in m[r.clone()].iter_mut().zip(t.as_slice::<f32>()?) {
                *m = beta1 * *m + gain * g;
            }
        }
        Ok(traffic)
    }
}

impl<C: Communicator + 'static> Combiner<C> for OneBitAdamMomentum {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        if bucket.step >= self.freeze_step {
            return self.quantized.combine(comm, bucket, tensors);
        }
        Ok(Combined {
            traffic: self.warm_up(comm, bucket, tensors)?,
            averaged: true,
        })
    }

    fn end_step(&mut self, bucket: usize, kept: bool) {
        Combiner::<C>::end_step(&mut self.quantized, bucket, kept);
    }

    /// As [`QuantizedAverage`]'s (`quantized/<bucket>/...`; the moment is
    /// `.../momentum`).
    fn save_state(&self, bucket: usize, ckpt: &mut Checkpoint) -> Result<()> {
        Combiner::<C>::save_state(&self.quantized, bucket, ckpt)
    }

    fn load_state(&mut self, bucket: usize, ckpt: &Checkpoint, apply: bool) -> Result<()> {
        Combiner::<C>::load_state(&mut self.quantized, bucket, ckpt, apply)
    }
}
