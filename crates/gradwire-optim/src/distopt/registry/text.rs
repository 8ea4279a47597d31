//! The registry's text form: [`StrategyConfig`]'s `Display` and `FromStr`
//! (`name[:value][:key=value|:flag]...`, defaults left out, every setting
//! round-tripping), the forms each strategy takes for messages, and serde
//! through the printed form.

use super::{
    DILOCO_LR, DILOCO_MOMENTUM, DiLoCoConfig, ONEBIT_ADAM_BETA1, ONEBIT_ADAM_FREEZE_STEP,
    OUTER_ADAM_LR, OuterCodec, OuterOptimizer, QSGD_LEVELS, StrategyConfig, StrategyError,
    WarmupBy,
};
use gradwire_algos::PowerSgdConfig;
use gradwire_compress::{QsgdNorm, Quantizer, SparseCodec};
use std::fmt;
use std::str::FromStr;

impl fmt::Display for StrategyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        let no_ef = |f: &mut fmt::Formatter<'_>, ef: bool| {
            if ef { Ok(()) } else { f.write_str(":no-ef") }
        };
        let seed = |f: &mut fmt::Formatter<'_>, seed: u64, default: u64| {
            if seed == default {
                Ok(())
            } else {
                write!(f, ":seed={seed}")
            }
        };
        let group = |f: &mut fmt::Formatter<'_>, group: Option<usize>| match group {
            Some(g) => write!(f, ":group={g}"),
            None => Ok(()),
        };
        match *self {
            StrategyConfig::Dense | StrategyConfig::Custom | StrategyConfig::DimReduce => Ok(()),
            StrategyConfig::Half { clip, .. } => match clip {
                Some(clip) => write!(f, ":clip={clip}"),
                None => Ok(()),
            },
            StrategyConfig::Sparse {
                codec,
                error_feedback,
            } => {
                match codec {
                    SparseCodec::Threshold(t) => write!(f, ":{t}")?,
                    SparseCodec::TopK(r) | SparseCodec::SampledTopK(r) => write!(f, ":{r}")?,
                    SparseCodec::RandomK { ratio, seed: s } => {
                        write!(f, ":{ratio}")?;
                        seed(f, s, 0)?;
                    }
                }
                no_ef(f, error_feedback)
            }
            StrategyConfig::PowerSgd(config) => {
                let default = PowerSgdConfig::default();
                write!(f, ":{}", config.rank)?;
                if config.start_step != default.start_step {
                    write!(f, ":start={}", config.start_step)?;
                }
                if config.min_compression_rate.to_bits() != default.min_compression_rate.to_bits() {
                    write!(f, ":min-rate={}", config.min_compression_rate)?;
                }
                if !config.warm_start {
                    f.write_str(":cold")?;
                }
                seed(f, config.seed, default.seed)?;
                no_ef(f, config.error_feedback)
            }
            StrategyConfig::Quantized {
                quantizer,
                error_feedback,
                momentum,
            } => {
                if let Quantizer::Qsgd {
                    levels,
                    seed: s,
                    norm,
                } = quantizer
                {
                    if levels != QSGD_LEVELS {
                        write!(f, ":levels={levels}")?;
                    }
                    seed(f, s, 0)?;
                    if norm == QsgdNorm::Max {
                        f.write_str(":max-norm")?;
                    }
                }
                if let Quantizer::E3m0 { seed: s } = quantizer {
                    seed(f, s, 0)?;
                }
                if let Some(mu) = momentum {
                    write!(f, ":momentum={mu}")?;
                }
                no_ef(f, error_feedback)
            }
            StrategyConfig::OneBitAdam { beta1, freeze_step } => {
                if freeze_step != ONEBIT_ADAM_FREEZE_STEP {
                    write!(f, ":freeze={freeze_step}")?;
                }
                if beta1.to_bits() != ONEBIT_ADAM_BETA1.to_bits() {
                    write!(f, ":beta1={beta1}")?;
                }
                Ok(())
            }
            StrategyConfig::AdaSum { group: g } | StrategyConfig::DeltaWeight { group: g } => {
                group(f, g)
            }
            StrategyConfig::Partial { average_state } => {
                if average_state {
                    f.write_str(":state")?;
                }
                Ok(())
            }
            StrategyConfig::DiLoCo(config) => {
                write!(f, ":{}", config.sync_every)?;
                if config.is_streaming() {
                    write!(f, ":{}", config.fragments)?;
                    if config.delay > 0 {
                        write!(f, ":tau={}", config.delay)?;
                    }
                    if config.alpha.to_bits() != 0 {
                        write!(f, ":alpha={}", config.alpha)?;
                    }
                }
                if let Some(codec) = config.codec.text() {
                    write!(f, ":{codec}")?;
                }
                if config.warmup > 0 {
                    let key = match config.warmup_by {
                        WarmupBy::Parameters => "warmup",
                        WarmupBy::Gradients => "grad-warmup",
                    };
                    write!(f, ":{key}={}", config.warmup)?;
                }
                match config.outer {
                    OuterOptimizer::Nesterov { lr, momentum } => {
                        if lr.to_bits() != DILOCO_LR.to_bits() {
                            write!(f, ":lr={lr}")?;
                        }
                        if momentum.to_bits() != DILOCO_MOMENTUM.to_bits() {
                            write!(f, ":momentum={momentum}")?;
                        }
                    }
                    OuterOptimizer::Adam { lr } => {
                        f.write_str(":adam")?;
                        if lr.to_bits() != OUTER_ADAM_LR.to_bits() {
                            write!(f, ":lr={lr}")?;
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

impl FromStr for StrategyConfig {
    type Err = StrategyError;

    /// Parses the printed form, `name[:value][:key=value|:flag]...`; the
    /// result is validated.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut parts = text.split(':');
        let name = parts.next().unwrap_or_default();
        let mut strategy = StrategyConfig::default_of(name)?;
        // Positional numbers seen (DiLoCo's H, then streaming's F).
        let mut numbers = 0;
        let bad = |reason: String| StrategyError::BadPart {
            text: text.to_string(),
            reason,
        };
        for part in parts {
            let (key, value) = match part.split_once('=') {
                Some((key, value)) => (key, Some(value)),
                None => (part, None),
            };
            let number = |what: &str| -> Result<f64, StrategyError> {
                let v = value.unwrap_or(part);
                v.parse::<f64>()
                    .map_err(|_| bad(format!("{v:?} is not a number ({what})")))
            };
            // f32 settings are parsed as f32: through f64 a printed f32
            // could round twice and come back as its neighbour.
            let number32 = |what: &str| -> Result<f32, StrategyError> {
                let v = value.unwrap_or(part);
                v.parse::<f32>()
                    .map_err(|_| bad(format!("{v:?} is not a number ({what})")))
            };
            let integer = |what: &str| -> Result<u64, StrategyError> {
                let v = value.unwrap_or(part);
                v.parse::<u64>()
                    .map_err(|_| bad(format!("{v:?} is not a whole number ({what})")))
            };
            let unknown = || {
                bad(format!(
                    "{part:?} is not a setting of {name} (the printed forms: {})",
                    StrategyConfig::default_of(name)
                        .map(|s| s.usage())
                        .unwrap_or_default()
                ))
            };
            match (&mut strategy, key, value) {
                (
                    StrategyConfig::Sparse { error_feedback, .. }
                    | StrategyConfig::Quantized { error_feedback, .. },
                    "ef" | "no-ef",
                    None,
                ) => *error_feedback = key == "ef",
                (StrategyConfig::PowerSgd(config), "ef" | "no-ef", None) => {
                    config.error_feedback = key == "ef"
                }
                (StrategyConfig::Half { clip, .. }, "clip", Some(_)) => {
                    *clip = Some(number32("the clip")?)
                }
                (StrategyConfig::Sparse { codec, .. }, _, None) if key.parse::<f64>().is_ok() => {
                    match codec {
                        SparseCodec::Threshold(t) => *t = number32("the threshold")?,
                        SparseCodec::TopK(r) | SparseCodec::SampledTopK(r) => {
                            *r = number("the ratio")?
                        }
                        SparseCodec::RandomK { ratio, .. } => *ratio = number("the ratio")?,
                    }
                }
                (
                    StrategyConfig::Sparse {
                        codec: SparseCodec::RandomK { seed, .. },
                        ..
                    },
                    "seed",
                    Some(_),
                ) => *seed = integer("the seed")?,
                (StrategyConfig::PowerSgd(config), _, None) if key.parse::<u64>().is_ok() => {
                    config.rank = usize::try_from(integer("the rank")?)
                        .map_err(|_| bad(format!("{key:?} is too large a rank")))?
                }
                (StrategyConfig::PowerSgd(config), "start", Some(_)) => {
                    config.start_step = integer("the start step")?
                }
                (StrategyConfig::PowerSgd(config), "min-rate", Some(_)) => {
                    config.min_compression_rate = number("the least compression rate")?
                }
                (StrategyConfig::PowerSgd(config), "cold", None) => config.warm_start = false,
                (StrategyConfig::PowerSgd(config), "seed", Some(_)) => {
                    config.seed = integer("the seed")?
                }
                (
                    StrategyConfig::Quantized {
                        quantizer: Quantizer::Qsgd { levels, .. },
                        ..
                    },
                    "levels",
                    Some(_),
                ) => {
                    *levels = u8::try_from(integer("the levels")?)
                        .map_err(|_| bad("QSGD's levels must be 1 to 127".into()))?
                }
                (
                    StrategyConfig::Quantized {
                        quantizer: Quantizer::Qsgd { seed, .. } | Quantizer::E3m0 { seed },
                        ..
                    },
                    "seed",
                    Some(_),
                ) => *seed = integer("the seed")?,
                (
                    StrategyConfig::Quantized {
                        quantizer: Quantizer::Qsgd { norm, .. },
                        ..
                    },
                    "max-norm",
                    None,
                ) => *norm = QsgdNorm::Max,
                (StrategyConfig::Quantized { momentum, .. }, "momentum", Some(_)) => {
                    *momentum = Some(number32("the momentum")?)
                }
                (StrategyConfig::OneBitAdam { freeze_step, .. }, "freeze", Some(_)) => {
                    *freeze_step = integer("the freeze step")?
                }
                (StrategyConfig::OneBitAdam { beta1, .. }, "beta1", Some(_)) => {
                    *beta1 = number32("beta1")?
                }
                (
                    StrategyConfig::AdaSum { group } | StrategyConfig::DeltaWeight { group },
                    "group",
                    Some(_),
                ) => {
                    *group = Some(
                        usize::try_from(integer("the group")?)
                            .map_err(|_| bad(format!("{part:?} is too large a group")))?,
                    )
                }
                (StrategyConfig::Partial { average_state }, "state", None) => *average_state = true,
                (StrategyConfig::DiLoCo(config), _, None) if key.parse::<u64>().is_ok() => {
                    // H, then (streaming) F.
                    numbers += 1;
                    let n = u32::try_from(integer("the inner steps")?)
                        .map_err(|_| bad(format!("{key:?} is too large")))?;
                    match numbers {
                        1 => config.sync_every = n,
                        2 if name == "streaming-diloco" => config.fragments = n,
                        _ => return Err(unknown()),
                    }
                }
                (StrategyConfig::DiLoCo(config), "tau", Some(_)) => {
                    config.delay = u32::try_from(integer("the delay")?)
                        .map_err(|_| bad(format!("{part:?} is too large a delay")))?
                }
                (StrategyConfig::DiLoCo(config), "warmup" | "grad-warmup", Some(_)) => {
                    config.warmup = u32::try_from(integer("the warm-up")?)
                        .map_err(|_| bad(format!("{part:?} is too long a warm-up")))?;
                    config.warmup_by = match key {
                        "warmup" => WarmupBy::Parameters,
                        _ => WarmupBy::Gradients,
                    };
                }
                (StrategyConfig::DiLoCo(config), "alpha", Some(_)) => {
                    config.alpha = number32("alpha")?
                }
                (StrategyConfig::DiLoCo(config), "adam", None) => {
                    // Adam's own default rate, unless one was given before.
                    let lr = match config.outer {
                        OuterOptimizer::Nesterov { lr, .. }
                            if lr.to_bits() != DILOCO_LR.to_bits() =>
                        {
                            lr
                        }
                        OuterOptimizer::Adam { lr } => lr,
                        OuterOptimizer::Nesterov { .. } => OUTER_ADAM_LR,
                    };
                    config.outer = OuterOptimizer::Adam { lr };
                }
                (StrategyConfig::DiLoCo(config), "lr", Some(_)) => match &mut config.outer {
                    OuterOptimizer::Nesterov { lr, .. } | OuterOptimizer::Adam { lr } => {
                        *lr = number32("the outer lr")?
                    }
                },
                (
                    StrategyConfig::DiLoCo(DiLoCoConfig {
                        outer: OuterOptimizer::Nesterov { momentum, .. },
                        ..
                    }),
                    "momentum",
                    Some(_),
                ) => *momentum = number32("the outer momentum")?,
                (
                    StrategyConfig::DiLoCo(DiLoCoConfig {
                        codec: OuterCodec::Quantized(Quantizer::Qsgd { norm, .. }),
                        ..
                    }),
                    "max-norm",
                    None,
                ) => *norm = QsgdNorm::Max,
                (StrategyConfig::DiLoCo(config), _, _) => match OuterCodec::parse(key, value) {
                    Some(codec) => config.codec = codec.map_err(bad)?,
                    None => return Err(unknown()),
                },
                _ => return Err(unknown()),
            }
        }
        strategy.validate()?;
        Ok(strategy)
    }
}

impl StrategyConfig {
    /// The forms this strategy's text takes, for messages and help.
    pub fn usage(&self) -> &'static str {
        match self {
            StrategyConfig::Dense => "dense",
            StrategyConfig::Half { .. } => "fp16|bf16[:clip=C]",
            StrategyConfig::Sparse {
                codec: SparseCodec::RandomK { .. },
                ..
            } => "randomk[:RATIO][:seed=S][:ef|:no-ef]",
            StrategyConfig::Sparse {
                codec: SparseCodec::Threshold(_),
                ..
            } => "threshold[:T][:ef|:no-ef]",
            StrategyConfig::Sparse { .. } => "topk|sampled-topk[:RATIO][:ef|:no-ef]",
            StrategyConfig::PowerSgd(_) => {
                "powersgd[:RANK][:start=STEP][:min-rate=R][:cold][:seed=S][:ef|:no-ef]"
            }
            StrategyConfig::Quantized {
                quantizer: Quantizer::Qsgd { .. },
                ..
            } => "qsgd[:levels=L][:seed=S][:max-norm][:momentum=M][:ef|:no-ef]",
            StrategyConfig::Quantized {
                quantizer: Quantizer::E3m0 { .. },
                ..
            } => "e3m0[:seed=S][:momentum=M][:ef|:no-ef]",
            StrategyConfig::Quantized { .. } => "onebit|uint8[:momentum=M][:ef|:no-ef]",
            StrategyConfig::OneBitAdam { .. } => "onebit-adam[:freeze=STEP][:beta1=B]",
            StrategyConfig::AdaSum { .. } => "adasum-grad[:group=G]",
            StrategyConfig::Custom => "custom (DistOpt::with_strategy; not parsed)",
            StrategyConfig::DeltaWeight { .. } => "adasum-delta[:group=G]",
            StrategyConfig::Partial { .. } => "partial[:state]",
            StrategyConfig::DimReduce => "dimreduce",
            StrategyConfig::DiLoCo(config) if config.is_streaming() => {
                "streaming-diloco[:H][:F][:tau=T][:alpha=A][:fp16|:bf16|:onebit|:qsgd[=L][:max-norm]|:e3m0|:uint8|:topk=R|:powersgd=R][:warmup=N|:grad-warmup=N][:adam][:lr=LR][:momentum=M]"
            }
            StrategyConfig::DiLoCo(_) => {
                "diloco[:H][:fp16|:bf16|:onebit|:qsgd[=L][:max-norm]|:e3m0|:uint8|:topk=R|:powersgd=R][:warmup=N|:grad-warmup=N][:adam][:lr=LR][:momentum=M]"
            }
        }
    }
}

impl serde::Serialize for StrategyConfig {
    /// As its printed form.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for StrategyConfig {
    /// From its printed form.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
