//! One `DataParallel` in every training loop: the local-step strategies
//! (partial averaging, with the optimizer's state too, and AdaSum by delta
//! weight) over candle variables with gradwire's SGD as the candle
//! optimizer give bitwise what gradwire's `LocalSteps` gives over gradwire
//! tensors with the same SGD, at W = 1..=4; `partial:state` with an
//! optimizer whose state is private (candle's) is refused with
//! `StrategyError::PrivateState`; a checkpoint carries the optimizer's state.

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use candle_nn::SGD;
use gradwire_candle::{DataParallel, with_values};
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::{
    DistOptConfig, LocalSteps, OptimError, ParamSpec, Sgd, SgdConfig, StrategyConfig,
    StrategyError, TrainingLoop,
};
use gradwire_tensor::Tensor as GwTensor;

use crate::support::{SHAPES, STEPS, values, vars};

fn gradient(n: usize, rank: usize, step: usize, k: usize) -> Vec<f32> {
    values(n, 10 + rank * 17 + step * 3 + k)
}

fn sgd_config() -> SgdConfig {
    SgdConfig::default().lr(0.1).momentum(0.9)
}

/// DataParallel over `vars` with gradwire's SGD ([`sgd_config`]) and
/// `strategy` ([`config`]).
fn sgd_over(
    vars: &[(String, Var)],
    comm: LocalComm,
    strategy: StrategyConfig,
) -> DataParallel<gradwire_candle::Sgd, LocalComm> {
    DataParallel::from_vars(vars.to_vec(), sgd_config(), comm, config(strategy)).unwrap()
}

fn config(strategy: StrategyConfig) -> DistOptConfig {
    DistOptConfig {
        strategy,
        fusion_threshold: 12,
        ..DistOptConfig::default()
    }
}

fn local_step_strategies() -> [StrategyConfig; 3] {
    [
        StrategyConfig::Partial {
            average_state: false,
        },
        StrategyConfig::Partial {
            average_state: true,
        },
        StrategyConfig::DeltaWeight { group: None },
    ]
}

fn bits(v: &[Vec<f32>]) -> Vec<u32> {
    v.iter().flatten().map(|x| x.to_bits()).collect()
}

/// `STEPS` steps through DataParallel with gradwire's SGD as the candle
/// optimizer: every variable's values at the end.
fn through_data_parallel(comm: LocalComm, strategy: StrategyConfig) -> Vec<Vec<f32>> {
    let rank = comm.rank();
    let vars = vars();
    let mut dp = sgd_over(&vars, comm, strategy);
    assert_eq!(dp.sync().training_loop(), TrainingLoop::LocalSteps);
    for step in 0..STEPS {
        let mut grads = GradStore::default();
        for (k, (_, var)) in vars.iter().enumerate() {
            let g = gradient(var.elem_count(), rank, step, k);
            let g = Tensor::from_vec(g, var.shape(), &Device::Cpu).unwrap();
            grads.insert(var.as_tensor(), g);
        }
        dp.step(grads).unwrap();
    }
    vars.iter()
        .map(|(_, v)| with_values(v.as_tensor(), <[f32]>::to_vec).unwrap())
        .collect()
}

/// The same steps through gradwire's LocalSteps with gradwire's SGD.
fn through_local_steps(comm: LocalComm, strategy: StrategyConfig) -> Vec<Vec<f32>> {
    let rank = comm.rank();
    let specs: Vec<ParamSpec> = SHAPES
        .iter()
        .enumerate()
        .map(|(k, shape)| ParamSpec::new(format!("p{k}"), shape.to_vec()))
        .collect();
    let sgd = Sgd::new(sgd_config()).unwrap();
    let mut dist = LocalSteps::new(sgd, comm, specs.clone(), config(strategy)).unwrap();
    let mut params: Vec<GwTensor> = specs
        .iter()
        .enumerate()
        .map(|(k, s)| {
            GwTensor::from_vec(values(s.shape.iter().product(), k), s.shape.clone()).unwrap()
        })
        .collect();
    for step in 0..STEPS {
        for (k, s) in specs.iter().enumerate() {
            let g = GwTensor::from_vec(
                gradient(s.shape.iter().product(), rank, step, k),
                s.shape.clone(),
            );
            dist.push(&s.name, g.unwrap()).unwrap();
        }
        let named = specs.iter().map(|s| s.name.as_str()).zip(params.iter_mut());
        dist.finish(named).unwrap();
    }
    params.iter().map(|p| p.to_vec::<f32>().unwrap()).collect()
}

#[test]
fn local_steps_over_candle_variables_are_bitwise_gradwires() {
    for strategy in local_step_strategies() {
        for world in 1..=4 {
            let want = local::run(world, |c| through_local_steps(c, strategy)).unwrap();
            let got = local::run(world, |c| through_data_parallel(c, strategy)).unwrap();
            for (rank, (w, g)) in want.iter().zip(&got).enumerate() {
                assert_eq!(bits(g), bits(w), "{strategy}, W = {world}, rank {rank}");
            }
        }
    }
}

#[test]
fn averaging_a_private_optimizer_state_is_refused() {
    let comm = LocalComm::create(1).unwrap().pop().unwrap();
    let var = Var::from_tensor(&Tensor::zeros(3, candle_core::DType::F32, &Device::Cpu).unwrap());
    let vars = vec![("w".to_string(), var.unwrap())];
    let state = StrategyConfig::Partial {
        average_state: true,
    };
    let err = DataParallel::<SGD, _>::from_vars(vars, 0.1, comm, config(state)).unwrap_err();
    assert!(
        matches!(&err, gradwire_candle::Error::Gradwire(OptimError::Strategy(
            StrategyError::PrivateState { strategy }
        )) if strategy == &state.to_string()),
        "{err:?}"
    );
}

#[test]
fn a_checkpoint_carries_the_optimizers_state() {
    let out = local::run(2, |comm| {
        let var = Var::from_tensor(&Tensor::ones(4, candle_core::DType::F32, &Device::Cpu)?)?;
        let vars = vec![("w".to_string(), var.clone())];
        let mut dp = DataParallel::<gradwire_candle::Sgd, _>::from_vars(
            vars.clone(),
            sgd_config(),
            comm,
            config(StrategyConfig::Dense),
        )?;
        let mut grads = GradStore::default();
        grads.insert(
            var.as_tensor(),
            Tensor::ones(4, candle_core::DType::F32, &Device::Cpu)?,
        );
        dp.step(grads)?;
        let ckpt = dp.checkpoint()?;
        let state = ckpt
            .optimizer_state(gradwire_candle::optim::STATE_PREFIX)
            .map_err(candle_core::Error::wrap)?;
        Ok::<_, candle_core::Error>(state.map(|s| s.step))
    })
    .unwrap();
    for r in out {
        assert_eq!(
            r.unwrap(),
            Some(1),
            "the optimizer's step is in the checkpoint"
        );
    }
}

/// `STEPS` steps of `strategy` through DataParallel with gradwire's SGD:
/// with `accumulate` = k, k micro-batches per step; with `premixed`, one
/// batch per step of their f32 mean (summed in micro-batch order, then
/// scaled by 1/k). The variables' values at the end, and whether every
/// micro-batch but the last reported `accumulated`.
fn accumulated_run(
    comm: LocalComm,
    strategy: StrategyConfig,
    micro_batches: usize,
    premixed: bool,
) -> (Vec<Vec<f32>>, bool) {
    let rank = comm.rank();
    let vars = vars();
    let dist = DistOptConfig {
        accumulate: if premixed { 1 } else { micro_batches as u32 },
        ..config(strategy)
    };
    let mut dp =
        DataParallel::<gradwire_candle::Sgd, _>::from_vars(vars.clone(), sgd_config(), comm, dist)
            .unwrap();
    let mut flags_right = true;
    for step in 0..STEPS {
        let micro_grads = |micro: usize, k: usize, n: usize| gradient(n, rank, step * 7 + micro, k);
        let batches = if premixed { 1 } else { micro_batches };
        for micro in 0..batches {
            let mut grads = GradStore::default();
            for (k, (_, var)) in vars.iter().enumerate() {
                let n = var.elem_count();
                let g = if premixed {
                    let mut sum = micro_grads(0, k, n);
                    for m in 1..micro_batches {
                        sum.iter_mut()
                            .zip(micro_grads(m, k, n))
                            .for_each(|(s, v)| *s += v);
                    }
                    let factor = 1.0 / micro_batches as f32;
                    sum.iter().map(|s| s * factor).collect()
                } else {
                    micro_grads(micro, k, n)
                };
                grads.insert(
                    var.as_tensor(),
                    Tensor::from_vec(g, var.shape(), &Device::Cpu).unwrap(),
                );
            }
            let stats = dp.step(grads).unwrap();
            flags_right &= stats.accumulated == (micro + 1 < batches);
            if stats.accumulated {
                // Between the micro-batches of a step: no checkpoint.
                flags_right &= matches!(
                    dp.checkpoint(),
                    Err(gradwire_candle::Error::Gradwire(
                        OptimError::InvalidArgument(_)
                    ))
                );
            }
        }
    }
    let values = vars
        .iter()
        .map(|(_, v)| with_values(v.as_tensor(), <[f32]>::to_vec).unwrap())
        .collect();
    (values, flags_right)
}

/// Accumulation through DataParallel, in the gradient strategies (gradwire's
/// engine sums) and the loops of local steps (DataParallel sums candle's
/// gradients): k micro-batches give bitwise the run whose steps take their
/// mean, at W = 1..=3, k = 2, 3; the optimizer's steps are the steps only.
#[test]
fn accumulation_steps_on_the_mean_of_the_micro_batches() {
    let mut strategies = vec![
        StrategyConfig::Dense,
        "topk:0.2".parse().unwrap(),
        "powersgd:1".parse().unwrap(),
        "diloco:2".parse().unwrap(),
    ];
    strategies.extend(local_step_strategies());
    for strategy in strategies {
        for world in 1..=3 {
            for k in [2, 3] {
                let got = local::run(world, |c| accumulated_run(c, strategy, k, false)).unwrap();
                let want = local::run(world, |c| accumulated_run(c, strategy, k, true)).unwrap();
                for (rank, ((g, flags), (w, _))) in got.iter().zip(&want).enumerate() {
                    let at = format!("{strategy}, W = {world}, k = {k}, rank {rank}");
                    assert!(flags, "{at}: accumulated flags or the mid-step checkpoint");
                    assert_eq!(bits(g), bits(w), "{at}");
                }
            }
        }
    }
}

/// Uneven inputs through DataParallel: worker r has 2 + r steps of data,
/// weights each step by its samples and joins when it runs out; a joined
/// worker goes on stepping with the others' mean, so at the end every
/// worker's variables are bitwise the same, at W = 1..=4, in the gradient
/// strategies that average; `join` returns the steps taken after joining.
#[test]
fn joined_workers_stay_replicas() {
    for text in ["dense", "fp16", "topk:0.2", "powersgd:1"] {
        let strategy: StrategyConfig = text.parse().unwrap();
        for world in 1..=4 {
            let out = local::run(world, |comm| {
                let rank = comm.rank();
                let vars = vars();
                let mut dp = sgd_over(&vars, comm, strategy);
                for step in 0..2 + rank {
                    let mut grads = GradStore::default();
                    for (k, (_, var)) in vars.iter().enumerate() {
                        let g = gradient(var.elem_count(), rank, step, k);
                        grads.insert(
                            var.as_tensor(),
                            Tensor::from_vec(g, var.shape(), &Device::Cpu).unwrap(),
                        );
                    }
                    dp.set_samples(1 + ((rank + step) % 3) as u64).unwrap();
                    dp.step(grads).unwrap();
                }
                let (joined, _) = dp.join().unwrap();
                let values: Vec<Vec<f32>> = vars
                    .iter()
                    .map(|(_, v)| with_values(v.as_tensor(), <[f32]>::to_vec).unwrap())
                    .collect();
                (values, joined)
            })
            .unwrap();
            let first = bits(&out[0].0);
            for (rank, (values, joined)) in out.iter().enumerate() {
                let at = format!("{text}, W = {world}, rank {rank}");
                assert_eq!(bits(values), first, "{at}: not a replica");
                assert_eq!(
                    *joined as usize,
                    world - 1 - rank,
                    "{at}: steps after joining"
                );
            }
        }
    }
}
