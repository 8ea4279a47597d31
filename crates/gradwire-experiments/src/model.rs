//! The models the CLI trains, built with candle: the digits MLP
//! (`64 - hidden... - 10`, ReLU) and a small convolutional network (3x3
//! convolutions with ReLU and 2x2 max-pooling over the 8x8 image, then a
//! linear layer), both ending in softmax cross-entropy. Forward and
//! backward are candle's; the weights are drawn from the run's seed
//! (Glorot-uniform, zero biases) because candle's CPU initialisation cannot
//! be seeded, so every worker and every run start from the same model.

use crate::config::ModelKind;
use crate::data::{CLASSES, FEATURES, xorshift};
use crate::error::{ExperimentError, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{Conv2d, Conv2dConfig, Linear, VarBuilder, VarMap};

/// Side of the square digit images.
const SIDE: usize = 8;

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
}

/// A candle model of the digits.
#[derive(Debug)]
pub struct Model {
    layers: Layers,
    /// Every variable, sorted by name (the declaration order of every
    /// worker: `gradwire_candle::named_vars`).
    vars: Vec<(String, Var)>,
}

impl Model {
    /// The model `kind` with `hidden` units per MLP layer or `channels`
    /// per convolution, weights from `seed`. Errors on a zero width.
    pub fn new(kind: ModelKind, hidden: &[usize], channels: &[usize], seed: u64) -> Result<Model> {
        match kind {
            ModelKind::Mlp => Model::mlp(hidden, seed),
            ModelKind::Cnn => Model::cnn(channels, seed),
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
        Model::seeded(Layers::Mlp(layers), &varmap, seed)
    }

    /// The weights of each layer of the model `kind` with these widths,
    /// in the order [`Model::mlp`] and [`Model::cnn`] build them (an MLP's
    /// `FEATURES x h0`, ..., `h_last x CLASSES`; a CNN's 3x3 convolutions
    /// and its final linear layer); `None` if one does not fit a `usize`.
    /// Computed without building anything, so a size can be refused
    /// before memory is allocated.
    pub fn layer_weights(
        kind: ModelKind,
        hidden: &[usize],
        channels: &[usize],
    ) -> Option<Vec<usize>> {
        let chained = |first: usize, widths: &[usize], each: usize| {
            std::iter::once(first)
                .chain(widths.iter().copied())
                .zip(widths.iter().copied())
                .map(|(a, b)| a.checked_mul(b)?.checked_mul(each))
                .collect::<Option<Vec<usize>>>()
        };
        match kind {
            ModelKind::Mlp => {
                let last = hidden.last().copied().unwrap_or(FEATURES);
                let mut layers = chained(FEATURES, hidden, 1)?;
                layers.push(last.checked_mul(CLASSES)?);
                Some(layers)
            }
            ModelKind::Cnn => {
                let mut layers = chained(1, channels, 9)?;
                let side = SIDE >> channels.len().min(3);
                let last = channels.last().copied().unwrap_or(1);
                layers.push(last.checked_mul(side * side)?.checked_mul(CLASSES)?);
                Some(layers)
            }
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
        Model::seeded(Layers::Cnn { convs, fc }, &varmap, seed)
    }

    /// The model with its variables overwritten from `seed`: weights
    /// Glorot-uniform (fans from the shape), biases zero, drawn in name
    /// order.
    fn seeded(layers: Layers, varmap: &VarMap, seed: u64) -> Result<Model> {
        let vars = gradwire_candle::named_vars(varmap)?;
        let mut state = seed | 1;
        for (name, var) in &vars {
            let dims = var.dims();
            let values: Vec<f32> = if name.ends_with(".bias") {
                vec![0.0; var.elem_count()]
            } else {
                let receptive: usize = dims.iter().skip(2).product();
                let fan_in = dims.get(1).copied().unwrap_or(1) * receptive;
                let fan_out = dims[0] * receptive;
                let bound = (6.0 / (fan_in + fan_out) as f64).sqrt() as f32;
                (0..var.elem_count())
                    .map(|_| {
                        ((xorshift(&mut state) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
                            * bound
                    })
                    .collect()
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

    /// The logits of a batch of images (`[n, 64]`).
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
        }
    }

    /// The images and labels of `samples` as a batch.
    fn batch(x: &[f32], y: &[usize], samples: &[usize]) -> Result<(Tensor, Tensor)> {
        let mut rows = Vec::with_capacity(samples.len() * FEATURES);
        let mut labels = Vec::with_capacity(samples.len());
        for &s in samples {
            let row = x
                .get(s * FEATURES..(s + 1) * FEATURES)
                .ok_or_else(|| ExperimentError::Usage(format!("no sample {s}")))?;
            rows.extend_from_slice(row);
            labels.push(u32::try_from(y[s]).unwrap_or(u32::MAX));
        }
        let n = samples.len();
        Ok((
            Tensor::from_vec(rows, (n, FEATURES), &Device::Cpu)?,
            Tensor::from_vec(labels, n, &Device::Cpu)?,
        ))
    }

    /// The mean cross-entropy over `samples` of (`x`, `y`), as a candle
    /// scalar (differentiable).
    fn loss_tensor(&self, x: &[f32], y: &[usize], samples: &[usize]) -> Result<Tensor> {
        let (inputs, labels) = Model::batch(x, y, samples)?;
        Ok(candle_nn::loss::cross_entropy(
            &self.forward(&inputs)?,
            &labels,
        )?)
    }

    /// Mean cross-entropy over `samples` and its gradients. No samples (a
    /// worker past the end of the last batch): loss 0 and no gradient.
    pub fn loss_and_grads(
        &self,
        x: &[f32],
        y: &[usize],
        samples: &[usize],
    ) -> Result<(f32, GradStore)> {
        if samples.is_empty() {
            return Ok((0.0, GradStore::default()));
        }
        let loss = self.loss_tensor(x, y, samples)?;
        let grads = loss.backward()?;
        Ok((loss.to_scalar::<f32>()?, grads))
    }

    /// Mean cross-entropy over `samples` (forward only; 0 for none).
    pub fn loss(&self, x: &[f32], y: &[usize], samples: &[usize]) -> Result<f32> {
        if samples.is_empty() {
            return Ok(0.0);
        }
        Ok(self.loss_tensor(x, y, samples)?.to_scalar::<f32>()?)
    }

    /// Fraction of `(x, y)` classified correctly.
    pub fn accuracy(&self, x: &[f32], y: &[usize]) -> Result<f64> {
        if y.is_empty() {
            return Ok(0.0);
        }
        let all: Vec<usize> = (0..y.len()).collect();
        let (inputs, labels) = Model::batch(x, y, &all)?;
        let predicted = self.forward(&inputs)?.argmax(1)?;
        let correct = predicted
            .eq(&labels)?
            .to_dtype(DType::F32)?
            .sum_all()?
            .to_scalar::<f32>()?;
        Ok(f64::from(correct) / y.len() as f64)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Digits;
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
            let model = Model::new(kind, &widths, &widths, 1).unwrap();
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
                Model::layer_weights(kind, &widths, &widths),
                Some(built),
                "{kind:?} {widths:?}"
            );
        }
        assert_eq!(
            Model::layer_weights(ModelKind::Mlp, &[usize::MAX], &[]),
            None
        );
    }

    /// Central differences in f64 of the loss along a few coordinates of
    /// every parameter, against candle's gradients, for both models. The
    /// images get a little noise and the biases small values, so that no
    /// ReLU sits exactly at its kink and no max-pool window has a tie (the
    /// digits have large blank areas).
    #[test]
    fn gradients_match_finite_differences() {
        let mut data = Digits::load(1);
        let mut state = 5u64;
        for x in &mut data.train_x {
            *x += (xorshift(&mut state) >> 40) as f32 / (1u64 << 24) as f32 * 0.1;
        }
        let samples: Vec<usize> = (0..13).collect();
        for model in [
            Model::mlp(&[7, 5], 3).unwrap(),
            Model::cnn(&[3, 4], 3).unwrap(),
        ] {
            for (name, var) in model.vars() {
                if name.ends_with(".bias") {
                    let values: Vec<f32> = (0..var.elem_count())
                        .map(|i| 0.05 * (i as f32 + 1.0).sin())
                        .collect();
                    gradwire_candle::write_values(var, &values).unwrap();
                }
            }
            let (_, grads) = model
                .loss_and_grads(&data.train_x, &data.train_y, &samples)
                .unwrap();
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
                    let h = 1e-4f32;
                    let at = |delta: f32| {
                        let mut v = base.clone();
                        v[j] += delta;
                        gradwire_candle::write_values(var, &v).unwrap();
                        f64::from(model.loss(&data.train_x, &data.train_y, &samples).unwrap())
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
        let data = Digits::load(2);
        let (loss, grads) = a.loss_and_grads(&data.train_x, &data.train_y, &[]).unwrap();
        assert_eq!(loss, 0.0);
        assert!(grads.get(a.vars()[0].1.as_tensor()).is_none());
    }
}
