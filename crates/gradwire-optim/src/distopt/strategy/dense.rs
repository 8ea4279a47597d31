//! The dense strategy: the f32 sum of the fused bucket (SINGA's
//! `backward_and_update`), which DistOpt divides by the world size.

use super::{BucketView, Combined, Combiner};
use gradwire_algos::{FusionBuffers, fused_all_reduce_with};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_tensor::Tensor;

/// The plain sum, through a fusion buffer reused from step to step.
#[derive(Debug, Default)]
pub struct DenseSum {
    fusion: FusionBuffers,
}

impl<C: Communicator + 'static> Combiner<C> for DenseSum {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        let traffic = fused_all_reduce_with(
            comm,
            tensors,
            ReduceOp::Sum,
            bucket.capacity,
            &mut self.fusion,
        )?;
        Ok(Combined {
            traffic,
            averaged: false,
        })
    }

    fn carries_non_finite(&self) -> bool {
        true
    }
}
