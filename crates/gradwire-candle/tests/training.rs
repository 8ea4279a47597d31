//! A candle MLP trained data-parallel through gradwire-candle equals the
//! same model trained in one process on the global batch (SGD and AdamW,
//! 1 to 8 workers), the workers stay bitwise equal, the compressed modes
//! still learn, and what gradwire-candle cannot train is a typed error.

use candle_core::{D, DType, Device, Module, Tensor, Var};
use candle_nn::{AdamW, Linear, Optimizer, ParamsAdamW, SGD, VarBuilder, VarMap, linear};
use gradwire_algos::HalfPrecision;
use gradwire_candle::{DataParallel, named_vars};
use gradwire_comm::{Communicator, local};
use gradwire_compress::SparseCodec;
use gradwire_optim::{DistOptConfig, Mode};

/// Divisible by every world size 1..=8.
const BATCH: usize = 840;
const FEATURES: usize = 8;
const CLASSES: usize = 3;
const STEPS: usize = 6;

struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

impl Mlp {
    fn new(varmap: &VarMap) -> candle_core::Result<Mlp> {
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

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(x)?.relu()?)
    }
}

/// Samples `rows` of the synthetic data set: features and class labels.
fn data(rows: std::ops::Range<usize>) -> candle_core::Result<(Tensor, Tensor)> {
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
    let logits = model.forward(x)?;
    candle_nn::loss::cross_entropy(&logits, y)
}

fn values(varmap: &VarMap) -> candle_core::Result<Vec<Vec<f32>>> {
    named_vars(varmap)?
        .iter()
        .map(|(_, v)| v.as_tensor().flatten_all()?.to_vec1::<f32>())
        .collect()
}

/// One process on the global batch.
fn single<O: Optimizer>(config: O::Config) -> candle_core::Result<(Vec<Vec<f32>>, Vec<f32>)> {
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

/// `world` workers, each on its shard, through DataParallel.
fn parallel<O: Optimizer>(
    world: usize,
    config: O::Config,
    dist: DistOptConfig,
) -> Vec<(Vec<Vec<f32>>, Vec<f32>)>
where
    O::Config: Clone + Sync,
{
    local::run(world, |comm| -> candle_core::Result<_> {
        let rank = comm.rank();
        let varmap = VarMap::new();
        let model = Mlp::new(&varmap)?;
        let mut dp = DataParallel::<O, _>::new(&varmap, config.clone(), comm, dist.clone())?;
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
    })
    .expect("workers ran")
    .into_iter()
    .map(|r| r.expect("a worker failed"))
    .collect()
}

/// Within a tolerance scaled to f32 and the number of steps (each step
/// re-associates the sums over the batch).
fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
        let tol = 64.0 * STEPS as f32 * f32::EPSILON * (w.abs() + 1.0);
        assert!((g - w).abs() <= tol, "{what}: {g} vs {w}");
    }
}

#[test]
fn sgd_and_adamw_on_1_to_8_workers_equal_one_process_on_the_global_batch() {
    let (sgd_want, _) = single::<SGD>(0.5).unwrap();
    let adamw = ParamsAdamW {
        lr: 0.01,
        ..ParamsAdamW::default()
    };
    let (adamw_want, _) = single::<AdamW>(adamw.clone()).unwrap();
    for world in 1..=8 {
        for (name, results, want) in [
            (
                "sgd",
                parallel::<SGD>(world, 0.5, DistOptConfig::default()),
                &sgd_want,
            ),
            (
                "adamw",
                parallel::<AdamW>(world, adamw.clone(), DistOptConfig::default()),
                &adamw_want,
            ),
        ] {
            for (rank, (got, _)) in results.iter().enumerate() {
                let bits = |v: &Vec<Vec<f32>>| -> Vec<u32> {
                    v.iter().flatten().map(|x| x.to_bits()).collect()
                };
                assert_eq!(
                    bits(got),
                    bits(&results[0].0),
                    "{name}, W = {world}: rank {rank} differs"
                );
            }
            assert_close(&results[0].0, want, &format!("{name}, W = {world}"));
        }
    }
}

#[test]
fn compressed_modes_learn() {
    let modes = [
        Mode::Half {
            precision: HalfPrecision::BF16,
            clip: None,
        },
        Mode::Sparse {
            codec: SparseCodec::TopK(0.2),
            error_feedback: true,
        },
    ];
    for mode in modes {
        let dist = DistOptConfig {
            mode,
            ..DistOptConfig::default()
        };
        let results = parallel::<SGD>(4, 0.5, dist);
        let losses = &results[0].1;
        assert!(
            losses[STEPS - 1] < 0.9 * losses[0],
            "{mode:?}: the loss went {losses:?}"
        );
        for r in &results {
            assert_eq!(r.0, results[0].0, "{mode:?}: workers differ");
        }
    }
}

#[test]
fn parameters_gradwire_candle_cannot_train_are_typed_errors() {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu);
    let _ = linear(2, 2, vb.pp("fc")).unwrap();
    let comm = gradwire_comm::LocalComm::create(1).unwrap().pop().unwrap();
    let err = DataParallel::<SGD, _>::new(&varmap, 0.1, comm, DistOptConfig::default()).err();
    let message = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("f32"), "{message}");
}

#[test]
fn the_argmax_does_not_depend_on_the_world() {
    // The trained models classify the training set alike whatever W: the
    // data-parallel run is the same model.
    let (want, _) = single::<SGD>(0.5).unwrap();
    let got = parallel::<SGD>(3, 0.5, DistOptConfig::default());
    let predict = |vals: &[Vec<f32>]| -> candle_core::Result<Vec<u32>> {
        let varmap = VarMap::new();
        let model = Mlp::new(&varmap)?;
        for ((_, var), v) in named_vars(&varmap)?.iter().zip(vals) {
            var.set(&Tensor::from_vec(v.clone(), var.shape(), &Device::Cpu)?)?;
        }
        let (x, _) = data(0..BATCH)?;
        model.forward(&x)?.argmax(D::Minus1)?.to_vec1::<u32>()
    };
    assert_eq!(predict(&got[0].0).unwrap(), predict(&want).unwrap());
}
