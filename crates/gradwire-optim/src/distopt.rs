//! DistOpt: data-parallel training over any [`Communicator`] and any
//! [`Optimizer`] (SINGA's DistOpt, SPEC §2-3, done right).
//!
//! The parameters are declared once, in backward order, with their shapes;
//! that order fixes the fusion buckets (SINGA's rule: a tensor above the
//! fusion threshold goes alone, smaller ones are grouped until the group's
//! element count exceeds the threshold) and every bucket must fit the fusion
//! capacity, checked at construction instead of overflowing. Because buckets
//! are fixed and launched strictly in order, ranks whose backward passes
//! produce different sets of gradients still issue the same collectives.
//!
//! During backward, [`DistOpt::push`] hands over each gradient; as soon as all
//! of a bucket's gradients (and all earlier buckets) are in, the bucket's
//! collective starts on the communication thread, overlapping the rest of
//! backward. [`DistOpt::finish`] sends what is left (a gradient never pushed
//! counts as not written), waits, averages, optionally clips by global norm
//! and checks for non-finite values, and applies the optimizer.
//!
//! Skipping (nnabla, done right): each bucket first reduces one byte per
//! parameter ("written on this rank", Max): a gradient written on no rank is
//! neither sent nor updated (the optimizer never sees it, so no weight decay
//! and no state advance); one written on some rank is sent by every rank (the
//! others contribute zeros) and updated identically everywhere. That is one
//! tiny collective per bucket, never one blocking vote per array, and it
//! cannot desynchronise ranks.

use crate::checkpoint::Checkpoint;
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_algos::adasum::AdaSum;
use gradwire_algos::dimreduce::{DimReduce, DimReduceConfig, DimReduceState, DimReduceStep, Pca};
use gradwire_algos::{
    AlgoError, DEFAULT_FUSION_CAPACITY, HalfOptions, HalfPrecision, Handle, Reduced, Traffic,
    fused_all_reduce, half_all_reduce, sparse_all_reduce,
};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_compress::{ErrorFeedback, ErrorFeedbackState, SparseCodec};
use gradwire_tensor::{DType, Device, Tensor};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// SINGA's default fusion threshold, in elements.
pub const DEFAULT_FUSION_THRESHOLD: usize = 2_097_152;

/// How gradients are combined.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// f32 sum, then divided by the world size (SINGA `backward_and_update`).
    Dense,
    /// f16 or bf16 on the wire (SINGA `backward_and_update_half`), averaged
    /// in f32 before the one rounding, so it cannot overflow as SINGA's fp16
    /// sum does; with `clip`, gradients are clamped to [-clip, clip] first.
    Half {
        /// The wire precision.
        precision: HalfPrecision,
        /// The clamp, if any.
        clip: Option<f32>,
    },
    /// Each bucket sends only what `codec` selects (SINGA
    /// `backward_and_sparse_update`), with an error-feedback residual per
    /// bucket when `error_feedback`; a bucket that is not sparse enough is
    /// sent dense. The sum is divided by the world size.
    Sparse {
        /// Which entries to send.
        codec: SparseCodec,
        /// Keep what is not sent for later steps (SINGA's `corr`).
        error_feedback: bool,
    },
    /// Each bucket is combined by the [`Combiner`] given to
    /// [`DistOpt::with_combiner`] (AdaSum by gradient, or any strategy of
    /// your own) instead of a built-in rule.
    Custom,
    /// Combine weight changes instead of gradients (Horovod's AdaSum default,
    /// MindSpore's `AdaSumByDeltaWeightWrapCell`): save `p0`, step the
    /// optimizer locally with this rank's gradient, `delta = p0 - p`, combine
    /// the deltas bucket by bucket with the [`Combiner`], `p = p0 - combined`.
    DeltaWeight,
    /// Local SGD with round-robin partial averaging (SINGA
    /// `backward_and_partial_update`): every parameter is updated with its
    /// own rank's gradient, then the parameters of one bucket (partition
    /// `counter mod K`) are averaged across ranks, and with `average_state`
    /// their optimizer buffers too (SINGA keeps them local).
    Partial {
        /// Also average the partition's optimizer buffers.
        average_state: bool,
    },
    /// DimReduce (MindSpore boost, SPEC §5): gradients are averaged bucket by
    /// bucket as in `Dense`, then a quasi-Newton step in the PCA subspace
    /// with a line search replaces the optimizer. Entered with
    /// [`DistOpt::start_dimreduce`] (usually after a first stage of another
    /// mode that recorded the trajectory); steps with
    /// [`DistOpt::finish_dimreduce`], which takes the loss.
    DimReduce,
}

/// DistOpt's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DistOptConfig {
    /// How gradients are combined.
    pub mode: Mode,
    /// Elements above which a bucket is closed (SINGA: 2,097,152).
    pub fusion_threshold: usize,
    /// The most elements a bucket may hold (SINGA's `buffSize`: 4,194,304).
    pub capacity: usize,
    /// Ranks per node, for [`DistOpt::local_rank`] (default: all ranks).
    pub ranks_per_node: Option<usize>,
    /// Scale the averaged gradients so their global L2 norm is at most this.
    pub clip_global_norm: Option<f64>,
    /// Skip the whole step, on every rank alike, when an averaged gradient
    /// holds a NaN or an infinity (AMP's `found_inf`).
    pub skip_non_finite: bool,
    /// When ranks agree on which gradients were written.
    pub vote: SkipVote,
}

/// When DistOpt decides which gradients no rank wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SkipVote {
    /// Each bucket starts with a tiny vote over its own parameters, so that
    /// buckets can travel during backward (overlap). One vote per bucket.
    #[default]
    PerBucket,
    /// One vote for all parameters together in `finish`, then the buckets:
    /// the fewest collectives, but no overlap with backward.
    PerStep,
}

impl Default for DistOptConfig {
    fn default() -> Self {
        DistOptConfig {
            mode: Mode::Dense,
            fusion_threshold: DEFAULT_FUSION_THRESHOLD,
            capacity: DEFAULT_FUSION_CAPACITY,
            ranks_per_node: None,
            clip_global_norm: None,
            skip_non_finite: false,
            vote: SkipVote::PerBucket,
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepStats {
    /// Buckets communicated.
    pub buckets: usize,
    /// Bytes this rank sent and received (ring model).
    pub traffic: Traffic,
    /// Time spent in `finish` waiting for communication.
    pub wait: Duration,
    /// Parameters updated.
    pub updated: usize,
    /// Parameters skipped because no rank wrote their gradient.
    pub skipped: usize,
    /// Whether the whole step was skipped (a non-finite gradient).
    pub non_finite: bool,
    /// DimReduce mode: the accepted step size and the loss there.
    pub dimreduce: Option<DimReduceStep>,
}

/// How DistOpt combines one bucket's tensors across ranks, beyond the
/// built-in modes: the hook AdaSum (or any strategy) plugs into without
/// changing DistOpt. It runs on the communication thread, one bucket at a
/// time, in bucket order on every rank.
pub trait Combiner<C: Communicator>: Send + 'static {
    /// Combines `tensors` (this rank's written gradients, or weight deltas, of
    /// bucket `bucket`, in declaration order) across the ranks of `comm`, in
    /// place.
    fn combine(
        &mut self,
        comm: &C,
        bucket: usize,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined>;
}

/// What a [`Combiner`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Combined {
    /// Bytes this rank sent and received.
    pub traffic: Traffic,
    /// Whether the result is already an average-like combination; if not it
    /// is a sum, which DistOpt divides by the world size.
    pub averaged: bool,
}

/// AdaSum as a combiner: orthogonal gradients add, identical ones average,
/// so the result is used as it is (`averaged`). Prepare it with
/// [`AdaSum::new`] (or [`AdaSum::hierarchical`]) on the DistOpt's
/// communicator, on every rank.
impl<C: Communicator + 'static> Combiner<C> for AdaSum<C> {
    fn combine(
        &mut self,
        comm: &C,
        _bucket: usize,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        let traffic = AdaSum::combine(self, comm, tensors)?;
        Ok(Combined {
            traffic,
            averaged: true,
        })
    }
}

/// A combiner shared between DistOpt and its bucket jobs (they run one at a
/// time on the communication thread; the lock is never contended).
struct SharedCombiner<C>(Arc<Mutex<Box<dyn Combiner<C>>>>);

impl<C> Clone for SharedCombiner<C> {
    fn clone(&self) -> Self {
        SharedCombiner(Arc::clone(&self.0))
    }
}

impl<C> std::fmt::Debug for SharedCombiner<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Combiner")
    }
}

fn run_combiner<C: Communicator + 'static>(
    combiner: &Option<SharedCombiner<C>>,
    comm: &C,
    bucket: usize,
    tensors: &mut [Tensor],
) -> gradwire_algos::Result<Combined> {
    let combiner = combiner.as_ref().ok_or_else(|| {
        AlgoError::InvalidArgument("this mode needs DistOpt::with_combiner".into())
    })?;
    let mut guard = combiner.0.lock().map_err(|_| {
        AlgoError::InvalidArgument("the combiner panicked in an earlier step".into())
    })?;
    guard.combine(comm, bucket, tensors)
}

/// A parameter's declaration: its name and shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// The name the optimizer knows it by.
    pub name: String,
    /// Its shape; gradients must have it.
    pub shape: Vec<usize>,
}

impl ParamSpec {
    /// A declaration.
    pub fn new(name: impl Into<String>, shape: impl Into<Vec<usize>>) -> Self {
        ParamSpec {
            name: name.into(),
            shape: shape.into(),
        }
    }

    fn len(&self) -> usize {
        self.shape.iter().product()
    }
}

/// What a bucket's job hands back: which parameters some rank wrote, and
/// their combined gradients (only those).
struct BucketResult {
    written: Vec<bool>,
    grads: Vec<Tensor>,
    residual: Option<ErrorFeedback>,
    /// Whether `grads` are averaged already (else summed).
    averaged: bool,
}

/// The data-parallel optimizer.
#[derive(Debug)]
pub struct DistOpt<O: Optimizer, C: Communicator> {
    optimizer: O,
    comm: C,
    config: DistOptConfig,
    params: Vec<ParamSpec>,
    index: HashMap<String, usize>,
    buckets: Vec<Range<usize>>,
    /// This step's gradients, by parameter index.
    grads: Vec<Option<Tensor>>,
    in_flight: Vec<Handle<BucketResult>>,
    /// Sparse mode's error-feedback memory, one per bucket (taken by a
    /// bucket's job while it runs, given back with its result).
    residuals: Vec<Option<ErrorFeedback>>,
    /// Partial mode's step counter: the bucket averaged next is
    /// `partial_counter mod K`, so the cycle never stops.
    partial_counter: u64,
    /// The combiner of `Mode::Custom` and `Mode::DeltaWeight`.
    combiner: Option<SharedCombiner<C>>,
    /// DimReduce's state, once [`DistOpt::start_dimreduce`] ran.
    dimreduce: Option<DimReduce>,
}

impl std::fmt::Debug for BucketResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketResult")
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

/// SINGA's grouping: a tensor above the threshold alone; smaller ones
/// together until the group's count exceeds the threshold.
fn plan_buckets(
    params: &[ParamSpec],
    threshold: usize,
    capacity: usize,
) -> Result<Vec<Range<usize>>> {
    let mut buckets = Vec::new();
    let mut start = 0;
    let mut count = 0usize;
    for (i, p) in params.iter().enumerate() {
        let n = p.len();
        if n > threshold {
            if start < i {
                buckets.push(start..i);
            }
            buckets.push(i..i + 1);
            start = i + 1;
            count = 0;
            continue;
        }
        count += n;
        if count > threshold {
            buckets.push(start..i + 1);
            start = i + 1;
            count = 0;
        }
    }
    if start < params.len() {
        buckets.push(start..params.len());
    }
    for b in &buckets {
        let needed: usize = params[b.clone()].iter().map(ParamSpec::len).sum();
        if needed > capacity {
            return Err(OptimError::InvalidArgument(format!(
                "a bucket of {needed} elements ({}) exceeds the fusion capacity of {capacity}",
                params[b.clone()]
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(buckets)
}

impl<O: Optimizer, C: Communicator + 'static> DistOpt<O, C> {
    /// Wraps `optimizer` for the parameters `params`, declared in the order
    /// backward produces their gradients.
    pub fn new(
        optimizer: O,
        comm: C,
        params: Vec<ParamSpec>,
        config: DistOptConfig,
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
        if config.ranks_per_node == Some(0) {
            return Err(OptimError::InvalidArgument(
                "ranks_per_node must be positive".into(),
            ));
        }
        let buckets = plan_buckets(&params, config.fusion_threshold, config.capacity)?;
        let grads = vec![None; params.len()];
        let residuals = buckets
            .iter()
            .map(|b| match config.mode {
                Mode::Sparse {
                    error_feedback: true,
                    ..
                } => Some(ErrorFeedback::new(
                    params[b.clone()].iter().map(ParamSpec::len).sum(),
                )),
                _ => None,
            })
            .collect();
        Ok(DistOpt {
            optimizer,
            comm,
            config,
            params,
            index,
            buckets,
            grads,
            in_flight: Vec::new(),
            residuals,
            partial_counter: 0,
            combiner: None,
            dimreduce: None,
        })
    }

    /// [`DistOpt::new`] with a [`Combiner`] for `Mode::Custom` (buckets of
    /// gradients) or `Mode::DeltaWeight` (buckets of weight changes).
    pub fn with_combiner(
        optimizer: O,
        comm: C,
        params: Vec<ParamSpec>,
        config: DistOptConfig,
        combiner: impl Combiner<C>,
    ) -> Result<Self> {
        let mut dist = DistOpt::new(optimizer, comm, params, config)?;
        dist.combiner = Some(SharedCombiner(Arc::new(Mutex::new(Box::new(combiner)))));
        Ok(dist)
    }

    /// Number of ranks (SINGA's `world_size`).
    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// This rank (SINGA's `rank_in_global`).
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// This rank within its node (SINGA's `rank_in_local`).
    pub fn local_rank(&self) -> usize {
        self.rank()
            % self
                .config
                .ranks_per_node
                .unwrap_or(self.world_size())
                .max(1)
    }

    /// The wrapped optimizer.
    pub fn optimizer(&self) -> &O {
        &self.optimizer
    }

    /// The wrapped optimizer, mutably (to register per-parameter settings).
    pub fn optimizer_mut(&mut self) -> &mut O {
        &mut self.optimizer
    }

    /// The communicator.
    pub fn comm(&self) -> &C {
        &self.comm
    }

    /// Gives the communicator back (the optimizer and DistOpt's state are
    /// dropped: take a [`DistOpt::checkpoint`] first to keep them).
    pub fn into_comm(self) -> C {
        self.comm
    }

    /// The current mode ([`Mode::DimReduce`] after
    /// [`DistOpt::start_dimreduce`]).
    pub fn mode(&self) -> Mode {
        self.config.mode
    }

    /// The buckets, as ranges of the declared parameters.
    pub fn buckets(&self) -> &[Range<usize>] {
        &self.buckets
    }

    /// Hands over the gradient of parameter `name` (during backward). Its
    /// bucket's collective starts as soon as the bucket is complete.
    pub fn push(&mut self, name: &str, grad: Tensor) -> Result<()> {
        let i = self.check_grad(name, &grad)?;
        self.grads[i] = Some(grad);
        if matches!(self.config.mode, Mode::Partial { .. } | Mode::DeltaWeight)
            || self.config.vote == SkipVote::PerStep
        {
            return Ok(()); // communication happens in finish
        }
        while self.in_flight.len() < self.buckets.len() {
            let next = self.buckets[self.in_flight.len()].clone();
            if !next.clone().all(|j| self.grads[j].is_some()) {
                break;
            }
            self.launch_next(None)?;
        }
        Ok(())
    }

    /// Whether parameter `i`'s bucket is already on its way.
    fn launched_through(&self, i: usize) -> bool {
        self.buckets[..self.in_flight.len()]
            .iter()
            .any(|b| b.contains(&i))
    }

    /// Starts the next bucket's collective on the communication thread.
    fn launch_next(&mut self, written: Option<Vec<bool>>) -> Result<()> {
        let range = self.buckets[self.in_flight.len()].clone();
        let mut grads = Vec::with_capacity(range.len());
        for i in range {
            let grad = match self.grads[i].take() {
                Some(g) => g,
                None => {
                    // Never pushed: not written on this rank.
                    let mut zeros =
                        Tensor::zeros(self.params[i].shape.clone(), DType::F32, Device::Cpu)?;
                    zeros.zero_();
                    zeros
                }
            };
            grads.push(grad);
        }
        let mode = match self.config.mode {
            // Without error feedback nothing counts the steps for random-k:
            // mix the optimizer's step into the seed, or every step would
            // draw the same indices.
            Mode::Sparse {
                codec: SparseCodec::RandomK { ratio, seed },
                error_feedback: false,
            } => Mode::Sparse {
                codec: SparseCodec::RandomK {
                    ratio,
                    seed: seed
                        ^ self
                            .optimizer
                            .step_count()
                            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
                },
                error_feedback: false,
            },
            mode => mode,
        };
        let job = BucketJob {
            bucket: self.in_flight.len(),
            mode,
            capacity: self.config.capacity,
            residual: self.residuals[self.in_flight.len()].take(),
            combiner: self.combiner.clone(),
            written,
        };
        let pending = self.comm.run_async(move |comm| Ok(job.run(comm, grads)));
        let pending = pending.map_err(AlgoError::from)?;
        self.in_flight.push(Handle::from_pending(pending));
        Ok(())
    }

    /// Sends what is left, waits for every bucket, and updates every
    /// parameter some rank wrote (SINGA's `wait` + update + `step`).
    /// `params` must hold every declared parameter.
    pub fn finish<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
    ) -> Result<StepStats> {
        let mut targets: HashMap<&str, &mut Tensor> = params.into_iter().collect();
        // A missing parameter is reported after the communication, which
        // every rank must complete to stay paired with the others.
        let missing = self.first_missing(&targets);
        match self.config.mode {
            Mode::Partial { average_state } => {
                return self.finish_partial(targets, missing, average_state);
            }
            Mode::DeltaWeight => return self.finish_delta_weight(targets, missing),
            _ => {}
        }
        if self.config.mode == Mode::DimReduce {
            // Keep the launched buckets paired with the other ranks.
            self.abort_step();
            return Err(OptimError::InvalidArgument(
                "DimReduce mode steps with finish_dimreduce, which takes the loss".into(),
            ));
        }
        let (mut stats, reduced) = self.reduce_gradients(missing)?;
        if stats.non_finite {
            return Ok(stats);
        }
        for (i, grad, _) in &reduced {
            let name = self.params[*i].name.as_str();
            let Some(param) = targets.get_mut(name) else {
                continue;
            };
            self.optimizer.update(name, param, grad)?;
            stats.updated += 1;
        }
        self.optimizer.step();
        Ok(stats)
    }

    /// The communication half of a step: launches the buckets not yet on
    /// their way, waits for all, averages, clips and checks for non-finite
    /// values. Returns the averaged gradients some rank wrote, by parameter
    /// index (none when the step is skipped as non-finite).
    fn reduce_gradients(
        &mut self,
        missing: Option<OptimError>,
    ) -> Result<(StepStats, Vec<ReducedGrad>)> {
        // With one vote per step, it happens now, for every parameter.
        let mut decided: Option<Vec<bool>> = None;
        let mut vote_traffic = Traffic::default();
        if self.config.vote == SkipVote::PerStep {
            let mut votes: Vec<u8> = self
                .grads
                .iter()
                .map(|g| u8::from(g.as_ref().is_some_and(|g| !g.is_zeroed())))
                .collect();
            if let Err(e) = self.comm.all_reduce(&mut votes, ReduceOp::Max) {
                self.abort_step();
                return Err(AlgoError::from(e).into());
            }
            vote_traffic = Traffic::all_reduce(votes.len(), self.world_size());
            decided = Some(votes.iter().map(|&v| v != 0).collect());
        }
        while self.in_flight.len() < self.buckets.len() {
            let written = decided
                .as_ref()
                .map(|d| d[self.buckets[self.in_flight.len()].clone()].to_vec());
            if let Err(e) = self.launch_next(written) {
                self.abort_step();
                return Err(e);
            }
        }
        let start = Instant::now();
        let mut stats = StepStats {
            buckets: self.buckets.len(),
            traffic: vote_traffic,
            ..StepStats::default()
        };
        let mut reduced: Vec<(usize, Tensor, bool)> = Vec::new();
        let mut failure = None;
        for (b, handle) in self.in_flight.drain(..).enumerate() {
            match handle.wait() {
                Ok(Reduced { value, traffic }) => {
                    stats.traffic += traffic;
                    if value.residual.is_some() {
                        self.residuals[b] = value.residual;
                    }
                    let averaged = value.averaged;
                    let mut grads = value.grads.into_iter();
                    for (i, written) in self.buckets[b].clone().zip(value.written) {
                        if written {
                            if let Some(g) = grads.next() {
                                reduced.push((i, g, averaged));
                            }
                        } else {
                            stats.skipped += 1;
                        }
                    }
                }
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        stats.wait = start.elapsed();
        self.grads.iter_mut().for_each(|g| *g = None);
        if let Some(e) = failure {
            // A failed bucket did not hand its residual back: start it afresh
            // (what it held is lost with the failed step).
            if let Mode::Sparse {
                error_feedback: true,
                ..
            } = self.config.mode
            {
                for (b, slot) in self.residuals.iter_mut().enumerate() {
                    if slot.is_none() {
                        let n = self.params[self.buckets[b].clone()]
                            .iter()
                            .map(ParamSpec::len)
                            .sum();
                        *slot = Some(ErrorFeedback::new(n));
                    }
                }
            }
            return Err(e.into());
        }
        if let Some(e) = missing {
            return Err(e);
        }

        // Average (half mode arrives averaged), then clip and check.
        let inverse = 1.0 / self.world_size() as f32;
        for (_, g, averaged) in &mut reduced {
            if !*averaged {
                g.scale(inverse)?;
            }
        }
        if self.config.skip_non_finite || self.config.clip_global_norm.is_some() {
            let mut sum_sq = 0f64;
            for (_, g, _) in &reduced {
                sum_sq += g.sum_sq()?;
            }
            if self.config.skip_non_finite && !sum_sq.is_finite() {
                stats.non_finite = true;
                return Ok((stats, Vec::new()));
            }
            if let Some(max_norm) = self.config.clip_global_norm {
                let norm = sum_sq.sqrt();
                if norm > max_norm {
                    let factor = (max_norm / norm) as f32;
                    for (_, g, _) in &mut reduced {
                        g.scale(factor)?;
                    }
                }
            }
        }
        Ok((stats, reduced))
    }

    /// Pushes every gradient, then [`DistOpt::finish`]: a step without
    /// overlap. `None` is a gradient backward did not produce. The arguments
    /// are checked before anything is sent.
    pub fn step<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor, Option<Tensor>)>,
    ) -> Result<StepStats> {
        let mut targets = Vec::new();
        let mut grads = Vec::new();
        for (name, param, grad) in params {
            if let Some(grad) = grad {
                let i = self.check_grad(name, &grad)?;
                grads.push((i, grad));
            }
            targets.push((name, param));
        }
        for (i, grad) in grads {
            let name = self.params[i].name.clone();
            self.push(&name, grad)?;
        }
        self.finish(targets)
    }

    /// Switches to [`Mode::DimReduce`] with the components `pca` (the same on
    /// every rank: fit from the same trajectory, or broadcast) over all
    /// declared parameters flattened in declaration order. Call between
    /// steps; the optimizer's state is kept, unused, in the checkpoints.
    pub fn start_dimreduce(&mut self, pca: &Pca, config: DimReduceConfig) -> Result<()> {
        let total: usize = self.params.iter().map(ParamSpec::len).sum();
        if pca.components.ncols() != total {
            return Err(OptimError::InvalidArgument(format!(
                "the components cover {} parameters, DistOpt has {total}",
                pca.components.ncols()
            )));
        }
        if !self.in_flight.is_empty() || self.grads.iter().any(Option::is_some) {
            return Err(OptimError::InvalidArgument(
                "start_dimreduce in the middle of a step".into(),
            ));
        }
        self.dimreduce = Some(DimReduce::new(&self.comm, pca, config)?);
        self.config.mode = Mode::DimReduce;
        Ok(())
    }

    /// DimReduce mode's [`DistOpt::finish`]: waits for the averaged
    /// gradients, averages this rank's `loss` across ranks, and takes one
    /// DimReduce step on `params` (every declared parameter, f32). The line
    /// search calls `eval_loss` with the trial parameters (name and tensor,
    /// in declaration order) on every rank alike; it returns this rank's loss
    /// on the same batch, which DistOpt averages. A parameter no rank wrote
    /// has a zero gradient here: DimReduce moves all parameters together.
    ///
    /// If `eval_loss` fails on a rank, that trial counts as rejected on every
    /// rank (the rank contributes NaN to the averaged loss), the step
    /// completes alike everywhere, and the failing rank then returns its
    /// error: ranks never diverge or wait on each other.
    pub fn finish_dimreduce<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
        loss: f64,
        mut eval_loss: impl FnMut(&[(&str, &Tensor)]) -> Result<f64>,
    ) -> Result<StepStats> {
        let mut targets: HashMap<&str, &mut Tensor> = params.into_iter().collect();
        let missing = self.first_missing(&targets);
        if self.config.mode != Mode::DimReduce || self.dimreduce.is_none() {
            self.abort_step();
            return Err(OptimError::InvalidArgument(
                "finish_dimreduce needs start_dimreduce first".into(),
            ));
        }
        let (mut stats, reduced) = self.reduce_gradients(missing)?;
        if stats.non_finite {
            return Ok(stats);
        }
        // The flat parameters and averaged gradient, in declaration order.
        let total: usize = self.params.iter().map(ParamSpec::len).sum();
        let mut w = Vec::with_capacity(total);
        let mut g = vec![0f32; total];
        let mut offsets = Vec::with_capacity(self.params.len());
        for spec in &self.params {
            let param = targets
                .get(spec.name.as_str())
                .ok_or_else(|| OptimError::InvalidArgument(format!("{} not given", spec.name)))?;
            offsets.push(w.len());
            w.extend(param.to_vec::<f32>()?);
        }
        for (i, grad, _) in &reduced {
            let at = offsets[*i];
            g[at..at + grad.len()].copy_from_slice(&grad.to_vec::<f32>()?);
        }
        let world = self.world_size();
        let mut avg_loss = [loss];
        self.comm
            .all_reduce(&mut avg_loss, ReduceOp::Avg)
            .map_err(AlgoError::from)?;
        // Trial points are evaluated on scratch copies of the parameters.
        let mut scratch: Vec<Tensor> = self
            .params
            .iter()
            .map(|spec| Tensor::zeros(spec.shape.clone(), DType::F32, Device::Cpu))
            .collect::<std::result::Result<_, _>>()?;
        let names: Vec<&str> = self.params.iter().map(|p| p.name.as_str()).collect();
        let comm = &self.comm;
        let mut user_error = None;
        let mut trials = 0usize;
        let dimreduce = self.dimreduce.as_mut().ok_or_else(|| {
            OptimError::InvalidArgument("finish_dimreduce needs start_dimreduce first".into())
        })?;
        let start = Instant::now();
        let outcome = dimreduce.step(comm, &mut w, &g, avg_loss[0], |trial| {
            trials += 1;
            for (t, &at) in scratch.iter_mut().zip(&offsets) {
                let n = t.len();
                t.as_mut_slice::<f32>()?.copy_from_slice(&trial[at..at + n]);
            }
            let view: Vec<(&str, &Tensor)> = names.iter().copied().zip(scratch.iter()).collect();
            // A failing closure on one rank must not leave its peers waiting
            // in the all-reduce: it contributes NaN, which rejects the trial
            // everywhere, and the error is returned after the step.
            let mut local = [match eval_loss(&view) {
                Ok(l) => l,
                Err(e) => {
                    user_error.get_or_insert(e);
                    f64::NAN
                }
            }];
            comm.all_reduce(&mut local, ReduceOp::Avg)?;
            Ok(local[0])
        });
        stats.wait += start.elapsed();
        let outcome = outcome?;
        for (spec, &at) in self.params.iter().zip(&offsets) {
            if let Some(param) = targets.get_mut(spec.name.as_str()) {
                let n = param.len();
                param.as_mut_slice::<f32>()?.copy_from_slice(&w[at..at + n]);
            }
        }
        if let Some(e) = user_error {
            return Err(e);
        }
        // The loss, the projection's all-gather, the back-projection's
        // all-reduce (2 x f64 per parameter) and one loss per trial.
        let n = dimreduce.b().nrows();
        stats.traffic += Traffic::all_reduce(8 * (1 + trials), world)
            + Traffic::all_gather(8 * n.div_ceil(world), 8 * n, world)
            + Traffic::all_reduce(16 * total, world);
        stats.updated = self.params.len();
        stats.dimreduce = Some(outcome);
        Ok(stats)
    }

    /// The error for the first declared parameter `targets` lacks, if any.
    fn first_missing(&self, targets: &HashMap<&str, &mut Tensor>) -> Option<OptimError> {
        self.params
            .iter()
            .find(|p| !targets.contains_key(p.name.as_str()))
            .map(|p| OptimError::InvalidArgument(format!("parameter {} not given", p.name)))
    }

    /// The index of `name`, if `grad` may be pushed for it now.
    fn check_grad(&self, name: &str, grad: &Tensor) -> Result<usize> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| OptimError::InvalidArgument(format!("unknown parameter {name}")))?;
        if grad.dims() != self.params[i].shape.as_slice() {
            return Err(OptimError::ShapeMismatch {
                what: format!("gradient of {name}"),
                expected: self.params[i].shape.clone(),
                got: grad.dims().to_vec(),
            });
        }
        if self.grads[i].is_some() || self.launched_through(i) {
            return Err(OptimError::InvalidArgument(format!(
                "gradient of {name} pushed twice"
            )));
        }
        Ok(i)
    }

    /// Delta-weight mode's finish: the local step from `p0`, then the weight
    /// changes combined bucket by bucket, then `p = p0 - combined`.
    fn finish_delta_weight(
        &mut self,
        mut targets: HashMap<&str, &mut Tensor>,
        missing: Option<OptimError>,
    ) -> Result<StepStats> {
        let mut stats = StepStats {
            buckets: self.buckets.len(),
            ..StepStats::default()
        };
        let grads: Vec<Option<Tensor>> = self.grads.iter_mut().map(Option::take).collect();
        if let Some(e) = missing {
            return Err(e);
        }
        // Local step; every parameter keeps its p0.
        let mut start = Vec::with_capacity(self.params.len());
        for (i, grad) in grads.into_iter().enumerate() {
            let name = self.params[i].name.as_str();
            let param = targets.get_mut(name).ok_or_else(|| {
                OptimError::InvalidArgument(format!("parameter {name} not given"))
            })?;
            start.push((**param).clone());
            if let Some(grad) = grad
                && !grad.is_zeroed()
            {
                self.optimizer.update(name, param, &grad)?;
                stats.updated += 1;
            }
        }
        self.optimizer.step();
        // Combine the deltas, bucket by bucket, in order on every rank.
        let begin = Instant::now();
        for (b, range) in self.buckets.clone().into_iter().enumerate() {
            let mut deltas = Vec::with_capacity(range.len());
            for i in range.clone() {
                let name = self.params[i].name.as_str();
                let param = targets.get(name).ok_or_else(|| {
                    OptimError::InvalidArgument(format!("parameter {name} not given"))
                })?;
                let mut delta = start[i].clone();
                delta.axpy(-1.0, param)?; // p0 - p
                deltas.push(delta);
            }
            let combined = run_combiner(&self.combiner, &self.comm, b, &mut deltas)?;
            stats.traffic += combined.traffic;
            let inverse = if combined.averaged {
                1.0
            } else {
                1.0 / self.world_size() as f32
            };
            for (i, delta) in range.zip(deltas) {
                let name = self.params[i].name.as_str();
                if let Some(param) = targets.get_mut(name) {
                    param.copy_from(&start[i])?;
                    param.axpy(-inverse, &delta)?; // p0 - combined
                }
            }
        }
        stats.wait = begin.elapsed();
        Ok(stats)
    }

    /// Partial mode's finish: the local update, then the average of one
    /// bucket's parameters across ranks.
    fn finish_partial(
        &mut self,
        mut targets: HashMap<&str, &mut Tensor>,
        missing: Option<OptimError>,
        average_state: bool,
    ) -> Result<StepStats> {
        let mut stats = StepStats {
            buckets: 1,
            ..StepStats::default()
        };
        let grads: Vec<Option<Tensor>> = self.grads.iter_mut().map(Option::take).collect();
        if let Some(e) = missing {
            // Every rank must still take part in the averaging below; a rank
            // missing a parameter cannot, so it fails and its peers see the
            // collective fail too rather than hang.
            return Err(e);
        }
        for (i, grad) in grads.into_iter().enumerate() {
            let name = self.params[i].name.as_str();
            if let (Some(grad), Some(param)) = (grad, targets.get_mut(name))
                && !grad.is_zeroed()
            {
                self.optimizer.update(name, param, &grad)?;
                stats.updated += 1;
            }
        }
        self.optimizer.step();
        let k = self.buckets.len() as u64;
        if k > 0 {
            let b = (self.partial_counter % k) as usize;
            self.partial_counter += 1;
            let mut chosen: Vec<Tensor> = Vec::new();
            for i in self.buckets[b].clone() {
                let name = self.params[i].name.as_str();
                let param = targets.get(name).ok_or_else(|| {
                    OptimError::InvalidArgument(format!("parameter {name} not given"))
                })?;
                chosen.push((**param).clone());
            }
            let start = Instant::now();
            stats.traffic +=
                fused_all_reduce(&self.comm, &mut chosen, ReduceOp::Avg, self.config.capacity)?;
            stats.wait = start.elapsed();
            for (i, averaged) in self.buckets[b].clone().zip(chosen) {
                let name = self.params[i].name.as_str();
                if let Some(param) = targets.get_mut(name) {
                    param.copy_from(&averaged)?;
                }
            }
            if average_state {
                stats.traffic += self.average_buffers(b)?;
            }
        }
        Ok(stats)
    }

    /// Averages the optimizer buffers of bucket `b`'s parameters across ranks
    /// (a rank without state for one contributes zeros and gains the average).
    fn average_buffers(&mut self, b: usize) -> Result<Traffic> {
        let names = self.optimizer.buffer_names();
        let mut buffers = Vec::new();
        for i in self.buckets[b].clone() {
            let spec = &self.params[i];
            let state = self.optimizer.param_state(&spec.name);
            for &buffer in names {
                let values = state
                    .and_then(|s| s.buffers.get(buffer).cloned())
                    .unwrap_or_else(|| vec![0.0; spec.len()]);
                buffers.push(Tensor::from_vec(values, spec.len())?);
            }
        }
        let traffic = fused_all_reduce(&self.comm, &mut buffers, ReduceOp::Avg, usize::MAX)?;
        let mut averaged = buffers.into_iter();
        for i in self.buckets[b].clone() {
            let spec = self.params[i].clone();
            for &buffer in names {
                if let Some(t) = averaged.next() {
                    self.optimizer.set_buffer(
                        &spec.name,
                        &spec.shape,
                        buffer,
                        t.into_vec::<f32>()?,
                    )?;
                }
            }
        }
        Ok(traffic)
    }

    /// DistOpt's whole state: the optimizer's, sparse mode's residuals (as
    /// tensors `residual/<bucket>`), partial mode's counter (value
    /// `partial_counter`) and DimReduce's state (`dimreduce/momentum`, and
    /// values `dimreduce/b`, `g_last`, `s`, `initialized`; the components
    /// themselves go to their own file, [`crate::checkpoint::save_pca`]).
    /// Call between steps.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        let mut ckpt = Checkpoint::new(self.optimizer.state()?);
        for (b, memory) in self.residuals.iter().enumerate() {
            if let Some(memory) = memory {
                let residual = memory.residual().to_vec();
                let n = residual.len();
                ckpt.tensors
                    .insert(format!("residual/{b}"), Tensor::from_vec(residual, n)?);
                ckpt.values
                    .insert(format!("residual_steps/{b}"), memory.steps().into());
            }
        }
        ckpt.values
            .insert("partial_counter".into(), self.partial_counter.into());
        ckpt.values
            .insert("buckets".into(), (self.buckets.len() as u64).into());
        if let Some(dimreduce) = &self.dimreduce {
            let state = dimreduce.state();
            let n = state.momentum.len();
            ckpt.tensors.insert(
                "dimreduce/momentum".into(),
                Tensor::from_vec(state.momentum, n)?,
            );
            // f64 values, exact through JSON (serde_json's float_roundtrip).
            ckpt.values.insert("dimreduce/b".into(), state.b.into());
            ckpt.values
                .insert("dimreduce/g_last".into(), state.g_last.into());
            ckpt.values.insert("dimreduce/s".into(), state.s.into());
            ckpt.values
                .insert("dimreduce/initialized".into(), state.initialized.into());
        }
        Ok(ckpt)
    }

    /// Restores a state saved by [`DistOpt::checkpoint`] from a DistOpt with
    /// the same parameters and buckets (and, for DimReduce state, after
    /// [`DistOpt::start_dimreduce`] with the same components); errors on any
    /// mismatch, leaving this DistOpt as it was.
    pub fn restore(&mut self, ckpt: &Checkpoint) -> Result<()> {
        let mismatch = |what: String| OptimError::StateMismatch(what);
        let buckets = ckpt.values.get("buckets").and_then(|v| v.as_u64());
        if buckets != Some(self.buckets.len() as u64) {
            return Err(mismatch(format!(
                "the checkpoint has {buckets:?} buckets, this DistOpt {}",
                self.buckets.len()
            )));
        }
        let counter = ckpt
            .values
            .get("partial_counter")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| mismatch("no partial_counter".into()))?;
        let mut residuals = Vec::with_capacity(self.residuals.len());
        for (b, current) in self.residuals.iter().enumerate() {
            let saved = ckpt.tensors.get(&format!("residual/{b}"));
            residuals.push(match (current, saved) {
                (None, None) => None,
                (Some(memory), Some(t)) if t.len() == memory.len() => {
                    let steps = ckpt
                        .values
                        .get(&format!("residual_steps/{b}"))
                        .and_then(|v| v.as_u64())
                        .ok_or_else(|| mismatch(format!("no residual_steps/{b}")))?;
                    Some(
                        ErrorFeedback::from_state(ErrorFeedbackState {
                            residual: t.to_vec::<f32>()?,
                            momentum: None,
                            steps,
                        })
                        .map_err(|e| mismatch(format!("residual {b}: {e}")))?,
                    )
                }
                _ => return Err(mismatch(format!("residual of bucket {b} does not match"))),
            });
        }
        let dimreduce = match (&self.dimreduce, ckpt.values.get("dimreduce/b")) {
            (None, None) => None,
            (Some(_), Some(_)) => Some(dimreduce_state(ckpt)?),
            (None, Some(_)) => {
                return Err(mismatch(
                    "the checkpoint holds DimReduce state: start_dimreduce first".into(),
                ));
            }
            (Some(_), None) => {
                return Err(mismatch("the checkpoint holds no DimReduce state".into()));
            }
        };
        // Checked against the components' dimensions before anything changes.
        let dimreduce = match (&self.dimreduce, dimreduce) {
            (Some(current), Some(state)) => {
                let mut restored = current.clone();
                restored
                    .restore(state)
                    .map_err(|e| mismatch(format!("DimReduce: {e}")))?;
                Some(restored)
            }
            _ => None,
        };
        self.optimizer.load_state(&ckpt.optimizer)?;
        if dimreduce.is_some() {
            self.dimreduce = dimreduce;
        }
        self.residuals = residuals;
        self.partial_counter = counter;
        Ok(())
    }

    /// Drops this step's gradients; buckets already launched complete with
    /// the other ranks (their results are discarded).
    fn abort_step(&mut self) {
        for handle in self.in_flight.drain(..) {
            // Waiting keeps the collectives paired with the other ranks.
            let _ = handle.wait();
        }
        self.grads.iter_mut().for_each(|g| *g = None);
    }
}

/// An averaged gradient: parameter index, value, whether it arrived averaged.
type ReducedGrad = (usize, Tensor, bool);

/// DimReduce's state as [`DistOpt::checkpoint`] stores it.
fn dimreduce_state(ckpt: &Checkpoint) -> Result<DimReduceState> {
    let mismatch = |what: &str| OptimError::StateMismatch(format!("DimReduce: {what}"));
    let floats = |key: &str| -> Result<Vec<f64>> {
        ckpt.values
            .get(key)
            .and_then(|v| v.as_array())
            .ok_or_else(|| mismatch(&format!("no {key}")))?
            .iter()
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| mismatch(&format!("{key} holds a non-number")))
            })
            .collect()
    };
    Ok(DimReduceState {
        b: floats("dimreduce/b")?,
        g_last: floats("dimreduce/g_last")?,
        s: floats("dimreduce/s")?,
        initialized: ckpt
            .values
            .get("dimreduce/initialized")
            .and_then(|v| v.as_bool())
            .ok_or_else(|| mismatch("no dimreduce/initialized"))?,
        momentum: ckpt
            .tensors
            .get("dimreduce/momentum")
            .ok_or_else(|| mismatch("no dimreduce/momentum"))?
            .to_vec::<f32>()?,
    })
}

/// What a bucket's job carries to the communication thread.
struct BucketJob<C: Communicator> {
    bucket: usize,
    mode: Mode,
    capacity: usize,
    residual: Option<ErrorFeedback>,
    combiner: Option<SharedCombiner<C>>,
    /// Which parameters some rank wrote, when the step's vote decided it.
    written: Option<Vec<bool>>,
}

impl<C: Communicator + 'static> BucketJob<C> {
    /// The written-anywhere vote, then the combination of the gradients some
    /// rank wrote.
    fn run(self, comm: &C, grads: Vec<Tensor>) -> gradwire_algos::Result<Reduced<BucketResult>> {
        reduce_bucket(self, comm, grads)
    }
}

/// A bucket's job on the communication thread: the written-anywhere vote,
/// then the combination of the gradients some rank wrote.
fn reduce_bucket<C: Communicator + 'static>(
    job: BucketJob<C>,
    comm: &C,
    grads: Vec<Tensor>,
) -> gradwire_algos::Result<Reduced<BucketResult>> {
    let BucketJob {
        bucket,
        mode,
        capacity,
        mut residual,
        combiner,
        written: decided,
    } = job;
    let combiner = &combiner;
    let world = comm.world_size();
    let mut traffic = Traffic::default();
    let written: Vec<bool> = match decided {
        Some(written) => written,
        None => {
            let mut votes: Vec<u8> = grads.iter().map(|g| u8::from(!g.is_zeroed())).collect();
            comm.all_reduce(&mut votes, ReduceOp::Max)?;
            traffic = Traffic::all_reduce(votes.len(), world);
            votes.iter().map(|&v| v != 0).collect()
        }
    };
    let lens: Vec<usize> = grads.iter().map(Tensor::len).collect();
    let mut live: Vec<Tensor> = grads
        .into_iter()
        .zip(&written)
        .filter(|(_, w)| **w)
        .map(|(g, _)| g)
        .collect();
    let mut averaged = matches!(mode, Mode::Half { .. });
    if !live.is_empty() {
        traffic += match mode {
            Mode::Custom | Mode::DeltaWeight => {
                let combined = run_combiner(combiner, comm, bucket, &mut live)?;
                averaged = combined.averaged;
                combined.traffic
            }
            Mode::Dense | Mode::Partial { .. } | Mode::DimReduce => {
                fused_all_reduce(comm, &mut live, ReduceOp::Sum, capacity)?
            }
            Mode::Half { precision, clip } => {
                let options = HalfOptions {
                    precision,
                    clip,
                    op: ReduceOp::Avg,
                };
                half_all_reduce(comm, &mut live, &options, capacity)?
            }
            Mode::Sparse { codec, .. } => match residual.as_mut() {
                None => sparse_all_reduce(comm, &mut live, &codec, None)?,
                Some(memory) if written.iter().all(|&w| w) => {
                    sparse_all_reduce(comm, &mut live, &codec, Some(memory))?
                }
                Some(memory) => {
                    // Only the written parameters take part: their part of the
                    // residual goes through the step, the rest stays as it is.
                    let mut ranges = Vec::new();
                    let mut offset = 0;
                    for (&n, &w) in lens.iter().zip(&written) {
                        if w {
                            ranges.push(offset..offset + n);
                        }
                        offset += n;
                    }
                    let full = memory.state();
                    let part: Vec<f32> = ranges
                        .iter()
                        .flat_map(|r| full.residual[r.clone()].iter().copied())
                        .collect();
                    let mut sub = ErrorFeedback::from_state(ErrorFeedbackState {
                        residual: part,
                        momentum: None,
                        steps: full.steps,
                    })?;
                    let t = sparse_all_reduce(comm, &mut live, &codec, Some(&mut sub))?;
                    let mut merged = full.residual;
                    let mut from = sub.residual().iter().copied();
                    for r in &ranges {
                        for slot in &mut merged[r.clone()] {
                            *slot = from.next().unwrap_or(0.0);
                        }
                    }
                    *memory = ErrorFeedback::from_state(ErrorFeedbackState {
                        residual: merged,
                        momentum: None,
                        steps: sub.steps(),
                    })?;
                    t
                }
            },
        };
    }
    Ok(Reduced {
        value: BucketResult {
            written,
            grads: live,
            residual,
            averaged,
        },
        traffic,
    })
}
