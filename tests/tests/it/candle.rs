//! A candle MLP trained data-parallel through gradwire-candle on LocalComm
//! equals the same model trained in one process on the global batch (SGD
//! and AdamW, 1 to 8 workers), the workers stay bitwise equal, the
//! compressed modes still learn, and the trained model classifies alike.
//! The conformance suite runs the same comparison on MpiComm under mpirun.

use candle_core::{D, Device, Tensor};
use candle_nn::{AdamW, ParamsAdamW, SGD, VarMap};
use gradwire_algos::HalfPrecision;
use gradwire_algos::adasum::AdaSum;
use gradwire_candle::{DataParallel, named_vars};
use gradwire_comm::Communicator;
use gradwire_comm::local;
use gradwire_compress::SparseCodec;
use gradwire_optim::{AdamConfig, DistOptConfig, SgdConfig, StrategyConfig};
use gradwire_tests::candle_model::{BATCH, Mlp, STEPS, data, first_far, single, values, worker};

fn parallel<O: gradwire_candle::DataParallelOptimizer>(
    world: usize,
    config: O::Config,
    dist: DistOptConfig,
) -> Vec<(Vec<Vec<f32>>, Vec<f32>)>
where
    O::Config: Clone + Sync,
{
    local::run(world, |comm| {
        worker::<O, _>(comm, config.clone(), dist.clone())
    })
    .expect("workers ran")
    .into_iter()
    .map(|r| r.expect("a worker failed"))
    .collect()
}

fn bits(v: &[Vec<f32>]) -> Vec<u32> {
    v.iter().flatten().map(|x| x.to_bits()).collect()
}

/// Optimizer `O` with `config` on 1 to 8 workers: every worker bitwise
/// equal, and equal to one process on the global batch (within
/// [`first_far`]'s tolerance).
fn equals_one_process<O: gradwire_candle::DataParallelOptimizer>(name: &str, config: O::Config)
where
    O::Config: Clone + Sync,
{
    let (want, _) = single::<O>(config.clone()).unwrap();
    for world in 1..=8 {
        let results = parallel::<O>(world, config.clone(), DistOptConfig::default());
        for (rank, (got, _)) in results.iter().enumerate() {
            assert_eq!(
                bits(got),
                bits(&results[0].0),
                "{name}, W = {world}: rank {rank} differs"
            );
        }
        assert_eq!(first_far(&results[0].0, &want), None, "{name}, W = {world}");
    }
}

#[test]
fn sgd_and_adamw_on_1_to_8_workers_equal_one_process_on_the_global_batch() {
    equals_one_process::<SGD>("sgd", 0.5);
    let adamw = ParamsAdamW {
        lr: 0.01,
        ..ParamsAdamW::default()
    };
    equals_one_process::<AdamW>("adamw", adamw);
}

/// gradwire's own update rules through gradwire-candle (SGD with momentum,
/// which candle-nn lacks, and gradwire's AdamW), in place on candle's
/// variables: the same equality with one process.
#[test]
fn sgd_with_momentum_and_gradwire_adamw_on_1_to_8_workers_equal_one_process() {
    let sgd = SgdConfig::default().lr(0.2).momentum(0.9);
    equals_one_process::<gradwire_candle::Sgd>("sgd, momentum 0.9", sgd);
    equals_one_process::<gradwire_candle::AdamW>("gradwire adamw", AdamConfig::adamw().lr(0.01));
}

#[test]
fn compressed_modes_learn() {
    let modes = [
        StrategyConfig::Half {
            precision: HalfPrecision::BF16,
            clip: None,
        },
        StrategyConfig::Sparse {
            codec: SparseCodec::TopK(0.2),
            error_feedback: true,
        },
    ];
    for mode in modes {
        let dist = DistOptConfig {
            strategy: mode,
            ..DistOptConfig::default()
        };
        let results = parallel::<SGD>(4, 0.5, dist);
        let losses = &results[0].1;
        assert!(
            losses[STEPS - 1] < 0.9 * losses[0],
            "{mode:?}: the loss went {losses:?}"
        );
        for r in &results {
            assert_eq!(bits(&r.0), bits(&results[0].0), "{mode:?}: workers differ");
        }
    }
}

/// candle-nn's own SGD as the local step of the parameter-stepping modes:
/// AdaSum by delta weight keeps the workers bitwise equal and learns;
/// partial averaging learns (its workers differ by design).
#[test]
fn a_candle_optimizer_steps_locally_in_partial_and_delta_weight_modes() {
    for world in 1..=4 {
        let results = local::run(world, |comm| {
            let rank = comm.rank();
            let mut runs = Vec::new();
            for mode in [
                StrategyConfig::DeltaWeight { group: None },
                StrategyConfig::Partial {
                    average_state: false,
                },
            ] {
                let own = comm
                    .split(Some(0), rank as i64)
                    .map_err(candle_core::Error::wrap)?
                    .expect("a member");
                let varmap = VarMap::new();
                let model = Mlp::new(&varmap)?;
                let vars = named_vars(&varmap)?;
                let dist = DistOptConfig {
                    strategy: mode,
                    fusion_threshold: 64,
                    ..DistOptConfig::default()
                };
                let mut dp = if matches!(mode, StrategyConfig::DeltaWeight { .. }) {
                    let adasum = AdaSum::new(&own).map_err(candle_core::Error::wrap)?;
                    DataParallel::<SGD, _>::with_strategy(vars, 0.5, own, dist, adasum)?
                } else {
                    DataParallel::<SGD, _>::from_vars(vars, 0.5, own, dist)?
                };
                let shard = BATCH / world;
                let (x, y) = data(rank * shard..(rank + 1) * shard)?;
                let mut losses = Vec::new();
                for _ in 0..STEPS {
                    let loss = candle_nn::loss::cross_entropy(&model.forward(&x)?, &y)?;
                    losses.push(loss.to_scalar::<f32>()?);
                    dp.backward_step(&loss)?;
                }
                runs.push((values(&varmap)?, losses));
            }
            Ok::<_, candle_core::Error>(runs)
        })
        .expect("workers ran");
        let results: Vec<_> = results
            .into_iter()
            .map(|r| r.expect("a worker failed"))
            .collect();
        for (rank, runs) in results.iter().enumerate() {
            let (delta, delta_losses) = &runs[0];
            assert_eq!(
                bits(delta),
                bits(&results[0][0].0),
                "delta weight, W = {world}: rank {rank} differs"
            );
            assert!(
                delta_losses[STEPS - 1] < 0.9 * delta_losses[0],
                "delta weight: {delta_losses:?}"
            );
            let partial_losses = &runs[1].1;
            assert!(
                partial_losses[STEPS - 1] < 0.9 * partial_losses[0],
                "partial: {partial_losses:?}"
            );
        }
    }
}

#[test]
fn the_trained_model_classifies_as_the_single_process_one() {
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
