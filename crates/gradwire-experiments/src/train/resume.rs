//! Checkpoints of a run: where they go, what the run adds to gradwire's
//! state (the epoch, the configuration, the history, DimReduce's
//! trajectory) and how a run continues from them, bitwise.

use super::{EpochRecord, Run};
use crate::config::TrainConfig;
use crate::engine::Backend;
use crate::engine::Engine;
use crate::error::{ExperimentError, Result};
use crate::model::Model;
use gradwire_algos::dimreduce::TrajectoryRecorder;
use gradwire_optim::StrategyConfig;
use gradwire_optim::UpdateRule;
use gradwire_optim::checkpoint::{self, Checkpoint};
use gradwire_tensor::Tensor;
use std::path::{Path, PathBuf};

/// Where checkpoints go, and whether to continue from them.
#[derive(Debug, Clone)]
pub struct CheckpointPlan {
    /// One `rank<r>.ckpt` per worker, after every epoch, and DimReduce's
    /// `pca.safetensors`.
    pub dir: PathBuf,
    /// Continue from the checkpoints in `dir`.
    pub resume: bool,
}

/// The checkpoint keys of the run's own state. They keep the names of the
/// first format (the crate was gradwire-cli then), so that checkpoints
/// written since still resume.
pub(super) const KEY_EPOCH: &str = "gradwire-cli/epoch";
pub(super) const KEY_CONFIG: &str = "gradwire-cli/config";
pub(super) const KEY_HISTORY: &str = "gradwire-cli/history";
pub(super) const KEY_TRAJECTORY: &str = "gradwire-cli/trajectory";
pub(super) const PCA_FILE: &str = "pca.safetensors";

/// The run configuration a checkpoint was written with.
pub(super) fn saved_config(ckpt: &Checkpoint) -> Result<TrainConfig> {
    let value = ckpt.state.values.get(KEY_CONFIG).cloned().ok_or_else(|| {
        ExperimentError::Resume("the checkpoint holds no run configuration".into())
    })?;
    Ok(serde_json::from_value(value)?)
}

pub(super) fn rank_file(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank{rank}.ckpt"))
}

impl Run<'_> {
    /// Writes this rank's checkpoint after `epochs_done` epochs.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn save<R: UpdateRule, C: Backend + 'static>(
        &self,
        dir: &Path,
        rank: usize,
        engine: &Engine<R, C>,
        model: &Model,
        recorder: &TrajectoryRecorder,
        history: &[EpochRecord],
        epochs_done: usize,
        dimreduce: bool,
    ) -> Result<()> {
        let mut ckpt = engine.checkpoint(model)?;
        let values = &mut ckpt.state.values;
        values.insert(KEY_EPOCH.into(), epochs_done.into());
        values.insert(KEY_CONFIG.into(), serde_json::to_value(self.config)?);
        values.insert(KEY_HISTORY.into(), serde_json::to_value(history)?);
        if self.config.strategy == StrategyConfig::DimReduce && !dimreduce && !recorder.is_empty() {
            let rows: Vec<f32> = recorder.snapshots().flatten().copied().collect();
            let width = rows.len() / recorder.len();
            ckpt.state.tensors.insert(
                KEY_TRAJECTORY.into(),
                Tensor::from_vec(rows, vec![recorder.len(), width])?,
            );
        }
        checkpoint::save(rank_file(dir, rank), &ckpt)?;
        Ok(())
    }

    /// Restores the trajectory and the history from `ckpt` (the engine
    /// restores the model); returns the epochs already done.
    pub(super) fn resume(
        &self,
        ckpt: &Checkpoint,
        recorder: &mut TrajectoryRecorder,
        history: &mut Vec<EpochRecord>,
    ) -> Result<usize> {
        let bad = |m: &str| ExperimentError::Resume(m.to_string());
        let saved = saved_config(ckpt)?;
        // Only the length of the run may change.
        let comparable = TrainConfig {
            epochs: self.config.epochs,
            ..saved.clone()
        };
        if &comparable != self.config {
            let (then, now) = (
                serde_json::to_value(&comparable)?,
                serde_json::to_value(self.config)?,
            );
            let differences: Vec<String> = then
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, v)| now.get(k.as_str()) != Some(*v))
                .map(|(k, v)| {
                    format!(
                        "{k} was {v}, now {}",
                        now.get(k.as_str()).unwrap_or(&serde_json::Value::Null)
                    )
                })
                .collect();
            return Err(ExperimentError::Resume(format!(
                "the checkpoint is of another run ({})",
                differences.join("; ")
            )));
        }
        let done = ckpt
            .state
            .values
            .get(KEY_EPOCH)
            .and_then(|v| v.as_u64())
            .ok_or_else(|| bad("the checkpoint holds no epoch count"))? as usize;
        if done > self.config.epochs {
            return Err(ExperimentError::Resume(format!(
                "the checkpoint is after epoch {done}, the run has {} epochs",
                self.config.epochs
            )));
        }
        *history = serde_json::from_value(
            ckpt.state
                .values
                .get(KEY_HISTORY)
                .cloned()
                .ok_or_else(|| bad("the checkpoint holds no history"))?,
        )?;
        if let Some(rows) = ckpt.state.tensors.get(KEY_TRAJECTORY) {
            let width = rows.dims().get(1).copied().unwrap_or(0);
            let flat = rows.to_vec::<f32>()?;
            for row in flat.chunks(width.max(1)) {
                let t = Tensor::from_vec(row.to_vec(), row.len())?;
                recorder.record(&[&t])?;
            }
        }
        Ok(done)
    }
}
