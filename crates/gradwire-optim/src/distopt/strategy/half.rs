//! The half-precision strategy (SINGA's `backward_and_update_half`, done
//! right): f16 or bf16 on the wire, averaged in f32 before the one
//! rounding, optionally clamped first.

use super::{BucketView, Combined, Combiner};
use gradwire_algos::{FusionBuffers, HalfOptions, HalfPrecision, half_all_reduce_with};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_tensor::Tensor;

/// The average with half-precision wire buffers, reused from step to step.
#[derive(Debug)]
pub struct HalfAverage {
    options: HalfOptions,
    fusion: FusionBuffers,
}

impl HalfAverage {
    /// `precision` on the wire; gradients clamped to `[-clip, clip]` first
    /// when `clip` is given.
    pub fn new(precision: HalfPrecision, clip: Option<f32>) -> Self {
        HalfAverage {
            options: HalfOptions {
                precision,
                clip,
                op: ReduceOp::Avg,
            },
            fusion: FusionBuffers::default(),
        }
    }
}

impl<C: Communicator + 'static> Combiner<C> for HalfAverage {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        let traffic = half_all_reduce_with(
            comm,
            tensors,
            &self.options,
            bucket.capacity,
            &mut self.fusion,
        )?;
        Ok(Combined {
            traffic,
            averaged: true,
        })
    }
}
