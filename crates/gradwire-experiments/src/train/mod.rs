//! One data-parallel training run: W workers (LocalComm threads, or any
//! Communicator), each taking its share of every global batch, combined
//! through gradwire-candle in the chosen strategy; per-epoch records of
//! loss, accuracy, traffic and time (`report.rs`); checkpoints that resume
//! bitwise (`resume.rs`); `gradwire train`'s flags and the backend they
//! choose (`command.rs`).
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
use crate::data::{Dataset, split_even};
use crate::engine::{Backend, Engine};
use crate::error::{ExperimentError, Result};
use crate::model::{Evaluation, Model};
use candle_core::backprop::GradStore;
use gradwire_algos::Traffic;
use gradwire_algos::dimreduce::{DimReduceConfig, Pca, TrajectoryRecorder};
use gradwire_comm::timeline::span;
use gradwire_comm::{LocalComm, LocalConfig, ReduceOp, local};
use gradwire_optim::checkpoint;
use gradwire_optim::{
    AdaGradConfig, AdaGradRule, AdamConfig, AdamRule, AdamWRule, DistOptConfig, OneBitAdamConfig,
    OneBitAdamRule, RmsPropConfig, RmsPropRule, Schedule, SgdConfig, SgdRule, SkipVote,
    StrategyConfig, UpdateRule,
};
use std::time::{Duration, Instant};

mod agree;
mod command;
mod report;
mod resume;
mod straggler;
mod timeline;

use agree::agree;
pub use command::TrainArgs;
pub use report::{EpochRecord, Observer, RunReport, Silent, StepSplit, TARGET_ACCURACY, Target};
pub use resume::CheckpointPlan;
use resume::{PCA_FILE, ResumePoint, agree_on_resume, has_checkpoint, prune, saved_config};
pub use straggler::{Straggler, straggler};
pub use timeline::TimelineSummary;

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

/// Everything a worker's loop reads.
struct Run<'a> {
    config: &'a TrainConfig,
    data: &'a Dataset,
    observer: &'a dyn Observer,
    plan: Option<&'a CheckpointPlan>,
    /// The set the ranks agreed to resume from (loaded and checked while
    /// they agreed).
    resume_from: Option<ResumePoint>,
    steps_per_epoch: usize,
}

/// 1-bit Adam's freeze step, which the optimizer needs as well as the
/// strategy.
fn onebit_adam_freeze_step(config: &TrainConfig) -> u64 {
    match config.strategy {
        StrategyConfig::OneBitAdam { freeze_step, .. } => freeze_step,
        _ => gradwire_optim::ONEBIT_ADAM_FREEZE_STEP,
    }
}

/// DimReduce's settings: MindSpore's, with the residual momentum's rate set
/// to the learning rate (it moves the parameters outside the subspace; at
/// MindSpore's 0.001 they barely move on a model this small).
fn dimreduce_config(config: &TrainConfig) -> DimReduceConfig {
    DimReduceConfig {
        alpha: config.lr,
        ..DimReduceConfig::default()
    }
}

/// Per-epoch tallies.
#[derive(Default)]
struct Tally {
    loss: f64,
    steps: usize,
    /// Steps taken after joining (`--uneven-shards`).
    joined: usize,
    /// Per step, this rank's seconds waiting in the exchange.
    waits: Vec<f64>,
    sent: u64,
    compute: Duration,
    comm: Duration,
    combine: Duration,
    /// The steps' own collectives outside the combining
    /// (`StepStats::coordination`) and this loop's at the epoch's end.
    coordination: Duration,
    searches: usize,
    accepted: usize,
    /// Per step, this rank's time outside the communicator's calls (where
    /// the backend counts them): compute, codecs, bookkeeping.
    busy: Vec<f64>,
}

/// The time `comm` spent in its calls (both threads) since `before`, its
/// count then; `None` where the backend keeps none.
fn in_calls_since<C: Backend>(before: Option<(Duration, Duration)>, comm: &C) -> Option<Duration> {
    let ((c0, j0), (c1, j1)) = before.zip(comm.time_in_calls())?;
    Some(c1.saturating_sub(c0) + j1.saturating_sub(j0))
}

impl Run<'_> {
    fn go<R: UpdateRule, C: Backend + 'static>(
        &self,
        comm: C,
        optimizer: R::Config,
    ) -> Result<Option<RunReport>> {
        let config = self.config;
        let data = self.data;
        let (rank, world) = (comm.rank(), comm.world_size());
        if world != config.world {
            return Err(ExperimentError::Usage(format!(
                "the communicator has {world} ranks, --world says {}",
                config.world
            )));
        }
        let model = Model::new(config)?;
        let dist_config = DistOptConfig {
            strategy: config.distopt_strategy(),
            fusion_threshold: config.fusion_threshold,
            capacity: config
                .fusion_threshold
                .max(gradwire_algos::DEFAULT_FUSION_CAPACITY),
            // candle's backward hands every gradient over at once: there is
            // no overlap for per-bucket votes to allow, so one vote per step
            // (the fewest collectives; the same decisions, the same bits).
            vote: SkipVote::PerStep,
            accumulate: config.accumulate,
            ..DistOptConfig::default()
        };
        let mut engine = Engine::<R, C>::new(config, &model, comm, optimizer, dist_config)?;
        let dense_epochs = config.dense_epochs();
        let mut recorder = TrajectoryRecorder::new(TRAJECTORY_SNAPSHOTS);
        let mut history: Vec<EpochRecord> = Vec::new();
        let mut start_epoch = 0;
        if let (Some(plan), Some(point)) = (self.plan, &self.resume_from) {
            let resumed = (|| -> Result<usize> {
                let done = self.resume(point.any(), &mut recorder, &mut history)?;
                // DimReduce ran when the checkpoint was saved if an epoch
                // past the dense stage was done (or a PCA file was given);
                // saved at the end of the dense stage, the loop below fits
                // the components from the restored trajectory, as the
                // straight run does.
                if config.strategy == StrategyConfig::DimReduce
                    && (config.pca.is_some() || done > dense_epochs)
                {
                    let pca = match &config.pca {
                        Some(path) => checkpoint::load_pca(path)?,
                        None => checkpoint::load_pca(plan.dir.join(PCA_FILE))?,
                    };
                    engine.start_dimreduce(&pca, dimreduce_config(config))?;
                }
                if point.resharded {
                    let own = engine.resharded(&point.set)?;
                    engine.restore(&own)?;
                } else {
                    engine.restore(point.any())?;
                }
                Ok(done)
            })();
            start_epoch = agree(engine.comm(), resumed, "resume from its checkpoint")?;
        } else if let (StrategyConfig::DimReduce, Some(path)) = (config.strategy, &config.pca) {
            let pca = checkpoint::load_pca(path)?;
            engine.start_dimreduce(&pca, dimreduce_config(config))?;
        }
        let dense_step = Traffic::all_reduce(4 * model.len(), world).sent;
        let mut bytes_total = history.last().map_or(0, |e| e.bytes_total);
        let mut dimreduce_started = engine.in_dimreduce();
        let micro_batches = config.accumulate as usize;
        // The forward and backward passes on the timeline, beside the
        // engine's own spans (a shared track: the clone allocates nothing).
        let track = engine.comm().timeline().cloned();
        // The last collective every rank took part in outside the steps:
        // what a rank does after it (an epoch's bookkeeping) delays its
        // arrival at the next exchange as its steps do, so it counts in
        // the first step's busy time.
        let mut synced = Instant::now();
        let mut calls_since_sync = engine.comm().time_in_calls();
        for epoch in start_epoch..config.epochs {
            let dimreduce = config.strategy == StrategyConfig::DimReduce && epoch >= dense_epochs;
            if dimreduce && !dimreduce_started {
                dimreduce_started = true;
                // Every rank fits the same components from the same snapshots.
                let pca: Pca = recorder.fit(config.components)?;
                if let Some(plan) = self.plan
                    && rank == 0
                {
                    checkpoint::save_pca(plan.dir.join(PCA_FILE), &pca)?;
                }
                engine.start_dimreduce(&pca, dimreduce_config(config))?;
            }
            if rank == 0 {
                self.observer.epoch_started(epoch + 1, self.steps_per_epoch);
            }
            let began = Instant::now();
            let calls_before = engine.comm().time_in_calls();
            let waiting_before = engine.comm().time_waiting();
            let mut tally = Tally::default();
            let order = data.epoch_samples(epoch);
            // Outside calls since the last synchronising collective, before
            // this epoch's first step.
            let mut gap = in_calls_since(calls_since_sync, engine.comm())
                .map(|in_calls| synced.elapsed().saturating_sub(in_calls));
            for mine in steps_of(&order, config, rank) {
                let calls_at_step = engine.comm().time_in_calls();
                let computing = Instant::now();
                // Every micro-batch but the last only accumulates (one
                // exchange per step); the step's loss is their mean by
                // samples. DimReduce takes one micro-batch (validated).
                let mut parts = split_even(&mine, micro_batches);
                let last = parts.next_back().unwrap_or_default();
                let mut loss_sum = 0.0f64;
                for part in parts {
                    if config.uneven_shards {
                        engine.set_samples(part.len() as u64)?;
                    }
                    let grads = if part.is_empty() {
                        GradStore::default()
                    } else {
                        let _compute = span(track.as_ref(), "compute", "forward, backward", None);
                        let (loss, grads) = model.loss_and_grads(data, part)?;
                        loss_sum += f64::from(loss) * part.len() as f64;
                        grads
                    };
                    engine.step(grads)?;
                }
                if config.uneven_shards {
                    engine.set_samples(last.len() as u64)?;
                }
                let computed = {
                    let _compute = span(track.as_ref(), "compute", "forward, backward", None);
                    model.loss_and_grads(data, last)
                };
                let (last_loss, grads) = computed?;
                loss_sum += f64::from(last_loss) * last.len() as f64;
                let loss = if micro_batches == 1 {
                    last_loss
                } else {
                    (loss_sum / mine.len().max(1) as f64) as f32
                };
                tally.compute += computing.elapsed();
                let stats = if dimreduce {
                    let stats = engine.step_dimreduce(grads, f64::from(loss), || {
                        model
                            .loss(data, last)
                            .map(f64::from)
                            .map_err(candle_core::Error::wrap)
                    })?;
                    tally.searches += 1;
                    tally.accepted += usize::from(stats.dimreduce.is_some_and(|d| d.step > 0.0));
                    stats
                } else {
                    engine.step(grads)?
                };
                if config.strategy == StrategyConfig::DimReduce && !dimreduce {
                    let params = engine.parameters(&model)?;
                    recorder.record(&params.iter().collect::<Vec<_>>())?;
                }
                if let Some(in_calls) = in_calls_since(calls_at_step, engine.comm()) {
                    let busy = computing.elapsed().saturating_sub(in_calls);
                    let gap = gap.take().unwrap_or_default();
                    tally.busy.push((busy + gap).as_secs_f64());
                }
                tally.comm += stats.wait;
                tally.waits.push(stats.wait.as_secs_f64());
                tally.combine += stats.combine;
                tally.coordination += stats.coordination;
                tally.sent += stats.traffic.sent;
                tally.loss += f64::from(loss);
                tally.steps += 1;
                if rank == 0 {
                    self.observer.step_done(stats.traffic.sent);
                }
            }
            if config.uneven_shards {
                // Out of data: this rank's part in the others' steps (its
                // bytes and waits count; its steps are the others').
                let (shadowed, joined) = engine.join()?;
                tally.joined = shadowed as usize;
                tally.comm += joined.wait;
                tally.combine += joined.combine;
                tally.coordination += joined.coordination;
                tally.sent += joined.traffic.sent;
            }
            let calls_at_end = engine.comm().time_in_calls();
            let mut loss = [tally.loss / tally.steps.max(1) as f64];
            engine.comm().all_reduce(&mut loss, ReduceOp::Avg)?;
            // Ranks wait for the slowest only where they synchronise: every
            // step, or in DiLoCo once a round (every H / F steps streaming),
            // where the wait is the slowest rank's time since the last
            // exchange. The maximum of the ranks' busy times per such
            // interval (every rank has the same steps, and the same
            // backend, so the same call or none).
            let busy: f64 = tally.busy.iter().sum();
            let interval = match config.strategy {
                // H / F steps between exchanges (H for DiLoCo, F = 1).
                StrategyConfig::DiLoCo(diloco) => diloco.stride(),
                _ => 1,
            }
            .max(1) as usize;
            // With uneven shards the ranks take different steps: no
            // interval is common to all.
            let mut slowest: Vec<f64> = if config.uneven_shards {
                Vec::new()
            } else {
                tally
                    .busy
                    .chunks(interval)
                    .map(|c| c.iter().sum())
                    .collect()
            };
            if !slowest.is_empty() {
                engine.comm().all_reduce(&mut slowest, ReduceOp::Max)?;
            }
            // The rank the others waited for: every rank's waits, gathered
            // (the same steps on every rank, except with uneven shards).
            let waited_for = if config.uneven_shards || world < 2 {
                None
            } else {
                let mut all = vec![0f64; tally.waits.len() * world];
                engine.comm().all_gather(&tally.waits, &mut all)?;
                let per_rank: Vec<Vec<f64>> = all
                    .chunks(tally.waits.len().max(1))
                    .map(<[f64]>::to_vec)
                    .collect();
                straggler(&per_rank)
            };
            tally.coordination += in_calls_since(calls_at_end, engine.comm()).unwrap_or_default();
            bytes_total += tally.sent;
            // The epoch's training ends here. Rank 0's evaluation is a
            // pause no epoch's clock counts (a time to accuracy counts the
            // training, not its measurement, which a run may do as rarely
            // as it likes): every rank waits for it in `agree`, so no
            // rank's steps run beside it either.
            let wall = began.elapsed();
            let network = in_calls_since(calls_before, engine.comm());
            let waiting = waiting_before
                .zip(engine.comm().time_waiting())
                .map(|(before, now)| now.saturating_sub(before).as_secs_f64());
            let evaluating = Instant::now();
            // Partial averaging leaves the models apart: rank 0's is shown.
            let tested = if rank == 0 {
                let _evaluate = span(track.as_ref(), "evaluate", "test set", None);
                model.evaluate(data).map(Some)
            } else {
                Ok(None)
            };
            let tested =
                agree(engine.comm(), tested, "evaluate the model")?.unwrap_or(Evaluation {
                    loss: 0.0,
                    accuracy: 0.0,
                });
            let eval_secs = evaluating.elapsed().as_secs_f64();
            (synced, calls_since_sync) = (Instant::now(), engine.comm().time_in_calls());
            // The steps the job took this epoch (with uneven shards, this
            // rank's own and those it took part in after joining).
            let steps = tally.steps + tally.joined;
            let steps_so_far: usize = history.iter().map(|e| e.steps).sum::<usize>() + steps;
            let dense_so_far = dense_step * steps_so_far as u64;
            let record = EpochRecord {
                epoch: epoch + 1,
                train_loss: loss[0],
                test_accuracy: tested.accuracy,
                test_loss: tested.loss,
                bytes_sent: tally.sent,
                bytes_total,
                compression: dense_so_far as f64 / bytes_total.max(1) as f64,
                compute_secs: tally.compute.as_secs_f64(),
                comm_secs: tally.comm.as_secs_f64(),
                wall_secs: wall.as_secs_f64(),
                eval_secs,
                steps,
                combine_secs: tally.combine.as_secs_f64(),
                coordination_secs: tally.coordination.as_secs_f64(),
                network_secs: network.map(|d| d.as_secs_f64()),
                waiting_secs: waiting,
                busy_secs: (!slowest.is_empty()).then_some(busy),
                slowest_busy_secs: (!slowest.is_empty()).then(|| slowest.iter().sum()),
                straggler: waited_for,
                line_search_accepted: (tally.searches > 0)
                    .then(|| tally.accepted as f64 / tally.searches as f64),
            };
            history.push(record.clone());
            if let Some(plan) = self.plan {
                let saved = self.save(
                    &plan.dir,
                    rank,
                    &engine,
                    &model,
                    &recorder,
                    &history,
                    epoch + 1,
                    dimreduce,
                );
                let what = format!("write its checkpoint of epoch {}", epoch + 1);
                agree(engine.comm(), saved, &what)?;
                (synced, calls_since_sync) = (Instant::now(), engine.comm().time_in_calls());
                // The set of epoch + 1 is complete; the one before stays as
                // the fallback, the one before that goes.
                if epoch >= 1 {
                    prune(&plan.dir, rank, world, epoch - 1);
                }
            }
            if rank == 0 {
                self.observer.epoch_done(&record);
            }
        }
        let timeline = match &config.timeline {
            Some(path) => Some(timeline::write_timeline(
                engine.comm(),
                path,
                &config.label(),
            )?),
            None => None,
        };
        if rank != 0 {
            return Ok(None);
        }
        Ok(Some(RunReport {
            label: config.label(),
            config: config.clone(),
            epochs: history,
            param_checksum: model.checksum()?,
            timeline,
        }))
    }
}

/// The samples of each of this rank's steps in an epoch of `order`: each
/// global batch's `r, r + W, ...` (every rank the same steps), or with
/// `--uneven-shards` rank `r`'s contiguous shard of the whole epoch, in
/// proportion to `r + 1`, cut into steps of `batch x accumulate` samples.
fn steps_of(order: &[usize], config: &TrainConfig, rank: usize) -> Vec<Vec<usize>> {
    let world = config.world.max(1);
    if !config.uneven_shards {
        return order
            .chunks(config.global_batch().max(1))
            .map(|global| global.iter().skip(rank).step_by(world).copied().collect())
            .collect();
    }
    let weight = |r: usize| r + 1;
    let total: usize = (0..world).map(weight).sum();
    // Shard r ends where the first r + 1 weights' share of the epoch ends.
    let end = |r: usize| order.len() * (0..=r).map(weight).sum::<usize>() / total;
    let start = if rank == 0 { 0 } else { end(rank - 1) };
    let step = (config.batch * config.accumulate as usize).max(1);
    order
        .get(start..end(rank))
        .unwrap_or_default()
        .chunks(step)
        .map(<[usize]>::to_vec)
        .collect()
}
