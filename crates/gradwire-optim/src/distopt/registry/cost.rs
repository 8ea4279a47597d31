//! What a strategy sends, for the cost model: [`StrategyConfig::cost_spec`]
//! maps the value to gradwire-algos' [`StrategySpec`], with what the value
//! does not decide taken from [`CostAssumptions`].

use super::StrategyConfig;
use gradwire_algos::cost::StrategySpec;
use gradwire_compress::SparseCodec;

/// What the cost model assumes where a strategy's value does not decide
/// what it sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostAssumptions {
    /// Sampled top-k's kept entries over `k`, in `[1, 1.3]`.
    pub sampled_overshoot: f64,
    /// DimReduce's principal components.
    pub dimreduce_components: usize,
    /// DimReduce's line-search trials per step.
    pub dimreduce_trials: usize,
    /// The local optimizer's buffers per parameter (what `partial:state`
    /// averages with the parameters).
    pub state_buffers: usize,
    /// The fraction of entries the threshold codec kept, measured on a run
    /// (`None`: the threshold is not modelled, what it keeps depends on
    /// the data).
    pub selected_density: Option<f64>,
}

impl StrategyConfig {
    /// What the strategy sends per step, for the cost model
    /// ([`gradwire_algos::cost::step_collectives`]): its compressed stage
    /// (after PowerSGD's start step, 1-bit Adam's freeze and DiLoCo's
    /// warm-up, whose rounds of one step are a transient), with what
    /// `assumptions` says of the settings the value does not decide;
    /// DiLoCo's round with its codec's calls once every `H` steps; partial
    /// averaging's buckets in turn; delta weight's AdaSum of the weight
    /// changes. `None` for a threshold without a measured density (its
    /// count depends on the data) and for a user's own strategy.
    pub fn cost_spec(&self, assumptions: &CostAssumptions) -> Option<StrategySpec> {
        Some(match *self {
            StrategyConfig::DiLoCo(config) => StrategySpec::Outer {
                sync_every: config.sync_every,
                fragments: config.fragments,
                delay: config.delay,
                codec: Box::new(config.codec.strategy().cost_spec(assumptions)?),
            },
            StrategyConfig::Dense => StrategySpec::Dense,
            StrategyConfig::Half { .. } => StrategySpec::Half,
            StrategyConfig::Sparse { codec, .. } => match codec {
                SparseCodec::Threshold(_) => StrategySpec::Selected {
                    density: assumptions.selected_density?,
                },
                SparseCodec::TopK(ratio) => StrategySpec::TopK { ratio },
                SparseCodec::SampledTopK(ratio) => StrategySpec::SampledTopK {
                    ratio,
                    overshoot: assumptions.sampled_overshoot,
                },
                SparseCodec::RandomK { ratio, .. } => StrategySpec::RandomK { ratio },
            },
            StrategyConfig::PowerSgd(config) => StrategySpec::PowerSgd {
                rank: config.rank,
                min_compression_rate: config.min_compression_rate,
            },
            StrategyConfig::Quantized { quantizer, .. } => StrategySpec::Quantized { quantizer },
            StrategyConfig::OneBitAdam { .. } => StrategySpec::OneBitAdam { compressed: true },
            StrategyConfig::AdaSum { .. } => StrategySpec::AdaSum,
            StrategyConfig::DimReduce => StrategySpec::DimReduce {
                components: assumptions.dimreduce_components,
                trials: assumptions.dimreduce_trials,
            },
            StrategyConfig::Partial { average_state } => StrategySpec::Partial {
                state_buffers: if average_state {
                    assumptions.state_buffers
                } else {
                    0
                },
            },
            StrategyConfig::DeltaWeight { .. } => StrategySpec::DeltaWeight {
                codec: Box::new(StrategySpec::AdaSum),
            },
            StrategyConfig::Custom => return None,
        })
    }
}
