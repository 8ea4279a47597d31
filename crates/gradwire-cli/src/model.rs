//! A multi-layer perceptron with ReLU hidden layers and softmax
//! cross-entropy, forward and backward written out by hand: the model the
//! CLI and the end-to-end tests train. Parameters are f32 tensors named
//! `w1, b1, w2, b2, ...` (`w<k>` is `out x in`, row-major); backward produces
//! gradients from the last layer to the first.

use crate::data::{CLASSES, FEATURES, xorshift};
use crate::error::{CliError, Result};
use gradwire_tensor::Tensor;

/// The MLP.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// Units per layer, input and output included: `[64, hidden..., 10]`.
    sizes: Vec<usize>,
    names: Vec<String>,
    /// `[w1, b1, w2, b2, ...]`.
    params: Vec<Tensor>,
}

impl Mlp {
    /// A `64 - hidden... - 10` network: Glorot-uniform weights drawn from
    /// `seed` layer by layer, zero biases. Errors on a zero-width layer.
    pub fn new(hidden: &[usize], seed: u64) -> Result<Mlp> {
        if hidden.contains(&0) {
            return Err(CliError::Usage(
                "a hidden layer needs at least one unit".into(),
            ));
        }
        let mut sizes = vec![FEATURES];
        sizes.extend_from_slice(hidden);
        sizes.push(CLASSES);
        let mut state = seed | 1;
        let mut names = Vec::new();
        let mut params = Vec::new();
        for (k, pair) in sizes.windows(2).enumerate() {
            let (fan_in, fan_out) = (pair[0], pair[1]);
            let bound = (6.0 / (fan_in + fan_out) as f64).sqrt() as f32;
            let w: Vec<f32> = (0..fan_in * fan_out)
                .map(|_| {
                    ((xorshift(&mut state) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * bound
                })
                .collect();
            names.push(format!("w{}", k + 1));
            params.push(Tensor::from_vec(w, vec![fan_out, fan_in])?);
            names.push(format!("b{}", k + 1));
            params.push(Tensor::from_vec(vec![0f32; fan_out], vec![fan_out])?);
        }
        Ok(Mlp {
            sizes,
            names,
            params,
        })
    }

    /// Units per layer, input and output included.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// Parameter names in forward order (`w1, b1, w2, ...`).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Parameter names in the order backward produces their gradients.
    pub fn backward_order(&self) -> Vec<String> {
        self.names.iter().rev().cloned().collect()
    }

    /// The shape of parameter `i` (forward order).
    pub fn shape(&self, i: usize) -> &[usize] {
        self.params[i].dims()
    }

    /// The parameters, forward order.
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// Total number of parameters.
    pub fn len(&self) -> usize {
        self.params.iter().map(Tensor::len).sum()
    }

    /// Whether the network has no parameters (never: kept for clippy's
    /// `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The parameters with their names, for DistOpt's `finish`.
    pub fn named(&mut self) -> impl Iterator<Item = (&str, &mut Tensor)> {
        self.names
            .iter()
            .map(String::as_str)
            .zip(self.params.iter_mut())
    }

    /// Sets parameter `name` to `value`.
    pub fn set(&mut self, name: &str, value: &Tensor) -> Result<()> {
        let i = self
            .names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| CliError::Usage(format!("no parameter {name}")))?;
        self.params[i].copy_from(value)?;
        Ok(())
    }

    fn values(&self) -> Result<Vec<Vec<f32>>> {
        Ok(self
            .params
            .iter()
            .map(|t| t.to_vec::<f32>())
            .collect::<std::result::Result<_, _>>()?)
    }

    /// The activations of every layer for one input (the last holds logits).
    fn forward(&self, values: &[Vec<f32>], x: &[f32], acts: &mut [Vec<f32>]) {
        let layers = self.sizes.len() - 1;
        acts[0].copy_from_slice(x);
        for k in 0..layers {
            let (w, b) = (&values[2 * k], &values[2 * k + 1]);
            let (before, after) = acts.split_at_mut(k + 1);
            let input = &before[k];
            let hidden = k + 1 < layers;
            for ((o, row), bias) in after[0].iter_mut().zip(w.chunks_exact(input.len())).zip(b) {
                let z = bias + row.iter().zip(input).map(|(a, c)| a * c).sum::<f32>();
                *o = if hidden { z.max(0.0) } else { z };
            }
        }
    }

    fn activations(&self) -> Vec<Vec<f32>> {
        self.sizes.iter().map(|&n| vec![0f32; n]).collect()
    }

    /// Mean cross-entropy over `samples` of (`x`, `y`) and its gradients in
    /// forward order (`[w1, b1, w2, ...]`).
    pub fn loss_and_grads(
        &self,
        x: &[f32],
        y: &[usize],
        samples: &[usize],
    ) -> Result<(f32, Vec<Vec<f32>>)> {
        let values = self.values()?;
        let mut grads: Vec<Vec<f32>> = values.iter().map(|v| vec![0f32; v.len()]).collect();
        let mut deltas = self.activations();
        let layers = self.sizes.len() - 1;
        let loss = self.cross_entropy(&values, x, y, samples, |acts, dlogits| {
            deltas[layers].copy_from_slice(dlogits);
            for k in (0..layers).rev() {
                let inputs = self.sizes[k];
                let (lower, upper) = deltas.split_at_mut(k + 1);
                let delta = &upper[0];
                let below = &mut lower[k];
                below.iter_mut().for_each(|d| *d = 0.0);
                let w = &values[2 * k];
                let (gw, rest) = grads[2 * k..].split_at_mut(1);
                let (gw, gb) = (&mut gw[0], &mut rest[0]);
                for (o, &d) in delta.iter().enumerate() {
                    if d == 0.0 {
                        continue; // an inactive ReLU: nothing flows back
                    }
                    gb[o] += d;
                    let row = o * inputs..(o + 1) * inputs;
                    for ((g, &a), (db, &wv)) in gw[row.clone()]
                        .iter_mut()
                        .zip(&acts[k])
                        .zip(below.iter_mut().zip(&w[row]))
                    {
                        *g += d * a;
                        *db += d * wv;
                    }
                }
                if k > 0 {
                    // Through the ReLU of layer k.
                    for (db, &a) in below.iter_mut().zip(&acts[k]) {
                        if a <= 0.0 {
                            *db = 0.0;
                        }
                    }
                }
            }
        });
        Ok((loss, grads))
    }

    /// Mean cross-entropy over `samples` (forward only).
    pub fn loss(&self, x: &[f32], y: &[usize], samples: &[usize]) -> Result<f32> {
        let values = self.values()?;
        Ok(self.cross_entropy(&values, x, y, samples, |_, _| {}))
    }

    /// The forward pass over `samples` with parameter `values`: returns the
    /// mean cross-entropy, and hands `backward` each sample's activations and
    /// the loss's gradient with respect to its logits (softmax - one-hot,
    /// scaled by 1 / samples).
    fn cross_entropy(
        &self,
        values: &[Vec<f32>],
        x: &[f32],
        y: &[usize],
        samples: &[usize],
        mut backward: impl FnMut(&[Vec<f32>], &[f32]),
    ) -> f32 {
        let mut acts = self.activations();
        let layers = self.sizes.len() - 1;
        let scale = 1.0 / samples.len().max(1) as f32;
        let mut loss = 0f32;
        let mut dlogits = vec![0f32; self.sizes[layers]];
        for &s in samples {
            self.forward(values, &x[s * FEATURES..(s + 1) * FEATURES], &mut acts);
            let (exp, total) = softmax_parts(&acts[layers]);
            loss -= (exp[y[s]] / total).ln() * scale;
            for (c, d) in dlogits.iter_mut().enumerate() {
                *d = (exp[c] / total - f32::from(u8::from(c == y[s]))) * scale;
            }
            backward(&acts, &dlogits);
        }
        loss
    }

    /// Fraction of `(x, y)` classified correctly.
    pub fn accuracy(&self, x: &[f32], y: &[usize]) -> Result<f64> {
        let values = self.values()?;
        let mut acts = self.activations();
        let layers = self.sizes.len() - 1;
        let mut correct = 0usize;
        for (s, &label) in y.iter().enumerate() {
            self.forward(&values, &x[s * FEATURES..(s + 1) * FEATURES], &mut acts);
            let best = acts[layers]
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |acc, (c, &v)| {
                        if v > acc.1 { (c, v) } else { acc }
                    },
                )
                .0;
            correct += usize::from(best == label);
        }
        Ok(correct as f64 / y.len().max(1) as f64)
    }
}

/// `exp(logit - max)` for each logit and their sum: the softmax is
/// `exp / total`, computed without overflow.
fn softmax_parts(logits: &[f32]) -> (Vec<f32>, f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let total = exp.iter().sum();
    (exp, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Digits;

    /// Central differences in f64 of the loss along each of a few
    /// coordinates of every parameter.
    #[test]
    fn gradients_match_finite_differences() {
        let data = Digits::load(1);
        let mut mlp = Mlp::new(&[7, 5], 3).unwrap();
        let samples: Vec<usize> = (0..13).collect();
        let (_, grads) = mlp
            .loss_and_grads(&data.train_x, &data.train_y, &samples)
            .unwrap();
        let names = mlp.names().to_vec();
        for (i, name) in names.iter().enumerate() {
            let base = mlp.params()[i].clone();
            for j in [0, base.len() / 2, base.len() - 1] {
                let h = 1e-3f32;
                let mut at = |delta: f32| {
                    let mut v = base.to_vec::<f32>().unwrap();
                    v[j] += delta;
                    let t = Tensor::from_vec(v, base.dims().to_vec()).unwrap();
                    mlp.set(name, &t).unwrap();
                    f64::from(mlp.loss(&data.train_x, &data.train_y, &samples).unwrap())
                };
                let numeric = (at(h) - at(-h)) / (2.0 * f64::from(h));
                mlp.set(name, &base).unwrap();
                let analytic = f64::from(grads[i][j]);
                assert!(
                    (numeric - analytic).abs() <= 2e-3 + 2e-2 * analytic.abs(),
                    "{name}[{j}]: numeric {numeric}, analytic {analytic}"
                );
            }
        }
    }

    #[test]
    fn forward_only_loss_equals_the_training_loss() {
        let data = Digits::load(2);
        let mlp = Mlp::new(&[16], 9).unwrap();
        let samples: Vec<usize> = (5..40).collect();
        let (with_grads, _) = mlp
            .loss_and_grads(&data.train_x, &data.train_y, &samples)
            .unwrap();
        let forward = mlp.loss(&data.train_x, &data.train_y, &samples).unwrap();
        assert!((with_grads - forward).abs() <= 1e-6 * with_grads.abs());
        assert!(Mlp::new(&[4, 0], 1).is_err());
    }
}
