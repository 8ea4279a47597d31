//! Streaming DiLoCo (Douillard et al., 2025) on DiLoCo's machinery
//! (`outer.rs`): the declared parameters split into F fragments, contiguous
//! and as even in elements as whole tensors allow
//! ([`gradwire_algos::cost::fragment_ranges`], which the cost model plans
//! with too; the
//! buckets are planned inside each), one fragment synchronised every
//! `H / F` inner steps, so each
//! is synchronised every H steps and the peak of bytes on the wire is `1 /
//! F` of DiLoCo's. After inner step `t` (counting from 1), if `t` is a
//! multiple of `H / F`, fragment `(t / (H / F)) mod F` sends its
//! pseudo-gradients `θ_global - θ_local` through the codec; τ inner steps
//! later (at once for τ = 0) the outer optimizer applies their mean to the
//! fragment's `θ_global`, and every rank's fragment becomes `α θ_local +
//! (1 - α) θ_global`.
//!
//! The exchange runs on the communication thread (each of the fragment's
//! buckets a job of its own, in its reusable slot) while the caller's
//! forward and backward passes and the next τ inner steps go on, and is
//! waited for at the merge. Its result depends on nothing but the values
//! sent, so it is the same bits whatever the timing; a checkpoint taken
//! while it runs waits for it ([`FragmentExchange`]).
//!
//! Failures: inner steps make no collective; a rank's fault (a non-finite
//! gradient, a failed update, a bad call) stops its local updates and rides
//! the next fragment's first combination. A fragment whose combination
//! fails, or whose mean is not finite, is skipped (or fails) on every rank
//! at its merge: the fragment's parameters go back to its global values
//! on every rank, which stay as they were, with the outer optimizer and the
//! strategies' residuals. The inner optimizer keeps its state (unlike
//! DiLoCo's whole round, a fragment is not all the parameters it updated).

use super::bucket::{BucketBuffers, BucketJob, BucketOutput, BucketTask, first_non_finite};
use super::local_step::LocalUpdate;
use super::outer::Lost;
use super::warmup::Sent;
use super::{DiLoCoConfig, Engine, StepStats};
use crate::error::Result;
use crate::optimizer::Optimizer;
use gradwire_algos::{AlgoError, Strategy, Traffic};
use gradwire_comm::{Communicator, Pending};
use gradwire_tensor::Tensor;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// A fragment that left, waiting for its merge.
#[derive(Debug)]
pub(crate) struct PendingMerge {
    /// Which fragment.
    pub(crate) fragment: u32,
    /// The inner step (counting from 1) after which it is merged.
    pub(crate) merge_at: u64,
    /// The exchange's outcome, the same on every rank, once known: `Ok`
    /// with the mean pseudo-gradients in the engine's `local.buckets`.
    /// `None` while the exchange is the [`FragmentExchange`]'s.
    pub(crate) outcome: Option<std::result::Result<(), Lost>>,
    /// What the exchange moved, where the outcome was restored from a
    /// checkpoint (the merge counts it, as it counts a live exchange's).
    pub(crate) traffic: Traffic,
}

/// The exchange of the fragment in flight: its buckets' jobs, then their
/// results, settled once (waited for, averaged, checked, every strategy
/// told whether its combination is kept) by the merge or by a checkpoint
/// taken before it, which is why it sits behind a lock a `&self` can take.
pub(crate) struct FragmentExchange<C: Communicator> {
    inner: Mutex<Exchange<C>>,
}

impl<C: Communicator> Default for FragmentExchange<C> {
    fn default() -> Self {
        FragmentExchange {
            inner: Mutex::new(Exchange {
                running: Vec::new(),
                done: Vec::new(),
                settled: None,
            }),
        }
    }
}

impl<C: Communicator> std::fmt::Debug for FragmentExchange<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ex = self.lock();
        f.debug_struct("FragmentExchange")
            .field("running", &ex.running.len())
            .field("done", &ex.done.len())
            .finish_non_exhaustive()
    }
}

/// A bucket's job on the communication thread, or why it could not start.
type Launched<C> = std::result::Result<Pending<BucketOutput<C>>, AlgoError>;

/// What [`FragmentExchange`] guards.
pub(crate) struct Exchange<C: Communicator> {
    /// Each bucket's job.
    running: Vec<(usize, Launched<C>)>,
    /// Each bucket's result once waited for.
    pub(crate) done: Vec<Finished<C>>,
    /// The outcome, once settled.
    settled: Option<std::result::Result<(), Lost>>,
}

/// One bucket's part of a settled exchange: what goes back to the engine.
pub(crate) struct Finished<C: Communicator> {
    pub(crate) bucket: usize,
    /// The strategy (`None` if its job was lost: made afresh).
    pub(crate) strategy: Option<Box<dyn Strategy<C>>>,
    buffers: Option<BucketBuffers>,
    /// The mean pseudo-gradients (`None` if the combination failed).
    pub(crate) deltas: Option<Vec<Tensor>>,
    traffic: Traffic,
    combine: Duration,
}

impl<C: Communicator> FragmentExchange<C> {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Exchange<C>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<C: Communicator + 'static> Exchange<C> {
    /// The settled outcome, if [`Exchange::settle`] ran.
    pub(crate) fn outcome(&self) -> Option<&std::result::Result<(), Lost>> {
        self.settled.as_ref()
    }

    /// Bucket `b`'s part, once settled.
    pub(crate) fn finished(&self, b: usize) -> Option<&Finished<C>> {
        self.done.iter().find(|f| f.bucket == b)
    }

    /// What the settled buckets moved.
    pub(crate) fn traffic(&self) -> Traffic {
        self.done
            .iter()
            .fold(Traffic::default(), |sum, f| sum + f.traffic)
    }

    /// Whether an exchange was started and not yet taken by a merge.
    pub(crate) fn is_open(&self) -> bool {
        !self.running.is_empty() || !self.done.is_empty() || self.settled.is_some()
    }

    /// Waits for every job, averages (over `world` ranks) what came back
    /// summed, checks the mean, tells every strategy whether its
    /// combination is kept, and returns the outcome (the same on every
    /// rank, [`Exchange::outcome`]). Once: later calls change nothing.
    pub(crate) fn settle(&mut self, world: usize) {
        if self.settled.is_none() {
            let mut failed: Option<AlgoError> = None;
            for (bucket, launched) in self.running.drain(..) {
                let mut finished = Finished {
                    bucket,
                    strategy: None,
                    buffers: None,
                    deltas: None,
                    traffic: Traffic::default(),
                    combine: Duration::ZERO,
                };
                match launched.and_then(|p| p.wait().map_err(AlgoError::from)) {
                    Ok(output) => {
                        finished.strategy = Some(output.strategy);
                        finished.buffers = Some(output.buffers);
                        match output.result {
                            Ok(reduced) => {
                                let mut deltas = reduced.value.grads;
                                if !reduced.value.averaged {
                                    let inverse = 1.0 / world as f32;
                                    for d in &mut deltas {
                                        if let Err(e) = d.scale(inverse) {
                                            failed.get_or_insert(e.into());
                                        }
                                    }
                                }
                                finished.deltas = Some(deltas);
                                finished.traffic = reduced.traffic;
                                finished.combine = reduced.value.combine;
                            }
                            Err(e) => {
                                failed.get_or_insert(e);
                            }
                        }
                    }
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
                self.done.push(finished);
            }
            // The mean is the same bits on every rank: a non-finite one is
            // found alike everywhere.
            let finite = failed.is_some()
                || matches!(
                    first_non_finite(self.done.iter().flat_map(|f| f.deltas.iter().flatten())),
                    Ok(None)
                );
            let kept = failed.is_none() && finite;
            for f in &mut self.done {
                if let Some(strategy) = f.strategy.as_mut() {
                    strategy.end_step(f.bucket, kept);
                }
            }
            self.settled = Some(match failed {
                Some(e) => Err(Lost::Failed(e)),
                None if !finite => Err(Lost::NonFinite),
                None => Ok(()),
            });
        }
    }
}

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// One inner step of Streaming DiLoCo, with the merge and the
    /// fragment's exchange due after it.
    pub(crate) fn finish_streaming(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        local: LocalUpdate<'_>,
        config: DiLoCoConfig,
    ) -> Result<StepStats> {
        let stats = self.inner_step(targets, local);
        self.optimizer.step();
        self.outer.steps += 1;
        let t = self.outer.steps;
        let fragments = u64::from(config.fragments);
        let stride = u64::from(config.stride());
        if config.delay > 0 && self.outer.pending.as_ref().is_some_and(|m| m.merge_at == t) {
            return self.merge(targets, config, stats);
        }
        if t.is_multiple_of(stride) {
            let launch = t / stride;
            let fragment = (launch % fragments) as usize;
            // The fault this rank kept since the last exchange rides this one.
            let fault = self.outer.fault.take().map(|f| f.kind);
            self.launch_fragment(
                Sent::PseudoGradients(targets),
                Some(fragment),
                launch - 1,
                fault,
            )?;
            self.outer.pending = Some(PendingMerge {
                fragment: fragment as u32,
                merge_at: t + u64::from(config.delay),
                outcome: None,
                traffic: Traffic::default(),
            });
            if config.delay == 0 {
                return self.merge(targets, config, stats);
            }
        }
        Ok(stats)
    }

    /// The pending fragment merged: the outer step on its global values
    /// and its parameters mixed with them; or, if its exchange was lost, its
    /// parameters put back to its global values on every rank.
    fn merge(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        config: DiLoCoConfig,
        mut stats: StepStats,
    ) -> Result<StepStats> {
        let Some(pending) = self.outer.pending.take() else {
            return Ok(stats);
        };
        let outcome = match pending.outcome {
            Some(outcome) => {
                stats.traffic += pending.traffic;
                outcome
            }
            None => self.take_exchange(&mut stats),
        };
        let fragment = pending.fragment as usize;
        let alpha = match outcome {
            Ok(()) => {
                self.outer_step(config, fragment)?;
                self.outer.rounds += 1;
                config.alpha
            }
            Err(_) => 0.0,
        };
        for b in self.fragment_buckets(fragment) {
            for i in self.buckets[b].clone() {
                // Without θ_global yet (every call so far bad, so this
                // fragment was lost) the parameters are the starting ones.
                let Some(global) = self.outer.global.get(i) else {
                    continue;
                };
                // A target the call got wrong is not one of ours.
                let Some(param) = targets[i].as_deref_mut() else {
                    continue;
                };
                if param.dims() != global.dims() {
                    continue;
                }
                if alpha == 0.0 {
                    param.copy_from(global)?;
                } else {
                    param.scale(alpha)?;
                    param.axpy(1.0 - alpha, global)?;
                }
                stats.updated += 1;
            }
        }
        match outcome {
            Ok(()) => Ok(stats),
            Err(lost) => {
                stats.updated = 0;
                self.round_lost(lost, stats)
            }
        }
    }
}

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// Starts fragment `fragment`'s exchange (`None`: every bucket's, a
    /// DiLoCo round or a warm-up round) on the communication thread:
    /// what each of its buckets sends (`sent`: the pseudo-gradients
    /// `θ_global - θ_local`, or the warm-up's gradients, in tensors kept
    /// from exchange to exchange) combined by the bucket's strategy in a
    /// job of its own, or `fault` posted in its place.
    pub(super) fn launch_fragment(
        &mut self,
        sent: Sent<'_, '_>,
        fragment: Option<usize>,
        step: u64,
        mut fault: Option<gradwire_algos::FaultKind>,
    ) -> Result<()> {
        if self.local.buckets.len() != self.buckets.len() {
            self.local.buckets.resize_with(self.buckets.len(), Vec::new);
        }
        for b in 0..self.buckets.len() {
            if fragment.is_some_and(|p| self.bucket_fragment[b] != p) {
                continue;
            }
            let mut values = std::mem::take(&mut self.local.buckets[b]);
            // A rank with a fault sends nothing (its targets may be the bad
            // call's); one that cannot form what it sends (no pseudo-
            // gradients without θ_global, which only a rank with a fault
            // lacks) posts that instead, in place of this bucket's
            // combination and the next.
            if fault.is_none()
                && let Err(e) = self.sent_into(&mut values, b, &sent)
            {
                let kind = gradwire_algos::FaultKind::Other;
                fault = Some(kind);
                self.record(kind, &e);
            }
            let strategy = self.strategies[b].take().unwrap_or_else(|| {
                let len = self.bucket_lens[b].iter().sum();
                super::strategies::for_bucket(self.config.strategy, len, self.shared.as_ref())
            });
            let job = BucketJob::combine_only(
                b,
                std::sync::Arc::clone(&self.bucket_lens[b]),
                self.config.capacity,
                step,
                fault,
                std::mem::take(&mut self.buffers[b]),
            );
            let launched = self
                .comm
                .run_job(&mut self.slots[b], BucketTask::new(job, values, strategy))
                .map_err(AlgoError::from);
            self.fragment_exchange.lock().running.push((b, launched));
        }
        Ok(())
    }

    /// The exchange in flight settled and taken back: strategies, buffers
    /// and mean pseudo-gradients where the engine keeps them; its outcome.
    pub(super) fn take_exchange(&mut self, stats: &mut StepStats) -> std::result::Result<(), Lost> {
        let world = self.world_size();
        let waited = std::time::Instant::now();
        let mut ex = self.fragment_exchange.lock();
        ex.settle(world);
        stats.wait += waited.elapsed();
        for f in ex.done.drain(..) {
            let b = f.bucket;
            self.strategies[b] = f.strategy;
            self.buffers[b] = f.buffers.unwrap_or_default();
            self.local.buckets[b] = f.deltas.unwrap_or_default();
            stats.traffic += f.traffic;
            stats.combine += f.combine;
        }
        ex.settled.take().unwrap_or(Ok(()))
    }
}
