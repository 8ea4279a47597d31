//! DiLoCo's loop (Douillard et al., 2023): every rank takes H inner steps
//! with its own optimizer, then the pseudo-gradients `θ_global - θ_local`
//! are combined bucket by bucket by the bucket's strategy (the codec of
//! [`DiLoCoConfig`]: dense, half, top-k, quantized or PowerSGD, with error
//! feedback kept from round to round), the outer optimizer applies their
//! average to `θ_global`, and every rank goes on from `θ_global`.
//!
//! `θ_global` is taken from the parameters at the first step (every rank
//! must start from the same values, as in any data-parallel run). Each
//! inner step is a step of the failure model like every local step (it
//! opens with an agreement, and a local update's failure is agreed after
//! it: two header-only collectives, no data); the round's last step also
//! combines. If the combination fails on any rank, every rank's
//! parameters go back to where that step began and `θ_global`, the outer
//! optimizer and the strategies' residuals stay as they were: the round's
//! last step can be taken again.

use super::bucket::first_non_finite;
use super::local_step::{LocalUpdate, copy_into, differences_into, overwrite};
use super::{DiLoCoConfig, Engine, OuterOptimizer, StepStats};
use crate::any::AnyOptimizer;
use crate::error::Result;
use crate::optimizer::Optimizer;
use crate::rules::{Adam, AdamConfig, Sgd, SgdConfig};
use gradwire_algos::{BucketView, FaultKind};
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;
use std::time::Instant;

/// DiLoCo's state, the same on every rank: the global parameters, the
/// outer optimizer and the inner steps taken in the current round.
#[derive(Debug, Default)]
pub(crate) struct OuterState {
    /// `θ_global`, one tensor per declared parameter (empty until the
    /// first step).
    pub(crate) global: Vec<Tensor>,
    /// The outer optimizer, made at the first round's end.
    pub(crate) optimizer: Option<AnyOptimizer>,
    /// Inner steps completed in the current round.
    pub(crate) inner: u64,
    /// Rounds completed.
    pub(crate) rounds: u64,
}

/// The outer optimizer `outer` describes.
pub(crate) fn outer_optimizer(outer: OuterOptimizer) -> Result<AnyOptimizer> {
    match outer {
        OuterOptimizer::Nesterov { lr, momentum } => AnyOptimizer::new(Sgd::new(
            SgdConfig::default()
                .lr(f64::from(lr))
                .momentum(f64::from(momentum))
                .nesterov(momentum > 0.0),
        )?),
        OuterOptimizer::Adam { lr } => {
            AnyOptimizer::new(Adam::new(AdamConfig::default().lr(f64::from(lr)))?)
        }
    }
}

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// One inner step of DiLoCo; the round's last also combines the
    /// pseudo-gradients and steps the outer optimizer.
    pub(crate) fn finish_diloco(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        local: LocalUpdate<'_>,
        config: DiLoCoConfig,
    ) -> Result<StepStats> {
        let mut stats = StepStats {
            buckets: self.buckets.len(),
            ..StepStats::default()
        };
        if self.outer.global.len() != targets.len() {
            copy_into(
                &mut self.outer.global,
                targets.iter().flatten().map(|t| &**t),
            );
        }
        let ends_round = self.outer.inner + 1 >= u64::from(config.sync_every);
        // Where the round's last step begins, to go back to if it fails.
        let mut p0 = std::mem::take(&mut self.local.p0);
        if ends_round {
            copy_into(&mut p0, targets.iter().flatten().map(|t| &**t));
        }
        let result = match self.open_local_step() {
            Ok(mut grads) => {
                let failure = self.step_locally(targets, &mut grads, &mut stats, local);
                self.local.grads = grads;
                if !ends_round || self.buckets.is_empty() {
                    self.agree_after(FaultKind::Optimizer, failure.map(|e| e.to_string()))
                        .map(|()| {
                            self.outer.inner += 1;
                            if ends_round {
                                self.outer.inner = 0;
                                self.outer.rounds += 1;
                            }
                            self.optimizer.step();
                            stats
                        })
                } else if failure.is_some() {
                    // Posted in place of the first combination.
                    overwrite(targets, &p0)?;
                    let err = self.comm.post_fault(FaultKind::Optimizer);
                    self.step_failed(err.into(), stats)
                } else {
                    self.end_round(targets, &p0, config, stats)
                }
            }
            Err(e) => self.step_failed(e, stats),
        };
        self.local.p0 = p0;
        result
    }

    /// The round's end: the pseudo-gradients of every bucket combined (all
    /// before any is applied), then the outer step on `θ_global`, which
    /// every rank's parameters become.
    fn end_round(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        p0: &[Tensor],
        config: DiLoCoConfig,
        mut stats: StepStats,
    ) -> Result<StepStats> {
        if self.local.buckets.len() != self.buckets.len() {
            self.local.buckets.resize_with(self.buckets.len(), Vec::new);
        }
        let begin = Instant::now();
        let mut failed = None;
        let mut done = 0;
        for b in 0..self.buckets.len() {
            let range = self.buckets[b].clone();
            // θ_global - θ_local, in tensors kept from round to round.
            let mut deltas = std::mem::take(&mut self.local.buckets[b]);
            differences_into(
                &mut deltas,
                &self.outer.global[range.clone()],
                &targets[range.clone()],
            )?;
            let mut strategy = self.take_strategy(b);
            let view = BucketView {
                index: b,
                lens: &self.bucket_lens[b],
                written: &self.all_written[..range.len()],
                step: self.outer.rounds,
                capacity: self.config.capacity,
            };
            let started = Instant::now();
            let combined = strategy.combine(&self.comm, &view, &mut deltas);
            stats.combine += started.elapsed();
            self.strategies[b] = Some(strategy);
            self.local.buckets[b] = deltas;
            done = b + 1;
            match combined {
                Ok(combined) => {
                    stats.traffic += combined.traffic;
                    if !combined.averaged {
                        let inverse = 1.0 / self.world_size() as f32;
                        for delta in &mut self.local.buckets[b] {
                            delta.scale(inverse)?;
                        }
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        stats.wait = begin.elapsed();
        // The average is the same bits on every rank: a non-finite one is
        // found alike everywhere.
        let finite = failed.is_some()
            || matches!(
                first_non_finite(self.local.buckets.iter().flatten()),
                Ok(None)
            );
        let kept = failed.is_none() && finite;
        for b in 0..done {
            if let Some(strategy) = self.strategies[b].as_mut() {
                strategy.end_step(b, kept);
            }
        }
        if !kept {
            overwrite(targets, p0)?;
            return match failed {
                Some(e) => self.step_failed(e, stats),
                None => self.non_finite_everywhere(stats, "the averaged pseudo-gradient"),
            };
        }
        // The outer step, parameter by parameter (the average is the
        // same on every rank, so is θ_global).
        let outer = match &mut self.outer.optimizer {
            Some(outer) => outer,
            slot => slot.insert(outer_optimizer(config.outer)?),
        };
        for (b, range) in self.buckets.iter().enumerate() {
            for (k, i) in range.clone().enumerate() {
                let name = self.params[i].name.as_str();
                outer.update(name, &mut self.outer.global[i], &self.local.buckets[b][k])?;
            }
        }
        outer.step();
        overwrite(targets, &self.outer.global)?;
        stats.updated = targets.iter().flatten().count();
        self.outer.inner = 0;
        self.outer.rounds += 1;
        self.optimizer.step();
        Ok(stats)
    }
}
