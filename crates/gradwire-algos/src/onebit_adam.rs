//! 1-bit Adam's exchange (Tang et al., ICML 2021) as a bucket's
//! [`Strategy`]: dense gradient averages during the warm-up, tracking
//! Adam's first moment as the optimizer does; from `freeze_step` on, each
//! rank's moment with its own gradient folded in, averaged through the
//! 1-bit all-reduce with error feedback on both sides
//! ([`crate::quantized`]); every rank continues from the average. State
//! (the moment, both residuals) is put back by a failed or skipped step.

use crate::dense::fused_all_reduce_with;
use crate::error::Result;
use crate::fault::prepare;
use crate::fusion::FusionBuffers;
use crate::handle::Traffic;
use crate::quantized::QuantizedAllReduce;
use crate::strategy::{BucketView, Combined, StateDict, Strategy};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_compress::Quantizer;
use gradwire_tensor::Tensor;

/// 1-bit Adam's exchange of one bucket: the warm-up here, the compressed
/// stage, the rollback and the checkpoints those of the
/// [`QuantizedAllReduce`] it holds (1-bit sign, error feedback, Adam's
/// momentum).
#[derive(Debug)]
pub struct OneBitAdamExchange {
    beta1: f32,
    freeze_step: u64,
    /// The compressed stage; its state's `momentum` is the bucket's first
    /// moment in both stages.
    quantized: QuantizedAllReduce,
    /// The warm-up's dense buffers.
    fusion: FusionBuffers,
}

impl OneBitAdamExchange {
    /// The exchange for Adam's `beta1`, compressed from `freeze_step` on.
    pub fn new(beta1: f32, freeze_step: u64) -> Result<Self> {
        let quantized =
            QuantizedAllReduce::new(Quantizer::Sign, true)?.with_adam_momentum(beta1)?;
        Ok(OneBitAdamExchange {
            beta1,
            freeze_step,
            quantized,
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
    ) -> Result<Traffic> {
        // Checked before the collective: the warm-up folds f32 host values.
        prepare(comm, || {
            tensors
                .iter()
                .try_for_each(|t| crate::error::require_f32_on_host("1-bit Adam", t))
        })?;
        let q = &mut self.quantized;
        q.before.keep(&q.state);
        let full_len = bucket.written_ranges(&mut q.written);
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
        let QuantizedAllReduce { state, written, .. } = q;
        let m = &mut state.momentum;
        if m.len() < full_len {
            m.resize(full_len, 0.0);
        }
        for (t, r) in tensors.iter_mut().zip(written.iter()) {
            t.scale(inverse)?;
            for (m, g) in m[r.clone()].iter_mut().zip(t.as_slice::<f32>()?) {
                *m = beta1 * *m + gain * g;
            }
        }
        Ok(traffic)
    }
}

impl<C: Communicator + 'static> Strategy<C> for OneBitAdamExchange {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> Result<Combined> {
        if bucket.step >= self.freeze_step {
            return self.quantized.combine(comm, bucket, tensors);
        }
        Ok(Combined {
            traffic: self.warm_up(comm, bucket, tensors)?,
            averaged: true,
        })
    }

    fn end_step(&mut self, bucket: usize, kept: bool) {
        Strategy::<C>::end_step(&mut self.quantized, bucket, kept);
    }

    /// As [`QuantizedAllReduce`]'s (`quantized/<bucket>/...`; the moment is
    /// `.../momentum`).
    fn save_state(&self, bucket: usize, state: &mut StateDict) -> Result<()> {
        Strategy::<C>::save_state(&self.quantized, bucket, state)
    }

    fn load_state(&mut self, bucket: usize, state: &StateDict, apply: bool) -> Result<()> {
        Strategy::<C>::load_state(&mut self.quantized, bucket, state, apply)
    }

    fn reshard_state(
        &self,
        bucket: usize,
        saved: &[&StateDict],
        out: &mut StateDict,
    ) -> Result<()> {
        Strategy::<C>::reshard_state(&self.quantized, bucket, saved, out)
    }
}
