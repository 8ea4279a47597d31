//! Data-parallel training over any [`Communicator`] and any [`Optimizer`]
//! (SINGA's DistOpt with nnabla's gradient skipping, done right): one
//! engine, three front ends.
//!
//! The front ends are one type per training loop, each with only the calls
//! that make sense for it (`front.rs`): [`DistOpt`] (gradient strategies:
//! the gradients combined bucket by bucket, then the optimizer steps),
//! [`LocalSteps`] (each rank steps first, then parameters or weight changes
//! are combined: partial averaging, AdaSum by delta weight, DiLoCo's outer
//! loop) and
//! [`DimReduceOpt`] (a dense first stage, then DimReduce's own update). A
//! strategy names its loop ([`StrategyConfig::training_loop`]); a front end
//! refuses another loop's strategy at construction
//! ([`StrategyError::WrongLoop`]). [`crate::GradSync`] is the
//! framework-neutral slice API over the same engine.
//!
//! The engine ([`Engine`]): the parameters are declared once, with their
//! shapes (and dtype and device); the fusion buckets (SINGA's rule: a
//! tensor above the fusion threshold goes alone, smaller ones are grouped
//! until the group's element count exceeds the threshold) are planned over
//! the declared order, and, with [`BucketOrder::Pushed`] in the gradient
//! loop, planned again at the first step's `finish` over rank 0's push
//! order (`order.rs`); every bucket must fit the fusion capacity, checked
//! instead of overflowing. Because buckets are planned alike on every rank
//! and launched strictly in order, ranks whose backward passes produce
//! different sets of gradients still issue the same collectives.
//!
//! During backward, `push` hands over each gradient; as soon as all of a
//! bucket's gradients (and all earlier buckets) are in, the bucket's
//! collective starts on the communication thread, overlapping the rest of
//! backward. `finish` sends what is left (a gradient never pushed counts as
//! not written), waits, averages, optionally clips by global norm, checks
//! for non-finite values, and applies the optimizer.
//!
//! Skipping (nnabla, done right): each bucket first reduces one byte per
//! parameter ("written on this rank", Max): a gradient written on no rank is
//! neither sent nor updated (the optimizer never sees it, so no weight decay
//! and no state advance); one written on some rank is sent by every rank (the
//! others contribute zeros) and updated identically everywhere. That is one
//! tiny collective per bucket, never one blocking vote per array, and it
//! cannot desynchronise ranks.
//!
//! # The failure model
//!
//! A step either completes on every rank or fails (or is skipped) on every
//! rank, and afterwards every rank stands at the same point of its
//! collective sequence, so the next step works. Nothing returns early
//! between collectives: a fault found on one rank (a bad [`Engine::push`],
//! a parameter of the wrong shape, dtype or device at `finish`, a NaN, an
//! optimizer error) is recorded, and the rank's next collective carries it
//! to the others ([`Communicator::post_fault`], see
//! [`gradwire_algos::fault`]): the vote of the next bucket (the last bucket
//! is launched by `finish`, after its checks, so it always has one), or an
//! agreement of its own where a mode has no vote. Every rank then returns
//! the same [`OptimError::Fault`] (the lowest failing rank and the
//! [`FaultKind`]), or, for a non-finite gradient with `skip_non_finite`,
//! skips the step alike. A skipped or failed step leaves the parameters, the
//! optimizer state, the error-feedback residuals and the counters as they
//! were; the one exception is an optimizer error while the parameters are
//! updated, after which the ranks agree that the step failed but the
//! failing rank's parameters may be partly updated (restore a checkpoint).
//! After a [`Engine::push`] error the step must still be ended with
//! `finish` on that rank (as on the others): that is where every rank
//! learns of it.

mod accumulate;
mod arrival;
mod bucket;
mod config;
mod delta_weight;
mod dimreduce;
mod front;
mod gradient;
mod local_step;
mod order;
mod outer;
mod partial;
mod registry;
mod samples;
mod spec;
mod state;
mod strategies;
mod streaming;
mod warmup;

use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use bucket::{BucketBuffers, BucketOutput, BucketTask, plan_buckets};
pub use config::{
    BucketOrder, DEFAULT_FUSION_THRESHOLD, DistOptConfig, SkipVote, StepStats, StepStraggler,
};
pub use front::{AnyLoop, DimReduceOpt, DistOpt, LocalSteps};
use gradient::StepScratch;
use gradwire_algos::adasum::AdaSum;
use gradwire_algos::dimreduce::DimReduce;
pub use gradwire_algos::{BucketView, Combined, StateDict, Strategy};
use gradwire_algos::{Fault, FaultKind};
use gradwire_comm::{Communicator, JobSlot, Pending};
use gradwire_tensor::Tensor;
pub use registry::{
    CostAssumptions, DILOCO_LR, DILOCO_MOMENTUM, DiLoCoConfig, ONEBIT_ADAM_BETA1,
    ONEBIT_ADAM_FREEZE_STEP, OUTER_ADAM_LR, OuterCodec, OuterOptimizer, QSGD_LEVELS, REGISTRY,
    StrategyConfig, StrategyError, TrainingLoop, WarmupBy,
};
pub use spec::ParamSpec;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
pub(crate) use strategies::SharedStrategy;

/// A fault this rank found during the current step, not yet known to the
/// others: the next collective of the step carries it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LocalFault {
    kind: FaultKind,
    detail: String,
}

/// The engine under every front end: the declared parameters, the
/// buckets and their overlap with backward, the vote, the strategies and
/// the failure model. Which training loop it runs is its strategy's
/// ([`StrategyConfig::training_loop`]); the front ends let only that
/// loop's calls through.
#[derive(Debug)]
pub(crate) struct Engine<O: Optimizer, C: Communicator> {
    optimizer: O,
    comm: C,
    config: DistOptConfig,
    /// The training loop the engine was built for (its configured
    /// strategy's: `config.strategy` holds DimReduce's first stage until
    /// DimReduce starts).
    training_loop: TrainingLoop,
    params: Vec<ParamSpec>,
    /// Element counts of `params` (checked at construction).
    lens: Vec<usize>,
    index: HashMap<String, usize>,
    buckets: Vec<Range<usize>>,
    /// This step's gradients, by parameter index.
    grads: Vec<Option<Tensor>>,
    /// Gradients no rank wrote in an earlier step, kept by parameter index
    /// to serve as the zeros of a parameter not pushed (no allocation).
    unpushed: Vec<Option<Tensor>>,
    in_flight: Vec<Pending<BucketOutput<C>>>,
    /// This step's first local fault.
    fault: Option<LocalFault>,
    /// The element counts of each bucket's parameters.
    bucket_lens: Vec<Arc<[usize]>>,
    /// Each bucket's strategy, with its state (taken by the bucket's job
    /// while it runs, given back with its result; one lost with a failed
    /// job is made afresh).
    strategies: Vec<Option<Box<dyn Strategy<C>>>>,
    /// `true` for as many parameters as the largest bucket holds (the
    /// written flags of a bucket whose parameters all take part).
    all_written: Vec<bool>,
    /// Each bucket's buffers, reused from step to step (taken by the
    /// bucket's job while it runs, given back with its result; one lost
    /// with a failed job is made afresh).
    buffers: Vec<BucketBuffers>,
    /// Each bucket's slot on the communication thread, reused every step.
    slots: Vec<JobSlot<BucketTask<C>, BucketOutput<C>>>,
    /// The step's bucket outputs, residuals and averaged gradients: lists
    /// kept between steps so that a step allocates none.
    scratch: StepScratch,
    /// The fragment of each bucket (Streaming DiLoCo; all 0 otherwise).
    bucket_fragment: Vec<usize>,
    /// DiLoCo's exchange of pseudo-gradients in flight.
    fragment_exchange: streaming::FragmentExchange<C>,
    /// Partial mode's step counter: the bucket averaged next is
    /// `partial_counter mod K`, so the cycle never stops.
    partial_counter: u64,
    /// The strategy of `StrategyConfig::AdaSum`, `Custom` and
    /// `DeltaWeight`, shared by the buckets.
    shared: Option<SharedStrategy<C>>,
    /// DimReduce's state, once [`Engine::start_dimreduce`] ran.
    dimreduce: Option<DimReduce>,
    /// What the local-step modes and `finish`'s targets reuse.
    local: local_step::LocalScratch,
    /// What DimReduce mode's step reuses.
    dimreduce_scratch: dimreduce::DimReduceScratch,
    /// DiLoCo's global parameters, outer optimizer and round counters.
    outer: outer::OuterState,
    /// The sums of the step's micro-batches ([`DistOptConfig::accumulate`]).
    accumulation: accumulate::Accumulation,
    /// When the previous step ended (the engine's making, before the
    /// first), and when this rank arrived at this step's exchange: its
    /// arrival in the step's first vote (`arrival.rs`).
    step_ended: std::time::Instant,
    arrived: Option<std::time::Instant>,
    /// This step's sample weighting (`samples.rs`).
    samples: samples::SampleWeights,
    /// The order the buckets follow (`order.rs`).
    order: order::OrderState,
}

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// An engine wrapping `optimizer` for `params` (declared in the order
    /// backward produces their gradients) in `config.strategy`, the front
    /// end `front` asked for: a strategy of another training loop is
    /// refused. AdaSum's strategy (`AdaSum`, `DeltaWeight`) is prepared
    /// here, on every rank alike (it splits the communicator), unless
    /// `shared` holds the one to use. DimReduce starts in its first stage
    /// ([`StrategyConfig::first_stage`]) until [`Engine::start_dimreduce`].
    pub(crate) fn build(
        front: TrainingLoop,
        optimizer: O,
        comm: C,
        params: Vec<ParamSpec>,
        mut config: DistOptConfig,
        shared: Option<SharedStrategy<C>>,
    ) -> Result<Self> {
        let mut index = HashMap::new();
        for (i, p) in params.iter().enumerate() {
            if index.insert(p.name.clone(), i).is_some() {
                return Err(OptimError::InvalidArgument(format!(
                    "parameter {} declared twice",
                    p.name
                )));
            }
        }
        config.strategy.validate()?;
        accumulate::check_config(&config)?;
        if config.accumulate > 1 && config.strategy == StrategyConfig::DimReduce {
            return Err(OptimError::InvalidArgument(
                "accumulate: DimReduce's line search evaluates one batch's loss, so its steps \
                 take one micro-batch"
                    .into(),
            ));
        }
        if config.strategy.training_loop() != front {
            return Err(StrategyError::WrongLoop {
                strategy: config.strategy.to_string(),
                runs_on: config.strategy.training_loop().front_end(),
                given_to: front.front_end(),
            }
            .into());
        }
        config.strategy = config.strategy.first_stage();
        if config.ranks_per_node == Some(0) {
            return Err(OptimError::InvalidArgument(
                "ranks_per_node must be positive".into(),
            ));
        }
        let lens = params
            .iter()
            .map(ParamSpec::checked_len)
            .collect::<Result<Vec<_>>>()?;
        // The flat model (DimReduce, checkpoints) must be addressable too.
        if lens
            .iter()
            .try_fold(0usize, |sum, &n| sum.checked_add(n))
            .is_none()
        {
            return Err(OptimError::InvalidArgument(
                "the declared parameters hold more elements than fit in memory".into(),
            ));
        }
        let fragments = match config.strategy {
            StrategyConfig::DiLoCo(diloco) => diloco.fragments as usize,
            _ => 1,
        };
        let cuts = gradwire_algos::cost::fragment_ranges(&lens, fragments).ok_or_else(|| {
            OptimError::InvalidArgument(format!(
                "{fragments} fragments need at least as many parameters, {} are declared",
                params.len()
            ))
        })?;
        // Buckets planned inside each fragment, so that none spans two.
        let mut buckets = Vec::new();
        let mut bucket_fragment = Vec::new();
        for (p, cut) in cuts.iter().enumerate() {
            let planned = plan_buckets(
                &params[cut.clone()],
                &lens[cut.clone()],
                config.fusion_threshold,
                config.capacity,
            )?;
            for b in planned {
                buckets.push(b.start + cut.start..b.end + cut.start);
                bucket_fragment.push(p);
            }
        }
        let params_len = params.len();
        let order = order::OrderState::new(params_len, config.bucket_order, front);
        let grads = vec![None; params.len()];
        let unpushed = vec![None; params.len()];
        let bucket_lens: Vec<Arc<[usize]>> = buckets
            .iter()
            .map(|b| Arc::from(&lens[b.clone()]))
            .collect();
        let buffers = buckets.iter().map(|_| BucketBuffers::default()).collect();
        let shared = match (shared, config.strategy) {
            (Some(shared), _) => Some(shared),
            (None, StrategyConfig::AdaSum { group } | StrategyConfig::DeltaWeight { group }) => {
                Some(SharedStrategy::new(AdaSum::grouped(&comm, group)?))
            }
            (None, _) => None,
        };
        Ok(Engine {
            optimizer,
            comm,
            config,
            training_loop: front,
            params,
            lens,
            index,
            buffers,
            slots: buckets.iter().map(|_| JobSlot::default()).collect(),
            scratch: StepScratch::default(),
            buckets,
            grads,
            unpushed,
            in_flight: Vec::new(),
            fault: None,
            strategies: bucket_lens.iter().map(|_| None).collect(),
            all_written: vec![true; bucket_lens.iter().map(|b| b.len()).max().unwrap_or(0)],
            bucket_lens,
            partial_counter: 0,
            bucket_fragment,
            fragment_exchange: streaming::FragmentExchange::default(),
            shared,
            dimreduce: None,
            local: local_step::LocalScratch::default(),
            dimreduce_scratch: dimreduce::DimReduceScratch::default(),
            outer: outer::OuterState::default(),
            accumulation: accumulate::Accumulation::new(params_len),
            step_ended: std::time::Instant::now(),
            arrived: None,
            samples: samples::SampleWeights::default(),
            order,
        })
    }

    /// Bucket `b`'s strategy, taken (made from the mode if it has none: at
    /// the first step, or after its job was lost).
    pub(super) fn take_strategy(&mut self, b: usize) -> Box<dyn Strategy<C>> {
        self.strategies[b].take().unwrap_or_else(|| {
            let len = self.bucket_lens[b].iter().sum();
            strategies::for_bucket(self.config.strategy, len, self.shared.as_ref())
        })
    }

    /// Bucket `b`'s strategy, made if it has none.
    pub(super) fn strategy_mut(&mut self, b: usize) -> &mut Box<dyn Strategy<C>> {
        let strategy = self.take_strategy(b);
        self.strategies[b].insert(strategy)
    }

    /// Number of ranks (SINGA's `world_size`).
    pub(crate) fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// This rank (SINGA's `rank_in_global`).
    pub(crate) fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// This rank within its node (SINGA's `rank_in_local`).
    pub(crate) fn local_rank(&self) -> usize {
        self.rank()
            % self
                .config
                .ranks_per_node
                .unwrap_or(self.world_size())
                .max(1)
    }

    /// The wrapped optimizer.
    pub(crate) fn optimizer(&self) -> &O {
        &self.optimizer
    }

    /// The wrapped optimizer, mutably (to register per-parameter settings).
    pub(crate) fn optimizer_mut(&mut self) -> &mut O {
        &mut self.optimizer
    }

    /// The communicator.
    pub(crate) fn comm(&self) -> &C {
        &self.comm
    }

    /// Gives the communicator back (the optimizer and the engine's state are
    /// dropped: take a [`Engine::checkpoint`] first to keep them).
    pub(crate) fn into_comm(self) -> C {
        self.comm
    }

    /// The training loop the engine runs.
    pub(crate) fn training_loop(&self) -> TrainingLoop {
        self.training_loop
    }

    /// The loop the next step takes: the current strategy's (dense in
    /// DimReduce's first stage), but the gradients' in DiLoCo's warm-up by
    /// gradients ([`WarmupBy::Gradients`]).
    pub(crate) fn current_loop(&self) -> TrainingLoop {
        match self.config.strategy {
            StrategyConfig::DiLoCo(config) if self.in_gradient_warmup(config) => {
                TrainingLoop::Gradients
            }
            strategy => strategy.training_loop(),
        }
    }

    /// Whether DimReduce's first stage is over ([`Engine::start_dimreduce`]).
    pub(crate) fn dimreduce_started(&self) -> bool {
        self.config.strategy == StrategyConfig::DimReduce
    }

    /// The current strategy ([`StrategyConfig::DimReduce`] after
    /// [`Engine::start_dimreduce`]).
    pub(crate) fn strategy(&self) -> StrategyConfig {
        self.config.strategy
    }

    /// Whether this step's combined gradients will be bitwise the pushed
    /// ones: one rank, the dense sum (alone, the identity), no clipping,
    /// one micro-batch per step and no weight but 1. Checked after the
    /// step's pushes, before it ends.
    pub(crate) fn combines_to_identity(&self) -> bool {
        self.world_size() == 1
            && self.config.strategy == StrategyConfig::Dense
            && self.config.clip_global_norm.is_none()
            && self.config.accumulate <= 1
            && self.samples.scale == 1.0
    }

    /// The buckets, as ranges of the declared parameters.
    pub(crate) fn buckets(&self) -> &[Range<usize>] {
        &self.buckets
    }

    /// The parameters' names in the order the buckets follow.
    pub(crate) fn bucket_order(&self) -> Vec<&str> {
        self.params.iter().map(|p| p.name.as_str()).collect()
    }

    /// Hands over the gradient of parameter `name` (during backward). Its
    /// bucket's collective starts as soon as the bucket is complete (the
    /// last bucket's in [`Engine::finish`]).
    ///
    /// A bad gradient (an unknown name, a wrong shape, dtype or device, a
    /// second push) is an error here, and the step is marked failed: end it
    /// with `finish` as usual, which then fails on every rank alike.
    pub(crate) fn push(&mut self, name: &str, mut grad: Tensor) -> Result<()> {
        // Where it came in the order, even if it is refused below (the
        // order does not depend on this rank's faults).
        if let Some(&i) = self.index.get(name) {
            self.note_push(i);
        }
        let i = match self.check_grad(name, &grad) {
            Ok(i) => i,
            Err(e) => {
                self.record(FaultKind::InvalidArgument, &e);
                return Err(e);
            }
        };
        // This micro-batch's sample weight, before the earlier ones' sum
        // joins it.
        if self.samples.scale != 1.0
            && let Err(e) = grad.scale(self.samples.scale)
        {
            let e = OptimError::from(e);
            self.record(FaultKind::InvalidArgument, &e);
            return Err(e);
        }
        let accumulating = self.accumulating();
        if !accumulating && let Err(e) = self.fold_into_last(i, &mut grad) {
            self.record(FaultKind::InvalidArgument, &e);
            return Err(e);
        }
        self.grads[i] = Some(grad);
        // The local-step loops and DimReduce send no gradients; a
        // micro-batch that only accumulates sends nothing; the first step
        // waits for the bucket order.
        if self.config.strategy.training_loop() != TrainingLoop::Gradients
            || self.config.vote == SkipVote::PerStep
            || accumulating
            || !self.order.decided
        {
            return Ok(()); // communication happens in finish
        }
        // Every bucket but the last: that one is launched by finish, after
        // its checks, so that its vote carries whatever they find.
        while self.in_flight.len() + 1 < self.buckets.len() {
            let next = self.buckets[self.in_flight.len()].clone();
            if !next.clone().all(|j| self.grads[j].is_some()) {
                break;
            }
            self.launch_next(None)?;
        }
        Ok(())
    }

    /// Pushes every gradient, then [`Engine::finish`]: a step without
    /// overlap. `None` is a gradient backward did not produce. A bad
    /// gradient on one rank fails the step on every rank (see the module
    /// docs); this rank returns the first such error.
    pub(crate) fn step<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor, Option<Tensor>)>,
    ) -> Result<StepStats> {
        // In the memory kept from the last step: no allocation.
        let mut targets: Vec<(&str, &mut Tensor)> =
            local_step::recycle(std::mem::take(&mut self.local.named));
        let mut first_error = None;
        for (name, param, grad) in params {
            if let Some(grad) = grad
                && let Err(e) = self.push(name, grad)
            {
                first_error.get_or_insert(e);
            }
            targets.push((name, param));
        }
        let stats = self.finish(targets.drain(..));
        self.local.named = local_step::recycle(targets);
        match first_error {
            Some(e) => Err(e),
            None => stats,
        }
    }

    /// Records this step's first local fault (later ones add nothing: the
    /// first is what the others learn); the step's next collective carries
    /// it. GradSync records the faults it finds in its own arguments here.
    pub(crate) fn record(&mut self, kind: FaultKind, err: &dyn std::fmt::Display) {
        if self.fault.is_none() {
            self.fault = Some(LocalFault {
                kind,
                detail: err.to_string(),
            });
        }
    }

    /// Whether parameter `i`'s bucket is already on its way.
    fn launched_through(&self, i: usize) -> bool {
        self.buckets[..self.in_flight.len()]
            .iter()
            .any(|b| b.contains(&i))
    }

    /// The index of `name`, if `grad` may be pushed for it now.
    fn check_grad(&self, name: &str, grad: &Tensor) -> Result<usize> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| OptimError::InvalidArgument(format!("unknown parameter {name}")))?;
        self.params[i].check("gradient", grad)?;
        if self.grads[i].is_some() || self.launched_through(i) {
            return Err(OptimError::InvalidArgument(format!(
                "gradient of {name} pushed twice"
            )));
        }
        Ok(i)
    }

    /// Checks the caller's parameters against the declarations (every one
    /// given once, no unknown name, shapes, dtypes and devices) and records
    /// the first problem as this step's fault. Returns them by index.
    pub(super) fn take_targets<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
    ) -> Vec<Option<&'p mut Tensor>> {
        // In the memory of the last step's list (no allocation per step).
        let mut targets: Vec<Option<&'p mut Tensor>> =
            local_step::recycle(std::mem::take(&mut self.local.targets));
        targets.resize_with(self.params.len(), || None);
        let mut problem: Option<OptimError> = None;
        for (name, param) in params {
            let Some(&i) = self.index.get(name) else {
                problem.get_or_insert(OptimError::InvalidArgument(format!(
                    "unknown parameter {name} given to finish"
                )));
                continue;
            };
            if let Err(e) = self.params[i].check_param(param) {
                problem.get_or_insert(e);
            }
            if targets[i].replace(param).is_some() {
                problem.get_or_insert(OptimError::InvalidArgument(format!(
                    "parameter {name} given twice"
                )));
            }
        }
        if let Some(i) = targets.iter().position(Option::is_none) {
            problem.get_or_insert(OptimError::InvalidArgument(format!(
                "parameter {} not given",
                self.params[i].name
            )));
        }
        if let Some(e) = problem {
            self.record(FaultKind::InvalidArgument, &e);
        }
        targets
    }

    /// The error every rank returns for a fault that ended the step: the
    /// lowest failing rank and its kind, with this rank's own description
    /// when it is that rank.
    fn fault_error(
        &self,
        rank: Option<usize>,
        kind: FaultKind,
        own: Option<&LocalFault>,
    ) -> OptimError {
        // Only the kind travels: the failing rank (or every rank, for a
        // value computed alike) has its own description, the others none.
        let detail = match own {
            Some(own) if rank.is_none_or(|r| r == self.rank()) => own.detail.clone(),
            _ => String::new(),
        };
        OptimError::Fault(Fault { rank, kind, detail })
    }
}
