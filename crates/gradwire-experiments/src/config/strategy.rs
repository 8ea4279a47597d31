//! What a run's settings make: the strategy parsed from `-s` and given to
//! DistOpt, the baseline's precision, DimReduce's dense epochs, the label.

use super::{OptimizerKind, TrainConfig};
use crate::error::{ExperimentError, Result};
use gradwire_algos::HalfPrecision;
use gradwire_compress::{Quantizer, SparseCodec};
use gradwire_optim::StrategyConfig;

/// Parses `-s`: a strategy of the registry (`topk:0.01`, ...) or
/// `baseline`; the result is the strategy and whether it is the baseline.
pub fn parse_strategy(text: &str) -> Result<(StrategyConfig, bool)> {
    if text == "baseline" {
        return Ok((StrategyConfig::Dense, true));
    }
    if let Some(half) = text.strip_prefix("baseline:") {
        return match half.parse() {
            Ok(strategy @ StrategyConfig::Half { clip: None, .. }) => Ok((strategy, true)),
            _ => Err(ExperimentError::Usage(format!(
                "{text}: the baseline is dense (baseline) or 16-bit (baseline:fp16, baseline:bf16)"
            ))),
        };
    }
    text.parse().map(|s| (s, false)).map_err(|e| {
        ExperimentError::Usage(match e {
            gradwire_optim::StrategyError::UnknownName { .. } => format!("{e}, or baseline"),
            other => other.to_string(),
        })
    })
}

impl TrainConfig {
    /// Whether SGD's momentum is applied by each worker before the exchange
    /// instead of by the optimizer after it: the 1-bit strategy with SGD
    /// (dist-EF-SGDM: the sign of a momentum with error feedback keeps
    /// momentum SGD's accuracy, where momentum after a 1-bit exchange
    /// amplifies the delayed entries of error feedback: 85 % against dense
    /// 96 % on digits, measured).
    pub fn momentum_before_exchange(&self) -> bool {
        matches!(
            self.strategy,
            StrategyConfig::Quantized {
                quantizer: Quantizer::Sign,
                momentum: None,
                ..
            }
        ) && self.optimizer == OptimizerKind::Sgd
            && self.momentum > 0.0
    }

    /// The strategy the run's front end is made with: the registry's,
    /// drawing from the run's seed, with SGD's momentum moved before the
    /// 1-bit exchange ([`TrainConfig::momentum_before_exchange`]).
    pub fn distopt_strategy(&self) -> StrategyConfig {
        let strategy = match self.strategy {
            StrategyConfig::Quantized {
                quantizer,
                error_feedback,
                momentum: None,
            } if self.momentum_before_exchange() => StrategyConfig::Quantized {
                quantizer,
                error_feedback,
                momentum: Some(self.momentum as f32),
            },
            other => other,
        };
        strategy.with_seed(self.seed)
    }

    /// DimReduce's dense epochs (0 with a PCA file; by default half the
    /// run, at least one).
    pub fn dense_epochs(&self) -> usize {
        if self.strategy != StrategyConfig::DimReduce || self.pca.is_some() {
            return 0;
        }
        self.dimreduce_dense_epochs
            .unwrap_or(self.epochs / 2)
            .max(1)
    }

    /// Samples per step over all workers: world x batch x accumulate.
    pub fn global_batch(&self) -> usize {
        self.world * self.batch * self.accumulate as usize
    }

    /// The 16-bit format the baseline sends, if it is the 16-bit baseline
    /// (`baseline:fp16`, `baseline:bf16`: Horovod's fp16 compression, the
    /// gradients cast, summed by the library in 16 bits, cast back).
    pub fn baseline_precision(&self) -> Option<HalfPrecision> {
        match self.strategy {
            StrategyConfig::Half {
                precision,
                clip: None,
            } if self.baseline => Some(precision),
            _ => None,
        }
    }

    /// A short label for tables and plots: the strategy and what sets it apart.
    pub fn label(&self) -> String {
        if self.baseline {
            return match self.baseline_precision() {
                Some(_) => format!("baseline {}", self.strategy),
                None => "baseline".into(),
            };
        }
        let percent = |r: f64| {
            let p = r * 100.0;
            if p >= 1.0 {
                format!("{p:.0} %")
            } else {
                format!("{p:.1} %")
            }
        };
        let name = self.strategy.name();
        let ef = if self.strategy.error_feedback() {
            ""
        } else {
            ", no EF"
        };
        match self.strategy {
            StrategyConfig::Sparse { codec, .. } => match codec {
                SparseCodec::Threshold(t) => format!("threshold {t}{ef}"),
                SparseCodec::TopK(r)
                | SparseCodec::SampledTopK(r)
                | SparseCodec::RandomK { ratio: r, .. } => format!("{name} {}{ef}", percent(r)),
            },
            StrategyConfig::PowerSgd(config) => format!("powersgd rank {}{ef}", config.rank),
            StrategyConfig::Quantized { .. } => format!("{name}{ef}"),
            // The printed form's settings: H, the codec, the outer rule.
            StrategyConfig::DiLoCo(_) => self.strategy.to_string().replacen(':', " ", 1),
            // The printed form: its settings where they are not the
            // defaults (`partial:state`), so that no two rows share a label.
            _ => self.strategy.to_string(),
        }
    }
}
