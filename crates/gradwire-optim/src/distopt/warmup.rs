//! DiLoCo's warm-up ([`DiLoCoConfig::warmup`]): its first rounds are of
//! one inner step each, combined before the outer optimizer's first step
//! (in Streaming DiLoCo every fragment at once, the stagger after them).
//!
//! By parameters ([`WarmupBy::Parameters`]) a warm-up round is an ordinary
//! round of `outer.rs` whose mean pseudo-gradient is applied as it is
//! (`θ_global -= Δ`). By gradients ([`WarmupBy::Gradients`]) it is a step
//! of synchronous training: the pushed gradients averaged through the
//! codec, the inner optimizer (gradwire's, or the caller's through
//! `GradSync::finish`) stepping every rank with the same mean, so that its
//! state is the same on every rank when the rounds begin. Its failure model
//! is the gradient modes': this rank's fault is posted in place of the
//! combination, a lost or non-finite combination is skipped (or fails) on
//! every rank before anything changes, and a failed update is agreed
//! after. `θ_global` is forgotten at each such step and taken from the
//! parameters at the first step of the rounds (`outer.rs`'s `inner_step`,
//! which leaves it to the first step without a fault, as at the start).

use super::{DiLoCoConfig, Engine, StepStats, WarmupBy};
use crate::error::Result;
use crate::optimizer::Optimizer;
use gradwire_algos::FaultKind;
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

/// What a round's exchange carries.
pub(super) enum Sent<'a, 't> {
    /// The pseudo-gradients `θ_global - θ_local` of these targets.
    PseudoGradients(&'a [Option<&'t mut Tensor>]),
    /// These pushed gradients (a missing one as zeros).
    Gradients(&'a [Option<Tensor>]),
}

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// Whether the current round is one of the warm-up's: the rounds
    /// completed say, the same on every rank and in the checkpoints.
    pub(super) fn in_warmup(&self, config: DiLoCoConfig) -> bool {
        self.outer.rounds < u64::from(config.warmup)
    }

    /// Whether the current round is a step of the warm-up by gradients.
    pub(super) fn in_gradient_warmup(&self, config: DiLoCoConfig) -> bool {
        config.warmup_by == WarmupBy::Gradients && self.in_warmup(config)
    }

    /// A warm-up round's end by parameters: the mean pseudo-gradient in
    /// `local.buckets` applied as it is, `θ_global -= Δ`, so that
    /// `θ_global` becomes the mean of the ranks' parameters (as the codec
    /// carried them).
    pub(super) fn warmup_step(&mut self) -> Result<()> {
        for b in 0..self.buckets.len() {
            for (k, i) in self.buckets[b].clone().enumerate() {
                self.outer.global[i].axpy(-1.0, &self.local.buckets[b][k])?;
            }
        }
        Ok(())
    }

    /// A step of the warm-up by gradients: this rank's pushed gradients
    /// (its non-finite check records a fault, posted in place of the
    /// combination) averaged through every bucket's strategy, then
    /// `apply(optimizer, name, index, mean)` for every parameter (engine
    /// index) until one fails, the agreement on the outcome, the inner
    /// optimizer's step.
    pub(super) fn gradient_round(
        &mut self,
        mut apply: impl FnMut(&mut O, &str, usize, Tensor) -> Result<()>,
    ) -> Result<StepStats> {
        let mut stats = StepStats {
            buckets: self.buckets.len(),
            ..StepStats::default()
        };
        // Taken again from the parameters when the rounds begin.
        self.outer.global.clear();
        let grads = self.take_local_grads();
        if self.buckets.is_empty() {
            self.local.grads = grads;
            // Nothing to combine: an agreement of its own.
            let failure = self.fault.as_ref().map(|f| f.detail.clone());
            let kind = self.fault.as_ref().map_or(FaultKind::Other, |f| f.kind);
            self.agree_after(kind, failure, &mut stats)?;
        } else {
            let fault = self.fault.as_ref().map(|f| f.kind);
            let launched =
                self.launch_fragment(Sent::Gradients(&grads), None, self.outer.rounds, fault);
            self.local.grads = grads;
            launched?;
            if let Err(lost) = self.take_exchange(&mut stats) {
                return self.round_lost(lost, stats);
            }
            let mut failure = None;
            for b in 0..self.buckets.len() {
                let means = std::mem::take(&mut self.local.buckets[b]);
                let range = self.buckets[b].clone();
                if failure.is_none() {
                    failure = self.apply_each(range.zip(means), &mut apply, &mut stats);
                }
            }
            self.agree_after(FaultKind::Optimizer, failure, &mut stats)?;
        }
        self.outer.inner = 0;
        self.outer.rounds += 1;
        self.optimizer.step();
        Ok(stats)
    }

    /// Bucket `b`'s part of what a round sends, in `values` (in the tensors
    /// already there: no allocation once they exist).
    pub(super) fn sent_into(
        &self,
        values: &mut Vec<Tensor>,
        b: usize,
        sent: &Sent<'_, '_>,
    ) -> Result<()> {
        let range = self.buckets[b].clone();
        match sent {
            Sent::PseudoGradients(targets) => match self.outer.global.get(range.clone()) {
                Some(global) => {
                    super::local_step::differences_into(values, global, &targets[range])
                }
                None => Err(crate::OptimError::InvalidArgument(
                    "no global parameters yet: no step has given them all".into(),
                )),
            },
            Sent::Gradients(grads) => {
                gradients_into(values, &grads[range.clone()], &self.params[range])
            }
        }
    }
}

/// `values` made to hold `grads`, a missing gradient as zeros of its
/// declaration (in the tensors already there: no allocation once they
/// exist, but for a missing gradient's zeros).
fn gradients_into(
    values: &mut Vec<Tensor>,
    grads: &[Option<Tensor>],
    specs: &[super::ParamSpec],
) -> Result<()> {
    values.truncate(grads.len());
    for (k, (grad, spec)) in grads.iter().zip(specs).enumerate() {
        let zeros;
        let grad = match grad {
            Some(grad) => grad,
            None => {
                zeros = Tensor::zeros(spec.shape.clone(), spec.dtype, spec.device)?;
                &zeros
            }
        };
        match values.get_mut(k) {
            Some(value) => value.clone_from(grad),
            None => values.push(grad.clone()),
        }
    }
    Ok(())
}
