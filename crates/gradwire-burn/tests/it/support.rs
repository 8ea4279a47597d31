//! What the test files share: a small burn MLP, deterministic data, and
//! the parameters read back as f32.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::{Device, Tensor, TensorData};

/// Inputs per sample.
pub const INPUTS: usize = 6;

/// A two-layer MLP, 6-5-1 (ranks 2 and 1 among its parameters).
#[derive(Module, Debug)]
pub struct Mlp {
    pub fc1: Linear,
    pub relu: Relu,
    pub fc2: Linear,
}

impl Mlp {
    pub fn new(device: &Device) -> Mlp {
        Mlp {
            fc1: LinearConfig::new(INPUTS, 5).init(device),
            relu: Relu::new(),
            fc2: LinearConfig::new(5, 1).init(device),
        }
    }

    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.fc2.forward(self.relu.forward(self.fc1.forward(x)))
    }

    /// The mean squared error on `batch`.
    pub fn loss(&self, batch: &Batch) -> Tensor<1> {
        (self.forward(batch.x.clone()) - batch.y.clone())
            .powi_scalar(2)
            .mean()
    }
}

/// The device the tests train on: flex, burn's pure-Rust CPU backend,
/// with autodiff.
pub fn device() -> Device {
    Device::flex().autodiff()
}

/// Samples: inputs and targets.
#[derive(Clone)]
pub struct Batch {
    pub x: Tensor<2>,
    pub y: Tensor<2>,
}

/// Sample `i`'s inputs at `step`: deterministic values in [-1, 1].
fn inputs(step: usize, i: usize) -> Vec<f32> {
    (0..INPUTS)
        .map(|k| (((step * 131 + i * 37 + k * 11) % 97) as f32 / 48.5) - 1.0)
        .collect()
}

/// The teacher's target for `x`: a fixed linear function.
fn target(x: &[f32]) -> f32 {
    x.iter()
        .enumerate()
        .map(|(k, v)| v * (0.5 - 0.2 * k as f32))
        .sum()
}

/// Samples `range` of the global batch of `step`.
pub fn batch(step: usize, range: std::ops::Range<usize>, device: &Device) -> Batch {
    let n = range.len();
    let mut x = Vec::with_capacity(n * INPUTS);
    let mut y = Vec::with_capacity(n);
    for i in range {
        let xi = inputs(step, i);
        y.push(target(&xi));
        x.extend(xi);
    }
    Batch {
        x: Tensor::from_data(TensorData::new(x, [n, INPUTS]), device),
        y: Tensor::from_data(TensorData::new(y, [n, 1]), device),
    }
}

/// Every float parameter of `module` as f32, in visiting order.
pub fn params<M: Module>(module: &M) -> Vec<Vec<f32>> {
    struct Read(Vec<Vec<f32>>);
    impl ModuleVisitor for Read {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0
                .push(param.val().into_data().try_to_vec::<f32>().unwrap());
        }
    }
    let mut read = Read(Vec::new());
    module.visit(&mut read);
    read.0
}

/// Bit patterns of [`params`], for bitwise comparisons.
pub fn bits<M: Module>(module: &M) -> Vec<Vec<u32>> {
    params(module)
        .into_iter()
        .map(|p| p.into_iter().map(f32::to_bits).collect())
        .collect()
}

/// [`Mlp::new`] with deterministic weights (the same in every run and on
/// every worker, without a broadcast): parameter `k` holds values of seed
/// `k` in [-0.5, 0.5].
pub fn seeded(device: &Device) -> Mlp {
    struct Seed(usize);
    impl burn::module::ModuleMapper for Seed {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let seed = self.0;
            self.0 += 1;
            param.map(|t| {
                let shape = t.shape();
                let n = shape.num_elements();
                let values: Vec<f32> = (0..n)
                    .map(|i| (((i * 37 + seed * 101) % 97) as f32 / 97.0) - 0.5)
                    .collect();
                Tensor::from_data(TensorData::new(values, shape), &t.device()).require_grad()
            })
        }
    }
    Mlp::new(device).map(&mut Seed(0))
}
