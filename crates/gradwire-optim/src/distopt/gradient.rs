//! The gradient modes' step (`Dense`, `Half`, `Sparse`, `Custom`, and the
//! averaging half of `DimReduce`): wait for the buckets, agree on the
//! step's outcome, average, check, clip, update.

use super::bucket::{BucketOutput, scan_non_finite};
use super::local_step::{LocalUpdate, recycle};
use super::{Engine, LocalFault, SkipVote, StepStats, StrategyConfig, TrainingLoop, arrival};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_algos::fault::agree;
use gradwire_algos::{AlgoError, FaultKind, Reduced, Traffic};
use gradwire_comm::timeline::span;
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_tensor::Tensor;
use std::time::Instant;

/// An averaged gradient: parameter index, value, whether it arrived averaged.
pub(super) type ReducedGrad = (usize, Tensor, bool);

/// The lists a step fills, kept by the engine between steps (emptied, their
/// capacity kept) so that a step in steady state allocates none.
#[derive(Debug, Default)]
pub(super) struct StepScratch {
    /// The averaged gradients of the step, by parameter index.
    pub(super) reduced: Vec<ReducedGrad>,
    votes: Vec<u8>,
    decided: Vec<bool>,
}

impl StepScratch {
    fn clear(&mut self) {
        self.reduced.clear();
        self.votes.clear();
        self.decided.clear();
    }
}

/// How the communication half of a step ended, alike on every rank.
pub(super) enum Reduction {
    /// The averaged gradients some rank wrote, by parameter index, are in
    /// the step's scratch (`StepScratch::reduced`).
    Reduced(StepStats),
    /// A non-finite gradient somewhere, with `skip_non_finite`: nothing
    /// changed.
    Skipped(StepStats),
}

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// Sends what is left, waits for every bucket, and updates every
    /// parameter some rank wrote (SINGA's `wait` + update + `step`).
    /// `params` must hold every declared parameter, once.
    ///
    /// Completes on every rank or fails (or is skipped) on every rank alike;
    /// see the module docs for the failure model.
    pub(crate) fn finish<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
    ) -> Result<StepStats> {
        if self.accumulating() {
            return Ok(self.accumulate_micro_batch(|_, _| {}));
        }
        // The track is shared (an Arc) so the span outlives the borrows of
        // the step; a clone allocates nothing.
        let track = self.comm.timeline().cloned();
        let _step = span(track.as_ref(), "step", "step", None);
        let result = self.open_step().and_then(|()| self.finish_step(params));
        self.end_step();
        result
    }

    fn finish_step<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
    ) -> Result<StepStats> {
        let mut targets = self.take_targets(params);
        let result = match self.config.strategy {
            StrategyConfig::Partial { average_state } => {
                self.finish_partial(&mut targets, average_state, LocalUpdate::Optimizer, None)
            }
            StrategyConfig::DeltaWeight { .. } => {
                self.finish_delta_weight(&mut targets, LocalUpdate::Optimizer)
            }
            StrategyConfig::DiLoCo(config) => {
                self.finish_diloco(&mut targets, LocalUpdate::Optimizer, config)
            }
            mode => {
                if mode == StrategyConfig::DimReduce {
                    self.record(
                        FaultKind::InvalidArgument,
                        &"DimReduce mode steps with finish_dimreduce, which takes the loss",
                    );
                }
                self.apply_reduced(|optimizer, name, i, grad| match targets[i].as_deref_mut() {
                    Some(param) => optimizer.update(name, param, &grad),
                    // Every target was checked present before the step's last vote.
                    None => Ok(()),
                })
            }
        };
        self.local.targets = recycle(targets);
        result
    }

    /// The gradient-level form of [`Engine::finish`]: the same step (the
    /// buckets not yet sent, the waits, the agreed outcome, averaging,
    /// clipping, the non-finite check) but no parameter is updated: each
    /// averaged gradient some rank wrote goes to `apply(index, gradient)`
    /// (declaration index; the tensor is the one pushed, now holding the
    /// combined values, handed back for reuse) instead of the optimizer,
    /// whose step counter
    /// still advances. An `apply` error on one rank is an error on every
    /// rank ([`OptimError::Fault`] of kind `Optimizer`), agreed like an
    /// optimizer error. Gradient-combining modes only
    /// ([`TrainingLoop::Gradients`]); [`crate::GradSync`] is built on it.
    pub(crate) fn finish_gradients(
        &mut self,
        apply: impl FnMut(usize, Tensor) -> Result<()>,
    ) -> Result<StepStats> {
        if self.accumulating() {
            return Ok(self.accumulate_micro_batch(|_, _| {}));
        }
        let track = self.comm.timeline().cloned();
        let _step = span(track.as_ref(), "step", "step", None);
        let result = self
            .open_step()
            .and_then(|()| self.finish_gradients_step(apply));
        self.end_step();
        result
    }

    fn finish_gradients_step(
        &mut self,
        mut apply: impl FnMut(usize, Tensor) -> Result<()>,
    ) -> Result<StepStats> {
        if self.current_loop() != TrainingLoop::Gradients {
            self.record(
                FaultKind::InvalidArgument,
                &format!(
                    "finish_gradients combines gradients; mode {:?} steps the parameters",
                    self.config.strategy
                ),
            );
        }
        // The front ends speak declaration indices (taken out for the
        // step, no copy).
        let declared = std::mem::take(&mut self.order.declared);
        let mut apply =
            |_: &mut O, _: &str, i: usize, grad| apply(declared.get(i).copied().unwrap_or(i), grad);
        let result = match self.config.strategy {
            StrategyConfig::DiLoCo(config) if self.in_gradient_warmup(config) => {
                self.gradient_round(&mut apply)
            }
            _ => self.apply_reduced(&mut apply),
        };
        self.order.declared = declared;
        result
    }

    /// The gradient modes' step after the checks: the reduction, then
    /// `apply(optimizer, name, index, gradient)` for every averaged gradient
    /// (until one fails), the agreement on the outcome, the optimizer's
    /// step.
    fn apply_reduced(
        &mut self,
        mut apply: impl FnMut(&mut O, &str, usize, Tensor) -> Result<()>,
    ) -> Result<StepStats> {
        let mut stats = match self.reduce_gradients()? {
            Reduction::Skipped(stats) => return Ok(stats),
            Reduction::Reduced(stats) => stats,
        };
        let track = self.comm.timeline().cloned();
        let optimizer_span = span(track.as_ref(), "optimizer", "optimizer", None);
        let mut reduced = std::mem::take(&mut self.scratch.reduced);
        let failure = self.apply_each(
            reduced.drain(..).map(|(i, grad, _)| (i, grad)),
            &mut apply,
            &mut stats,
        );
        self.scratch.reduced = reduced;
        // The agreement on the outcome is a collective of its own.
        drop(optimizer_span);
        self.agree_after(FaultKind::Optimizer, failure, &mut stats)?;
        self.optimizer.step();
        Ok(stats)
    }

    /// `apply(optimizer, name, index, value)` for each `(index, value)` of
    /// `values` until one fails, each success counted in `stats.updated`:
    /// the failure's description, for the agreement that follows (the
    /// gradient modes' update, and DiLoCo's warm-up by gradients').
    pub(super) fn apply_each(
        &mut self,
        values: impl IntoIterator<Item = (usize, Tensor)>,
        apply: &mut impl FnMut(&mut O, &str, usize, Tensor) -> Result<()>,
        stats: &mut StepStats,
    ) -> Option<String> {
        for (i, value) in values {
            let name = self.params[i].name.as_str();
            if let Err(e) = apply(&mut self.optimizer, name, i, value) {
                return Some(e.to_string());
            }
            stats.updated += 1;
        }
        None
    }

    /// The start of a step's last micro-batch: this rank's arrival, the
    /// bucket order (the first step's), the micro-batches' sums and sample
    /// weights closed. An error is every rank's (the order's broadcast).
    fn open_step(&mut self) -> Result<()> {
        self.arrive();
        self.decide_order()?;
        self.close_accumulation();
        self.close_sample_weights();
        Ok(())
    }

    /// Notes this rank's arrival at the step's exchange (the first time).
    pub(super) fn arrive(&mut self) {
        self.arrived.get_or_insert_with(Instant::now);
    }

    /// From the end of the previous step to this rank's arrival at this
    /// one's exchange (now, if not yet noted).
    pub(super) fn arrival(&mut self) -> std::time::Duration {
        self.arrive();
        self.arrived.map_or_else(Default::default, |at| {
            at.saturating_duration_since(self.step_ended)
        })
    }

    /// Ends the step whatever happened: nothing of it stays behind.
    pub(super) fn end_step(&mut self) {
        self.step_ended = Instant::now();
        self.arrived = None;
        self.samples.scale = 1.0;
        let mut in_flight = std::mem::take(&mut self.in_flight);
        for (b, pending) in in_flight.drain(..).enumerate() {
            // Only reached after an error that stopped before the waits;
            // waiting keeps the lane's jobs paired with the other ranks.
            // The step failed: the strategy puts its state back.
            if let Ok(mut output) = pending.wait() {
                output.strategy.end_step(b, false);
                self.strategies[b] = Some(output.strategy);
                self.buffers[b] = output.buffers;
            }
        }
        self.in_flight = in_flight;
        self.grads.iter_mut().for_each(|g| *g = None);
        self.fault = None;
    }

    /// The agreement after work that issues no collective (the updates, a
    /// loss closure): one header-only collective in which a rank that
    /// failed (`failure`, its description) posts a fault of `kind`, so that
    /// every rank returns an error from the same step. Its time goes to
    /// `stats.coordination`.
    pub(super) fn agree_after(
        &mut self,
        kind: FaultKind,
        failure: Option<String>,
        stats: &mut StepStats,
    ) -> Result<()> {
        match stats.coordinate(|| agree(&self.comm, failure.as_ref().map(|_| kind))) {
            Ok(()) => Ok(()),
            Err(AlgoError::Fault(fault)) => {
                let kind = fault.kind;
                let own = failure.map(|detail| LocalFault { kind, detail });
                Err(self.fault_error(fault.rank, kind, own.as_ref()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// How a step ends when a value every rank computed alike (an averaged
    /// gradient, the averaged loss) is not finite: skipped with
    /// `skip_non_finite`, else a fault naming no rank.
    pub(super) fn non_finite_everywhere(&self, stats: StepStats, what: &str) -> Result<StepStats> {
        if self.config.skip_non_finite {
            return Ok(StepStats {
                non_finite: true,
                ..stats
            });
        }
        Err(OptimError::Fault(gradwire_algos::Fault {
            rank: None,
            kind: FaultKind::NonFinite,
            detail: format!("{what} not finite"),
        }))
    }

    /// How a step ends after an agreed failure `err` (the same on every
    /// rank): a skip for a non-finite gradient with `skip_non_finite`, else
    /// the step's [`OptimError::Fault`]; the comm layer's own errors (a lost
    /// peer, a timeout, a mismatch) pass through.
    pub(super) fn step_failed(&mut self, err: AlgoError, stats: StepStats) -> Result<StepStats> {
        let (rank, kind, own) = match err {
            AlgoError::Fault(fault) => (fault.rank, fault.kind, self.fault.clone()),
            AlgoError::Comm(e) => return Err(AlgoError::Comm(e).into()),
            // This rank's own error, which it posted to the others.
            local => {
                let kind = local.fault_kind();
                let own = LocalFault {
                    kind,
                    detail: local.to_string(),
                };
                (Some(self.rank()), kind, Some(own))
            }
        };
        if kind == FaultKind::NonFinite && self.config.skip_non_finite {
            return Ok(StepStats {
                non_finite: true,
                ..stats
            });
        }
        Err(self.fault_error(rank, kind, own.as_ref()))
    }

    /// The communication half of a step: carries this rank's faults to the
    /// others, launches the buckets not yet on their way, waits for all,
    /// averages, clips and checks for non-finite values. On any failure
    /// (agreed by every rank) the strategies' state is as before the step.
    pub(super) fn reduce_gradients(&mut self) -> Result<Reduction> {
        let mut stats = StepStats {
            buckets: self.buckets.len(),
            ..StepStats::default()
        };
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let result = self.reduce_with(&mut stats, &mut scratch);
        self.scratch = scratch;
        result.map(|reduced| match reduced {
            true => Reduction::Reduced(stats),
            false => Reduction::Skipped(stats),
        })
    }

    /// [`Engine::reduce_gradients`] with its lists in `scratch`: `true`
    /// when the averaged gradients are in `scratch.reduced`, `false` for a
    /// skipped step.
    fn reduce_with(&mut self, stats: &mut StepStats, scratch: &mut StepScratch) -> Result<bool> {
        // With one vote per step, it happens now, for every parameter, and
        // carries this rank's faults (its non-finite check included).
        let per_step = self.config.vote == SkipVote::PerStep;
        if per_step {
            if self.fault.is_none()
                && self.checks_finite_locally()
                && let Some((kind, detail)) = scan_non_finite(&self.grads)
            {
                self.record(kind, &detail);
            }
            scratch.votes.extend(
                self.grads
                    .iter()
                    .map(|g| u8::from(g.as_ref().is_some_and(|g| !g.is_zeroed()))),
            );
            let flags = scratch.votes.len();
            let (rank, world) = (self.comm.rank(), self.world_size());
            arrival::append(&mut scratch.votes, rank, world, self.arrival());
            let voted = stats.coordinate(|| match &self.fault {
                Some(f) => Err(self.comm.post_fault(f.kind)),
                None => self.comm.all_reduce(&mut scratch.votes, ReduceOp::Max),
            });
            if let Err(e) = voted {
                return self.step_failed(e.into(), *stats).map(|s| {
                    *stats = s;
                    false
                });
            }
            stats.traffic = Traffic::all_reduce(scratch.votes.len(), self.world_size());
            stats.straggler = arrival::read(&scratch.votes[flags..], world);
            scratch
                .decided
                .extend(scratch.votes[..flags].iter().map(|&v| v != 0));
        } else if self.buckets.is_empty() {
            // No bucket to carry a fault: an agreement of its own.
            let fault = self.fault.as_ref().map(|f| f.kind);
            if let Err(e) = stats.coordinate(|| agree(&self.comm, fault)) {
                return self.step_failed(e, *stats).map(|s| {
                    *stats = s;
                    false
                });
            }
        }
        while self.in_flight.len() < self.buckets.len() {
            let range = self.buckets[self.in_flight.len()].clone();
            let written = per_step.then(|| &scratch.decided[range]);
            // Only a lost communication thread fails here; the other ranks
            // learn it from their own lanes.
            self.launch_next(written)?;
        }
        let start = Instant::now();
        let track = self.comm.timeline().cloned();
        let wait_span = span(track.as_ref(), "wait", "wait for buckets", None);
        let mut failure = None;
        // The list goes back emptied, its capacity kept.
        let mut in_flight = std::mem::take(&mut self.in_flight);
        for (b, pending) in in_flight.drain(..).enumerate() {
            let output = pending.wait().map_err(AlgoError::from);
            let BucketOutput {
                strategy,
                buffers,
                result,
            } = match output {
                Ok(output) => output,
                Err(e) => {
                    // The job is lost with its strategy and buffers: the
                    // next step makes them afresh.
                    failure = failure.or(Some(e));
                    continue;
                }
            };
            self.strategies[b] = Some(strategy);
            let mut buffers = buffers;
            match result {
                Ok(Reduced { value, traffic }) => {
                    stats.traffic += traffic;
                    stats.combine += value.combine;
                    stats.straggler = stats.straggler.or(value.straggler);
                    let averaged = value.averaged;
                    let mut grads = value.grads;
                    let mut combined = grads.drain(..);
                    let mut unwritten = buffers.unwritten.drain(..);
                    for (i, &written) in self.buckets[b].clone().zip(&buffers.written) {
                        if written {
                            if let Some(g) = combined.next() {
                                scratch.reduced.push((i, g, averaged));
                            }
                        } else {
                            stats.skipped += 1;
                            self.unpushed[i] = unwritten.next();
                        }
                    }
                    drop(unwritten);
                    drop(combined);
                    // The emptied list goes back for the next step.
                    buffers.grads = grads;
                }
                Err(e) => failure = failure.or(Some(e)),
            }
            self.buffers[b] = buffers;
        }
        self.in_flight = in_flight;
        stats.wait = start.elapsed();
        drop(wait_span);
        if let Some(e) = failure {
            self.end_strategies(false);
            return self.step_failed(e, *stats).map(|s| {
                *stats = s;
                false
            });
        }

        // Average (some combinations arrive averaged), then check and clip:
        // the averaged values are bitwise the same on every rank, and so is
        // every decision taken from them.
        let inverse = 1.0 / self.world_size() as f32;
        let reduced = &mut scratch.reduced;
        let checked = (|| -> gradwire_algos::Result<Option<f64>> {
            for (_, g, averaged) in reduced.iter_mut() {
                // x * 1 is x: a lone worker's sum is its mean.
                if !*averaged && inverse != 1.0 {
                    g.scale(inverse)?;
                }
            }
            let mut sum_sq = 0f64;
            for (_, g, _) in reduced.iter() {
                sum_sq += g.sum_sq()?;
            }
            Ok(sum_sq.is_finite().then_some(sum_sq))
        })();
        let sum_sq = match checked {
            Ok(Some(sum_sq)) => sum_sq,
            Ok(None) => {
                self.end_strategies(false);
                *stats = self.non_finite_everywhere(*stats, "the averaged gradients are")?;
                return Ok(false);
            }
            Err(e) => {
                // A tensor error on identical data and shapes: every rank.
                self.end_strategies(false);
                return Err(e.into());
            }
        };
        if let Some(max_norm) = self.config.clip_global_norm {
            let norm = sum_sq.sqrt();
            if norm > max_norm {
                let factor = (max_norm / norm) as f32;
                for (_, g, _) in reduced.iter_mut() {
                    g.scale(factor)?;
                }
            }
        }
        self.end_strategies(true);
        Ok(true)
    }

    /// Whether this rank's gradients are checked for NaN and infinities
    /// before they are sent: unless the strategy's combination carries them
    /// to every rank (a plain sum), where the check after it finds them.
    pub(super) fn checks_finite_locally(&mut self) -> bool {
        self.buckets.is_empty() || !self.strategy_mut(0).carries_non_finite()
    }

    /// Tells every bucket's strategy that the step is over: `kept`, or
    /// failed or skipped on every rank (it puts its state back).
    pub(super) fn end_strategies(&mut self, kept: bool) {
        for (b, strategy) in self.strategies.iter_mut().enumerate() {
            if let Some(strategy) = strategy {
                strategy.end_step(b, kept);
            }
        }
    }
}
