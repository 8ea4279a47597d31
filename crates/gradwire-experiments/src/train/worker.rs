//! A worker's loop: every epoch's steps through its engine (micro-batches
//! accumulated, the exchange, the local step), DimReduce's switch, the
//! evaluation, the epoch's record and checkpoint (`Run::go`).

use super::agree::agree;
use super::report::{EpochRecord, Observer, RunReport};
use super::resume::{CheckpointPlan, PCA_FILE, ResumePoint, prune};
use super::straggler::straggler;
use super::{TRAJECTORY_SNAPSHOTS, timeline};
use crate::config::TrainConfig;
use crate::data::{Dataset, split_even};
use crate::engine::{Backend, Engine};
use crate::error::{ExperimentError, Result};
use crate::model::{Evaluation, Model};
use candle_core::backprop::GradStore;
use gradwire_algos::Traffic;
use gradwire_algos::dimreduce::{DimReduceConfig, Pca, TrajectoryRecorder};
use gradwire_comm::ReduceOp;
use gradwire_comm::timeline::span;
use gradwire_optim::checkpoint;
use gradwire_optim::{DistOptConfig, SkipVote, StrategyConfig, UpdateRule};
use std::time::{Duration, Instant};

/// Everything a worker's loop reads.
pub(super) struct Run<'a> {
    pub(super) config: &'a TrainConfig,
    pub(super) data: &'a Dataset,
    pub(super) observer: &'a dyn Observer,
    pub(super) plan: Option<&'a CheckpointPlan>,
    /// The set the ranks agreed to resume from (loaded and checked while
    /// they agreed).
    pub(super) resume_from: Option<ResumePoint>,
    pub(super) steps_per_epoch: usize,
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
    pub(super) fn go<R: UpdateRule, C: Backend + 'static>(
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
