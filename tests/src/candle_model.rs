//! The candle model the cross-crate tests train through gradwire-candle: a
//! two-layer MLP on a synthetic three-class data set, initialised the same
//! way in every process, trained in one process on the global batch or on
//! any communicator's ranks, each on its shard.

use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{Linear, Optimizer, VarBuilder, VarMap, linear};
use gradwire_candle::{DataParallel, DataParallelOptimizer, named_vars};
use gradwire_comm::Communicator;
use gradwire_optim::DistOptConfig;

/// Divisible by every world size 1..=8.
pub const BATCH: usize = 840;
const FEATURES: usize = 8;
const CLASSES: usize = 3;
/// Steps of every run.
pub const STEPS: usize = 6;

/// The model.
#[derive(Debug)]
pub struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

impl Mlp {
    /// The model's layers in `varmap`, with the deterministic initialisation.
    pub fn new(varmap: &VarMap) -> candle_core::Result<Mlp> {
        let vb = VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
        let mlp = Mlp {
            fc1: linear(FEATURES, 16, vb.pp("fc1"))?,
            fc2: linear(16, CLASSES, vb.pp("fc2"))?,
        };
        // A deterministic initialisation, the same in every process.
        for (k, (_, var)) in named_vars(varmap)?.iter().enumerate() {
            let n = var.elem_count();
            let values: Vec<f32> = (0..n)
                .map(|i| (((k * 101 + i * 7) as f32) * 0.37).sin() * 0.3)
                .collect();
            var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu)?)?;
        }
        Ok(mlp)
    }

    /// The logits.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(x)?.relu()?)
    }
}

/// Samples `rows` of the synthetic data set: features and class labels.
pub fn data(rows: std::ops::Range<usize>) -> candle_core::Result<(Tensor, Tensor)> {
    let n = rows.len();
    let mut x = Vec::with_capacity(n * FEATURES);
    let mut y = Vec::with_capacity(n);
    for i in rows {
        let f: Vec<f32> = (0..FEATURES)
            .map(|j| (((i * 31 + j * 17) % 23) as f32 - 11.0) / 11.0)
            .collect();
        let score = f[0] + 0.5 * f[1] - f[2];
        y.push(if score > 0.3 {
            0u32
        } else if score > -0.3 {
            1
        } else {
            2
        });
        x.extend(f);
    }
    Ok((
        Tensor::from_vec(x, (n, FEATURES), &Device::Cpu)?,
        Tensor::from_vec(y, n, &Device::Cpu)?,
    ))
}

fn loss(model: &Mlp, x: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
    candle_nn::loss::cross_entropy(&model.forward(x)?, y)
}

/// Every parameter's values, in declaration order.
pub fn values(varmap: &VarMap) -> candle_core::Result<Vec<Vec<f32>>> {
    named_vars(varmap)?
        .iter()
        .map(|(_, v)| v.as_tensor().flatten_all()?.to_vec1::<f32>())
        .collect()
}

/// One process on the global batch: the parameters and each step's loss.
pub fn single<O: Optimizer>(config: O::Config) -> candle_core::Result<(Vec<Vec<f32>>, Vec<f32>)> {
    let varmap = VarMap::new();
    let model = Mlp::new(&varmap)?;
    let vars: Vec<Var> = named_vars(&varmap)?.into_iter().map(|(_, v)| v).collect();
    let mut opt = O::new(vars, config)?;
    let (x, y) = data(0..BATCH)?;
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let l = loss(&model, &x, &y)?;
        losses.push(l.to_scalar::<f32>()?);
        opt.backward_step(&l)?;
    }
    Ok((values(&varmap)?, losses))
}

/// This rank's run through DataParallel on its shard of the batch: the
/// parameters and each step's (local) loss.
pub fn worker<O: DataParallelOptimizer, C: Communicator + 'static>(
    comm: C,
    config: O::Config,
    dist: DistOptConfig,
) -> candle_core::Result<(Vec<Vec<f32>>, Vec<f32>)> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let varmap = VarMap::new();
    let model = Mlp::new(&varmap)?;
    let mut dp = DataParallel::<O, _>::new(&varmap, config, comm, dist)?;
    dp.broadcast_parameters(0)?;
    let shard = BATCH / world;
    let (x, y) = data(rank * shard..(rank + 1) * shard)?;
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let l = loss(&model, &x, &y)?;
        losses.push(l.to_scalar::<f32>()?);
        dp.backward_step(&l)?;
    }
    Ok((values(&varmap)?, losses))
}

/// Whether `got` is within a tolerance of `want` scaled to f32 and the
/// number of steps (each step re-associates the sums over the batch); the
/// first element that is not, if any.
pub fn first_far(got: &[Vec<f32>], want: &[Vec<f32>]) -> Option<(f32, f32)> {
    got.iter()
        .flatten()
        .zip(want.iter().flatten())
        .find(|(g, w)| (*g - *w).abs() > 64.0 * STEPS as f32 * f32::EPSILON * (w.abs() + 1.0))
        .map(|(g, w)| (*g, *w))
}
