//! The models the CLI trains, built with candle: the digits MLP
//! (`64 - hidden... - 10`, ReLU), a small convolutional network (3x3
//! convolutions with ReLU and 2x2 max-pooling over the 8x8 image, then a
//! linear layer), both ending in softmax cross-entropy, and a
//! character-level transformer language model (`gpt.rs`). Forward and
//! backward are candle's; the weights are drawn from the run's seed
//! (Glorot-uniform for the digits models, GPT-2's scheme for the
//! transformer; zero biases) because candle's CPU initialisation cannot be
//! seeded, so every worker and every run start from the same model.

mod gpt;

pub use gpt::GptShape;

use crate::config::{ModelKind, TrainConfig};
use crate::data::{CLASSES, Dataset, FEATURES, xorshift};
use crate::error::{ExperimentError, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{Conv2d, Conv2dConfig, Linear, VarBuilder, VarMap};
use gpt::{Fill, Gpt};

/// Side of the square digit images.
const SIDE: usize = 8;

/// Test samples evaluated per forward pass (bounds the attention's memory).
const EVAL_CHUNK: usize = 64;

/// 2x2 max-pooling with stride 2 of `[n, c, h, w]` (even `h`, `w`), as
/// two max reductions: candle 0.11's `max_pool2d` backward multiplies the
/// gradient by the share of the window's elements that equal the maximum
/// (1/4 when one does) where it should divide by their count, so its
/// gradients are 4x too small per pooling layer.
fn max_pool_2x2(x: &Tensor) -> candle_core::Result<Tensor> {
    let (n, c, h, w) = x.dims4()?;
    x.reshape((n, c, h / 2, 2, w / 2, 2))?.max(5)?.max(3)
}

/// The layers of one architecture.
#[derive(Debug)]
enum Layers {
    Mlp(Vec<Linear>),
    Cnn { convs: Vec<Conv2d>, fc: Linear },
    Gpt(Box<Gpt>),
}

/// Which part of a data set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Split {
    Train,
    Test,
}

/// How well a model does on the test samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean cross-entropy (nats) per prediction: per image, or per
    /// character of the test windows.
    pub loss: f64,
    /// Fraction of the predictions that are right (the class, or the next
    /// character).
    pub accuracy: f64,
}

/// A candle model of a run's data.
#[derive(Debug)]
pub struct Model {
    layers: Layers,
    /// Every variable, sorted by name (the declaration order of every
    /// worker: `gradwire_candle::named_vars`).
    vars: Vec<(String, Var)>,
}

impl Model {
    /// The model `config` trains (`--model` with its widths), weights from
    /// `config.seed`. Errors on a shape that cannot be built.
    pub fn new(config: &TrainConfig) -> Result<Model> {
        match config.model {
            ModelKind::Mlp => Model::mlp(&config.hidden, config.seed),
            ModelKind::Cnn => Model::cnn(&config.channels, config.seed),
            ModelKind::Gpt => Model::gpt(config.gpt, config.seed),
        }
    }

    /// A `64 - hidden... - 10` MLP (layers `fc1`, `fc2`, ...).
    pub fn mlp(hidden: &[usize], seed: u64) -> Result<Model> {
        if hidden.contains(&0) {
            return Err(ExperimentError::Usage(
                "a hidden layer needs at least one unit".into(),
            ));
        }
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let mut sizes = vec![FEATURES];
        sizes.extend_from_slice(hidden);
        sizes.push(CLASSES);
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(k, w)| candle_nn::linear(w[0], w[1], vb.pp(format!("fc{}", k + 1))))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Model::seeded(Layers::Mlp(layers), &varmap, seed, glorot)
    }

    /// The weights of each layer of `config`'s model, in the order the
    /// constructors build them (an MLP's `FEATURES x h0`, ...,
    /// `h_last x CLASSES`; a CNN's 3x3 convolutions and its final linear
    /// layer; a GPT's [`GptShape::layer_weights`]); `None` if one does not
    /// fit a `usize`. Computed without building anything, so a size can be
    /// refused before memory is allocated.
    pub fn layer_weights(config: &TrainConfig) -> Option<Vec<usize>> {
        let chained = |first: usize, widths: &[usize], each: usize| {
            std::iter::once(first)
                .chain(widths.iter().copied())
                .zip(widths.iter().copied())
                .map(|(a, b)| a.checked_mul(b)?.checked_mul(each))
                .collect::<Option<Vec<usize>>>()
        };
        match config.model {
            ModelKind::Mlp => {
                let hidden = &config.hidden;
                let last = hidden.last().copied().unwrap_or(FEATURES);
                let mut layers = chained(FEATURES, hidden, 1)?;
                layers.push(last.checked_mul(CLASSES)?);
                Some(layers)
            }
            ModelKind::Cnn => {
                let channels = &config.channels;
                let mut layers = chained(1, channels, 9)?;
                let side = SIDE >> channels.len().min(3);
                let last = channels.last().copied().unwrap_or(1);
                layers.push(last.checked_mul(side * side)?.checked_mul(CLASSES)?);
                Some(layers)
            }
            ModelKind::Gpt => config.gpt.layer_weights(),
        }
    }

    /// A convolutional network: for each of `channels`, a 3x3 convolution
    /// (padding 1), ReLU and 2x2 max-pooling (`conv1`, `conv2`, ...); then
    /// a linear layer `fc` to the classes. At most three convolutions (the
    /// image is 8x8).
    pub fn cnn(channels: &[usize], seed: u64) -> Result<Model> {
        if channels.is_empty() || channels.len() > 3 || channels.contains(&0) {
            return Err(ExperimentError::Usage(
                "--channels takes one to three convolution widths, each at least 1".into(),
            ));
        }
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let config = Conv2dConfig {
            padding: 1,
            ..Conv2dConfig::default()
        };
        let mut convs = Vec::new();
        let mut input = 1;
        for (k, &c) in channels.iter().enumerate() {
            convs.push(candle_nn::conv2d(
                input,
                c,
                3,
                config,
                vb.pp(format!("conv{}", k + 1)),
            )?);
            input = c;
        }
        let side = SIDE >> channels.len();
        let fc = candle_nn::linear(input * side * side, CLASSES, vb.pp("fc"))?;
        Model::seeded(Layers::Cnn { convs, fc }, &varmap, seed, glorot)
    }

    /// A character-level transformer of `shape` (`gpt.rs`).
    pub fn gpt(shape: GptShape, seed: u64) -> Result<Model> {
        if let Some(problem) = shape.problem() {
            return Err(ExperimentError::Usage(problem));
        }
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let gpt = Gpt::new(shape, vb)?;
        Model::seeded(Layers::Gpt(Box::new(gpt)), &varmap, seed, |name, _| {
            shape.fill(name)
        })
    }

    /// The model with its variables overwritten from `seed`, drawn in name
    /// order, each as `fill` says from its name and shape.
    fn seeded(
        layers: Layers,
        varmap: &VarMap,
        seed: u64,
        fill: impl Fn(&str, &[usize]) -> Fill,
    ) -> Result<Model> {
        let vars = gradwire_candle::named_vars(varmap)?;
        let mut state = seed | 1;
        for (name, var) in &vars {
            let values: Vec<f32> = match fill(name, var.dims()) {
                Fill::Zero => vec![0.0; var.elem_count()],
                Fill::One => vec![1.0; var.elem_count()],
                Fill::Uniform(bound) => (0..var.elem_count())
                    .map(|_| {
                        ((xorshift(&mut state) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
                            * bound
                    })
                    .collect(),
            };
            gradwire_candle::write_values(var, &values)?;
        }
        Ok(Model { layers, vars })
    }

    /// Every variable with its name, sorted by name.
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// Total number of parameters.
    pub fn len(&self) -> usize {
        self.vars.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// Whether the model has no parameters (never: kept for clippy's
    /// `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The logits of a batch, one row per prediction: `[n, CLASSES]` for
    /// images (`[n, 64]`), `[n * context, VOCAB]` for windows of tokens.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match &self.layers {
            Layers::Mlp(layers) => {
                let mut h = x.clone();
                for (k, layer) in layers.iter().enumerate() {
                    h = layer.forward(&h)?;
                    if k + 1 < layers.len() {
                        h = h.relu()?;
                    }
                }
                Ok(h)
            }
            Layers::Cnn { convs, fc } => {
                let n = x.dim(0)?;
                let mut h = x.reshape((n, 1, SIDE, SIDE))?;
                for conv in convs {
                    h = max_pool_2x2(&conv.forward(&h)?.relu()?)?;
                }
                fc.forward(&h.flatten_from(1)?)
            }
            Layers::Gpt(gpt) => gpt.forward(x),
        }
    }

    /// The inputs and the labels (one per prediction) of `samples` of
    /// `split`. Errors if the data are not this model's or a sample is
    /// out of range.
    fn batch(&self, data: &Dataset, split: Split, samples: &[usize]) -> Result<(Tensor, Tensor)> {
        let missing = |s: usize| ExperimentError::Usage(format!("no sample {s}"));
        let n = samples.len();
        match (data, &self.layers) {
            (Dataset::Digits(d), Layers::Mlp(_) | Layers::Cnn { .. }) => {
                let (x, y) = match split {
                    Split::Train => (&d.train_x, &d.train_y),
                    Split::Test => (&d.test_x, &d.test_y),
                };
                let mut rows = Vec::with_capacity(n * FEATURES);
                let mut labels = Vec::with_capacity(n);
                for &s in samples {
                    let row = x
                        .get(s * FEATURES..(s + 1) * FEATURES)
                        .ok_or_else(|| missing(s))?;
                    rows.extend_from_slice(row);
                    let label = y.get(s).ok_or_else(|| missing(s))?;
                    labels.push(u32::try_from(*label).unwrap_or(u32::MAX));
                }
                Ok((
                    Tensor::from_vec(rows, (n, FEATURES), &Device::Cpu)?,
                    Tensor::from_vec(labels, n, &Device::Cpu)?,
                ))
            }
            (Dataset::Text(corpus), Layers::Gpt(gpt)) => {
                let t = gpt.context();
                if corpus.context() != t {
                    return Err(ExperimentError::Usage(format!(
                        "the corpus is cut into windows of {} characters, the model reads {t}",
                        corpus.context()
                    )));
                }
                let mut inputs = Vec::with_capacity(n * t);
                let mut targets = Vec::with_capacity(n * t);
                for &s in samples {
                    let window = match split {
                        Split::Train => corpus.train_window(s),
                        Split::Test => corpus.test_window(s),
                    }
                    .ok_or_else(|| missing(s))?;
                    inputs.extend(window[..t].iter().map(|&c| u32::from(c)));
                    targets.extend(window[1..].iter().map(|&c| u32::from(c)));
                }
                Ok((
                    Tensor::from_vec(inputs, (n, t), &Device::Cpu)?,
                    Tensor::from_vec(targets, n * t, &Device::Cpu)?,
                ))
            }
            _ => Err(ExperimentError::Usage(
                "the data set is not the one this model learns from".into(),
            )),
        }
    }

    /// The mean cross-entropy over the training `samples`, as a candle
    /// scalar (differentiable).
    fn loss_tensor(&self, data: &Dataset, samples: &[usize]) -> Result<Tensor> {
        let (inputs, labels) = self.batch(data, Split::Train, samples)?;
        Ok(candle_nn::loss::cross_entropy(
            &self.forward(&inputs)?,
            &labels,
        )?)
    }

    /// Mean cross-entropy over the training `samples` and its gradients.
    /// No samples (a worker past the end of the last batch): loss 0 and no
    /// gradient.
    pub fn loss_and_grads(&self, data: &Dataset, samples: &[usize]) -> Result<(f32, GradStore)> {
        if samples.is_empty() {
            return Ok((0.0, GradStore::default()));
        }
        let loss = self.loss_tensor(data, samples)?;
        let grads = loss.backward()?;
        Ok((loss.to_scalar::<f32>()?, grads))
    }

    /// Mean cross-entropy over the training `samples` (forward only; 0 for
    /// none).
    pub fn loss(&self, data: &Dataset, samples: &[usize]) -> Result<f32> {
        if samples.is_empty() {
            return Ok(0.0);
        }
        Ok(self.loss_tensor(data, samples)?.to_scalar::<f32>()?)
    }

    /// Loss and accuracy over every test sample (zeros for none), in
    /// chunks of 64 samples (bounding the attention's memory).
    pub fn evaluate(&self, data: &Dataset) -> Result<Evaluation> {
        let test_len = match data {
            Dataset::Digits(d) => d.test_y.len(),
            Dataset::Text(c) => c.test_len(),
        };
        let (mut loss, mut correct, mut predictions) = (0.0f64, 0.0f64, 0usize);
        let all: Vec<usize> = (0..test_len).collect();
        for chunk in all.chunks(EVAL_CHUNK) {
            let (inputs, labels) = self.batch(data, Split::Test, chunk)?;
            let logits = self.forward(&inputs)?;
            let count = labels.elem_count();
            let mean = candle_nn::loss::cross_entropy(&logits, &labels)?.to_scalar::<f32>()?;
            loss += f64::from(mean) * count as f64;
            let right = logits
                .argmax(1)?
                .eq(&labels)?
                .to_dtype(DType::F32)?
                .sum_all()?
                .to_scalar::<f32>()?;
            correct += f64::from(right);
            predictions += count;
        }
        let per = predictions.max(1) as f64;
        Ok(Evaluation {
            loss: loss / per,
            accuracy: correct / per,
        })
    }

    /// FNV-1a over the bits of every parameter (name order): equal
    /// checksums mean bitwise-equal models.
    pub fn checksum(&self) -> Result<String> {
        use std::hash::Hasher;
        let mut hash = fnv::FnvHasher::default();
        for (_, var) in &self.vars {
            gradwire_candle::with_values(var.as_tensor(), |values| {
                for v in values {
                    hash.write(&v.to_bits().to_le_bytes());
                }
            })?;
        }
        Ok(format!("{:016x}", hash.finish()))
    }
}

/// The digits models' initialisation: biases zero, weights
/// Glorot-uniform (fans from the shape).
fn glorot(name: &str, dims: &[usize]) -> Fill {
    if name.ends_with(".bias") {
        return Fill::Zero;
    }
    let receptive: usize = dims.iter().skip(2).product();
    let fan_in = dims.get(1).copied().unwrap_or(1) * receptive;
    let fan_out = dims.first().copied().unwrap_or(1) * receptive;
    Fill::Uniform((6.0 / (fan_in + fan_out) as f64).sqrt() as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Corpus, Digits};
    use crate::error::assert_usage;

    /// `layer_weights` names the weights of the layers the models build
    /// (their non-bias variables, in build order), for both kinds, one to
    /// three widths, primes among them; and `None` past `usize`.
    #[test]
    fn layer_weights_are_the_built_models_weights() {
        for (kind, widths) in [
            (ModelKind::Mlp, vec![7]),
            (ModelKind::Mlp, vec![13, 5, 3]),
            (ModelKind::Cnn, vec![2]),
            (ModelKind::Cnn, vec![3, 5, 7]),
        ] {
            let config = TrainConfig {
                model: kind,
                hidden: widths.clone(),
                channels: widths.clone(),
                seed: 1,
                ..TrainConfig::default()
            };
            let model = Model::new(&config).unwrap();
            let mut built: Vec<(String, usize)> = model
                .vars()
                .iter()
                .filter(|(name, _)| !name.ends_with(".bias"))
                .map(|(name, var)| (name.clone(), var.elem_count()))
                .collect();
            // Build order: conv1.., fc last; layer0.., output last.
            built.sort_by_key(|(name, _)| {
                (
                    name.starts_with("fc") || name.starts_with("out"),
                    name.clone(),
                )
            });
            let built: Vec<usize> = built.into_iter().map(|(_, n)| n).collect();
            assert_eq!(
                Model::layer_weights(&config),
                Some(built),
                "{kind:?} {widths:?}"
            );
        }
        let huge = TrainConfig {
            hidden: vec![usize::MAX],
            ..TrainConfig::default()
        };
        assert_eq!(Model::layer_weights(&huge), None);
        // The transformer's: its matrices and embeddings (not the biases
        // and LayerNorms), as a multiset.
        let config = TrainConfig {
            model: ModelKind::Gpt,
            gpt: GptShape {
                layers: 3,
                width: 10,
                heads: 2,
                context: 7,
            },
            ..TrainConfig::default()
        };
        let model = Model::new(&config).unwrap();
        let mut built: Vec<usize> = model
            .vars()
            .iter()
            .filter(|(name, _)| !name.ends_with(".bias") && !name.contains("norm"))
            .map(|(_, var)| var.elem_count())
            .collect();
        let mut planned = Model::layer_weights(&config).unwrap();
        built.sort_unstable();
        planned.sort_unstable();
        assert_eq!(built, planned);
    }

    /// Central differences in f64 of the loss along a few coordinates of
    /// every parameter, against candle's gradients, for both models. The
    /// images get a little noise and the biases small values, so that no
    /// ReLU sits exactly at its kink and no max-pool window has a tie (the
    /// digits have large blank areas).
    #[test]
    fn gradients_match_finite_differences() {
        let mut digits = Digits::load(1);
        let mut state = 5u64;
        for x in &mut digits.train_x {
            *x += (xorshift(&mut state) >> 40) as f32 / (1u64 << 24) as f32 * 0.1;
        }
        let digits = Dataset::Digits(digits);
        let text: Vec<u8> = (0..400u32)
            .map(|i| b"the cat sat on a mat\n"[(i * 7 % 21) as usize])
            .collect();
        let text = Dataset::Text(Corpus::from_text(&text, 5, 1).unwrap());
        let samples: Vec<usize> = (0..13).collect();
        let gpt = GptShape {
            layers: 2,
            width: 8,
            heads: 2,
            context: 5,
        };
        for (model, data) in [
            (Model::mlp(&[7, 5], 3).unwrap(), &digits),
            (Model::cnn(&[3, 4], 3).unwrap(), &digits),
            (Model::gpt(gpt, 3).unwrap(), &text),
        ] {
            for (name, var) in model.vars() {
                // The transformer's weights scaled up, so that its
                // gradients stand well above f32's rounding of the loss.
                if matches!(model.layers, Layers::Gpt(_)) && !name.ends_with(".bias") {
                    let base: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
                    let scaled: Vec<f32> = base.iter().map(|v| v * 5.0).collect();
                    gradwire_candle::write_values(var, &scaled).unwrap();
                }
                if name.ends_with(".bias") {
                    let values: Vec<f32> = (0..var.elem_count())
                        .map(|i| 0.05 * (i as f32 + 1.0).sin())
                        .collect();
                    gradwire_candle::write_values(var, &values).unwrap();
                }
            }
            let (_, grads) = model.loss_and_grads(data, &samples).unwrap();
            for (name, var) in model.vars() {
                let base: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
                let grad: Vec<f32> = grads
                    .get(var)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                for j in [0, base.len() / 2, base.len() - 1] {
                    // The transformer is smooth (no ReLU kink, no max
                    // pooling): a wider step keeps f32's rounding of the
                    // loss out of the difference.
                    let h = if matches!(model.layers, Layers::Gpt(_)) {
                        3e-3f32
                    } else {
                        1e-4
                    };
                    let at = |delta: f32| {
                        let mut v = base.clone();
                        v[j] += delta;
                        gradwire_candle::write_values(var, &v).unwrap();
                        f64::from(model.loss(data, &samples).unwrap())
                    };
                    let numeric = (at(h) - at(-h)) / (2.0 * f64::from(h));
                    gradwire_candle::write_values(var, &base).unwrap();
                    let analytic = f64::from(grad[j]);
                    assert!(
                        (numeric - analytic).abs() <= 2e-3 + 2e-2 * analytic.abs(),
                        "{name}[{j}]: numeric {numeric}, analytic {analytic}"
                    );
                }
            }
        }
    }

    /// The transformer is causal: changing the character at position p
    /// leaves every prediction before p bitwise as it was, and changes the
    /// ones from p on; its logits are one row of [`VOCAB`] per position.
    #[test]
    fn the_transformer_sees_only_the_past() {
        let shape = GptShape {
            layers: 2,
            width: 12,
            heads: 3,
            context: 7,
        };
        let model = Model::gpt(shape, 5).unwrap();
        let logits = |tokens: &[u32]| -> Vec<Vec<f32>> {
            let x = Tensor::from_vec(tokens.to_vec(), (1, tokens.len()), &Device::Cpu).unwrap();
            let out = model.forward(&x).unwrap();
            assert_eq!(out.dims(), [tokens.len(), crate::data::VOCAB]);
            out.to_vec2().unwrap()
        };
        let base: Vec<u32> = vec![5, 17, 42, 3, 97, 1, 60];
        let before = logits(&base);
        for p in 0..base.len() {
            let mut changed = base.clone();
            changed[p] = (changed[p] + 11) % crate::data::VOCAB as u32;
            let after = logits(&changed);
            for q in 0..base.len() {
                if q < p {
                    assert_eq!(before[q], after[q], "position {q} saw position {p}");
                } else {
                    assert_ne!(before[q], after[q], "position {q} ignored position {p}");
                }
            }
        }
        assert_usage(
            Model::gpt(GptShape { heads: 5, ..shape }, 1),
            "must be a multiple of --heads",
        );
        assert_usage(
            Model::gpt(GptShape { layers: 0, ..shape }, 1),
            "must be at least 1",
        );
        assert_usage(
            Model::gpt(
                GptShape {
                    context: usize::MAX,
                    ..shape
                },
                1,
            ),
            "--context must be at most 4096",
        );
        assert_usage(
            Model::gpt(
                GptShape {
                    layers: 1 << 40,
                    ..shape
                },
                1,
            ),
            "--layers must be at most 256",
        );
    }

    #[test]
    fn seeded_models_are_equal_and_bad_widths_are_refused() {
        let a = Model::cnn(&[4], 9).unwrap();
        let b = Model::cnn(&[4], 9).unwrap();
        assert_eq!(a.checksum().unwrap(), b.checksum().unwrap());
        assert_ne!(
            a.checksum().unwrap(),
            Model::cnn(&[4], 10).unwrap().checksum().unwrap()
        );
        let names: Vec<&str> = a.vars().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["conv1.bias", "conv1.weight", "fc.bias", "fc.weight"]
        );
        assert_eq!(a.len(), 4 * 9 + 4 + 4 * 16 * 10 + 10);
        assert_usage(
            Model::mlp(&[4, 0], 1),
            "a hidden layer needs at least one unit",
        );
        let widths = "--channels takes one to three convolution widths";
        assert_usage(Model::cnn(&[], 1), widths);
        assert_usage(Model::cnn(&[1, 1, 1, 1], 1), widths);
        let data = Dataset::Digits(Digits::load(2));
        let (loss, grads) = a.loss_and_grads(&data, &[]).unwrap();
        assert_eq!(loss, 0.0);
        assert!(grads.get(a.vars()[0].1.as_tensor()).is_none());
    }
}
