//! Sample weights and joining (uneven inputs) in the gradient loop, for
//! every front end (`DistOpt`, `GradSync`, and gradwire-candle's
//! `DataParallel` through it): a rank that saw `samples` of a step's
//! global batch weights its gradients so that the combined gradient is the
//! mean over the samples actually seen, `sum_r samples_r * g_r / sum_r
//! samples_r`; a rank out of data joins (PyTorch DDP's `Join`, Horovod's
//! `hvd.join()`) and takes its part in the others' steps with no samples
//! until every rank has joined. The steps' totals are agreed by one
//! all-reduce of two u64 (the samples, and whether the rank still trains),
//! before the step's first push; the weight is applied by `push`, in place.

use super::{Engine, StrategyConfig, TrainingLoop};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_algos::FaultKind;
use gradwire_comm::{Communicator, ReduceOp};

/// The weighting of this step's gradients.
#[derive(Debug)]
pub(super) struct SampleWeights {
    /// The factor this rank's gradients are scaled by at `push`, 1 without
    /// weighting.
    pub(super) scale: f32,
    /// With accumulation: the samples of this step's micro-batches so far,
    /// and how many of them were weighted.
    step_samples: u64,
    weighted_micro_batches: u32,
}

impl Default for SampleWeights {
    fn default() -> Self {
        SampleWeights {
            scale: 1.0,
            step_samples: 0,
            weighted_micro_batches: 0,
        }
    }
}

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// See [`crate::DistOpt::set_samples`].
    pub(crate) fn set_samples(&mut self, samples: u64) -> Result<()> {
        self.check_weighted("sample weights")?;
        self.samples.weighted_micro_batches += 1;
        if self.accumulating() {
            // The total is agreed at the step's last micro-batch.
            self.samples.step_samples = self.samples.step_samples.saturating_add(samples);
            self.samples.scale = samples as f32;
            return Ok(());
        }
        let mine = std::mem::take(&mut self.samples.step_samples).saturating_add(samples);
        let total = self.agree_samples(mine, true)?.0;
        let world = self.world_size() as f64;
        if self.micro_batches() == 1 {
            self.samples.scale = if total == 0 {
                // Nobody saw a sample: nothing to weight.
                1.0
            } else {
                (world * samples as f64 / total as f64) as f32
            };
        } else {
            // Each micro-batch weighted by its samples, the sum by the total.
            self.samples.scale = samples as f32;
            self.set_step_factor(total);
        }
        Ok(())
    }

    /// A joined rank's agreement of a step: `false` once every rank has
    /// joined; otherwise the engine is ready for this rank's part of the
    /// step the others take (what it accumulated before joining, or
    /// nothing), weighted by the step's total.
    pub(crate) fn join_agreed(&mut self) -> Result<bool> {
        self.check_weighted("join")?;
        // The samples of the micro-batches taken before joining, if any.
        let mine = std::mem::take(&mut self.samples.step_samples);
        let (total, active) = self.agree_samples(mine, false)?;
        self.samples.weighted_micro_batches = 0;
        self.samples.scale = 1.0;
        if active == 0 {
            return Ok(false);
        }
        self.skip_to_last_micro_batch();
        if self.micro_batches() > 1 {
            self.set_step_factor(total);
        }
        Ok(true)
    }

    /// At the step's last micro-batch: a fault unless `set_samples` was
    /// called for every micro-batch of the step or for none; the count
    /// starts again.
    pub(super) fn close_sample_weights(&mut self) {
        let weighted = std::mem::take(&mut self.samples.weighted_micro_batches);
        if weighted != 0 && weighted != self.micro_batches() {
            self.record(
                FaultKind::InvalidArgument,
                &format!(
                    "set_samples was called for {weighted} of the step's {} micro-batches: \
                     call it for all of them or for none",
                    self.micro_batches()
                ),
            );
        }
    }

    /// An error unless this strategy averages (what sample weights and
    /// joining need); `what` names the call.
    fn check_weighted(&self, what: &str) -> Result<()> {
        if self.training_loop != TrainingLoop::Gradients {
            return Err(OptimError::InvalidArgument(format!(
                "{what}: the local-step and DimReduce loops send parameters or steps, not an \
                 average of gradients"
            )));
        }
        if matches!(
            self.strategy(),
            StrategyConfig::Custom | StrategyConfig::AdaSum { .. }
        ) {
            return Err(OptimError::InvalidArgument(format!(
                "{what}: a strategy is not an average, so sample weights do not apply"
            )));
        }
        Ok(())
    }

    /// The step's agreement on samples: one all-reduce of this rank's
    /// samples and whether it still trains (`active`); returns the total
    /// samples and how many ranks still train.
    fn agree_samples(&self, mine: u64, active: bool) -> Result<(u64, u64)> {
        let mut counts = [mine, u64::from(active)];
        self.comm
            .all_reduce(&mut counts, ReduceOp::Sum)
            .map_err(gradwire_algos::AlgoError::from)?;
        Ok((counts[0], counts[1]))
    }

    /// With accumulation: the factor of the step's sum of sample-weighted
    /// gradients, W / total (1/k when nobody saw a sample).
    fn set_step_factor(&mut self, total: u64) {
        let factor = if total == 0 {
            1.0 / f64::from(self.micro_batches())
        } else {
            self.world_size() as f64 / total as f64
        };
        self.set_accumulation_factor(factor as f32);
    }
}
