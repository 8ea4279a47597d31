//! DistOpt's strategies that keep state between steps (PowerSGD's warm
//! start and residuals, the quantized modes' worker and server residuals)
//! on LocalComm: their gradients are exactly what the algorithm gives on
//! the same bucket; a skipped step (a NaN on one rank) leaves their state
//! as it was, so the run goes on as if the step had never come; a
//! checkpoint resumes bitwise.

use gradwire_algos::PowerSgdConfig;
use gradwire_algos::powersgd::PowerSgd;
use gradwire_algos::quantized::QuantizedAllReduce;
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_compress::Quantizer;
use gradwire_optim::checkpoint;
use gradwire_optim::{
    DistOpt, DistOptConfig, GradSync, OptimError, ParamSpec, Sgd, SgdConfig, StrategyConfig,
    StrategyError,
};
use gradwire_tensor::Tensor;

/// Matrices (compressed at rank 2), a conv-shaped kernel and a vector (dense).
const SHAPES: &[&[usize]] = &[&[24, 20], &[12, 3, 3], &[7], &[16, 33]];

fn specs() -> Vec<ParamSpec> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(k, dims)| ParamSpec::new(format!("p{k}"), dims.to_vec()))
        .collect()
}

fn names() -> Vec<String> {
    (0..SHAPES.len()).map(|k| format!("p{k}")).collect()
}

/// Rank `rank`'s gradient of parameter `k` at `step`: a shared low-rank
/// part plus a per-rank part, so compression loses something.
fn gradient(rank: usize, step: usize, k: usize) -> Tensor {
    let dims = SHAPES[k].to_vec();
    let n: usize = dims.iter().product();
    let values = (0..n)
        .map(|i| {
            let shared = ((i % 7) as f32 - 3.0) * 0.01 * (step as f32 + 1.0).sqrt();
            let own = (((rank * 131 + step * 17 + k * 5 + i) as f32) * 0.37).sin() * 0.05;
            shared + own
        })
        .collect();
    Tensor::from_vec(values, dims).unwrap()
}

fn powersgd() -> PowerSgdConfig {
    PowerSgdConfig {
        rank: 2,
        start_step: 1,
        ..PowerSgdConfig::default()
    }
}

/// Every stateful mode.
fn modes() -> Vec<StrategyConfig> {
    vec![
        StrategyConfig::PowerSgd(powersgd()),
        StrategyConfig::Quantized {
            quantizer: Quantizer::Sign,
            error_feedback: true,
            momentum: Some(0.9),
        },
        StrategyConfig::Quantized {
            quantizer: Quantizer::Qsgd {
                levels: 127,
                seed: 5,
                norm: gradwire_compress::QsgdNorm::L2,
            },
            error_feedback: true,
            momentum: None,
        },
        StrategyConfig::Quantized {
            quantizer: Quantizer::E3m0 { seed: 5 },
            error_feedback: true,
            momentum: None,
        },
        StrategyConfig::Quantized {
            quantizer: Quantizer::MinMaxU8,
            error_feedback: false,
            momentum: None,
        },
        // Dense for two steps, then the 1-bit moment.
        StrategyConfig::OneBitAdam {
            beta1: 0.9,
            freeze_step: 2,
        },
    ]
}

fn config(mode: StrategyConfig, fusion_threshold: usize) -> DistOptConfig {
    DistOptConfig {
        strategy: mode,
        fusion_threshold,
        skip_non_finite: true,
        ..DistOptConfig::default()
    }
}

fn sgd() -> Sgd {
    Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9)).unwrap()
}

/// The algorithm a mode runs, on one bucket of every parameter.
enum Reference {
    PowerSgd(PowerSgd),
    Quantized(Box<QuantizedAllReduce>),
}

impl Reference {
    fn new(mode: StrategyConfig) -> Reference {
        match mode {
            StrategyConfig::PowerSgd(c) => Reference::PowerSgd(PowerSgd::new(c).unwrap()),
            StrategyConfig::Quantized {
                quantizer,
                error_feedback,
                momentum,
            } => {
                let mut q = QuantizedAllReduce::new(quantizer, error_feedback).unwrap();
                if let Some(mu) = momentum {
                    q = q.with_momentum(mu).unwrap();
                }
                Reference::Quantized(Box::new(q))
            }
            other => panic!("no algorithm of its own to compare with: {other:?}"),
        }
    }

    fn all_reduce(
        &mut self,
        comm: &LocalComm,
        tensors: &mut [Tensor],
        step: u64,
    ) -> gradwire_algos::Result<()> {
        match self {
            Reference::PowerSgd(p) => {
                let slots: Vec<usize> = (0..tensors.len()).collect();
                p.all_reduce(comm, tensors, &slots, step).map(|_| ())
            }
            Reference::Quantized(q) => q.all_reduce(comm, tensors, step).map(|_| ()),
        }
    }
}

#[test]
fn distopt_gives_what_the_algorithm_gives_on_the_same_bucket() {
    // 1-bit Adam's strategy is a warm-up and the quantized all-reduce,
    // tested through its optimizer in tests/onebit_adam.rs.
    for mode in modes()
        .into_iter()
        .filter(|m| !matches!(m, StrategyConfig::OneBitAdam { .. }))
    {
        for world in [1usize, 2, 3, 5] {
            let results = local::run(world, |comm: LocalComm| {
                let rank = comm.rank();
                // The reference runs on a communicator of its own.
                let own = comm
                    .split(Some(0), rank as i64)
                    .map_err(gradwire_algos::AlgoError::from)?
                    .expect("every rank has color 0");
                // One bucket holding every parameter.
                // The engine's gradient step, through its slice API.
                let mut sync = GradSync::new(comm, specs(), config(mode, 1 << 20))?;
                let mut reference = Reference::new(mode);
                let mut differing = 0usize;
                for step in 0..4 {
                    for k in 0..SHAPES.len() {
                        sync.push_tensor(k, gradient(rank, step, k))?;
                    }
                    let mut got = vec![None; SHAPES.len()];
                    sync.finish_each(|i, g: &[f32]| {
                        got[i] = Some(g.to_vec());
                        Ok(())
                    })?;
                    let mut want: Vec<Tensor> =
                        (0..SHAPES.len()).map(|k| gradient(rank, step, k)).collect();
                    reference.all_reduce(&own, &mut want, step as u64)?;
                    for (g, w) in got.iter().zip(&want) {
                        let (g, w) = (g.as_ref().unwrap(), w.to_vec::<f32>()?);
                        differing += g
                            .iter()
                            .zip(&w)
                            .filter(|(a, b)| a.to_bits() != b.to_bits())
                            .count();
                    }
                }
                Ok::<_, OptimError>(differing)
            })
            .unwrap();
            for r in results {
                assert_eq!(r.unwrap(), 0, "{mode:?}, W = {world}: bits differ");
            }
        }
    }
}

/// Each rank's parameters after training in `mode` on `steps` (a `None`
/// step is one whose gradient holds a NaN on the last rank, skipped on
/// every rank), with a checkpoint through bytes into a fresh DistOpt after
/// `save_at` steps when given.
fn train(
    mode: StrategyConfig,
    world: usize,
    steps: &[Option<usize>],
    save_at: Option<usize>,
) -> Vec<Vec<u32>> {
    let results = local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let mut dist = Some(DistOpt::new(sgd(), comm, specs(), config(mode, 400))?);
        let mut params: Vec<Tensor> = SHAPES
            .iter()
            .map(|d| {
                Tensor::zeros(
                    d.to_vec(),
                    gradwire_tensor::DType::F32,
                    gradwire_tensor::Device::Cpu,
                )
            })
            .collect::<Result<_, _>>()?;
        let names = names();
        for (i, step) in steps.iter().enumerate() {
            if Some(i) == save_at {
                let old = dist.take().unwrap();
                let bytes = checkpoint::to_bytes(&old.checkpoint()?)?;
                let mut fresh = DistOpt::new(sgd(), old.into_comm(), specs(), config(mode, 400))?;
                fresh.restore(&checkpoint::from_bytes(&bytes)?)?;
                dist = Some(fresh);
            }
            let dist = dist.as_mut().unwrap();
            let (step, poisoned) = match step {
                Some(s) => (*s, false),
                None => (0, true),
            };
            for (k, name) in names.iter().enumerate() {
                let mut g = gradient(rank, step, k);
                if poisoned && rank == world - 1 && k == 0 {
                    g.as_mut_slice::<f32>()?[3] = f32::NAN;
                }
                dist.push(name, g)?;
            }
            let stats = dist.finish(names.iter().map(String::as_str).zip(params.iter_mut()))?;
            assert_eq!(stats.non_finite, poisoned);
        }
        Ok::<_, OptimError>(
            params
                .iter()
                .flat_map(|p| p.to_vec::<f32>().unwrap())
                .map(f32::to_bits)
                .collect::<Vec<_>>(),
        )
    })
    .unwrap();
    results.into_iter().map(|r| r.unwrap()).collect()
}

#[test]
fn a_skipped_step_leaves_the_state_as_it_was() {
    for mode in modes() {
        for world in [2usize, 3] {
            let straight = train(mode, world, &[Some(0), Some(1), Some(2), Some(3)], None);
            let skipped = train(
                mode,
                world,
                &[Some(0), Some(1), None, Some(2), Some(3)],
                None,
            );
            for r in 0..world {
                assert_eq!(
                    straight[r], straight[0],
                    "{mode:?}, W = {world}: ranks diverged"
                );
                assert_eq!(straight[r], skipped[r], "{mode:?}, W = {world}, rank {r}");
            }
        }
    }
}

#[test]
fn a_checkpoint_resumes_bitwise() {
    let steps: Vec<Option<usize>> = (0..6).map(Some).collect();
    for mode in modes() {
        let straight = train(mode, 3, &steps, None);
        let resumed = train(mode, 3, &steps, Some(3));
        assert_eq!(straight, resumed, "{mode:?}");
    }
}

#[test]
fn bad_settings_are_refused_at_construction() {
    let bad = [
        StrategyConfig::PowerSgd(PowerSgdConfig {
            rank: 0,
            ..PowerSgdConfig::default()
        }),
        StrategyConfig::Quantized {
            quantizer: Quantizer::Qsgd {
                levels: 0,
                seed: 0,
                norm: gradwire_compress::QsgdNorm::L2,
            },
            error_feedback: false,
            momentum: None,
        },
        StrategyConfig::Quantized {
            quantizer: Quantizer::Sign,
            error_feedback: true,
            momentum: Some(1.0),
        },
    ];
    for mode in bad {
        let comm = LocalComm::create(1).unwrap().pop().unwrap();
        let err = DistOpt::new(sgd(), comm, specs(), config(mode, 400)).unwrap_err();
        assert!(
            matches!(err, OptimError::Strategy(StrategyError::OutOfRange { .. })),
            "{mode:?}: {err}"
        );
    }
}
