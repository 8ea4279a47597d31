//! The modes that step locally first: `Partial` (local SGD, then one
//! bucket of parameters averaged per step, SINGA's partial update) and
//! `DeltaWeight` (a local step, then the weight changes combined). Their
//! gradients never travel, so the step opens with an agreement of its own
//! (one header-only collective carrying this rank's faults) before anything
//! changes; a failure after the local update is carried by the next
//! collective of the step.

use super::bucket::scan_non_finite;
use super::combiner::run_combiner;
use super::{DistOpt, Mode, StepStats};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_algos::fault::{agree, fail};
use gradwire_algos::{AlgoError, FaultKind, Traffic, fused_all_reduce};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_tensor::Tensor;
use std::time::Instant;

/// Who takes the local step of `Partial` and `DeltaWeight`.
pub(crate) enum LocalUpdate<'f> {
    /// DistOpt's optimizer, with the pushed gradients.
    Optimizer,
    /// The caller's own step (a framework's optimizer): it leaves the
    /// stepped values in the targets. The pushed gradients, if any, are
    /// only checked for non-finite values.
    Caller(&'f mut dyn FnMut(&mut [Option<&mut Tensor>]) -> Result<()>),
}

impl<O: Optimizer, C: Communicator + 'static> DistOpt<O, C> {
    /// `Partial` or `DeltaWeight` with the caller's own local step
    /// ([`crate::GradSync::step_locally`]): `params` hold every declared
    /// parameter's current values; `step` steps the caller's parameters
    /// and leaves the new values in the targets. In any other mode (the
    /// same on every rank) an error on every rank, with no collective.
    pub(crate) fn finish_with_caller_step<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
        step: &mut dyn FnMut(&mut [Option<&mut Tensor>]) -> Result<()>,
    ) -> Result<StepStats> {
        let result = match self.config.mode {
            Mode::Partial {
                average_state: false,
            } => {
                let targets = self.take_targets(params);
                self.finish_partial(targets, false, LocalUpdate::Caller(step))
            }
            Mode::DeltaWeight => {
                let targets = self.take_targets(params);
                self.finish_delta_weight(targets, LocalUpdate::Caller(step))
            }
            mode => Err(OptimError::InvalidArgument(format!(
                "a step of the caller's own takes Partial (without average_state) or DeltaWeight, not {mode:?}"
            ))),
        };
        self.end_step();
        result
    }

    /// The local step by `local`; its failure (returned) is recorded as this
    /// rank's fault for the next collective to carry.
    fn step_locally(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        grads: Vec<Option<Tensor>>,
        stats: &mut StepStats,
        local: LocalUpdate<'_>,
    ) -> Option<OptimError> {
        match local {
            LocalUpdate::Optimizer => self.update_locally(targets, grads, stats),
            LocalUpdate::Caller(step) => match step(targets) {
                Ok(()) => {
                    stats.updated += targets.iter().flatten().count();
                    None
                }
                Err(e) => {
                    self.record(FaultKind::Optimizer, &e);
                    Some(e)
                }
            },
        }
    }

    /// This step's gradients, taken, after this rank's non-finite check; then
    /// the agreement that opens the step. `Err` carries the agreed failure
    /// (as [`DistOpt::step_failed`] ends it).
    fn open_local_step(&mut self) -> std::result::Result<Vec<Option<Tensor>>, AlgoError> {
        let grads: Vec<Option<Tensor>> = self.grads.iter_mut().map(Option::take).collect();
        if self.fault.is_none()
            && let Some((kind, detail)) = scan_non_finite(&grads)
        {
            self.record(kind, &detail);
        }
        agree(&self.comm, self.fault.as_ref().map(|f| f.kind))?;
        Ok(grads)
    }

    /// Updates each parameter with its own pushed gradient; stops at the
    /// first optimizer error, which it returns (recorded as this rank's
    /// fault) for the next collective to carry.
    fn update_locally(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        grads: Vec<Option<Tensor>>,
        stats: &mut StepStats,
    ) -> Option<OptimError> {
        for (i, grad) in grads.into_iter().enumerate() {
            let name = self.params[i].name.as_str();
            if let (Some(grad), Some(param)) = (grad, targets[i].as_deref_mut())
                && !grad.is_zeroed()
            {
                if let Err(e) = self.optimizer.update(name, param, &grad) {
                    self.record(FaultKind::Optimizer, &e);
                    return Some(e);
                }
                stats.updated += 1;
            }
        }
        None
    }

    /// Partial mode's finish: the local update, then the average of one
    /// bucket's parameters across ranks (and, with `average_state`, of
    /// their optimizer buffers). The counter advances only when the step
    /// completes.
    pub(crate) fn finish_partial(
        &mut self,
        mut targets: Vec<Option<&mut Tensor>>,
        average_state: bool,
        local: LocalUpdate<'_>,
    ) -> Result<StepStats> {
        let mut stats = StepStats {
            buckets: 1,
            ..StepStats::default()
        };
        let grads = match self.open_local_step() {
            Ok(grads) => grads,
            Err(e) => return self.step_failed(e, stats),
        };
        let failure = self.step_locally(&mut targets, grads, &mut stats, local);
        let k = self.buckets.len() as u64;
        if k == 0 {
            self.agree_after(FaultKind::Optimizer, failure.map(|e| e.to_string()))?;
            self.optimizer.step();
            return Ok(stats);
        }
        if failure.is_some() {
            // Posted in place of the averaging the other ranks start.
            let err = self.comm.post_fault(FaultKind::Optimizer.code());
            return self.step_failed(err.into(), stats);
        }
        let b = (self.partial_counter % k) as usize;
        let mut chosen: Vec<Tensor> = self.buckets[b]
            .clone()
            .filter_map(|i| targets[i].as_deref().cloned())
            .collect();
        let start = Instant::now();
        match fused_all_reduce(&self.comm, &mut chosen, ReduceOp::Avg, self.config.capacity) {
            Ok(traffic) => stats.traffic += traffic,
            Err(e) => return self.step_failed(e, stats),
        }
        stats.wait = start.elapsed();
        for (i, averaged) in self.buckets[b].clone().zip(chosen) {
            if let Some(param) = targets[i].as_deref_mut() {
                param.copy_from(&averaged)?;
            }
        }
        if average_state {
            match self.average_buffers(b) {
                Ok(traffic) => stats.traffic += traffic,
                Err(e) => return self.step_failed(e, stats),
            }
        }
        self.optimizer.step();
        self.partial_counter += 1;
        Ok(stats)
    }

    /// Averages the optimizer buffers of bucket `b`'s parameters across ranks
    /// (a rank without state for one contributes zeros and gains the
    /// average). Buffers on a device are read from there
    /// ([`Optimizer::buffer_values`]), so the average is of the real state.
    fn average_buffers(&mut self, b: usize) -> std::result::Result<Traffic, AlgoError> {
        let names = self.optimizer.buffer_names();
        let gathered = (|| -> Result<Vec<Tensor>> {
            let mut buffers = Vec::new();
            for i in self.buckets[b].clone() {
                let (name, n) = (self.params[i].name.as_str(), self.lens[i]);
                for &buffer in names {
                    let values = self
                        .optimizer
                        .buffer_values(name, buffer)?
                        .unwrap_or_else(|| vec![0.0; n]);
                    buffers.push(Tensor::from_vec(values, n)?);
                }
            }
            Ok(buffers)
        })();
        let mut buffers = match gathered {
            Ok(buffers) => buffers,
            Err(e) => {
                self.record(FaultKind::Optimizer, &e);
                return Err(fail(
                    &self.comm,
                    AlgoError::InvalidArgument(format!("optimizer state: {e}")),
                ));
            }
        };
        let traffic = fused_all_reduce(&self.comm, &mut buffers, ReduceOp::Avg, usize::MAX)?;
        let mut averaged = buffers.into_iter();
        for i in self.buckets[b].clone() {
            let spec = self.params[i].clone();
            for &buffer in names {
                if let Some(t) = averaged.next() {
                    // Same names and lengths on every rank: cannot fail on
                    // one rank alone.
                    self.optimizer
                        .set_buffer(&spec.name, &spec.shape, buffer, t.into_vec::<f32>()?)
                        .map_err(|e| AlgoError::InvalidArgument(e.to_string()))?;
                }
            }
        }
        Ok(traffic)
    }

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
            let combined = match run_combiner(&self.combiner, &self.comm, b, &mut deltas) {
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
