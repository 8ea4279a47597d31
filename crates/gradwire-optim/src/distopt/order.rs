//! Buckets in the order gradients arrive (PyTorch DDP rebuilds its buckets
//! after its first iteration): with [`BucketOrder::Pushed`], the default,
//! the first step launches no bucket during its pushes; at its `finish`
//! rank 0's push order (the parameters it did not push after them, in
//! declared order) is broadcast, and every rank re-plans its buckets over
//! the parameters in that order (SINGA's rule, alike on every rank), then
//! the step goes on with them and later steps overlap as usual. A step
//! that rank 0 has already failed (a push under an unknown name leaves a
//! parameter out of its order) decides nothing: rank 0 broadcasts no
//! order, the step runs on the declared buckets and fails on every rank,
//! and the next step decides, as if the failed one had never run. An order
//! equal to the declared one changes nothing: the run is bitwise the
//! declared order's. [`BucketOrder::Declared`] keeps the declared order
//! (the user fixed it). Only the gradient loop rebuilds: the local-step,
//! DiLoCo and DimReduce loops address the parameters in declared order.
//!
//! The engine's parameter index is then a position in the bucket order;
//! `declared` maps it back for the front ends, which speak declaration
//! indices. A checkpoint records the order (`bucket_order`, names), and a
//! restore re-plans to it before the state is loaded; a checkpoint taken
//! before any step decided the order says so (`bucket_order_undecided`),
//! and an engine that restores it before its own first step still decides
//! at its next one.

use super::bucket::{BucketBuffers, plan_buckets};
use super::{BucketOrder, Engine, ParamSpec, StateDict, TrainingLoop, strategies};
use crate::checkpoint::Checkpoint;
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_comm::{Communicator, JobSlot};
use std::ops::Range;
use std::sync::Arc;

/// What rank 0 broadcasts in place of an order it cannot give (no
/// parameter index).
const NO_ORDER: u64 = u64::MAX;

/// The checkpoint value (`true`) of an engine whose order no step has
/// decided yet: one that restores it, undecided itself, stays so.
pub(super) const UNDECIDED_ORDER: &str = "bucket_order_undecided";

/// Parameters in some order, their element counts, their buckets.
type Plan = (Vec<ParamSpec>, Vec<usize>, Vec<Range<usize>>);

/// Where the bucket order stands.
#[derive(Debug)]
pub(super) struct OrderState {
    /// Whether the buckets are final (decided, fixed, or restored).
    pub(super) decided: bool,
    /// This rank's pushes of the undecided step, first push of each.
    pushed: Vec<usize>,
    seen: Vec<bool>,
    /// The declaration index of each engine index.
    pub(super) declared: Vec<usize>,
}

impl OrderState {
    /// For `params` parameters, decided from the start unless the order is
    /// the first step's pushes in the gradient loop.
    pub(super) fn new(params: usize, order: BucketOrder, training_loop: TrainingLoop) -> Self {
        OrderState {
            decided: order == BucketOrder::Declared || training_loop != TrainingLoop::Gradients,
            pushed: Vec::new(),
            seen: vec![false; params],
            declared: (0..params).collect(),
        }
    }
}

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// Notes the push of parameter `i` while the order is undecided.
    pub(super) fn note_push(&mut self, i: usize) {
        let order = &mut self.order;
        if !order.decided && !order.seen[i] {
            order.seen[i] = true;
            order.pushed.push(i);
        }
    }

    /// At the first step's `finish` (before anything is taken or sent):
    /// rank 0's order, broadcast, and the buckets re-planned to it; or, if
    /// rank 0 has a fault already, [`NO_ORDER`] and nothing decided (the
    /// step fails on every rank). A failure is every rank's (the
    /// broadcast's, or the same plan refused on every rank).
    pub(super) fn decide_order(&mut self) -> Result<()> {
        if self.order.decided {
            return Ok(());
        }
        let n = self.params.len();
        let mut order: Vec<u64> = if self.rank() == 0 && self.fault.is_some() && n > 0 {
            vec![NO_ORDER; n]
        } else {
            self.order
                .pushed
                .iter()
                .copied()
                .chain((0..n).filter(|&i| !self.order.seen[i]))
                .map(|i| i as u64)
                .collect()
        };
        self.order.pushed.clear();
        self.order.seen.fill(false);
        self.comm
            .broadcast(&mut order, 0)
            .map_err(gradwire_algos::AlgoError::from)?;
        if order.first() == Some(&NO_ORDER) {
            return Ok(());
        }
        self.order.decided = true;
        self.order.seen = Vec::new();
        self.forget_undecided_strategies();
        let order: Vec<usize> = order.into_iter().map(|i| i as usize).collect();
        self.reorder(&order)
    }

    /// Drops the strategies of the steps before the order was decided.
    /// Every one of them failed (or was skipped) on every rank, rank 0
    /// having had no order to give, so what their launches made holds
    /// nothing a new strategy would not: the buckets may be re-planned.
    fn forget_undecided_strategies(&mut self) {
        if self.in_flight.is_empty() {
            self.strategies.iter_mut().for_each(|s| *s = None);
        }
    }

    /// Re-plans the buckets over the parameters in `order` (engine
    /// indices, a permutation); changes nothing on an error.
    pub(super) fn reorder(&mut self, order: &[usize]) -> Result<()> {
        let n = self.params.len();
        let mut seen = vec![false; n];
        if order.len() != n
            || order
                .iter()
                .any(|&i| i >= n || std::mem::replace(&mut seen[i], true))
        {
            return Err(OptimError::InvalidArgument(format!(
                "a bucket order of {} entries is no permutation of the {n} parameters",
                order.len()
            )));
        }
        if order.iter().enumerate().all(|(k, &i)| k == i) {
            return Ok(());
        }
        if self.strategies.iter().any(Option::is_some) || !self.in_flight.is_empty() {
            // Never reached from a step: a strategy holding state is only
            // made at a launch, which waits for the order.
            return Err(OptimError::InvalidArgument(
                "the buckets cannot be re-planned while their strategies hold state".into(),
            ));
        }
        let (params, lens, buckets) = self.plan_in(order)?;
        self.order.declared = order.iter().map(|&i| self.order.declared[i]).collect();
        self.params = params;
        self.lens = lens;
        for (k, p) in self.params.iter().enumerate() {
            self.index.insert(p.name.clone(), k);
        }
        permute(&mut self.grads, order);
        permute(&mut self.unpushed, order);
        self.accumulation.permute(order);
        self.bucket_lens = buckets
            .iter()
            .map(|b| Arc::from(&self.lens[b.clone()]))
            .collect();
        self.buffers = buckets.iter().map(|_| BucketBuffers::default()).collect();
        self.slots = buckets.iter().map(|_| JobSlot::default()).collect();
        self.strategies = buckets.iter().map(|_| None).collect();
        self.bucket_fragment = vec![0; buckets.len()];
        let widest = buckets.iter().map(|b| b.len()).max().unwrap_or(0);
        self.all_written = vec![true; widest];
        self.buckets = buckets;
        Ok(())
    }

    /// The parameters in `order` (engine indices), their element counts,
    /// and the buckets SINGA's rule makes of them.
    fn plan_in(&self, order: &[usize]) -> Result<Plan> {
        let params: Vec<ParamSpec> = order.iter().map(|&i| self.params[i].clone()).collect();
        let lens: Vec<usize> = order.iter().map(|&i| self.lens[i]).collect();
        let buckets = plan_buckets(
            &params,
            &lens,
            self.config.fusion_threshold,
            self.config.capacity,
        )?;
        Ok((params, lens, buckets))
    }

    /// Whether the buckets follow the declared order.
    pub(super) fn in_declared_order(&self) -> bool {
        self.order.declared.iter().enumerate().all(|(k, &d)| k == d)
    }

    /// The parameters' names in bucket order (a checkpoint's
    /// `bucket_order`).
    pub(super) fn order_names(&self) -> Vec<String> {
        self.params.iter().map(|p| p.name.clone()).collect()
    }

    /// The engine indices of the parameters in a checkpoint's order
    /// (`saved`: its `bucket_order`; the declared order without one).
    pub(super) fn order_of(&self, saved: Option<&serde_json::Value>) -> Result<Vec<usize>> {
        let mismatch = |what: &str| OptimError::StateMismatch(format!("bucket_order: {what}"));
        let n = self.params.len();
        let order: Vec<usize> = match saved {
            None => {
                let mut by_declared = vec![0; n];
                for (k, &d) in self.order.declared.iter().enumerate() {
                    if let Some(slot) = by_declared.get_mut(d) {
                        *slot = k;
                    }
                }
                by_declared
            }
            Some(value) => value
                .as_array()
                .ok_or_else(|| mismatch("not a list"))?
                .iter()
                .map(|name| {
                    name.as_str()
                        .and_then(|name| self.index.get(name).copied())
                        .ok_or_else(|| mismatch(&format!("{name} is no parameter of this one")))
                })
                .collect::<Result<_>>()?,
        };
        let mut seen = vec![false; n];
        if order.len() != n || order.iter().any(|&i| std::mem::replace(&mut seen[i], true)) {
            return Err(mismatch("not every parameter once"));
        }
        Ok(order)
    }

    /// `restore` in the order `ckpt`'s buckets follow: taken up by an
    /// engine that has not decided its own (no step yet), else the same
    /// one; a failed `restore` leaves the order as it was.
    pub(super) fn in_order_of(
        &mut self,
        ckpt: &Checkpoint,
        restore: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let order = self.order_of(ckpt.state.values.get("bucket_order"))?;
        let undecided = !self.order.decided;
        let saved_undecided = ckpt
            .state
            .values
            .get(UNDECIDED_ORDER)
            .and_then(serde_json::Value::as_bool)
            == Some(true);
        if undecided {
            self.forget_undecided_strategies();
        }
        if order.iter().enumerate().any(|(k, &i)| k != i) {
            if !undecided {
                return Err(OptimError::StateMismatch(
                    "the checkpoint's buckets follow another parameter order".into(),
                ));
            }
            self.reorder(&order)?;
        }
        // A checkpoint of an undecided engine leaves an undecided one to
        // decide at its next step (its order is the declared one).
        self.order.decided = !(undecided && saved_undecided);
        let restored = restore(self);
        if restored.is_err() && undecided {
            // As it was: the fresh strategies go, the order comes back.
            self.strategies.iter_mut().for_each(|s| *s = None);
            let mut back = vec![0; order.len()];
            for (k, &i) in order.iter().enumerate() {
                back[i] = k;
            }
            self.reorder(&back)?;
            self.order.decided = false;
        }
        restored
    }

    /// `resharded`'s strategies' state when the saved buckets follow
    /// another order than this engine's (a run whose buckets followed its
    /// pushes, resumed by a fresh engine): each saved bucket's, of its own
    /// size. `false` (nothing done) for the same order.
    pub(super) fn reshard_in_saved_order(
        &self,
        first: &Checkpoint,
        dicts: &[&StateDict],
        out: &mut Checkpoint,
    ) -> Result<bool> {
        let order = self.order_of(first.state.values.get("bucket_order"))?;
        if order.iter().enumerate().all(|(k, &i)| k == i) {
            return Ok(false);
        }
        let (_, lens, buckets) = self.plan_in(&order)?;
        for (b, bucket) in buckets.into_iter().enumerate() {
            let len = lens[bucket].iter().sum();
            strategies::for_bucket(self.config.strategy, len, self.shared.as_ref()).reshard_state(
                b,
                dicts,
                &mut out.state,
            )?;
        }
        Ok(true)
    }
}

/// `v` rearranged so that its k-th entry is the old `v[order[k]]`.
pub(super) fn permute<T>(v: &mut Vec<T>, order: &[usize]) {
    let mut old: Vec<Option<T>> = v.drain(..).map(Some).collect();
    v.extend(
        order
            .iter()
            .filter_map(|&i| old.get_mut(i).and_then(Option::take)),
    );
}
