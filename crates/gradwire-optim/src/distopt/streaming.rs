//! Streaming DiLoCo (Douillard et al., 2025) on DiLoCo's machinery
//! (`outer.rs`): the declared parameters split into F fragments, contiguous
//! and as even in elements as whole tensors allow ([`fragment_ranges`]; the
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
//! The exchange is made when the fragment leaves and its result kept until
//! the merge, τ steps later: the values are those of an exchange that
//! overlaps the τ steps, bit for bit, but this version does not yet run it
//! on the communication thread, so it hides no time.
//!
//! Failures: inner steps make no collective; a rank's fault (a non-finite
//! gradient, a failed update, a bad call) stops its local updates and rides
//! the next fragment's first combination. A fragment whose combination
//! fails, or whose mean is not finite, is skipped (or fails) on every rank
//! at its merge: the fragment's parameters go back to its global values
//! on every rank, which stay as they were, with the outer optimizer and the
//! strategies' residuals. The inner optimizer keeps its state (unlike
//! DiLoCo's whole round, a fragment is not all the parameters it updated).

use super::local_step::LocalUpdate;
use super::outer::Lost;
use super::{DiLoCoConfig, Engine, StepStats};
use crate::error::Result;
use crate::optimizer::Optimizer;
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

/// A fragment whose exchange is made, waiting for its merge.
#[derive(Debug)]
pub(crate) struct PendingMerge {
    /// Which fragment.
    pub(crate) fragment: u32,
    /// The inner step (counting from 1) after which it is merged.
    pub(crate) merge_at: u64,
    /// The exchange's outcome, the same on every rank: `Ok` with the mean
    /// pseudo-gradients in the engine's `local.buckets`.
    pub(crate) outcome: std::result::Result<(), Lost>,
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
        let mut stats = self.inner_step(targets, local);
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
            self.fault = self.outer.fault.take();
            let outcome = self.combine_pseudo_gradients(
                targets,
                (config.fragments as usize, fragment),
                launch - 1,
                &mut stats,
            )?;
            self.outer.pending = Some(PendingMerge {
                fragment: fragment as u32,
                merge_at: t + u64::from(config.delay),
                outcome,
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
        let fragment = (config.fragments as usize, pending.fragment as usize);
        let alpha = match pending.outcome {
            Ok(()) => {
                self.outer_step(config, fragment)?;
                self.outer.rounds += 1;
                config.alpha
            }
            Err(_) => 0.0,
        };
        for b in self.fragment_buckets(fragment) {
            for i in self.buckets[b].clone() {
                let global = &self.outer.global[i];
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
        match pending.outcome {
            Ok(()) => Ok(stats),
            Err(lost) => {
                stats.updated = 0;
                self.round_lost(lost, stats)
            }
        }
    }
}

/// The declared parameters (of element counts `lens`) cut into `fragments`
/// contiguous ranges as even in elements as whole tensors allow: fragment
/// `k` ends at the first parameter where the running count reaches `(k +
/// 1) / F` of the total, leaving at least one parameter to each later
/// fragment. `None` when there are fewer parameters than fragments.
pub(crate) fn fragment_ranges(
    lens: &[usize],
    fragments: usize,
) -> Option<Vec<std::ops::Range<usize>>> {
    let fragments = fragments.max(1);
    if lens.len() < fragments {
        return None;
    }
    let total: u128 = lens.iter().map(|&n| n as u128).sum();
    let mut cuts = Vec::with_capacity(fragments);
    let (mut start, mut running) = (0usize, 0u128);
    for (i, &n) in lens.iter().enumerate() {
        running += n as u128;
        let k = cuts.len();
        if k + 1 == fragments {
            break;
        }
        // Enough left for the later fragments, and this one reached its share.
        let must_cut = lens.len() - (i + 1) == fragments - (k + 1);
        if must_cut || running * fragments as u128 >= total * (k as u128 + 1) {
            cuts.push(start..i + 1);
            start = i + 1;
        }
    }
    cuts.push(start..lens.len());
    Some(cuts)
}
