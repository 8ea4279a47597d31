//! A candle MLP trained data-parallel through gradwire-candle on LocalComm
//! equals the same model trained in one process on the global batch (SGD
//! and AdamW, 1 to 8 workers), the workers stay bitwise equal, the
//! compressed modes still learn, and the trained model classifies alike.
//! The conformance suite runs the same comparison on MpiComm under mpirun.

use candle_core::{D, Device, Tensor};
use candle_nn::{AdamW, ParamsAdamW, SGD, VarMap};
use gradwire_algos::HalfPrecision;
use gradwire_candle::named_vars;
use gradwire_comm::local;
use gradwire_compress::SparseCodec;
use gradwire_optim::{AdamConfig, DistOptConfig, Mode, SgdConfig};
use gradwire_tests::candle_model::{BATCH, Mlp, STEPS, data, first_far, single, worker};

fn parallel<O: candle_nn::Optimizer>(
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
                assert_eq!(
                    bits(got),
                    bits(&results[0].0),
                    "{name}, W = {world}: rank {rank} differs"
                );
            }
            assert_eq!(first_far(&results[0].0, want), None, "{name}, W = {world}");
        }
    }
}

/// gradwire's own update rules through gradwire-candle (SGD with momentum,
/// which candle-nn lacks, and gradwire's AdamW), in place on candle's
/// variables: the same equality with one process.
#[test]
fn sgd_with_momentum_and_gradwire_adamw_on_1_to_8_workers_equal_one_process() {
    let sgd = SgdConfig::default().lr(0.2).momentum(0.9);
    let adamw = AdamConfig::adamw().lr(0.01);
    let (sgd_want, _) = single::<gradwire_candle::Sgd>(sgd.clone()).unwrap();
    let (adamw_want, _) = single::<gradwire_candle::AdamW>(adamw.clone()).unwrap();
    for world in 1..=8 {
        for (name, results, want) in [
            (
                "sgd, momentum 0.9",
                parallel::<gradwire_candle::Sgd>(world, sgd.clone(), DistOptConfig::default()),
                &sgd_want,
            ),
            (
                "gradwire adamw",
                parallel::<gradwire_candle::AdamW>(world, adamw.clone(), DistOptConfig::default()),
                &adamw_want,
            ),
        ] {
            for (rank, (got, _)) in results.iter().enumerate() {
                assert_eq!(
                    bits(got),
                    bits(&results[0].0),
                    "{name}, W = {world}: rank {rank} differs"
                );
            }
            assert_eq!(first_far(&results[0].0, want), None, "{name}, W = {world}");
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
            assert_eq!(bits(&r.0), bits(&results[0].0), "{mode:?}: workers differ");
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
