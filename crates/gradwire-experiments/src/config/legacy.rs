//! The first format of a saved configuration: the strategy by name, its
//! settings in fields of their own (`ratio`, `threshold`, ...). Both
//! formats read through [`TrainConfigRecord`].

use super::{ModelKind, OptimizerKind, ScheduleKind, TrainConfig, parse_strategy};
use crate::error::{ExperimentError, Result};
use crate::model::GptShape;
use gradwire_compress::SparseCodec;
use gradwire_optim::StrategyConfig;
use serde::Deserialize;
use std::path::PathBuf;

/// A saved configuration of either format.
#[derive(Debug, Deserialize)]
#[serde(default)]
pub struct TrainConfigRecord {
    strategy: String,
    baseline: bool,
    world: usize,
    epochs: usize,
    batch: usize,
    accumulate: u32,
    uneven_shards: bool,
    model: ModelKind,
    hidden: Vec<usize>,
    channels: Vec<usize>,
    gpt: GptShape,
    corpus: PathBuf,
    epoch_windows: Option<usize>,
    target_loss: f64,
    fusion_threshold: usize,
    optimizer: OptimizerKind,
    lr: f64,
    momentum: f64,
    schedule: ScheduleKind,
    seed: u64,
    dimreduce_dense_epochs: Option<usize>,
    components: usize,
    pca: Option<PathBuf>,
    // The first format's strategy settings.
    ratio: Option<f64>,
    threshold: Option<f32>,
    error_feedback: Option<bool>,
    clip: Option<f32>,
    average_state: Option<bool>,
    adasum_group: Option<usize>,
    powersgd_rank: Option<usize>,
    powersgd_start_step: Option<u64>,
    freeze_step: Option<u64>,
}

impl Default for TrainConfigRecord {
    fn default() -> Self {
        let d = TrainConfig::default();
        TrainConfigRecord {
            strategy: d.strategy.to_string(),
            baseline: d.baseline,
            world: d.world,
            epochs: d.epochs,
            batch: d.batch,
            accumulate: d.accumulate,
            uneven_shards: d.uneven_shards,
            model: d.model,
            hidden: d.hidden,
            channels: d.channels,
            gpt: d.gpt,
            corpus: d.corpus,
            epoch_windows: d.epoch_windows,
            target_loss: d.target_loss,
            fusion_threshold: d.fusion_threshold,
            optimizer: d.optimizer,
            lr: d.lr,
            momentum: d.momentum,
            schedule: d.schedule,
            seed: d.seed,
            dimreduce_dense_epochs: d.dimreduce_dense_epochs,
            components: d.components,
            pca: d.pca,
            ratio: None,
            threshold: None,
            error_feedback: None,
            clip: None,
            average_state: None,
            adasum_group: None,
            powersgd_rank: None,
            powersgd_start_step: None,
            freeze_step: None,
        }
    }
}

impl TrainConfigRecord {
    /// The strategy and whether it is the baseline: the printed form, or
    /// the first format's name with its settings. An unreadable one is
    /// an error, never another run.
    fn strategy(&self) -> Result<(StrategyConfig, bool)> {
        let (mut s, baseline) = parse_strategy(&self.strategy)?;
        match &mut s {
            StrategyConfig::Half { clip, .. } => *clip = self.clip.or(*clip),
            StrategyConfig::Sparse {
                codec,
                error_feedback,
            } => {
                *error_feedback = self.error_feedback.unwrap_or(*error_feedback);
                match codec {
                    SparseCodec::Threshold(t) => *t = self.threshold.unwrap_or(*t),
                    SparseCodec::TopK(r)
                    | SparseCodec::SampledTopK(r)
                    | SparseCodec::RandomK { ratio: r, .. } => *r = self.ratio.unwrap_or(*r),
                }
            }
            StrategyConfig::PowerSgd(config) => {
                config.rank = self.powersgd_rank.unwrap_or(config.rank);
                config.start_step = self.powersgd_start_step.unwrap_or(config.start_step);
                config.error_feedback = self.error_feedback.unwrap_or(config.error_feedback);
            }
            StrategyConfig::Quantized { error_feedback, .. } => {
                *error_feedback = self.error_feedback.unwrap_or(*error_feedback)
            }
            StrategyConfig::OneBitAdam { freeze_step, .. } => {
                *freeze_step = self.freeze_step.unwrap_or(*freeze_step)
            }
            StrategyConfig::AdaSum { group } | StrategyConfig::DeltaWeight { group } => {
                *group = self.adasum_group.or(*group)
            }
            StrategyConfig::Partial { average_state } => {
                *average_state = self.average_state.unwrap_or(*average_state)
            }
            StrategyConfig::Dense
            | StrategyConfig::Custom
            | StrategyConfig::DimReduce
            | StrategyConfig::DiLoCo(_) => {}
        }
        Ok((s, baseline))
    }
}

impl TryFrom<TrainConfigRecord> for TrainConfig {
    type Error = ExperimentError;

    fn try_from(r: TrainConfigRecord) -> Result<TrainConfig> {
        let (strategy, baseline) = r.strategy()?;
        Ok(TrainConfig {
            strategy,
            baseline: baseline || r.baseline,
            world: r.world,
            epochs: r.epochs,
            batch: r.batch,
            accumulate: r.accumulate,
            uneven_shards: r.uneven_shards,
            model: r.model,
            hidden: r.hidden,
            channels: r.channels,
            gpt: r.gpt,
            corpus: r.corpus,
            epoch_windows: r.epoch_windows,
            target_loss: r.target_loss,
            fusion_threshold: r.fusion_threshold,
            optimizer: r.optimizer,
            lr: r.lr,
            momentum: r.momentum,
            schedule: r.schedule,
            seed: r.seed,
            dimreduce_dense_epochs: r.dimreduce_dense_epochs,
            components: r.components,
            pca: r.pca,
            timeline: None,
        })
    }
}
