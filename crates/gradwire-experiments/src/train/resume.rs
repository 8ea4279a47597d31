//! Checkpoints of a run: where they go, what the run adds to gradwire's
//! state (the epoch, the configuration, the history, DimReduce's
//! trajectory) and how a run continues from them, bitwise.
//!
//! A run's checkpoints are sets, one file per rank and epoch
//! (`rank<r>.epoch<e>.ckpt`). A set is complete when every rank has
//! written its part: after its write each rank says whether it succeeded,
//! and the run goes on only if all did (else every rank stops with the same
//! error). Each rank keeps its last two files. A resume loads and checks
//! (checksum, format) every file of its own, and the ranks agree on the
//! newest epoch whose file every rank holds intact, which falls back to the
//! set before when a rank's newest is missing or corrupt; a first-format
//! file (`rank<r>.ckpt`) counts at the epoch it records.
//!
//! A run resumes at another world size too: the ranks agree on the size of
//! the world that wrote the newest set, and if it differs from theirs each
//! rank reads every file of the set (the directory must be one that every
//! rank reads: one host, or a shared file system) and restores what
//! gradwire's resharding gives it (`DistOpt::resharded`: the strategies'
//! per-rank state averaged, so that it adds what it would have added).

use super::{EpochRecord, Run};
use crate::config::TrainConfig;
use crate::engine::Backend;
use crate::engine::Engine;
use crate::error::{ExperimentError, Result};
use crate::model::Model;
use gradwire_algos::dimreduce::TrajectoryRecorder;
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_optim::StrategyConfig;
use gradwire_optim::UpdateRule;
use gradwire_optim::checkpoint::{self, Checkpoint};
use gradwire_tensor::Tensor;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where checkpoints go, and whether to continue from them.
#[derive(Debug, Clone)]
pub struct CheckpointPlan {
    /// One `rank<r>.epoch<e>.ckpt` per worker and epoch (each worker
    /// keeps its last two), and DimReduce's `pca.safetensors`.
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

/// Rank `rank`'s checkpoint after `epoch` epochs.
pub(super) fn rank_file(dir: &Path, rank: usize, epoch: usize) -> PathBuf {
    dir.join(format!("rank{rank}.epoch{epoch}.ckpt"))
}

/// Rank `rank`'s checkpoint of the first format: one file, overwritten
/// after every epoch.
fn first_format_file(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank{rank}.ckpt"))
}

/// The most epochs a checkpoint may claim (an absurd count in a damaged
/// file is not worth a bitmap).
const MAX_SAVED_EPOCH: usize = 1 << 20;

/// The epoch a checkpoint was written after.
fn saved_epoch(ckpt: &Checkpoint) -> Option<usize> {
    let epoch = ckpt.state.values.get(KEY_EPOCH)?.as_u64()?;
    usize::try_from(epoch)
        .ok()
        .filter(|&e| (1..=MAX_SAVED_EPOCH).contains(&e))
}

/// Rank `rank`'s checkpoint files in `dir`, each with the epoch its name
/// says (`None` for the first format's file).
fn checkpoint_files(dir: &Path, rank: usize) -> Vec<(Option<usize>, PathBuf)> {
    let prefix = format!("rank{rank}.epoch");
    let first_format = first_format_file(dir, rank);
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?;
            let named = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix(".ckpt"))
                .and_then(|e| e.parse::<usize>().ok());
            (named.is_some() || path == first_format).then_some((named, path))
        })
        .collect()
}

/// Every `rank<k>.epoch<e>.ckpt` in `dir`, as `(e, k, path)`, newest
/// epoch first.
fn epoch_files(dir: &Path) -> Vec<(usize, usize, PathBuf)> {
    let mut found: Vec<(usize, usize, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?;
            let (rank, epoch) = name
                .strip_prefix("rank")?
                .strip_suffix(".ckpt")?
                .split_once(".epoch")?;
            Some((epoch.parse().ok()?, rank.parse().ok()?, path))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    found
}

/// The world size recorded in a checkpoint's run configuration.
fn saved_world(ckpt: &Checkpoint) -> Option<usize> {
    saved_config(ckpt).ok().map(|c| c.world)
}

/// The size of the world that wrote the newest checkpoints this rank can
/// read: that of the newest intact file of any rank (files of ranks that a
/// later, smaller world did not have are older), else of this rank's own
/// newest (a first-format file); 0 if none.
fn newest_saved_world(dir: &Path, mine: &BTreeMap<usize, Checkpoint>) -> usize {
    epoch_files(dir)
        .into_iter()
        .find_map(|(epoch, _, path)| match mine.get(&epoch) {
            // This rank's own file of that epoch, already loaded.
            Some(own) => saved_world(own),
            None => saved_world(&checkpoint::load(&path).ok()?),
        })
        .or_else(|| mine.values().next_back().and_then(saved_world))
        .unwrap_or(0)
}

/// Every file of the set of `epoch` written by a world of `world` ranks,
/// in rank order, if each loads, passes every check and says it is that
/// rank's file of that set.
fn whole_set(dir: &Path, epoch: usize, world: usize) -> Option<Vec<Checkpoint>> {
    (0..world)
        .map(|rank| {
            let ckpt = checkpoint::load(rank_file(dir, rank, epoch)).ok()?;
            (saved_epoch(&ckpt) == Some(epoch) && saved_world(&ckpt) == Some(world)).then_some(ckpt)
        })
        .collect()
}

/// Rank `rank`'s checkpoints in `dir` that load and pass every check, by
/// the epoch they record (an epoch file whose name says another epoch is
/// left out, as is anything unreadable: a crash mid-write, a flipped bit).
fn intact_checkpoints(dir: &Path, rank: usize) -> BTreeMap<usize, Checkpoint> {
    let mut found = BTreeMap::new();
    for (named, path) in checkpoint_files(dir, rank) {
        let Ok(ckpt) = checkpoint::load(&path) else {
            continue;
        };
        if let Some(epoch) = saved_epoch(&ckpt)
            && named.is_none_or(|n| n == epoch)
            // An epoch file wins over a first-format file of the same epoch.
            && (named.is_some() || !found.contains_key(&epoch))
        {
            found.insert(epoch, ckpt);
        }
    }
    found
}

/// Whether `dir` holds a checkpoint file of rank `rank`, of either format
/// (what a run checks before its workers start; which one resumes is
/// agreed by the ranks, [`agree_on_resume`]).
pub(super) fn has_checkpoint(dir: &Path, rank: usize) -> bool {
    !checkpoint_files(dir, rank).is_empty()
}

/// The checkpoints every rank agreed to resume from (each records the
/// epochs done).
pub(super) struct ResumePoint {
    /// At the world size that wrote the set, this rank's own checkpoint
    /// alone; at another, every file of the set, in rank order.
    pub(super) set: Vec<Checkpoint>,
    /// Whether the set was written by a world of another size.
    pub(super) resharded: bool,
}

impl ResumePoint {
    /// A checkpoint of the set, for what every rank saved alike (the run's
    /// configuration, its history).
    pub(super) fn any(&self) -> &Checkpoint {
        &self.set[0]
    }
}

/// The checkpoints every rank resumes from: the newest epoch whose set is
/// intact, agreed by all (all-reduces), loaded and checked. The ranks first
/// agree on the size of the world that wrote the newest set; at their own
/// size each rank reads its own file, and the set is intact when every
/// rank's is; at another, each rank reads every file of a set. Every rank
/// returns the same epoch, or every rank the same
/// [`ExperimentError::Resume`].
pub(super) fn agree_on_resume<C: Communicator>(comm: &C, dir: &Path) -> Result<ResumePoint> {
    let mut mine = intact_checkpoints(dir, comm.rank());
    let known = newest_saved_world(dir, &mine) as u64;
    let mut sizes = [
        known,
        if known == 0 {
            u64::MAX
        } else {
            u64::MAX - known
        },
    ];
    comm.all_reduce(&mut sizes, ReduceOp::Max)?;
    let (largest, smallest) = (sizes[0], u64::MAX - sizes[1]);
    if largest == 0 {
        return Err(ExperimentError::Resume(format!(
            "no rank found an intact checkpoint in {}",
            dir.display()
        )));
    }
    if largest != smallest {
        return Err(ExperimentError::Resume(format!(
            "the ranks found checkpoints of worlds of {smallest} and {largest} ranks in {}",
            dir.display()
        )));
    }
    let old_world = largest as usize;
    let resharded = old_world != comm.world_size();
    let mut sets: BTreeMap<usize, Vec<Checkpoint>> = BTreeMap::new();
    if resharded {
        let mut epochs: Vec<usize> = epoch_files(dir).into_iter().map(|(e, _, _)| e).collect();
        epochs.dedup();
        for epoch in epochs {
            if let Some(set) = whole_set(dir, epoch, old_world) {
                sets.insert(epoch, set);
            }
        }
    } else {
        sets = std::mem::take(&mut mine)
            .into_iter()
            // A file of another world (left by an older run) is no part of
            // the set; one that records no world is checked later.
            .filter(|(_, ckpt)| saved_world(ckpt).is_none_or(|w| w == old_world))
            .map(|(epoch, ckpt)| (epoch, vec![ckpt]))
            .collect();
    }
    let mut newest = [sets.keys().next_back().copied().unwrap_or(0) as u64];
    comm.all_reduce(&mut newest, ReduceOp::Max)?;
    // Bounded by MAX_SAVED_EPOCH on every rank.
    let mut held = vec![0u8; newest[0] as usize + 1];
    for &epoch in sets.keys() {
        held[epoch] = 1;
    }
    comm.all_reduce(&mut held, ReduceOp::Min)?;
    let common = held.iter().rposition(|&h| h == 1).filter(|&e| e > 0);
    match common.and_then(|e| Some((e, sets.remove(&e)?))) {
        Some((_, set)) => Ok(ResumePoint { set, resharded }),
        None => Err(ExperimentError::Resume(format!(
            "no epoch has an intact checkpoint from every rank of the world of {old_world} \
             that saved in {}",
            dir.display()
        ))),
    }
}

/// Removes this rank's checkpoint of `epoch` (a set two behind the newest
/// complete one, no longer a fallback) and its first-format file; rank 0
/// also removes the files of ranks this world of `world` lacks, of `epoch`
/// or older (left by a larger world this run was resumed from). A file
/// that cannot be removed is left.
pub(super) fn prune(dir: &Path, rank: usize, world: usize, epoch: usize) {
    let _ = std::fs::remove_file(rank_file(dir, rank, epoch));
    let _ = std::fs::remove_file(first_format_file(dir, rank));
    if rank == 0 {
        for (e, k, path) in epoch_files(dir) {
            if k >= world && e <= epoch {
                let _ = std::fs::remove_file(path);
            }
        }
    }
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
        checkpoint::save(rank_file(dir, rank, epochs_done), &ckpt)?;
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
        // Only the length of the run and its world size may change (the
        // set was resharded for this one), and its outputs.
        let comparable = TrainConfig {
            epochs: self.config.epochs,
            world: self.config.world,
            timeline: self.config.timeline.clone(),
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
