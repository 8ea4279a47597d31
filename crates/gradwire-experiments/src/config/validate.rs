//! The bounds a run's values keep, and the check of a whole configuration
//! before anything starts (every message names its flag).

use super::{ModelKind, OptimizerKind, TrainConfig};
use crate::error::{ExperimentError, Result};
use gradwire_optim::StrategyConfig;

/// The largest world size the in-process backend is run with here: every
/// worker is a thread.
pub const MAX_LOCAL_WORLD: usize = 256;

/// An error unless `world` ranks fit this process: 1 to
/// [`MAX_LOCAL_WORLD`] (`flag` names the flag that set it).
pub fn check_local_world(flag: &str, world: usize) -> Result<()> {
    if world == 0 || world > MAX_LOCAL_WORLD {
        return Err(ExperimentError::Usage(format!(
            "{flag} must be between 1 and {MAX_LOCAL_WORLD}, got {world}"
        )));
    }
    Ok(())
}

/// The most weights one layer of a run's model may hold (`--hidden`,
/// `--channels`): 2^26, 256 MiB of f32 per copy, of which every worker
/// keeps several.
pub const MAX_LAYER: usize = 1 << 26;

/// The most epochs a run takes (as many as a checkpoint may record; the
/// bound keeps the step count far from overflowing).
pub const MAX_EPOCHS: usize = 1 << 20;

/// The largest batch per worker a run takes (the digits have 1,797
/// samples; the bound keeps `world * batch` far from overflowing).
pub const MAX_BATCH: usize = 1 << 16;

/// The most micro-batches a step takes (`--accumulate`; with
/// [`MAX_BATCH`] and the largest world, the global batch stays far from
/// overflowing).
pub const MAX_ACCUMULATE: u32 = 1 << 10;

impl TrainConfig {
    /// Checks every value; the message names the flag.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ExperimentError::Usage(m));
        check_local_world("--world", self.world)?;
        if !(1..=MAX_EPOCHS).contains(&self.epochs) {
            return bad(format!(
                "--epochs must be between 1 and {MAX_EPOCHS}, got {}",
                self.epochs
            ));
        }
        if !(1..=MAX_BATCH).contains(&self.batch) {
            return bad(format!(
                "--batch must be between 1 and {MAX_BATCH}, got {}",
                self.batch
            ));
        }
        if !(1..=MAX_ACCUMULATE).contains(&self.accumulate) {
            return bad(format!(
                "--accumulate must be between 1 and {MAX_ACCUMULATE}, got {}",
                self.accumulate
            ));
        }
        if self.accumulate > 1 && self.strategy == StrategyConfig::DimReduce {
            return bad(
                "--accumulate: DimReduce's line search evaluates one batch, so its steps take one micro-batch"
                    .into(),
            );
        }
        if self.uneven_shards
            && (self.baseline
                || self.strategy.training_loop() != gradwire_optim::TrainingLoop::Gradients
                || matches!(self.strategy, StrategyConfig::AdaSum { .. }))
        {
            return bad(format!(
                "--uneven-shards: {} does not average gradients, so workers cannot join it \
                 (a gradient strategy that averages: dense, fp16, topk, powersgd, ...)",
                self.label()
            ));
        }
        if self.hidden.contains(&0) {
            return bad("--hidden widths must be at least 1".into());
        }
        if self.channels.is_empty() || self.channels.len() > 3 || self.channels.contains(&0) {
            return bad("--channels takes one to three widths, each at least 1".into());
        }
        if self.model == ModelKind::Gpt
            && let Some(problem) = self.gpt.problem()
        {
            return bad(problem);
        }
        if self.epoch_windows == Some(0) {
            return bad("--epoch-windows must be at least 1".into());
        }
        if !(self.target_loss.is_finite() && self.target_loss > 0.0) {
            return bad(format!(
                "--target-loss must be positive and finite, got {}",
                self.target_loss
            ));
        }
        let layers = crate::model::Model::layer_weights(self);
        if layers.is_none_or(|layers| layers.iter().any(|&n| n > MAX_LAYER)) {
            let flag = match self.model {
                ModelKind::Mlp => "--hidden",
                ModelKind::Cnn => "--channels",
                ModelKind::Gpt => "--width",
            };
            return bad(format!(
                "{flag}: a layer would hold more than {MAX_LAYER} weights"
            ));
        }
        if let Err(e) = self.strategy.validate() {
            return bad(format!("--strategy: {e}"));
        }
        if self.strategy == StrategyConfig::Custom {
            return bad("--strategy: a custom strategy has no name to run".into());
        }
        if self.baseline
            && self.baseline_precision().is_none()
            && self.strategy != StrategyConfig::Dense
        {
            return bad(
                "--strategy: the baseline is dense (baseline) or 16-bit (baseline:fp16, baseline:bf16)"
                    .into(),
            );
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("--lr must be positive and finite, got {}", self.lr));
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return bad(format!(
                "--momentum must be in [0, 1), got {}",
                self.momentum
            ));
        }
        if matches!(self.strategy, StrategyConfig::OneBitAdam { .. })
            && !matches!(self.optimizer, OptimizerKind::Adam | OptimizerKind::Adamw)
        {
            return bad("-s onebit-adam is Adam's own: it takes --optimizer adam or adamw".into());
        }
        if self.fusion_threshold == 0 {
            return bad("--fusion-threshold must be at least 1".into());
        }
        if let StrategyConfig::AdaSum { group: Some(group) }
        | StrategyConfig::DeltaWeight { group: Some(group) } = self.strategy
            && !self.world.is_multiple_of(group)
        {
            return bad(format!(
                "--strategy: AdaSum's group must divide --world ({}), got {group}",
                self.world
            ));
        }
        if self.components == 0 {
            return bad("--components must be at least 1".into());
        }
        // A dense stage as long as the run is allowed: a run may stop in it
        // and be resumed with more epochs.
        if self.dimreduce_dense_epochs == Some(0) && self.strategy == StrategyConfig::DimReduce {
            return bad("--dimreduce-dense-epochs must be at least 1 (or give --pca)".into());
        }
        // Written at the end of the run: a directory that is not there
        // would throw the whole run away.
        if let Some(path) = &self.timeline {
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => std::path::Path::new("."),
            };
            if !dir.is_dir() {
                return bad(format!(
                    "--timeline: the directory {} does not exist",
                    dir.display()
                ));
            }
        }
        Ok(())
    }
}
