//! Delta-weight mode (Horovod's AdaSum default, MindSpore's
//! `AdaSumByDeltaWeightWrapCell`): a local step from `p0`, then the weight
//! changes `p0 - p` combined bucket by bucket by the bucket's strategy (the
//! [`super::Combiner`]), then `p = p0 - combined`.

use super::local_step::LocalUpdate;
use super::strategy::BucketView;
use super::{DistOpt, StepStats};
use crate::error::Result;
use crate::optimizer::Optimizer;
use gradwire_algos::FaultKind;
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;
use std::time::Instant;

impl<O: Optimizer, C: Communicator + 'static> DistOpt<O, C> {
    /// Delta-weight mode's finish: the local step from `p0`, then the weight
    /// changes combined bucket by bucket, then `p = p0 - combined`. If the
    /// combination fails (on any rank: every rank alike), every parameter
    /// is put back to its `p0`.
    pub(crate) fn finish_delta_weight(
        &mut self,
        mut targets: Vec<Option<&mut Tensor>>,
        local: LocalUpdate<'_>,
    ) -> Result<StepStats> {
        let mut stats = StepStats {
            buckets: self.buckets.len(),
            ..StepStats::default()
        };
        let grads = match self.open_local_step() {
            Ok(grads) => grads,
            Err(e) => return self.step_failed(e, stats),
        };
        // Every parameter keeps its p0 (all are present: checked above).
        let start: Vec<Option<Tensor>> = targets.iter().map(|t| t.as_deref().cloned()).collect();
        let failure = self.step_locally(&mut targets, grads, &mut stats, local);
        let restore = |targets: &mut [Option<&mut Tensor>]| -> Result<()> {
            for (param, p0) in targets.iter_mut().zip(&start) {
                if let (Some(param), Some(p0)) = (param.as_deref_mut(), p0) {
                    param.copy_from(p0)?;
                }
            }
            Ok(())
        };
        if self.buckets.is_empty() {
            self.agree_after(FaultKind::Optimizer, failure.map(|e| e.to_string()))?;
            self.optimizer.step();
            return Ok(stats);
        }
        if failure.is_some() {
            restore(&mut targets)?;
            // Posted in place of the first combination the others start.
            let err = self.comm.post_fault(FaultKind::Optimizer.code());
            return self.step_failed(err.into(), stats);
        }
        let begin = Instant::now();
        for (b, range) in self.buckets.clone().into_iter().enumerate() {
            let mut deltas = Vec::with_capacity(range.len());
            for i in range.clone() {
                if let (Some(param), Some(p0)) = (targets[i].as_deref(), &start[i]) {
                    let mut delta = p0.clone();
                    delta.axpy(-1.0, param)?; // p0 - p
                    deltas.push(delta);
                }
            }
            let mut strategy = self.take_strategy(b);
            // Every parameter has a delta: all count as written.
            let view = BucketView {
                index: b,
                lens: &self.bucket_lens[b],
                written: &self.all_written[..range.len()],
                step: self.optimizer.step_count(),
                capacity: self.config.capacity,
            };
            let combined = strategy.combine(&self.comm, &view, &mut deltas);
            strategy.end_step(b, combined.is_ok());
            self.strategies[b] = Some(strategy);
            let combined = match combined {
                Ok(combined) => combined,
                Err(e) => {
                    restore(&mut targets)?;
                    return self.step_failed(e, stats);
                }
            };
            stats.traffic += combined.traffic;
            let inverse = if combined.averaged {
                1.0
            } else {
                1.0 / self.world_size() as f32
            };
            for (i, delta) in range.zip(deltas) {
                if let (Some(param), Some(p0)) = (targets[i].as_deref_mut(), &start[i]) {
                    param.copy_from(p0)?;
                    param.axpy(-inverse, &delta)?; // p0 - combined
                }
            }
        }
        stats.wait = begin.elapsed();
        self.optimizer.step();
        Ok(stats)
    }
}
