//! DiLoCo's loop (Douillard et al., 2023): every rank takes H inner steps
//! with its own optimizer, then the pseudo-gradients `θ_global - θ_local`
//! are combined bucket by bucket by the bucket's strategy (the codec of
//! [`DiLoCoConfig`]: dense, half, top-k, quantized or PowerSGD, with error
//! feedback kept from round to round) through the exchange of
//! `streaming.rs` (a round is an exchange of one fragment holding every
//! bucket, waited for at once), the outer optimizer applies their
//! average to `θ_global`, and every rank goes on from `θ_global`.
//!
//! The first [`DiLoCoConfig::warmup`] rounds are of one inner step each,
//! before the outer optimizer's first step (`warmup.rs`).
//!
//! `θ_global` is taken from the parameters at the first step (every rank
//! must start from the same values, as in any data-parallel run) at
//! which this rank has no fault: a bad first call (a parameter of the
//! wrong shape) changes nothing and leaves `θ_global` to the next step
//! without one, whose parameters are still the starting values (a rank
//! with a fault takes no local update, and the round or fragment that
//! carries it is skipped on every rank).
//!
//! A round is the unit of the failure model, and its inner steps make no
//! collective at all: a rank whose inner step fails (a non-finite gradient,
//! a failed update, a bad call) keeps the fault, takes no more local
//! updates this round, and posts the fault in place of the round's first
//! combination. If any rank posted one, or a combination fails, or the
//! average is not finite, every rank skips the round alike (with
//! `skip_non_finite`, for a non-finite one) or fails alike: its parameters
//! go back to `θ_global`, its inner optimizer to its state when the round
//! began (a snapshot taken then, in memory kept from round to round), and
//! `θ_global`, the outer optimizer, the strategies' residuals and the
//! counters stay as they were; the next round starts afresh. With the
//! caller's own inner step (`GradSync::step_locally`) gradwire cannot see
//! the caller's optimizer: only the parameters go back.

use super::local_step::{LocalUpdate, copy_into, overwrite};
use super::warmup::Sent;
use super::{DiLoCoConfig, Engine, LocalFault, OuterOptimizer, StepStats};
use crate::any::AnyOptimizer;
use crate::error::Result;
use crate::optimizer::Optimizer;
use crate::rules::{Adam, AdamConfig, Sgd, SgdConfig};
use crate::state::OptimizerState;
use gradwire_algos::FaultKind;
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

/// DiLoCo's state, the same on every rank: the global parameters, the
/// outer optimizer and the inner steps taken in the current round.
#[derive(Debug, Default)]
pub(crate) struct OuterState {
    /// `θ_global`, one tensor per declared parameter (empty until the
    /// first step).
    pub(crate) global: Vec<Tensor>,
    /// The outer optimizer, made at the first round's end.
    pub(crate) optimizer: Option<AnyOptimizer>,
    /// Inner steps completed in the current round (DiLoCo).
    pub(crate) inner: u64,
    /// Rounds completed (streaming: fragments merged).
    pub(crate) rounds: u64,
    /// This rank's first fault of the current round, which the round's
    /// end carries to every rank.
    pub(crate) fault: Option<LocalFault>,
    /// The inner optimizer's state when the round began (`None` with the
    /// caller's own inner step): what a skipped round puts back.
    pub(crate) round_start: Option<OptimizerState>,
    /// Streaming: inner steps taken since the start.
    pub(crate) steps: u64,
    /// Streaming: the fragment exchanged and not yet merged.
    pub(crate) pending: Option<super::streaming::PendingMerge>,
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
        // A warm-up round exchanges every fragment at once; Streaming
        // DiLoCo's stagger starts after it.
        if config.is_streaming() && !self.in_warmup(config) {
            return self.finish_streaming(targets, local, config);
        }
        if self.in_gradient_warmup(config) {
            if let LocalUpdate::Caller(_) = local {
                // Posted in place of the step's combination.
                self.record(
                    FaultKind::InvalidArgument,
                    &"a step of DiLoCo's warm-up by gradients combines the gradients \
                      (GradSync::current_loop is Gradients): end it with GradSync::finish",
                );
            }
            return self.gradient_round(|optimizer, name, i, mean| {
                match targets.get_mut(i).and_then(Option::as_deref_mut) {
                    Some(param) => optimizer.update(name, param, &mean),
                    // A rank missing one posted that fault: not reached.
                    None => Ok(()),
                }
            });
        }
        if self.outer.inner == 0 {
            self.snapshot_inner_optimizer(&local);
        }
        let mut stats = self.inner_step(targets, local);
        if self.outer.inner + 1 < self.round_length(config) {
            self.outer.inner += 1;
            self.optimizer.step();
            return Ok(stats);
        }
        // The round's end carries the round's fault.
        self.fault = self.outer.fault.take();
        if self.buckets.is_empty() {
            // Nothing to combine: an agreement of its own.
            let failure = self.fault.as_ref().map(|f| f.detail.clone());
            let kind = self.fault.as_ref().map_or(FaultKind::Other, |f| f.kind);
            return match self.agree_after(kind, failure, &mut stats) {
                Ok(()) => {
                    self.outer.inner = 0;
                    self.outer.rounds += 1;
                    self.optimizer.step();
                    Ok(stats)
                }
                Err(e) => {
                    self.skip_round(targets)?;
                    Err(e)
                }
            };
        }
        // A fault of the round is posted in place of the first combination.
        self.end_round(targets, config, stats)
    }

    /// The inner steps of the current round: one in the warm-up, else H.
    fn round_length(&self, config: DiLoCoConfig) -> u64 {
        if self.in_warmup(config) {
            1
        } else {
            u64::from(config.sync_every)
        }
    }

    /// The local update of an inner step (none once this rank has a fault
    /// not yet carried, which this step's own fault then becomes), with
    /// `θ_global` taken from the parameters at the first step without a
    /// fault (every target given, of its declared shape: `take_targets`
    /// records any other call as one). No collective.
    pub(super) fn inner_step(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        local: LocalUpdate<'_>,
    ) -> StepStats {
        let mut stats = StepStats {
            buckets: self.buckets.len(),
            ..StepStats::default()
        };
        if self.outer.global.len() != targets.len()
            && self.fault.is_none()
            && self.outer.fault.is_none()
        {
            copy_into(
                &mut self.outer.global,
                targets.iter().flatten().map(|t| &**t),
            );
        }
        let mut grads = self.take_local_grads();
        if self.fault.is_none() && self.outer.fault.is_none() {
            // Its failure is recorded as this rank's fault.
            let _ = self.step_locally(targets, &mut grads, &mut stats, local);
        }
        self.local.grads = grads;
        if self.outer.fault.is_none() {
            self.outer.fault = self.fault.take();
        }
        stats
    }

    /// The inner optimizer's state copied aside at a round's start (a
    /// failure to copy it is this rank's fault for the round).
    fn snapshot_inner_optimizer(&mut self, local: &LocalUpdate<'_>) {
        if !matches!(local, LocalUpdate::Optimizer) {
            self.outer.round_start = None;
            return;
        }
        let snapshot = self
            .outer
            .round_start
            .get_or_insert_with(OptimizerState::default);
        if let Err(e) = self.optimizer.snapshot_into(snapshot) {
            self.outer.round_start = None;
            self.record(FaultKind::Optimizer, &e);
        }
    }

    /// A round every rank skips: the parameters back to `θ_global`, the
    /// inner optimizer to the round's start, a new round.
    fn skip_round(&mut self, targets: &mut [Option<&mut Tensor>]) -> Result<()> {
        // Declared parameter by declared parameter; a target the call got
        // wrong (missing, or of another shape: the step's own fault) is
        // not one of ours and stays as it is.
        for (target, global) in targets.iter_mut().zip(&self.outer.global) {
            if let Some(param) = target
                && param.dims() == global.dims()
            {
                param.copy_from(global)?;
            }
        }
        if let Some(snapshot) = &self.outer.round_start {
            self.optimizer.restore_snapshot(snapshot)?;
        }
        self.outer.inner = 0;
        Ok(())
    }

    /// The round's end: the pseudo-gradients of every bucket combined (all
    /// before any is applied), then the outer step on `θ_global`, which
    /// every rank's parameters become.
    fn end_round(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        config: DiLoCoConfig,
        mut stats: StepStats,
    ) -> Result<StepStats> {
        // The round's exchange is Streaming DiLoCo's, of every bucket (in
        // DiLoCo all fragment 0), waited for at once. This rank's fault
        // of the round is posted in place of each bucket's combination.
        let fault = self.fault.as_ref().map(|f| f.kind);
        self.launch_fragment(
            Sent::PseudoGradients(targets),
            None,
            self.outer.rounds,
            fault,
        )?;
        if let Err(lost) = self.take_exchange(&mut stats) {
            self.skip_round(targets)?;
            return self.round_lost(lost, stats);
        }
        if self.in_warmup(config) {
            self.warmup_step()?;
        } else {
            self.outer_step(config, 0)?;
        }
        overwrite(targets, &self.outer.global)?;
        stats.updated = targets.iter().flatten().count();
        self.outer.inner = 0;
        self.outer.rounds += 1;
        self.optimizer.step();
        Ok(stats)
    }

    /// How a step ends whose combination was `lost` on every rank.
    pub(super) fn round_lost(&mut self, lost: Lost, stats: StepStats) -> Result<StepStats> {
        match lost {
            Lost::Failed(e) => self.step_failed(e, stats),
            Lost::NonFinite => self.non_finite_everywhere(stats, "the averaged pseudo-gradient"),
        }
    }

    /// The buckets of fragment `p` (every bucket is fragment 0 but in
    /// Streaming DiLoCo), in order.
    pub(super) fn fragment_buckets(&self, p: usize) -> FragmentBuckets<'_> {
        FragmentBuckets {
            of: &self.bucket_fragment,
            fragment: p,
            next: 0,
        }
    }

    /// The outer optimizer's step on fragment `fragment`'s global values,
    /// with the mean pseudo-gradients in `local.buckets` (the same on every
    /// rank, so is `θ_global`).
    pub(super) fn outer_step(&mut self, config: DiLoCoConfig, fragment: usize) -> Result<()> {
        let outer = match &mut self.outer.optimizer {
            Some(outer) => outer,
            slot => slot.insert(outer_optimizer(config.outer)?),
        };
        for b in 0..self.buckets.len() {
            if self.bucket_fragment[b] != fragment {
                continue;
            }
            for (k, i) in self.buckets[b].clone().enumerate() {
                let name = self.params[i].name.as_str();
                outer.update(name, &mut self.outer.global[i], &self.local.buckets[b][k])?;
            }
        }
        outer.step();
        Ok(())
    }
}

/// Why a combination of pseudo-gradients is not applied, the same on every
/// rank.
#[derive(Debug)]
pub(crate) enum Lost {
    /// It failed (a rank's posted fault, a lost peer, ...).
    Failed(gradwire_algos::AlgoError),
    /// Its mean holds a NaN or an infinity.
    NonFinite,
}

/// The buckets of one fragment ([`Engine::fragment_buckets`]).
pub(super) struct FragmentBuckets<'e> {
    of: &'e [usize],
    fragment: usize,
    next: usize,
}

impl Iterator for FragmentBuckets<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.next < self.of.len() {
            let b = self.next;
            self.next += 1;
            if self.of[b] == self.fragment {
                return Some(b);
            }
        }
        None
    }
}
