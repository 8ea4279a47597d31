//! A small classifier for end-to-end runs: smartcore's embedded digits data
//! set (1,797 8x8 images, 10 classes) with a fixed, seeded train/test split,
//! and a one-hidden-layer MLP with hand-written forward and backward passes.

use gradwire_tensor::Tensor;

/// Pixels per image.
pub const FEATURES: usize = 64;
/// Digits 0-9.
pub const CLASSES: usize = 10;

/// The data, split: features scaled to [0, 1].
#[derive(Debug, Clone)]
pub struct Digits {
    /// Training images, row-major, `FEATURES` each.
    pub train_x: Vec<f32>,
    /// Training labels.
    pub train_y: Vec<usize>,
    /// Test images.
    pub test_x: Vec<f32>,
    /// Test labels.
    pub test_y: Vec<usize>,
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

impl Digits {
    /// Loads the data set and splits it 80/20 with a seeded shuffle.
    pub fn load(seed: u64) -> Digits {
        let data = smartcore::dataset::digits::load_dataset();
        let n = data.num_samples;
        let mut order: Vec<usize> = (0..n).collect();
        let mut state = seed | 1;
        for i in (1..n).rev() {
            let j = (xorshift(&mut state) % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        let test_len = n / 5;
        let mut digits = Digits {
            train_x: vec![],
            train_y: vec![],
            test_x: vec![],
            test_y: vec![],
        };
        for (k, &i) in order.iter().enumerate() {
            let x = data.data[i * FEATURES..(i + 1) * FEATURES]
                .iter()
                .map(|v| v / 16.0);
            let y = data.target[i] as usize;
            if k < test_len {
                digits.test_x.extend(x);
                digits.test_y.push(y);
            } else {
                digits.train_x.extend(x);
                digits.train_y.push(y);
            }
        }
        digits
    }

    /// Number of training images.
    pub fn train_len(&self) -> usize {
        self.train_y.len()
    }
}

/// A 64-`hidden`-10 MLP with ReLU and softmax cross-entropy. Parameters are
/// tensors named `w1`, `b1`, `w2`, `b2`; backward produces gradients in the
/// reverse order (`b2`, `w2`, `b1`, `w1`).
#[derive(Debug)]
pub struct Mlp {
    /// Hidden units.
    pub hidden: usize,
    /// `[w1 (hidden x 64), b1, w2 (10 x hidden), b2]`.
    pub params: Vec<Tensor>,
}

/// Parameter names, in backward order (as gradients come out of backward).
pub const BACKWARD_ORDER: [&str; 4] = ["b2", "w2", "b1", "w1"];

impl Mlp {
    /// Glorot-uniform weights from `seed`, zero biases.
    pub fn new(hidden: usize, seed: u64) -> Mlp {
        let mut state = seed | 1;
        let mut uniform = |fan_in: usize, fan_out: usize, n: usize| -> Vec<f32> {
            let bound = (6.0 / (fan_in + fan_out) as f64).sqrt() as f32;
            (0..n)
                .map(|_| {
                    ((xorshift(&mut state) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * bound
                })
                .collect()
        };
        let w1 = uniform(FEATURES, hidden, hidden * FEATURES);
        let w2 = uniform(hidden, CLASSES, CLASSES * hidden);
        let t = |v: Vec<f32>, shape: Vec<usize>| Tensor::from_vec(v, shape).expect("shape");
        Mlp {
            hidden,
            params: vec![
                t(w1, vec![hidden, FEATURES]),
                t(vec![0.0; hidden], vec![hidden]),
                t(w2, vec![CLASSES, hidden]),
                t(vec![0.0; CLASSES], vec![CLASSES]),
            ],
        }
    }

    /// The parameters with their names, for DistOpt's `finish`.
    pub fn named(&mut self) -> impl Iterator<Item = (&'static str, &mut Tensor)> {
        ["w1", "b1", "w2", "b2"]
            .into_iter()
            .zip(self.params.iter_mut())
    }

    fn values(&self) -> [Vec<f32>; 4] {
        let v = |i: usize| self.params[i].to_vec::<f32>().expect("f32");
        [v(0), v(1), v(2), v(3)]
    }

    /// Mean cross-entropy over `samples` of (`x`, `y`) and its gradients
    /// `[w1, b1, w2, b2]`.
    pub fn loss_and_grads(
        &self,
        x: &[f32],
        y: &[usize],
        samples: &[usize],
    ) -> (f32, [Vec<f32>; 4]) {
        let h = self.hidden;
        let [w1, b1, w2, b2] = self.values();
        let mut g = [
            vec![0f32; w1.len()],
            vec![0f32; h],
            vec![0f32; w2.len()],
            vec![0f32; CLASSES],
        ];
        let mut loss = 0f32;
        let scale = 1.0 / samples.len().max(1) as f32;
        let mut hidden = vec![0f32; h];
        let mut logits = [0f32; CLASSES];
        for &s in samples {
            let xs = &x[s * FEATURES..(s + 1) * FEATURES];
            relu_layer(&w1, &b1, xs, &mut hidden);
            for (c, l) in logits.iter_mut().enumerate() {
                *l = b2[c]
                    + w2[c * h..(c + 1) * h]
                        .iter()
                        .zip(&hidden)
                        .map(|(a, b)| a * b)
                        .sum::<f32>();
            }
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
            let total: f32 = exp.iter().sum();
            loss -= (exp[y[s]] / total).ln() * scale;
            // dlogits = softmax - onehot
            let mut dhidden = vec![0f32; h];
            for c in 0..CLASSES {
                let d = (exp[c] / total - f32::from(u8::from(c == y[s]))) * scale;
                g[3][c] += d;
                for j in 0..h {
                    g[2][c * h + j] += d * hidden[j];
                    dhidden[j] += d * w2[c * h + j];
                }
            }
            for j in 0..h {
                if hidden[j] <= 0.0 {
                    continue;
                }
                g[1][j] += dhidden[j];
                for (gw, &xi) in g[0][j * FEATURES..(j + 1) * FEATURES].iter_mut().zip(xs) {
                    *gw += dhidden[j] * xi;
                }
            }
        }
        (loss, g)
    }

    /// Fraction of `(x, y)` classified correctly.
    pub fn accuracy(&self, x: &[f32], y: &[usize]) -> f64 {
        let h = self.hidden;
        let [w1, b1, w2, b2] = self.values();
        let mut correct = 0;
        let mut hidden = vec![0f32; h];
        for (s, &label) in y.iter().enumerate() {
            let xs = &x[s * FEATURES..(s + 1) * FEATURES];
            relu_layer(&w1, &b1, xs, &mut hidden);
            let best = (0..CLASSES)
                .map(|c| {
                    b2[c]
                        + w2[c * h..(c + 1) * h]
                            .iter()
                            .zip(&hidden)
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                })
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |acc, (c, v)| if v > acc.1 { (c, v) } else { acc },
                )
                .0;
            correct += usize::from(best == label);
        }
        correct as f64 / y.len().max(1) as f64
    }
}

/// `out = relu(w x + b)` for a row-major `w` of `out.len() x x.len()`.
fn relu_layer(w: &[f32], b: &[f32], x: &[f32], out: &mut [f32]) {
    for ((o, row), bias) in out.iter_mut().zip(w.chunks_exact(x.len())).zip(b) {
        *o = (bias + row.iter().zip(x).map(|(a, c)| a * c).sum::<f32>()).max(0.0);
    }
}
