//! Delta-weight mode (Horovod's AdaSum default, MindSpore's
//! `AdaSumByDeltaWeightWrapCell`): a local step from `p0`, then the weight
//! changes `p0 - p` combined bucket by bucket by the bucket's strategy (the
//! [`super::Strategy`]), then `p = p0 - combined`.

use super::local_step::{LocalUpdate, copy_into, differences_into, overwrite};
use super::{Engine, StepStats};
use crate::error::Result;
use crate::optimizer::Optimizer;
use gradwire_algos::BucketView;
use gradwire_algos::FaultKind;
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;
use std::time::Instant;

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// Delta-weight mode's finish: the local step from `p0`, then the weight
    /// changes combined bucket by bucket, then `p = p0 - combined`. If the
    /// combination fails (on any rank: every rank alike), every parameter
    /// is put back to its `p0`.
    pub(crate) fn finish_delta_weight(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        local: LocalUpdate<'_>,
    ) -> Result<StepStats> {
        let mut stats = StepStats {
            buckets: self.buckets.len(),
            ..StepStats::default()
        };
        // Every parameter keeps its p0, in tensors kept from step to step.
        let mut p0 = std::mem::take(&mut self.local.p0);
        copy_into(&mut p0, targets.iter().flatten().map(|t| &**t));
        let result = match self.open_local_step() {
            Ok(mut grads) => {
                let failure = self.step_locally(targets, &mut grads, &mut stats, local);
                self.local.grads = grads;
                self.combine_deltas(targets, &p0, failure, stats)
            }
            Err(e) => self.step_failed(e, stats),
        };
        self.local.p0 = p0;
        result
    }

    /// The combination of the weight changes from `p0`, bucket by bucket,
    /// after the local step (`failure`: this rank's, posted in place of the
    /// first combination); `p = p0 - combined`, or every parameter back to
    /// `p0` when the step fails.
    fn combine_deltas(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        p0: &[Tensor],
        failure: Option<crate::OptimError>,
        mut stats: StepStats,
    ) -> Result<StepStats> {
        if self.buckets.is_empty() {
            self.agree_after(
                FaultKind::Optimizer,
                failure.map(|e| e.to_string()),
                &mut stats,
            )?;
            self.optimizer.step();
            return Ok(stats);
        }
        if failure.is_some() {
            overwrite(targets, p0)?;
            // Posted in place of the first combination the others start.
            let err = self.comm.post_fault(FaultKind::Optimizer);
            return self.step_failed(err.into(), stats);
        }
        if self.local.buckets.len() != self.buckets.len() {
            self.local.buckets.resize_with(self.buckets.len(), Vec::new);
        }
        let begin = Instant::now();
        for b in 0..self.buckets.len() {
            let range = self.buckets[b].clone();
            // p0 - p, in tensors kept from step to step.
            let mut deltas = std::mem::take(&mut self.local.buckets[b]);
            differences_into(&mut deltas, &p0[range.clone()], &targets[range.clone()])?;
            let mut strategy = self.take_strategy(b);
            // Every parameter has a delta: all count as written.
            let view = BucketView {
                index: b,
                lens: &self.bucket_lens[b],
                written: &self.all_written[..range.len()],
                step: self.optimizer.step_count(),
                capacity: self.config.capacity,
            };
            let started = Instant::now();
            let combined = strategy.combine(&self.comm, &view, &mut deltas);
            stats.combine += started.elapsed();
            strategy.end_step(b, combined.is_ok());
            self.strategies[b] = Some(strategy);
            let combined = match combined {
                Ok(combined) => combined,
                Err(e) => {
                    self.local.buckets[b] = deltas;
                    overwrite(targets, p0)?;
                    return self.step_failed(e, stats);
                }
            };
            stats.traffic += combined.traffic;
            let inverse = if combined.averaged {
                1.0
            } else {
                1.0 / self.world_size() as f32
            };
            for ((param, p0), delta) in targets[range.clone()]
                .iter_mut()
                .flatten()
                .zip(&p0[range])
                .zip(&deltas)
            {
                param.copy_from(p0)?;
                param.axpy(-inverse, delta)?; // p0 - combined
            }
            self.local.buckets[b] = deltas;
        }
        stats.wait = begin.elapsed();
        self.optimizer.step();
        Ok(stats)
    }
}
