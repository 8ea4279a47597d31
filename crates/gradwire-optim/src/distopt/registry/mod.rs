//! The strategy registry: [`StrategyConfig`], the one value that names a
//! strategy and its settings. It parses and prints itself (the names the
//! CLI takes: `topk:0.01`, `powersgd:4:start=1`, `adasum-delta:group=2`),
//! validates itself, is built by the engine into each bucket's
//! [`Strategy`](super::Strategy), tells the cost model what it sends
//! ([`StrategyConfig::cost_spec`]) and lists example configurations
//! ([`StrategyConfig::examples`]) that the CLI, the cost model, the fault
//! matrix and the benches walk. Adding a strategy is its module, a variant
//! here, its [`REGISTRY`] entry and its arms in this module (`text.rs` holds the printed form:
//! `Display`, `FromStr`, serde).
//!
//! The printed form is `name[:value][:key=value|:flag]...`: a setting is
//! printed only when it differs from the default the parser fills in, so
//! `s.to_string().parse() == Ok(s)` for every value but
//! [`StrategyConfig::Custom`] (a user's own strategy, which has no name to
//! parse).

pub use cost::CostAssumptions;
pub use outer::{
    DILOCO_LR, DILOCO_MOMENTUM, DiLoCoConfig, OUTER_ADAM_LR, OuterCodec, OuterOptimizer, WarmupBy,
};

use gradwire_algos::{HalfPrecision, PowerSgdConfig};
use gradwire_compress::{Quantizer, SparseCodec};

/// How what the ranks computed is combined: a gradient strategy (the
/// gradients combined bucket by bucket), a local-step strategy (each rank
/// steps first; parameters or weight changes are combined), or DimReduce;
/// each runs on the front end of its [`TrainingLoop`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StrategyConfig {
    /// `dense`: f32 sum, then divided by the world size (SINGA
    /// `backward_and_update`).
    Dense,
    /// `fp16` / `bf16`: half precision on the wire (SINGA
    /// `backward_and_update_half`), averaged in f32 before the one
    /// rounding, so it cannot overflow as SINGA's fp16 sum does; with
    /// `clip`, gradients are clamped to [-clip, clip] first.
    Half {
        /// The wire precision.
        precision: HalfPrecision,
        /// The clamp, if any.
        clip: Option<f32>,
    },
    /// `threshold:T`, `topk:R`, `sampled-topk:R`, `randomk:R`: each bucket
    /// sends only what `codec` selects (SINGA `backward_and_sparse_update`),
    /// with an error-feedback residual per bucket when `error_feedback`; a
    /// bucket that is not sparse enough is sent dense. The sum is divided
    /// by the world size.
    Sparse {
        /// Which entries to send.
        codec: SparseCodec,
        /// Keep what is not sent for later steps (SINGA's `corr`).
        error_feedback: bool,
    },
    /// `powersgd:R`: PowerSGD (Vogels et al., NeurIPS 2019; DDP's PowerSGD
    /// hook): each matrix-shaped gradient travels as two rank-`R` factors
    /// (two all-reduces per bucket), with error feedback and a warm start;
    /// vectors and small matrices travel dense beside them. Dense until
    /// `start_step`. The result is an average.
    PowerSgd(PowerSgdConfig),
    /// `onebit`, `qsgd`, `e3m0`, `uint8`: every entry in 1 bit
    /// ([`Quantizer::Sign`], EF-SignSGD), 4 bits (E3M0, QSGD up to 7
    /// levels) or 8 bits (QSGD, min-max uint8),
    /// both ways: a reduce-scatter and an all-gather of quantized chunks
    /// (DeepSpeed's compressed all-reduce, Bagua's ByteGrad), with worker
    /// and server error feedback when `error_feedback` (the 1-bit sign
    /// needs it). The result is an average.
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
    /// `onebit-adam`: 1-bit Adam's exchange (with [`crate::OneBitAdam`],
    /// made by [`crate::OneBitAdamConfig::strategy`]): dense averages of the
    /// gradients until `freeze_step`; from then on each rank folds its
    /// gradient into Adam's first moment (`beta1`), and the moments are
    /// averaged through the 1-bit all-reduce with error feedback on both
    /// sides, every rank continuing from the average, which is what the
    /// optimizer receives.
    OneBitAdam {
        /// Adam's `beta1`, constant.
        beta1: f32,
        /// The first step of the compressed stage.
        freeze_step: u64,
    },
    /// `adasum-grad`: the gradients combined by AdaSum (orthogonal
    /// gradients add, identical ones average), which the engine prepares on
    /// its communicator: flat, or with `group`, averaged within groups of
    /// that many consecutive ranks (a node) first, then AdaSum across
    /// groups.
    AdaSum {
        /// Ranks per group of the hierarchical form.
        group: Option<usize>,
    },
    /// Each bucket combined by the [`Strategy`](super::Strategy) given to
    /// [`DistOpt::with_strategy`](super::DistOpt::with_strategy): a
    /// strategy of your own. It has no printed name to parse.
    Custom,
    /// `adasum-delta`: weight changes combined instead of gradients
    /// (Horovod's AdaSum default, MindSpore's
    /// `AdaSumByDeltaWeightWrapCell`): save `p0`, step the optimizer
    /// locally with this rank's gradient, `delta = p0 - p`, combine the
    /// deltas bucket by bucket with AdaSum (`group` as in
    /// [`StrategyConfig::AdaSum`]) or the strategy given to
    /// [`LocalSteps::with_strategy`](super::LocalSteps::with_strategy),
    /// `p = p0 - combined`.
    DeltaWeight {
        /// Ranks per group of AdaSum's hierarchical form.
        group: Option<usize>,
    },
    /// `partial`: local SGD with round-robin partial averaging (SINGA
    /// `backward_and_partial_update`): every parameter is updated with its
    /// own rank's gradient, then the parameters of one bucket (partition
    /// `counter mod K`) are averaged across ranks, and with `average_state`
    /// (`partial:state`) their optimizer buffers too (SINGA keeps them
    /// local).
    Partial {
        /// Also average the partition's optimizer buffers.
        average_state: bool,
    },
    /// `dimreduce`: DimReduce (MindSpore boost): a quasi-Newton step in the
    /// PCA subspace with a line search replaces the optimizer; the
    /// gradients are averaged within the step (P sharded by parameter
    /// columns: 1.5 times a dense step's bytes). Entered with
    /// [`DimReduceOpt::start`](super::DimReduceOpt::start) after a first
    /// stage that recorded the trajectory (dense:
    /// [`StrategyConfig::first_stage`]); steps with
    /// [`DimReduceOpt::finish_dimreduce`](super::DimReduceOpt::finish_dimreduce),
    /// which takes the loss.
    DimReduce,
    /// `diloco:H`: DiLoCo (Douillard et al., 2023), a loop of local steps:
    /// every rank takes H inner steps with its own optimizer, then the
    /// pseudo-gradients `θ_global - θ_local` are averaged through the
    /// codec (any gradient strategy that averages: `:fp16`, `:uint8`,
    /// `:topk=R`, `:powersgd=R`, ...) and the outer optimizer (SGD with
    /// Nesterov momentum, lr 0.7, momentum 0.9; or `:adam`) applies the
    /// average to `θ_global`, from which every rank goes on.
    DiLoCo(DiLoCoConfig),
}

/// The training loops, one front end each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrainingLoop {
    /// The gradients combined, bucket by bucket, then the optimizer steps:
    /// [`DistOpt`](crate::DistOpt).
    Gradients,
    /// Each rank steps with its own gradients, then the parameters (partial
    /// averaging) or the weight changes (delta weight; DiLoCo every H
    /// steps) are combined:
    /// [`LocalSteps`](crate::LocalSteps).
    LocalSteps,
    /// A dense first stage, then DimReduce's own update:
    /// [`DimReduceOpt`](crate::DimReduceOpt).
    DimReduce,
}

impl TrainingLoop {
    /// The name of the front end that runs this loop.
    pub fn front_end(self) -> &'static str {
        match self {
            TrainingLoop::Gradients => "DistOpt",
            TrainingLoop::LocalSteps => "LocalSteps",
            TrainingLoop::DimReduce => "DimReduceOpt",
        }
    }
}

/// QSGD's default levels per sign: 127, every entry in 8 bits.
pub const QSGD_LEVELS: u8 = 127;

/// 1-bit Adam's default freeze step.
pub const ONEBIT_ADAM_FREEZE_STEP: u64 = 100;

/// Adam's default `beta1`, 1-bit Adam's too.
pub const ONEBIT_ADAM_BETA1: f32 = 0.9;

/// Why a strategy's text or settings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StrategyError {
    /// The name is none of the registry's.
    #[error("unknown strategy {name:?} (one of: {known})")]
    UnknownName {
        /// The name given.
        name: String,
        /// The registry's names, comma-separated.
        known: String,
    },
    /// A part after the name is not one this strategy takes.
    #[error("{text:?}: {reason}")]
    BadPart {
        /// The whole text.
        text: String,
        /// What is wrong with which part.
        reason: String,
    },
    /// The strategy runs in another training loop than the front end it
    /// was given to takes.
    #[error("{strategy} runs on {runs_on}, not {given_to}")]
    WrongLoop {
        /// The strategy's printed form.
        strategy: String,
        /// The front end that runs it.
        runs_on: &'static str,
        /// The front end it was given to.
        given_to: &'static str,
    },
    /// The strategy averages the optimizer's state (`partial:state`), and
    /// the optimizer it was given keeps its state private (candle's own).
    #[error("{strategy} averages the optimizer's state, which this optimizer keeps private")]
    PrivateState {
        /// The strategy's printed form.
        strategy: String,
    },
    /// A setting is out of its domain.
    #[error("{strategy}: {reason}")]
    OutOfRange {
        /// The strategy's name.
        strategy: &'static str,
        /// Which setting and why.
        reason: String,
    },
}

/// The registry: every strategy that has a name, each with its settings at
/// their defaults (the sparse ratios and the threshold at 1 %, PowerSGD at
/// rank 2 from step 10, 1-bit Adam frozen at step 100), in the order of the
/// help text. The names, the parser's starting points and the help derive
/// from it.
pub const REGISTRY: [StrategyConfig; 19] = [
    StrategyConfig::Dense,
    StrategyConfig::Half {
        precision: HalfPrecision::F16,
        clip: None,
    },
    StrategyConfig::Half {
        precision: HalfPrecision::BF16,
        clip: None,
    },
    StrategyConfig::Sparse {
        codec: SparseCodec::Threshold(0.01),
        error_feedback: true,
    },
    StrategyConfig::Sparse {
        codec: SparseCodec::TopK(0.01),
        error_feedback: true,
    },
    StrategyConfig::Sparse {
        codec: SparseCodec::SampledTopK(0.01),
        error_feedback: true,
    },
    StrategyConfig::Sparse {
        codec: SparseCodec::RandomK {
            ratio: 0.01,
            seed: 0,
        },
        error_feedback: true,
    },
    StrategyConfig::Partial {
        average_state: false,
    },
    StrategyConfig::AdaSum { group: None },
    StrategyConfig::DeltaWeight { group: None },
    StrategyConfig::DimReduce,
    StrategyConfig::PowerSgd(PowerSgdConfig::DEFAULT),
    StrategyConfig::Quantized {
        quantizer: Quantizer::Sign,
        error_feedback: true,
        momentum: None,
    },
    StrategyConfig::Quantized {
        quantizer: Quantizer::Qsgd {
            levels: QSGD_LEVELS,
            seed: 0,
            norm: gradwire_compress::QsgdNorm::L2,
        },
        error_feedback: true,
        momentum: None,
    },
    StrategyConfig::Quantized {
        quantizer: Quantizer::E3m0 { seed: 0 },
        error_feedback: true,
        momentum: None,
    },
    StrategyConfig::Quantized {
        quantizer: Quantizer::MinMaxU8,
        error_feedback: true,
        momentum: None,
    },
    StrategyConfig::OneBitAdam {
        beta1: ONEBIT_ADAM_BETA1,
        freeze_step: ONEBIT_ADAM_FREEZE_STEP,
    },
    StrategyConfig::DiLoCo(DiLoCoConfig::DEFAULT),
    StrategyConfig::DiLoCo(DiLoCoConfig::STREAMING),
];

impl StrategyConfig {
    /// The registry name (`custom` for a user's own strategy).
    pub fn name(&self) -> &'static str {
        match self {
            StrategyConfig::Dense => "dense",
            StrategyConfig::Half {
                precision: HalfPrecision::F16,
                ..
            } => "fp16",
            StrategyConfig::Half {
                precision: HalfPrecision::BF16,
                ..
            } => "bf16",
            StrategyConfig::Sparse { codec, .. } => match codec {
                SparseCodec::Threshold(_) => "threshold",
                SparseCodec::TopK(_) => "topk",
                SparseCodec::SampledTopK(_) => "sampled-topk",
                SparseCodec::RandomK { .. } => "randomk",
            },
            StrategyConfig::PowerSgd(_) => "powersgd",
            StrategyConfig::Quantized { quantizer, .. } => match quantizer {
                Quantizer::Sign => "onebit",
                Quantizer::Qsgd { .. } => "qsgd",
                Quantizer::E3m0 { .. } => "e3m0",
                Quantizer::MinMaxU8 => "uint8",
            },
            StrategyConfig::OneBitAdam { .. } => "onebit-adam",
            StrategyConfig::AdaSum { .. } => "adasum-grad",
            StrategyConfig::Custom => "custom",
            StrategyConfig::DeltaWeight { .. } => "adasum-delta",
            StrategyConfig::Partial { .. } => "partial",
            StrategyConfig::DimReduce => "dimreduce",
            StrategyConfig::DiLoCo(config) if config.is_streaming() => "streaming-diloco",
            StrategyConfig::DiLoCo(_) => "diloco",
        }
    }

    /// The strategy of `name` with every setting at its default (its entry
    /// of [`REGISTRY`]).
    pub fn default_of(name: &str) -> Result<StrategyConfig, StrategyError> {
        REGISTRY
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| StrategyError::UnknownName {
                name: name.to_string(),
                known: REGISTRY.map(|s| s.name()).join(", "),
            })
    }

    /// The forms every registered strategy's text takes, one line each
    /// (what `gradwire train --help` prints for `-s`).
    pub fn forms() -> String {
        let mut forms: Vec<&str> = Vec::new();
        for form in REGISTRY.iter().map(StrategyConfig::usage) {
            if !forms.contains(&form) {
                forms.push(form);
            }
        }
        forms.join("\n")
    }

    /// One example of every registered strategy, with settings that make
    /// each one compress even a model of a few small tensors (top-k 30 %,
    /// PowerSGD at rank 1 from the second step on any matrix, 1-bit Adam
    /// frozen at step 2, DiLoCo after a warm-up step by gradients and
    /// Streaming DiLoCo after one by parameters): what the registry
    /// test, the fault matrix and
    /// `gradwire bench strategies` walk. [`StrategyConfig::Custom`] is not
    /// among them. (Every one of them parses: the registry's test checks
    /// that there is one per registered name.)
    pub fn examples() -> Vec<StrategyConfig> {
        [
            "dense",
            "fp16",
            "bf16:clip=1",
            "threshold:0.05:no-ef",
            "topk:0.3",
            "sampled-topk:0.3",
            "randomk:0.3:no-ef",
            "partial:state",
            "adasum-grad",
            "adasum-delta",
            "dimreduce",
            "powersgd:1:start=1:min-rate=1",
            "onebit:momentum=0.9",
            "qsgd",
            "e3m0",
            "uint8",
            "onebit-adam:freeze=2",
            "diloco:2:uint8:grad-warmup=1",
            "streaming-diloco:4:2:tau=1:uint8:warmup=1",
        ]
        .into_iter()
        .filter_map(|text| text.parse::<StrategyConfig>().ok())
        .collect()
    }

    /// The training loop the strategy runs in, and so the front end that
    /// takes it: the gradients combined bucket by bucket (every strategy
    /// but the three below), a local step first (`Partial`,
    /// `DeltaWeight`), or DimReduce, which steps the parameters itself.
    pub fn training_loop(&self) -> TrainingLoop {
        match self {
            StrategyConfig::Partial { .. }
            | StrategyConfig::DeltaWeight { .. }
            | StrategyConfig::DiLoCo(_) => TrainingLoop::LocalSteps,
            StrategyConfig::DimReduce => TrainingLoop::DimReduce,
            _ => TrainingLoop::Gradients,
        }
    }

    /// The strategy the engine starts with: DimReduce is entered with
    /// [`DimReduceOpt::start`](crate::DimReduceOpt::start) after a first
    /// stage that records the trajectory, which runs dense; every other
    /// strategy is its own first stage.
    pub fn first_stage(self) -> StrategyConfig {
        match self {
            StrategyConfig::DimReduce => StrategyConfig::Dense,
            other => other,
        }
    }

    /// Whether the strategy keeps what it did not send for later steps.
    pub fn error_feedback(&self) -> bool {
        match self {
            StrategyConfig::Sparse { error_feedback, .. }
            | StrategyConfig::Quantized { error_feedback, .. } => *error_feedback,
            StrategyConfig::PowerSgd(config) => config.error_feedback,
            StrategyConfig::OneBitAdam { .. } => true,
            StrategyConfig::DiLoCo(config) => config.codec.strategy().error_feedback(),
            _ => false,
        }
    }

    /// The same strategy drawing from `seed` wherever it draws at random
    /// (random-k's indices, QSGD's and E3M0's rounding, PowerSGD's fresh `Q`s): the
    /// run's seed, which the printed form leaves out when it is 0
    /// (PowerSGD's: its default).
    pub fn with_seed(self, seed: u64) -> StrategyConfig {
        match self {
            StrategyConfig::Sparse {
                codec: SparseCodec::RandomK { ratio, .. },
                error_feedback,
            } => StrategyConfig::Sparse {
                codec: SparseCodec::RandomK { ratio, seed },
                error_feedback,
            },
            StrategyConfig::Quantized {
                quantizer,
                error_feedback,
                momentum,
            } => StrategyConfig::Quantized {
                quantizer: quantizer.with_seed(seed),
                error_feedback,
                momentum,
            },
            StrategyConfig::PowerSgd(config) => {
                StrategyConfig::PowerSgd(PowerSgdConfig { seed, ..config })
            }
            other => other,
        }
    }

    /// Checks every setting: ratios in (0, 1], a finite threshold of at
    /// least 0, a positive finite clip, PowerSGD's and the quantizers' own checks, momenta and
    /// `beta1` in [0, 1), groups of at least one rank. (That a group
    /// divides the world size is checked where the world is known, when
    /// the engine builds AdaSum.)
    pub fn validate(&self) -> Result<(), StrategyError> {
        let strategy = self.name();
        let bad = |reason: String| Err(StrategyError::OutOfRange { strategy, reason });
        match *self {
            StrategyConfig::Half {
                clip: Some(clip), ..
            } if !(clip.is_finite() && clip > 0.0) => {
                bad(format!("the clip must be positive and finite, got {clip}"))
            }
            StrategyConfig::Sparse { codec, .. } => match codec {
                SparseCodec::Threshold(t) if !(t.is_finite() && t >= 0.0) => bad(format!(
                    "the threshold must be finite and not negative, got {t}"
                )),
                SparseCodec::TopK(r)
                | SparseCodec::SampledTopK(r)
                | SparseCodec::RandomK { ratio: r, .. }
                    if !(r > 0.0 && r <= 1.0) =>
                {
                    bad(format!("the ratio must be in (0, 1], got {r}"))
                }
                _ => Ok(()),
            },
            StrategyConfig::PowerSgd(config) => config.validate().or_else(|e| bad(e.to_string())),
            StrategyConfig::Quantized {
                quantizer,
                momentum,
                ..
            } => {
                if let Err(e) = quantizer.validate() {
                    return bad(e.to_string());
                }
                match momentum {
                    Some(mu) if !(0.0..1.0).contains(&mu) => {
                        bad(format!("the momentum must be in [0, 1), got {mu}"))
                    }
                    _ => Ok(()),
                }
            }
            StrategyConfig::OneBitAdam { beta1, .. } if !(0.0..1.0).contains(&beta1) => {
                bad(format!("beta1 must be in [0, 1), got {beta1}"))
            }
            StrategyConfig::AdaSum { group: Some(0) }
            | StrategyConfig::DeltaWeight { group: Some(0) } => {
                bad("a group must hold at least one rank".into())
            }
            StrategyConfig::DiLoCo(config) => config.validate().or_else(bad),
            _ => Ok(()),
        }
    }
}

impl StrategyConfig {
    /// How a DistOpt checkpoint records the strategy (its value
    /// `distopt/mode`, which `restore` compares): the first format's,
    /// which named AdaSum by gradient `Custom` and the weight-change
    /// strategy `DeltaWeight` (with no group), kept so that its
    /// checkpoints still load.
    pub(crate) fn checkpoint_label(&self) -> String {
        match self {
            StrategyConfig::AdaSum { group: None } => "Custom".into(),
            StrategyConfig::DeltaWeight { group: None } => "DeltaWeight".into(),
            other => format!("{other:?}"),
        }
    }
}

mod cost;
mod outer;
mod text;

#[cfg(test)]
mod tests;
