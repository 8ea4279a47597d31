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
        let (mut loss, mut correct, mut predictions) = (0.0f64, 0.0f64, 0usize);
        let all: Vec<usize> = (0..data.test_len()).collect();
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
mod tests;
