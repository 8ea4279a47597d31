//! DistOpt's settings ([`DistOptConfig`], [`SkipVote`]) and what a step
//! reports ([`StepStats`]).

use super::StrategyConfig;
use gradwire_algos::dimreduce::DimReduceStep;
use gradwire_algos::{DEFAULT_FUSION_CAPACITY, Traffic};
use std::time::Duration;

/// SINGA's default fusion threshold, in elements.
pub const DEFAULT_FUSION_THRESHOLD: usize = 2_097_152;

/// The settings of every front end (DistOpt, LocalSteps, DimReduceOpt) and GradSync.
#[derive(Debug, Clone, PartialEq)]
pub struct DistOptConfig {
    /// How the ranks' work is combined: a strategy of the registry.
    pub strategy: StrategyConfig,
    /// Elements above which a bucket is closed (SINGA: 2,097,152).
    pub fusion_threshold: usize,
    /// The most elements a bucket may hold (SINGA's `buffSize`: 4,194,304).
    pub capacity: usize,
    /// Ranks per node, for [`DistOpt::local_rank`](super::DistOpt::local_rank) (default: all ranks).
    pub ranks_per_node: Option<usize>,
    /// Scale the averaged gradients so their global L2 norm is at most this.
    pub clip_global_norm: Option<f64>,
    /// Skip the whole step, on every rank alike, when a gradient holds a NaN
    /// or an infinity on any rank (AMP's `found_inf`): parameters, optimizer
    /// state, residuals and counters stay as they were, in every mode.
    /// Without it such a step is an [`OptimError::Fault`](crate::OptimError::Fault) of kind
    /// [`FaultKind::NonFinite`](gradwire_algos::FaultKind::NonFinite) on every rank (nothing changed either).
    pub skip_non_finite: bool,
    /// When ranks agree on which gradients were written.
    pub vote: SkipVote,
    /// Micro-batches per step (gradient accumulation; Horovod's
    /// `backward_passes_per_step`, DeepSpeed's
    /// `gradient_accumulation_steps`): every `finish` but the k-th only adds
    /// the pushed gradients into per-parameter sums, the k-th exchanges
    /// their mean (sum / k) once and steps. 1 (the default): every
    /// `finish` is a step. 0 is refused; DimReduce takes 1.
    pub accumulate: u32,
    /// The order of the parameters that the buckets follow (gradient loop).
    pub bucket_order: BucketOrder,
}

/// The order of the parameters the buckets are planned over (SINGA's
/// rule: consecutive parameters until the fusion threshold).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BucketOrder {
    /// The order rank 0 pushed its gradients in during the first step
    /// (PyTorch DDP's rebuilt buckets): the first step sends every bucket
    /// in `finish`, after one broadcast of the order; later steps overlap
    /// the buckets with backward in the order backward really produces the
    /// gradients, whatever order the parameters were declared in.
    #[default]
    Pushed,
    /// The declaration order, fixed (the user declared the parameters in
    /// backward order).
    Declared,
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
            strategy: StrategyConfig::Dense,
            fusion_threshold: DEFAULT_FUSION_THRESHOLD,
            capacity: DEFAULT_FUSION_CAPACITY,
            ranks_per_node: None,
            clip_global_norm: None,
            skip_non_finite: false,
            vote: SkipVote::PerBucket,
            accumulate: 1,
            bucket_order: BucketOrder::Pushed,
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
    /// Time the strategies spent combining the buckets (their codecs and
    /// their collectives, summed over buckets; on the communication thread
    /// when the buckets are asynchronous, so it overlaps the caller's work).
    pub combine: Duration,
    /// Time in the step's own collectives outside the combining: the vote
    /// of a per-step skip vote, the agreement on the step's outcome, waits
    /// for the last rank included. The time in calls less this is what
    /// the combining spent communicating (a profile's codec time is the
    /// rest of `combine`).
    pub coordination: Duration,
    /// Parameters updated.
    pub updated: usize,
    /// Parameters skipped because no rank wrote their gradient.
    pub skipped: usize,
    /// Whether the whole step was skipped (a non-finite gradient on some
    /// rank, with `skip_non_finite`).
    pub non_finite: bool,
    /// DimReduce mode: the accepted step size and the loss there.
    pub dimreduce: Option<DimReduceStep>,
    /// Whether this `finish` ended a micro-batch that only accumulated
    /// ([`DistOptConfig::accumulate`]): nothing was exchanged or updated.
    pub accumulated: bool,
    /// The rank the others waited for at this step's exchange, the same on
    /// every rank (gradient modes with a vote; `None` with one rank, or
    /// when every rank took the same time).
    pub straggler: Option<StepStraggler>,
}

impl StepStats {
    /// Runs `call`, one of the step's own collectives outside the
    /// combining, and adds its time to [`StepStats::coordination`].
    pub(crate) fn coordinate<T>(&mut self, call: impl FnOnce() -> T) -> T {
        let started = std::time::Instant::now();
        let result = call();
        self.coordination += started.elapsed();
        result
    }

    /// Adds `step`'s counts into these, for a total over several steps
    /// (a joined rank's steps, an epoch): buckets, traffic, waiting,
    /// combining and coordinating time, parameters updated. The per-step flags and
    /// reports (skips, DimReduce, straggler) are left as they are.
    pub fn add_step(&mut self, step: &StepStats) {
        self.buckets += step.buckets;
        self.traffic += step.traffic;
        self.wait += step.wait;
        self.combine += step.combine;
        self.coordination += step.coordination;
        self.updated += step.updated;
    }
}

/// The rank that arrived last at a step's exchange: the one that took
/// longest since the previous step ended (compute, data loading, whatever
/// the caller did in between), and how long the first to arrive waited for
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepStraggler {
    /// The rank.
    pub rank: usize,
    /// How much longer it took than the rank that took least.
    pub late: Duration,
}
