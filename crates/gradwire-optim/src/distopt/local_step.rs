//! What the modes that step locally first share (`Partial`, in
//! `partial.rs`, and `DeltaWeight`, in `delta_weight.rs`): who takes the
//! local step, and how the step opens. Their gradients never travel, so the
//! step opens with an agreement of its own
//! (one header-only collective carrying this rank's faults) before anything
//! changes; a failure after the local update is carried by the next
//! collective of the step.

use super::bucket::scan_non_finite;
use super::{DistOpt, Mode, StepStats};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_algos::fault::agree;
use gradwire_algos::{AlgoError, FaultKind};
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

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
    pub(super) fn step_locally(
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
    pub(super) fn open_local_step(
        &mut self,
    ) -> std::result::Result<Vec<Option<Tensor>>, AlgoError> {
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
}
