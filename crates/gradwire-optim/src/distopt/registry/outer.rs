//! DiLoCo's settings (`diloco:H[:CODEC][:warmup=N|:grad-warmup=N][:adam][:lr=LR][:momentum=M]`): how
//! often the workers synchronise, what carries the pseudo-gradient, and the
//! outer optimizer that applies it to the global parameters
//! (`../outer.rs` runs the loop).

use super::StrategyConfig;
use gradwire_algos::{HalfPrecision, PowerSgdConfig};
use gradwire_compress::{QsgdNorm, Quantizer, SparseCodec};

/// What carries DiLoCo's pseudo-gradient `θ_global - θ_local` across the
/// ranks: one of the gradient strategies that average, with error feedback
/// where the codec is biased (top-k, the quantizers, PowerSGD), its
/// residual kept from round to round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OuterCodec {
    /// f32, summed in rank order.
    Dense,
    /// f16 or bf16 on the wire, averaged in f32.
    Half(HalfPrecision),
    /// The largest entries by magnitude, this share of them.
    TopK(f64),
    /// 1-bit sign, QSGD (4 bits an entry up to 7 levels: `qsgd=7`), E3M0
    /// (Streaming DiLoCo's 4-bit float pseudo-gradients) or min-max uint8,
    /// both ways.
    Quantized(Quantizer),
    /// PowerSGD's low-rank factors of this rank, from the first round.
    PowerSgd(usize),
}

impl OuterCodec {
    /// The gradient strategy that carries the pseudo-gradient.
    pub fn strategy(self) -> StrategyConfig {
        match self {
            OuterCodec::Dense => StrategyConfig::Dense,
            OuterCodec::Half(precision) => StrategyConfig::Half {
                precision,
                clip: None,
            },
            OuterCodec::TopK(ratio) => StrategyConfig::Sparse {
                codec: SparseCodec::TopK(ratio),
                error_feedback: true,
            },
            OuterCodec::Quantized(quantizer) => StrategyConfig::Quantized {
                quantizer,
                error_feedback: true,
                momentum: None,
            },
            OuterCodec::PowerSgd(rank) => StrategyConfig::PowerSgd(PowerSgdConfig {
                rank,
                start_step: 0,
                ..PowerSgdConfig::DEFAULT
            }),
        }
    }

    /// The codec's part of the printed form (`None` for dense, the default).
    pub(super) fn text(self) -> Option<String> {
        match self {
            OuterCodec::Dense => None,
            OuterCodec::Half(HalfPrecision::F16) => Some("fp16".into()),
            OuterCodec::Half(HalfPrecision::BF16) => Some("bf16".into()),
            OuterCodec::TopK(ratio) => Some(format!("topk={ratio}")),
            OuterCodec::Quantized(Quantizer::Sign) => Some("onebit".into()),
            OuterCodec::Quantized(Quantizer::MinMaxU8) => Some("uint8".into()),
            OuterCodec::Quantized(Quantizer::E3m0 { .. }) => Some("e3m0".into()),
            OuterCodec::Quantized(Quantizer::Qsgd { levels, norm, .. }) => {
                let mut text = String::from("qsgd");
                if levels != super::QSGD_LEVELS {
                    text += &format!("={levels}");
                }
                if norm == QsgdNorm::Max {
                    text += ":max-norm";
                }
                Some(text)
            }
            OuterCodec::PowerSgd(rank) => Some(format!("powersgd={rank}")),
        }
    }

    /// The codec a part of the printed form names, if it names one.
    pub(super) fn parse(key: &str, value: Option<&str>) -> Option<Result<OuterCodec, String>> {
        let number = |what: &str| -> Result<f64, String> {
            value
                .ok_or_else(|| format!("{key} takes ={what}"))?
                .parse::<f64>()
                .map_err(|_| format!("{value:?} is not a number ({what})"))
        };
        Some(match (key, value) {
            ("dense", None) => Ok(OuterCodec::Dense),
            ("fp16", None) => Ok(OuterCodec::Half(HalfPrecision::F16)),
            ("bf16", None) => Ok(OuterCodec::Half(HalfPrecision::BF16)),
            ("onebit", None) => Ok(OuterCodec::Quantized(Quantizer::Sign)),
            ("uint8", None) => Ok(OuterCodec::Quantized(Quantizer::MinMaxU8)),
            ("e3m0", None) => Ok(OuterCodec::Quantized(Quantizer::E3m0 { seed: 0 })),
            // The levels' range is the codec's validation.
            ("qsgd", levels) => levels
                .map_or(Ok(super::QSGD_LEVELS), |v| {
                    v.parse::<u8>()
                        .map_err(|_| format!("{v:?} is not a number of QSGD levels"))
                })
                .map(|levels| {
                    OuterCodec::Quantized(Quantizer::Qsgd {
                        levels,
                        seed: 0,
                        norm: QsgdNorm::L2,
                    })
                }),
            ("topk", Some(_)) => number("the ratio").map(OuterCodec::TopK),
            ("powersgd", Some(v)) => v
                .parse::<usize>()
                .map(OuterCodec::PowerSgd)
                .map_err(|_| format!("{v:?} is not a rank")),
            _ => return None,
        })
    }
}

/// The outer optimizer, which applies the averaged pseudo-gradient to the
/// global parameters (its state the same on every rank).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OuterOptimizer {
    /// SGD with Nesterov momentum, as PyTorch's: `b = μ b + Δ`,
    /// `θ -= lr (Δ + μ b)`. DiLoCo's: lr 0.7, μ 0.9.
    Nesterov {
        /// The outer learning rate.
        lr: f32,
        /// The momentum μ.
        momentum: f32,
    },
    /// Adam (β₁ 0.9, β₂ 0.999, ε 1e-8, bias-corrected) with this learning
    /// rate.
    Adam {
        /// The outer learning rate.
        lr: f32,
    },
}

/// DiLoCo's outer learning rate.
pub const DILOCO_LR: f32 = 0.7;
/// DiLoCo's outer momentum, for rounds of many inner steps: with it a step
/// can reach `lr / (1 - μ)` = 7 times the mean pseudo-gradient, which
/// overshoots with short rounds (on the README's transformer, H = 4 ends
/// far behind with 0.9 and ahead of plain averaging with 0.5).
pub const DILOCO_MOMENTUM: f32 = 0.9;
/// The outer Adam's default learning rate.
pub const OUTER_ADAM_LR: f32 = 1e-3;

/// DiLoCo (Douillard et al., 2023): every worker takes `sync_every` inner
/// steps with its own optimizer from the global parameters, then the
/// pseudo-gradients `θ_global - θ_local` are averaged through `codec` and
/// the outer optimizer applies the average to `θ_global`, from which every
/// worker goes on.
///
/// Streaming DiLoCo (Douillard et al., 2025) splits the buckets into
/// `fragments` (contiguous, as even in elements as whole tensors allow:
/// `gradwire_algos::cost::fragment_ranges`; the buckets planned inside
/// each) synchronised one every `H / F` inner steps, each every H steps with its
/// own global values; a fragment's exchange runs on the communication
/// thread while `delay` more inner steps go on, then the fragment is merged
/// (`θ_local = α θ_local + (1 - α) θ_global`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiLoCoConfig {
    /// H: the inner steps between two synchronisations of a fragment.
    pub sync_every: u32,
    /// F: the fragments (1: every bucket at once, DiLoCo).
    pub fragments: u32,
    /// τ: the inner steps a fragment's exchange overlaps before it is
    /// merged, below `H / F` (0: merged at once).
    pub delay: u32,
    /// α: the weight of the local values at a merge, in [0, 1] (0: the
    /// global values).
    pub alpha: f32,
    /// What carries the pseudo-gradient.
    pub codec: OuterCodec,
    /// What applies it.
    pub outer: OuterOptimizer,
    /// The first `warmup` rounds are of one inner step each (in Streaming
    /// DiLoCo every fragment at once; its stagger starts after them),
    /// combined as `warmup_by` says, before the outer optimizer's first
    /// step (whose state starts after them). Each of its steps is an
    /// exchange through the codec. On the README's transformer 64 of 320
    /// steps took DiLoCo's loss from 5.7 % above synchronous training's
    /// to 2.3 % by parameters and 1.4 % by gradients, at 4 times the
    /// bytes. 0: none.
    pub warmup: u32,
    /// What the warm-up's steps average.
    pub warmup_by: WarmupBy,
}

/// What DiLoCo's warm-up steps ([`DiLoCoConfig::warmup`]) average.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WarmupBy {
    /// The parameters after one local step (`warmup=N`): the mean
    /// pseudo-gradient applied as it is (`θ_global -= Δ`), post-local
    /// SGD's synchronous start (Lin et al., 2020), which with an inner SGD
    /// and dense pseudo-gradients *is* synchronous training; with an
    /// adaptive inner optimizer each rank's state stays its own. Any inner
    /// step, gradwire's optimizer or the caller's.
    #[default]
    Parameters,
    /// The gradients (`grad-warmup=N`): each step is synchronous
    /// data-parallel training, the mean gradient (through the codec) given
    /// to the inner optimizer on every rank, so its state is the same on
    /// every rank when the rounds begin (DiLoCo's start from a
    /// synchronously trained model). A gradient no rank pushed counts as
    /// zeros. With gradwire's optimizer ([`crate::LocalSteps`]) a step is
    /// the same call; with the caller's own these steps are gradient
    /// steps ([`crate::GradSync::current_loop`] says when):
    /// [`crate::GradSync::finish`] in place of `step_locally`.
    Gradients,
}

impl DiLoCoConfig {
    /// The registry's defaults: H = 50, dense, SGD-Nesterov at lr 0.7 and
    /// momentum 0.9.
    pub const DEFAULT: DiLoCoConfig = DiLoCoConfig {
        sync_every: 50,
        fragments: 1,
        delay: 0,
        alpha: 0.0,
        codec: OuterCodec::Dense,
        outer: OuterOptimizer::Nesterov {
            lr: DILOCO_LR,
            momentum: DILOCO_MOMENTUM,
        },
        warmup: 0,
        warmup_by: WarmupBy::Parameters,
    };

    /// The registry's streaming defaults: H = 50 in 2 fragments, merged at
    /// once with the global values (τ = 0, α = 0, as torchft's), dense.
    pub const STREAMING: DiLoCoConfig = DiLoCoConfig {
        fragments: 2,
        ..DiLoCoConfig::DEFAULT
    };

    /// Whether this is Streaming DiLoCo (fragments, a delay or a mixing
    /// weight): `streaming-diloco` in the registry, else `diloco`.
    pub fn is_streaming(&self) -> bool {
        self.fragments > 1 || self.delay > 0 || self.alpha.to_bits() != 0
    }

    /// The inner steps between two fragments' synchronisations, `H / F`.
    pub fn stride(&self) -> u32 {
        self.sync_every / self.fragments.max(1)
    }

    /// The inner steps (counting from 0) of the round that holds inner step
    /// `step` where no round is skipped: one step in the warm-up, then H
    /// (a skipped round is taken again, so it moves the later ones; in
    /// Streaming DiLoCo, each fragment's round).
    pub fn round_of(&self, step: u64) -> std::ops::Range<u64> {
        let warmup = u64::from(self.warmup);
        if step < warmup {
            return step..step + 1;
        }
        let h = u64::from(self.sync_every.max(1));
        let start = warmup + (step - warmup) / h * h;
        start..start + h
    }

    /// Checks every setting: at least one inner step, H a multiple of F,
    /// τ below H / F, α in [0, 1], a positive finite learning rate, a
    /// momentum in [0, 1), and the codec's own settings.
    pub fn validate(&self) -> Result<(), String> {
        if self.sync_every == 0 {
            return Err("a round takes at least one inner step".into());
        }
        if self.fragments == 0 || !self.sync_every.is_multiple_of(self.fragments) {
            return Err(format!(
                "H = {} must be a positive multiple of the fragments, {}",
                self.sync_every, self.fragments
            ));
        }
        if self.delay >= self.stride() {
            return Err(format!(
                "the delay tau = {} must be below H / F = {}: a fragment is merged before the next one leaves",
                self.delay,
                self.stride()
            ));
        }
        if !(0.0..=1.0).contains(&self.alpha) {
            return Err(format!("alpha must be in [0, 1], got {}", self.alpha));
        }
        let (lr, momentum) = match self.outer {
            OuterOptimizer::Nesterov { lr, momentum } => (lr, momentum),
            OuterOptimizer::Adam { lr } => (lr, 0.0),
        };
        if !(lr.is_finite() && lr > 0.0) {
            return Err(format!(
                "the outer lr must be positive and finite, got {lr}"
            ));
        }
        if !(0.0..1.0).contains(&momentum) {
            return Err(format!(
                "the outer momentum must be in [0, 1), got {momentum}"
            ));
        }
        self.codec
            .strategy()
            .validate()
            .map_err(|e| format!("the pseudo-gradient's codec: {e}"))
    }
}
