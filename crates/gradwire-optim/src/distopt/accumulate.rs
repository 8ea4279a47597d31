//! Gradient accumulation ([`DistOptConfig::accumulate`]): a step of k
//! micro-batches, one exchange per step. Every micro-batch but the last
//! only adds its pushed gradients into a sum kept per parameter (in place,
//! in buffers reused from step to step); the last micro-batch's gradients
//! are added to the sums as they are pushed and scaled by the step's
//! factor (1/k: the mean over the micro-batches, so that k micro-batches
//! of equal size step as their concatenation would), and from there the
//! step is the engine's usual one: buckets launched during backward, the
//! vote, the strategy (error feedback sees one combined gradient per step),
//! the optimizer. A parameter written in an earlier micro-batch but not
//! the last is handed over at `finish`.
//!
//! The failure model holds per step: a fault found in any micro-batch (a
//! bad push) is kept and carried by the step's first collective, so the
//! whole step fails on every rank and the sums are dropped; parameters,
//! optimizer state and residuals change only when the step completes. A
//! checkpoint is taken between steps, never between micro-batches.

use super::{DistOptConfig, Engine, StepStats};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_algos::FaultKind;
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

/// The sums of the micro-batches of the step in progress.
#[derive(Debug, Default)]
pub(super) struct Accumulation {
    /// Micro-batches of this step already accumulated.
    micro: u32,
    /// Per parameter, the sum of its gradients over those micro-batches;
    /// the buffer stays allocated from step to step.
    sums: Vec<Option<Tensor>>,
    /// Whether `sums[i]` holds this step's values (a stale buffer does
    /// not).
    written: Vec<bool>,
    /// The factor of this step's sum, if not 1/k ([`Engine::set_accumulation_factor`]).
    factor: Option<f32>,
}

impl Accumulation {
    /// For `params` parameters.
    pub(super) fn new(params: usize) -> Accumulation {
        Accumulation {
            micro: 0,
            sums: vec![None; params],
            written: vec![false; params],
            factor: None,
        }
    }

    /// The sums rearranged to the engine's new parameter order
    /// (`order.rs`).
    pub(super) fn permute(&mut self, order: &[usize]) {
        super::order::permute(&mut self.sums, order);
        super::order::permute(&mut self.written, order);
    }

    /// Forgets this step's sums (a new step starts; the buffers stay).
    pub(super) fn reset(&mut self) {
        self.micro = 0;
        self.written.iter_mut().for_each(|w| *w = false);
        self.factor = None;
    }
}

/// An error unless `config.accumulate` is at least 1.
pub(super) fn check_config(config: &DistOptConfig) -> Result<()> {
    if config.accumulate == 0 {
        return Err(OptimError::InvalidArgument(
            "accumulate: a step takes at least one micro-batch".into(),
        ));
    }
    Ok(())
}

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// Whether the micro-batch in progress only accumulates (it is not the
    /// last of its step): its gradients are kept, nothing is exchanged.
    pub(crate) fn accumulating(&self) -> bool {
        self.accumulation.micro + 1 < self.config.accumulate
    }

    /// Micro-batches per step ([`DistOptConfig::accumulate`]).
    pub(crate) fn micro_batches(&self) -> u32 {
        self.config.accumulate
    }

    /// Replaces this step's factor 1/k by `factor` (GradSync's sample
    /// weights: the sum is then of sample-weighted gradients). Call before
    /// the last micro-batch's first push.
    pub(crate) fn set_accumulation_factor(&mut self, factor: f32) {
        self.accumulation.factor = Some(factor);
    }

    /// Makes the next `finish` the last micro-batch of the step in
    /// progress (a joined rank's part of the others' step: what it
    /// accumulated, exchanged now).
    pub(crate) fn skip_to_last_micro_batch(&mut self) {
        self.accumulation.micro = self.config.accumulate - 1;
    }

    /// The last micro-batch's gradient of parameter `i`, as pushed: the
    /// sum of the earlier micro-batches added, then the step's factor
    /// applied, in place. Nothing to do without accumulation.
    pub(super) fn fold_into_last(&mut self, i: usize, grad: &mut Tensor) -> Result<()> {
        if self.config.accumulate == 1 {
            return Ok(());
        }
        if self.accumulation.written[i]
            && let Some(sum) = &self.accumulation.sums[i]
        {
            grad.axpy(1.0, sum)?;
        }
        grad.scale(self.accumulation_factor())?;
        Ok(())
    }

    /// This step's factor: 1/k unless set.
    fn accumulation_factor(&self) -> f32 {
        self.accumulation
            .factor
            .unwrap_or(1.0 / self.config.accumulate as f32)
    }

    /// Ends a micro-batch that only accumulates: its pushed gradients are
    /// added into the sums (the first one of a step copied, into the
    /// buffer kept from the last step where there is one), and each pushed
    /// tensor goes back through `give_back(index, tensor)` for reuse. A
    /// fault found so far stays for the step's first collective to carry.
    /// Nothing is exchanged or updated.
    pub(crate) fn accumulate_micro_batch(
        &mut self,
        mut give_back: impl FnMut(usize, Tensor),
    ) -> StepStats {
        let acc = &mut self.accumulation;
        let declared = &self.order.declared;
        let mut failed = None;
        for (i, grad) in self.grads.iter_mut().enumerate() {
            let Some(grad) = grad.take() else {
                continue;
            };
            let added = match (&mut acc.sums[i], acc.written[i]) {
                (Some(sum), true) => sum.axpy(1.0, &grad),
                (Some(sum), false) => sum.copy_from(&grad),
                // The first step: the buffer made once.
                (slot @ None, _) => {
                    *slot = Some(grad.clone());
                    Ok(())
                }
            };
            // The front ends speak declaration indices.
            give_back(declared.get(i).copied().unwrap_or(i), grad);
            acc.written[i] = true;
            if let Err(e) = added {
                failed.get_or_insert(e);
            }
        }
        acc.micro += 1;
        // The next micro-batch's weight is set anew.
        self.samples.scale = 1.0;
        if let Some(e) = failed {
            self.record(FaultKind::InvalidArgument, &e);
        }
        StepStats {
            accumulated: true,
            ..StepStats::default()
        }
    }

    /// At the last micro-batch's `finish`, before anything is sent: a
    /// parameter written in an earlier micro-batch but not in this one gets
    /// its sum, scaled by the factor, as its gradient; then the sums are
    /// forgotten (the step goes on, or fails, with what it holds now).
    pub(super) fn close_accumulation(&mut self) {
        if self.config.accumulate == 1 {
            return;
        }
        let factor = self.accumulation_factor();
        for i in 0..self.grads.len() {
            if self.grads[i].is_none()
                && self.accumulation.written[i]
                && let Some(mut sum) = self.accumulation.sums[i].take()
            {
                match sum.scale(factor) {
                    Ok(()) => self.grads[i] = Some(sum),
                    Err(e) => self.record(FaultKind::InvalidArgument, &e),
                }
            }
        }
        self.accumulation.reset();
    }

    /// An error if a step is between its micro-batches (a checkpoint or a
    /// strategy change must come between steps).
    pub(super) fn between_steps(&self, what: &str) -> Result<()> {
        if self.accumulation.micro > 0 {
            return Err(OptimError::between_micro_batches(
                what,
                self.accumulation.micro,
                self.config.accumulate,
            ));
        }
        Ok(())
    }
}
