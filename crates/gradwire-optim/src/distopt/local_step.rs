//! What the modes that step locally first share (`Partial`, in
//! `partial.rs`, `DeltaWeight`, in `delta_weight.rs`, and `DiLoCo`, in
//! `outer.rs`): who takes the local step, and how the step opens. Their
//! gradients never travel, so a step of `Partial` and `DeltaWeight` opens
//! with an agreement of its own (one header-only collective carrying this
//! rank's faults) before anything changes; a failure after the local
//! update is carried by the next collective of the step. DiLoCo's inner
//! steps keep their faults for the round's end instead (`outer.rs`).

use super::bucket::scan_non_finite;
use super::{Engine, StepStats, StrategyConfig};
use crate::error::{OptimError, Result};
use crate::optimizer::{Optimizer, StateBuffers};
use gradwire_algos::fault::agree;
use gradwire_algos::{AlgoError, FaultKind, FusionBuffers};
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

/// What the local-step modes keep from step to step, so that a steady step
/// allocates nothing: the parameters' values before the step (delta
/// weight), per bucket the weight changes or the averaged parameters, the
/// fusion buffers, the list of the step's gradients and the memory of the
/// lists of targets.
#[derive(Debug, Default)]
pub(super) struct LocalScratch {
    pub(super) p0: Vec<Tensor>,
    pub(super) buckets: Vec<Vec<Tensor>>,
    pub(super) fusion: FusionBuffers,
    pub(super) grads: Vec<Option<Tensor>>,
    /// Always empty: its memory holds the next step's targets.
    pub(super) targets: Vec<Option<&'static mut Tensor>>,
    /// Always empty: its memory holds the next `step`'s named parameters.
    pub(super) named: Vec<(&'static str, &'static mut Tensor)>,
}

/// `v` emptied, as a list of another item type, in the same memory when
/// the two have the same layout (references of another lifetime):
/// collecting an empty iterator over a vector's own items into a vector of
/// the same layout reuses its allocation (else this allocates, correctly).
pub(super) fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    // Empty: the closure never runs; it only names the new item type.
    v.into_iter().filter_map(|_| None::<U>).collect()
}

/// `tensors` made to hold copies of `values` ([`Tensor::clone_from`]: in
/// the tensors already there, so no allocation once they exist).
pub(super) fn copy_into<'t>(
    tensors: &mut Vec<Tensor>,
    values: impl Iterator<Item = &'t Tensor> + Clone,
) {
    let n = values.clone().count();
    tensors.truncate(n);
    for (k, v) in values.enumerate() {
        match tensors.get_mut(k) {
            Some(t) => t.clone_from(v),
            None => tensors.push(v.clone()),
        }
    }
}

/// `deltas` made to hold `from - to`, tensor by tensor (in the tensors
/// already there: no allocation once they exist): the weight changes of
/// delta weight (`p0 - p`) and DiLoCo's pseudo-gradients
/// (`θ_global - θ_local`).
pub(super) fn differences_into(
    deltas: &mut Vec<Tensor>,
    from: &[Tensor],
    to: &[Option<&mut Tensor>],
) -> Result<()> {
    copy_into(deltas, from.iter());
    for (delta, param) in deltas.iter_mut().zip(to.iter().flatten()) {
        delta.axpy(-1.0, param)?;
    }
    Ok(())
}

/// Every present target overwritten with its value in `values` (in
/// order): a local-step mode's parameters put back after a failed step, or
/// made DiLoCo's global ones.
pub(super) fn overwrite(targets: &mut [Option<&mut Tensor>], values: &[Tensor]) -> Result<()> {
    for (param, value) in targets.iter_mut().flatten().zip(values) {
        param.copy_from(value)?;
    }
    Ok(())
}

/// Who takes the local step of `Partial` and `DeltaWeight`.
pub(crate) enum LocalUpdate<'f> {
    /// The engine's optimizer, with the pushed gradients.
    Optimizer,
    /// The caller's own step (a framework's optimizer): it leaves the
    /// stepped values in the targets. The pushed gradients, if any, are
    /// only checked for non-finite values.
    Caller(&'f mut dyn FnMut(&mut [Option<&mut Tensor>]) -> Result<()>),
}

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// `Partial`, `DeltaWeight` or `DiLoCo` with the caller's own local step
    /// ([`crate::GradSync::step_locally`]): `params` hold every declared
    /// parameter's current values; `step` steps the caller's parameters
    /// and leaves the new values in the targets; `state` is the caller's
    /// optimizer's buffers, which `Partial` with `average_state` averages
    /// (without them that step fails on every rank). In any other mode
    /// (the same on every rank) an error on every rank, with no collective.
    pub(crate) fn finish_with_caller_step<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
        step: &mut dyn FnMut(&mut [Option<&mut Tensor>]) -> Result<()>,
        state: Option<&mut dyn StateBuffers>,
    ) -> Result<StepStats> {
        if self.accumulating() {
            return Ok(self.accumulate_micro_batch(|_, _| {}));
        }
        self.close_accumulation();
        let result = match self.config.strategy {
            StrategyConfig::Partial { average_state } => {
                if average_state && state.is_none() {
                    // Carried by the step's opening agreement.
                    self.record(
                        FaultKind::InvalidArgument,
                        &"partial averaging with the optimizer's state needs its buffers \
                          (step_locally_with_state)",
                    );
                }
                let mut targets = self.take_targets(params);
                let result = self.finish_partial(
                    &mut targets,
                    average_state,
                    LocalUpdate::Caller(step),
                    state,
                );
                self.local.targets = recycle(targets);
                result
            }
            StrategyConfig::DeltaWeight { .. } => {
                let mut targets = self.take_targets(params);
                let result = self.finish_delta_weight(&mut targets, LocalUpdate::Caller(step));
                self.local.targets = recycle(targets);
                result
            }
            StrategyConfig::DiLoCo(config) => {
                let mut targets = self.take_targets(params);
                let result = self.finish_diloco(&mut targets, LocalUpdate::Caller(step), config);
                self.local.targets = recycle(targets);
                result
            }
            mode => Err(OptimError::InvalidArgument(format!(
                "a step of the caller's own takes Partial, DeltaWeight or DiLoCo, not {mode:?}"
            ))),
        };
        self.end_step();
        result
    }

    /// The local step by `local`; its failure (returned) is recorded as this
    /// rank's fault for the next collective to carry.
    pub(super) fn step_locally(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        grads: &mut Vec<Option<Tensor>>,
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
    /// (as [`Engine::step_failed`] ends it).
    pub(super) fn open_local_step(
        &mut self,
    ) -> std::result::Result<Vec<Option<Tensor>>, AlgoError> {
        let grads = self.take_local_grads();
        if let Err(e) = agree(&self.comm, self.fault.as_ref().map(|f| f.kind)) {
            self.local.grads = grads;
            return Err(e);
        }
        Ok(grads)
    }

    /// This step's gradients, taken (into the list kept from the last step:
    /// no allocation), after this rank's non-finite check, which records a
    /// fault for the next collective to carry.
    pub(super) fn take_local_grads(&mut self) -> Vec<Option<Tensor>> {
        let mut grads = std::mem::take(&mut self.local.grads);
        grads.clear();
        grads.extend(self.grads.iter_mut().map(Option::take));
        if self.fault.is_none()
            && let Some((kind, detail)) = scan_non_finite(&grads)
        {
            self.record(kind, &detail);
        }
        grads
    }

    /// Updates each parameter with its own pushed gradient; stops at the
    /// first optimizer error, which it returns (recorded as this rank's
    /// fault) for the next collective to carry.
    fn update_locally(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        grads: &mut Vec<Option<Tensor>>,
        stats: &mut StepStats,
    ) -> Option<OptimError> {
        for (i, grad) in grads.drain(..).enumerate() {
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
}
