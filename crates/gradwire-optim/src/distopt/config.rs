//! DistOpt's settings ([`DistOptConfig`], the [`Mode`] that picks the
//! strategy, [`SkipVote`]) and what a step reports ([`StepStats`]).

use gradwire_algos::dimreduce::DimReduceStep;
use gradwire_algos::{DEFAULT_FUSION_CAPACITY, HalfPrecision, PowerSgdConfig, Traffic};
use gradwire_compress::{Quantizer, SparseCodec};
use std::time::Duration;

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
    /// Each bucket is combined by the [`Combiner`](super::Combiner) given to
    /// [`DistOpt::with_combiner`](super::DistOpt::with_combiner) (AdaSum by gradient, or any strategy of
    /// your own) instead of a built-in rule.
    Custom,
    /// Combine weight changes instead of gradients (Horovod's AdaSum default,
    /// MindSpore's `AdaSumByDeltaWeightWrapCell`): save `p0`, step the
    /// optimizer locally with this rank's gradient, `delta = p0 - p`, combine
    /// the deltas bucket by bucket with the [`Combiner`](super::Combiner), `p = p0 - combined`.
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
    /// DimReduce (MindSpore boost, SPEC §5): a quasi-Newton step in the PCA
    /// subspace with a line search replaces the optimizer; the gradients
    /// are averaged within the step (P sharded by parameter columns: 1.5
    /// times a dense step's bytes). Entered with
    /// [`DistOpt::start_dimreduce`](super::DistOpt::start_dimreduce) (usually after a first stage of another
    /// mode that recorded the trajectory); steps with
    /// [`DistOpt::finish_dimreduce`](super::DistOpt::finish_dimreduce), which takes the loss.
    DimReduce,
    /// PowerSGD (Vogels et al., NeurIPS 2019; DDP's PowerSGD hook): each
    /// matrix-shaped gradient travels as two rank-`r` factors (two
    /// all-reduces per bucket), with error feedback and a warm start;
    /// vectors and small matrices travel dense beside them. Dense until
    /// `start_step`. The result is an average.
    PowerSgd(PowerSgdConfig),
    /// Every entry in 1 bit ([`Quantizer::Sign`], EF-SignSGD) or 8 bits
    /// (QSGD, min-max uint8), both ways: a reduce-scatter and an all-gather
    /// of quantized chunks (DeepSpeed's compressed all-reduce, Bagua's
    /// ByteGrad), with worker and server error feedback when
    /// `error_feedback` (the 1-bit sign needs it). The result is an average.
    Quantized {
        /// How entries are quantized.
        quantizer: Quantizer,
        /// Keep what quantization lost, on both sides, for later steps.
        error_feedback: bool,
        /// Send a local momentum `m = mu m + g` instead of the gradients
        /// (dist-EF-SGDM): the combined gradient is then the average
        /// momentum, for an optimizer without momentum of its own. What
        /// keeps momentum SGD accurate with the 1-bit sign.
        momentum: Option<f32>,
    },
    /// 1-bit Adam's exchange (with [`crate::OneBitAdam`], made by
    /// [`crate::OneBitAdamConfig::mode`]): dense averages of the gradients
    /// until `freeze_step`; from then on each rank folds its gradient into
    /// Adam's first moment (`beta1`), and the moments are averaged through
    /// the 1-bit all-reduce with error feedback on both sides, every rank
    /// continuing from the average, which is what the optimizer receives.
    OneBitAdam {
        /// Adam's `beta1`, constant.
        beta1: f32,
        /// The first step of the compressed stage.
        freeze_step: u64,
    },
}

impl Mode {
    /// Whether the mode combines gradients, bucket by bucket (every mode but
    /// those that step locally first, `Partial` and `DeltaWeight`, and
    /// `DimReduce`, which steps the parameters itself).
    pub fn combines_gradients(&self) -> bool {
        !matches!(
            self,
            Mode::Partial { .. } | Mode::DeltaWeight | Mode::DimReduce
        )
    }
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
    /// Time the strategies spent combining the buckets (their codecs and
    /// their collectives, summed over buckets; on the communication thread
    /// when the buckets are asynchronous, so it overlaps the caller's work).
    pub combine: Duration,
    /// Parameters updated.
    pub updated: usize,
    /// Parameters skipped because no rank wrote their gradient.
    pub skipped: usize,
    /// Whether the whole step was skipped (a non-finite gradient on some
    /// rank, with `skip_non_finite`).
    pub non_finite: bool,
    /// DimReduce mode: the accepted step size and the loss there.
    pub dimreduce: Option<DimReduceStep>,
}
