//! The models `gradwire project` projects to (parameter shapes and a
//! published compute time per step), and the codec throughputs it assumes
//! without a profile.

use crate::bench::strategies::resnet50_shapes;
use crate::config::TrainConfig;
use crate::error::{ExperimentError, Result};
use gradwire_algos::HalfPrecision;
use gradwire_algos::cost::StrategySpec;
use gradwire_compress::{Quantizer, SparseCodec};
use gradwire_optim::{CostAssumptions, StrategyConfig};

/// A model to project: a name, its parameter shapes (`[out, in, ...]`, in
/// declaration order) and its forward + backward time per step on one
/// worker.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// The name on the command line.
    pub name: String,
    /// The parameter shapes.
    pub shapes: Vec<Vec<usize>>,
    /// Seconds of forward and backward per step and worker.
    pub compute_s: f64,
    /// Where `compute_s` comes from.
    pub compute_source: String,
}

impl ModelSpec {
    /// Its parameter count.
    pub fn params(&self) -> usize {
        self.shapes
            .iter()
            .map(|s| s.iter().product::<usize>())
            .sum()
    }

    /// ResNet-50 (torchvision, 25 557 032 parameters) at 32 images per
    /// worker: 32 / 367 s. 367 images/s is NVIDIA's FP32 training
    /// throughput of ResNet-50 v1.5 on one V100 16 GB (DeepLearningExamples,
    /// PyTorch/Classification/ConvNets/resnet50v1.5, pytorch-21.03
    /// container), taken as constant down to a batch of 32.
    pub fn resnet50() -> ModelSpec {
        ModelSpec {
            name: "resnet50".into(),
            shapes: resnet50_shapes(),
            compute_s: 32.0 / 367.0,
            compute_source: "32 images at 367 img/s: V100 16 GB FP32, NVIDIA DeepLearningExamples \
                             resnet50v1.5 (PyTorch, 21.03)"
                .into(),
        }
    }

    /// BERT-Large (24 layers, hidden 1024, FFN 4096, 16 heads, vocabulary
    /// 30522, 512 positions, 2 token types, the pooler: 335 141 888
    /// parameters; the masked-LM head's transform is left out, its decoder
    /// is tied to the word embeddings) at 8 sequences of 128 tokens per
    /// worker: 8 / 40 s. 40 sequences/s is NVIDIA's FP32 pre-training
    /// (phase 1, sequence length 128) throughput on one V100 16 GB
    /// (DeepLearningExamples, PyTorch/LanguageModeling/BERT, 20.06
    /// container).
    pub fn bert_large() -> ModelSpec {
        ModelSpec {
            name: "bert-large".into(),
            shapes: bert_large_shapes(),
            compute_s: 8.0 / 40.0,
            compute_source:
                "8 sequences of 128 at 40 seq/s: V100 16 GB FP32 pre-training phase 1, \
                             NVIDIA DeepLearningExamples BERT (PyTorch, 20.06)"
                    .into(),
        }
    }

    /// ResNet-18 for CIFAR-10 (11 173 962 parameters; PowerSGD's benchmark
    /// model) at 128 images per worker. No published time at hand: an
    /// estimate, 0.56 GFLOP forward per 32x32 image, three times that with
    /// backward, at 7 TFLOP/s sustained on a V100 in FP32 (30.7 ms).
    pub fn resnet18_cifar() -> ModelSpec {
        ModelSpec {
            name: "resnet18-cifar".into(),
            shapes: resnet18_cifar_shapes(),
            compute_s: 0.56e9 * 3.0 * 128.0 / 7e12,
            compute_source: "estimate: 128 images x 3 x 0.56 GFLOP at 7 TFLOP/s (V100 FP32)".into(),
        }
    }

    /// The model named `name` (resnet50, bert-large, resnet18-cifar).
    pub fn by_name(name: &str) -> Result<ModelSpec> {
        match name {
            "resnet50" => Ok(ModelSpec::resnet50()),
            "bert-large" => Ok(ModelSpec::bert_large()),
            "resnet18-cifar" => Ok(ModelSpec::resnet18_cifar()),
            other => Err(ExperimentError::Usage(format!(
                "unknown model {other:?} (one of: resnet50, bert-large, resnet18-cifar)"
            ))),
        }
    }
}

/// BERT-Large's parameter shapes (Hugging Face `BertModel` order, linear
/// weights `[out, in]`): 335 141 888 parameters.
pub fn bert_large_shapes() -> Vec<Vec<usize>> {
    let (hidden, ffn, layers, vocab, positions, types) = (1024, 4096, 24, 30522, 512, 2);
    let mut shapes = vec![
        vec![vocab, hidden],
        vec![positions, hidden],
        vec![types, hidden],
        vec![hidden],
        vec![hidden],
    ];
    for _ in 0..layers {
        // Query, key, value and the attention's output projection (16
        // heads of 64 share these matrices: the heads change no shape).
        for _ in 0..4 {
            shapes.push(vec![hidden, hidden]);
            shapes.push(vec![hidden]);
        }
        shapes.push(vec![hidden]); // attention LayerNorm
        shapes.push(vec![hidden]);
        shapes.push(vec![ffn, hidden]);
        shapes.push(vec![ffn]);
        shapes.push(vec![hidden, ffn]);
        shapes.push(vec![hidden]);
        shapes.push(vec![hidden]); // output LayerNorm
        shapes.push(vec![hidden]);
    }
    shapes.push(vec![hidden, hidden]); // pooler
    shapes.push(vec![hidden]);
    shapes
}

/// ResNet-18 for CIFAR-10 (3x3 stem, no max-pool, BasicBlocks of 64 to
/// 512 channels, 1x1 projection shortcuts, 10 classes).
pub fn resnet18_cifar_shapes() -> Vec<Vec<usize>> {
    let mut shapes = Vec::new();
    let conv_bn = |shapes: &mut Vec<Vec<usize>>, out: usize, inp: usize, k: usize| {
        shapes.push(vec![out, inp, k, k]);
        shapes.push(vec![out]);
        shapes.push(vec![out]);
    };
    conv_bn(&mut shapes, 64, 3, 3);
    let mut inp = 64;
    for width in [64, 128, 256, 512] {
        for b in 0..2 {
            conv_bn(&mut shapes, width, inp, 3);
            conv_bn(&mut shapes, width, width, 3);
            if b == 0 && inp != width {
                conv_bn(&mut shapes, width, inp, 1);
            }
            inp = width;
        }
    }
    shapes.push(vec![10, 512]);
    shapes.push(vec![10]);
    shapes
}

/// A strategy as the projection sees it: its label (as `compare` prints
/// it), what it sends, and its codec's throughput.
#[derive(Debug, Clone, PartialEq)]
pub struct StrategyEntry {
    /// The label (`TrainConfig::label`).
    pub label: String,
    /// What it sends per step.
    pub spec: StrategySpec,
    /// Its codec's throughput as a fraction of one core's memcpy of the
    /// f32 gradient (0: no codec).
    pub codec_fraction: f64,
    /// Where `codec_fraction` comes from.
    pub codec_source: &'static str,
}

/// The sampled top-k selection's overshoot the projection assumes: the
/// middle of DGC's `[k, 1.3 k]`.
pub const SAMPLED_OVERSHOOT: f64 = 1.15;

/// DimReduce's line-search trials per step the projection assumes (the
/// first step size accepted).
pub const DIMREDUCE_TRIALS: usize = 1;

/// What a run measured of a selection that depends on the data, which
/// the model then takes instead of its assumption.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Selection {
    /// The threshold's: the fraction of each bucket's entries it kept.
    Density(f64),
    /// Sampled top-k's: the entries it kept over `k`, in `[1, 1.3]`.
    Overshoot(f64),
}

/// What the cost model assumes of `config`'s strategy where its value does
/// not decide what it sends: sampled top-k's overshoot, DimReduce's
/// components and trials, the optimizer's buffers; a selection a run
/// measured replaces the overshoot, or gives the threshold its density.
pub fn assumptions_of(config: &TrainConfig, measured: Option<Selection>) -> CostAssumptions {
    CostAssumptions {
        sampled_overshoot: match measured {
            Some(Selection::Overshoot(o)) => o,
            _ => SAMPLED_OVERSHOOT,
        },
        dimreduce_components: config.components,
        dimreduce_trials: DIMREDUCE_TRIALS,
        state_buffers: config.optimizer.state_buffers(),
        selected_density: match measured {
            Some(Selection::Density(d)) => Some(d),
            _ => None,
        },
    }
}

/// The projection's view of `config`'s strategy, with the selection a
/// run `measured` (without one the threshold is not modelled). The codec throughputs are
/// this repository's `gradwire bench compress` figures on one core, 16 M
/// f32 entries, relative to a memcpy of the same bytes (README.md,
/// "Benchmarks"); strategies it did not measure say so.
pub fn entry_of(config: &TrainConfig, measured: Option<Selection>) -> Result<StrategyEntry> {
    const BENCH: &str = "gradwire bench compress, 16 M f32, one core (README)";
    let strategy = config.strategy;
    // The 16-bit baseline is costed as the 16-bit all-reduce it is.
    let Some(spec) = (if config.baseline && config.baseline_precision().is_none() {
        Some(StrategySpec::Dense)
    } else {
        strategy.cost_spec(&assumptions_of(config, measured))
    }) else {
        return Err(ExperimentError::Usage(format!(
            "{} is not modelled: {}",
            strategy.name(),
            if matches!(strategy, StrategyConfig::Sparse { .. }) {
                "what it keeps depends on the data (a shaped run measures it; or use topk)"
            } else {
                "a strategy of the caller's own"
            }
        )));
    };
    let (codec_fraction, codec_source) = match strategy {
        _ if config.baseline && config.baseline_precision().is_none() => (0.0, "none"),
        // The codec runs once a round, on the pseudo-gradient: per step,
        // H times faster than on every step's gradient.
        StrategyConfig::DiLoCo(diloco) => {
            let inner = entry_of(
                &TrainConfig {
                    strategy: diloco.codec.strategy(),
                    ..config.clone()
                },
                measured,
            )?;
            (
                inner.codec_fraction * f64::from(diloco.sync_every),
                "its codec's figure (gradwire bench compress) times H: it runs once a round",
            )
        }
        StrategyConfig::Dense => (0.0, "none"),
        StrategyConfig::Half {
            precision: HalfPrecision::F16,
            ..
        } => (0.67, BENCH),
        StrategyConfig::Half { .. } => (0.51, BENCH),
        StrategyConfig::Sparse { codec, .. } => match codec {
            SparseCodec::TopK(_) if strategy.error_feedback() => (0.20, BENCH),
            SparseCodec::TopK(_) => (0.48, BENCH),
            SparseCodec::SampledTopK(_) => (0.42, BENCH),
            _ => (0.40, BENCH),
        },
        StrategyConfig::PowerSgd(_) => (
            0.18,
            "gradwire bench compress, rank-4 step on 1024 rows (README)",
        ),
        StrategyConfig::Quantized { quantizer, .. } => match quantizer {
            Quantizer::Sign => (0.25, BENCH),
            Quantizer::Qsgd { .. } => (0.12, BENCH),
            Quantizer::E3m0 { .. } => (0.17, BENCH),
            Quantizer::MinMaxU8 => (0.18, BENCH),
        },
        StrategyConfig::OneBitAdam { .. } => (0.25, "as onebit"),
        StrategyConfig::AdaSum { .. } => (
            0.5,
            "assumed: two passes (partials, combine) per level at memcpy's half",
        ),
        // P g and P^T d: 2 x components multiply-adds per entry of a
        // rank's slice, about 8 GFLOP/s on a core: relative to memcpy's
        // 2.5 G f32/s, 1.6 / components.
        StrategyConfig::DimReduce => (
            1.6 / config.components.max(1) as f64,
            "assumed: 2 x components multiply-adds per entry at 8 GFLOP/s",
        ),
        // Averages parameters: no codec.
        StrategyConfig::Partial { .. } => (0.0, "none"),
        StrategyConfig::DeltaWeight { .. } => (
            0.5,
            "assumed as adasum-grad: two passes (partials, combine) per level at memcpy's half",
        ),
        // No cost_spec: refused above.
        StrategyConfig::Custom => (0.0, "none"),
    };
    Ok(StrategyEntry {
        label: config.label(),
        spec,
        codec_fraction,
        codec_source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_have_their_published_parameter_counts() {
        assert_eq!(ModelSpec::bert_large().params(), 335_141_888);
        assert_eq!(ModelSpec::resnet50().params(), 25_557_032);
        assert_eq!(ModelSpec::resnet18_cifar().params(), 11_173_962);
        crate::error::assert_usage(ModelSpec::by_name("gpt-5"), "unknown model \"gpt-5\"");
    }
}
