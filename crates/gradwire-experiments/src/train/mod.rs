//! One data-parallel training run: W workers (LocalComm threads, or any
//! Communicator), each taking its share of every global batch, combined
//! through gradwire-candle in the chosen strategy; per-epoch records of
//! loss, accuracy, traffic and time (`report.rs`); checkpoints that resume
//! bitwise (`resume.rs`); `gradwire train`'s flags and the backend they
//! choose (`command.rs`); a worker's loop (`worker.rs`).
//!
//! Every worker runs the same loop: the global batch of `world * batch *
//! accumulate` samples comes from the epoch's seeded order, worker `r`
//! takes samples `r, r + W, ...` of it, cut into `accumulate` micro-batches,
//! computes loss and gradients of each with candle and steps through its
//! engine (`crate::engine`; every micro-batch but the last only
//! accumulates). DimReduce's first stage is
//! a dense run that records the trajectory; at its end every worker fits
//! the same components from the same snapshots and switches DistOpt's mode.

use crate::config::{OptimizerKind, ScheduleKind, TrainConfig};
use crate::data::Dataset;
use crate::engine::Backend;
use crate::error::{ExperimentError, Result};
use gradwire_comm::{LocalComm, LocalConfig, local};
use gradwire_optim::{
    AdaGradConfig, AdaGradRule, AdamConfig, AdamRule, AdamWRule, OneBitAdamConfig, OneBitAdamRule,
    RmsPropConfig, RmsPropRule, Schedule, SgdConfig, SgdRule, StrategyConfig,
};

mod agree;
mod command;
mod report;
mod resume;
mod straggler;
mod timeline;
mod worker;

use agree::agree;
pub use command::TrainArgs;
pub use report::{EpochRecord, Observer, RunReport, Silent, StepSplit, TARGET_ACCURACY, Target};
pub use resume::CheckpointPlan;
use resume::{agree_on_resume, has_checkpoint, saved_config};
pub use straggler::{Straggler, straggler};
pub use timeline::TimelineSummary;
use worker::Run;

/// Snapshots DimReduce's first stage keeps (MindSpore's recipe: 60).
pub const TRAJECTORY_SNAPSHOTS: usize = 60;

/// Trains `config` on `data` with `config.world` LocalComm workers; returns
/// rank 0's report.
pub fn train(
    config: &TrainConfig,
    data: &Dataset,
    observer: &dyn Observer,
    plan: Option<&CheckpointPlan>,
) -> Result<RunReport> {
    prepare(config, plan)?;
    let local_config = LocalConfig {
        timeline: config.timeline.is_some(),
        ..LocalConfig::default()
    };
    let results = local::run_with(config.world, &local_config, |comm: LocalComm| {
        train_rank(comm, config, data, observer, plan)
    })?;
    rank_zero_report(
        results
            .into_iter()
            .map(|r| r.map_err(ExperimentError::from).and_then(|r| r)),
    )
}

/// Trains `config` on `data` with one NcclComm worker per GPU (devices 0 to
/// `config.world - 1`, threads of this process); returns rank 0's report.
/// The model and its gradients stay in host memory (candle's CPU backend):
/// NcclComm moves them through device buffers. With `deterministic` it
/// reduces in rank order, so a run is bitwise the LocalComm run; otherwise
/// with NCCL's own collectives (NCCL's order of additions).
#[cfg(feature = "nccl")]
pub fn train_nccl(
    config: &TrainConfig,
    data: &Dataset,
    observer: &dyn Observer,
    plan: Option<&CheckpointPlan>,
    deterministic: bool,
) -> Result<RunReport> {
    use gradwire_comm::nccl::{self, NcclConfig, NcclReduction};
    prepare(config, plan)?;
    let devices: Vec<usize> = (0..config.world).collect();
    let nccl_config = NcclConfig {
        reduction: if deterministic {
            NcclReduction::RankOrdered
        } else {
            NcclReduction::Native
        },
        timeline: config.timeline.is_some(),
        ..NcclConfig::default()
    };
    let results = nccl::run(&devices, nccl_config, |comm| {
        Ok(train_rank(comm, config, data, observer, plan))
    })?;
    rank_zero_report(
        results
            .into_iter()
            .map(|r| r.map_err(ExperimentError::from).and_then(|r| r)),
    )
}

/// Checks the configuration and the checkpoint directory before any worker
/// starts (a resume needs every rank's file).
fn prepare(config: &TrainConfig, plan: Option<&CheckpointPlan>) -> Result<()> {
    config.validate()?;
    if let Some(plan) = plan {
        std::fs::create_dir_all(&plan.dir).map_err(|source| ExperimentError::Io {
            path: plan.dir.display().to_string(),
            source,
        })?;
        // Rank 0's file is in every set, whatever the world size that
        // wrote it (the ranks check the rest as they agree).
        if plan.resume && !has_checkpoint(&plan.dir, 0) {
            return Err(ExperimentError::Resume(format!(
                "no checkpoint of rank 0 in {} (was the run saved with --checkpoint?)",
                plan.dir.display(),
            )));
        }
    }
    Ok(())
}

/// Rank 0's report out of every rank's result (the first error wins).
fn rank_zero_report(
    results: impl IntoIterator<Item = Result<Option<RunReport>>>,
) -> Result<RunReport> {
    let mut report = None;
    for result in results {
        if let Some(r) = result? {
            report = Some(r);
        }
    }
    report.ok_or_else(|| ExperimentError::Usage("rank 0 returned no report".into()))
}

/// One worker's part of a run on any communicator: rank 0 returns the
/// report, the others `None`.
pub fn train_rank<C: Backend + 'static>(
    comm: C,
    config: &TrainConfig,
    data: &Dataset,
    observer: &dyn Observer,
    plan: Option<&CheckpointPlan>,
) -> Result<Option<RunReport>> {
    config.validate()?;
    // Every rank must agree that it can resume (and from which epoch), or
    // none starts: a rank that gave up alone would leave the others
    // waiting in a collective.
    let resume_from = match plan {
        Some(plan) if plan.resume => Some(agree_on_resume(&comm, &plan.dir)?),
        Some(plan) => {
            let created =
                std::fs::create_dir_all(&plan.dir).map_err(|source| ExperimentError::Io {
                    path: plan.dir.display().to_string(),
                    source,
                });
            agree(&comm, created, "create the checkpoint directory")?;
            None
        }
        None => None,
    };
    // DimReduce's dense stage, fixed for the whole run: a resumed run keeps
    // the saved one unless told otherwise (it would move with --epochs).
    let mut config = config.clone();
    if config.strategy == StrategyConfig::DimReduce && config.dimreduce_dense_epochs.is_none() {
        let saved = match &resume_from {
            Some(point) => {
                agree(&comm, saved_config(point.any()), "read its checkpoint")?
                    .dimreduce_dense_epochs
            }
            None => None,
        };
        config.dimreduce_dense_epochs = Some(saved.unwrap_or_else(|| config.dense_epochs()));
    }
    let config = &config;
    let steps_per_epoch = data.epoch_len().div_ceil(config.global_batch());
    let total_steps = (steps_per_epoch * config.epochs) as u64;
    let lr = match config.schedule {
        ScheduleKind::Constant => Schedule::constant(config.lr),
        ScheduleKind::Cosine => Schedule::CosineWarmup {
            peak: config.lr,
            floor: config.lr / 10.0,
            warmup_steps: steps_per_epoch as u64,
            total_steps: total_steps.max(steps_per_epoch as u64),
        },
        ScheduleKind::Step => Schedule::StepDecay {
            init: config.lr,
            step_size: (total_steps / 4).max(1),
            gamma: 0.5,
        },
    };
    let run = Run {
        config,
        data,
        observer,
        plan,
        resume_from,
        steps_per_epoch,
    };
    match config.optimizer {
        OptimizerKind::Sgd => {
            // The strategy keeps the momentum when it sends it.
            let momentum = if config.momentum_before_exchange() {
                0.0
            } else {
                config.momentum
            };
            run.go::<SgdRule, _>(comm, SgdConfig::default().lr(lr).momentum(momentum))
        }
        // 1-bit Adam is an optimizer and a strategy together.
        OptimizerKind::Adam | OptimizerKind::Adamw
            if matches!(config.strategy, StrategyConfig::OneBitAdam { .. }) =>
        {
            let adam = match config.optimizer {
                OptimizerKind::Adamw => AdamConfig::adamw(),
                _ => AdamConfig::default(),
            };
            run.go::<OneBitAdamRule, _>(
                comm,
                OneBitAdamConfig::new(adam.lr(lr), onebit_adam_freeze_step(config)),
            )
        }
        OptimizerKind::Adam => run.go::<AdamRule, _>(comm, AdamConfig::default().lr(lr)),
        OptimizerKind::Adamw => run.go::<AdamWRule, _>(comm, AdamConfig::adamw().lr(lr)),
        OptimizerKind::Rmsprop => run.go::<RmsPropRule, _>(
            comm,
            RmsPropConfig {
                lr,
                ..RmsPropConfig::default()
            },
        ),
        OptimizerKind::Adagrad => run.go::<AdaGradRule, _>(
            comm,
            AdaGradConfig {
                lr,
                ..AdaGradConfig::default()
            },
        ),
    }
}

/// 1-bit Adam's freeze step, which the optimizer needs as well as the
/// strategy.
fn onebit_adam_freeze_step(config: &TrainConfig) -> u64 {
    match config.strategy {
        StrategyConfig::OneBitAdam { freeze_step, .. } => freeze_step,
        _ => gradwire_optim::ONEBIT_ADAM_FREEZE_STEP,
    }
}
