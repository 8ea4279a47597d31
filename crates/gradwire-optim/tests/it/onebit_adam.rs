//! 1-bit Adam through DistOpt on LocalComm: until the freeze it is AdamW
//! with dense averaging, bit for bit; after it every rank's optimizer holds
//! the same first moment, the one the exchange averaged; entries that never
//! had a gradient stay where they are; it still descends.

use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::{
    AdamConfig, AdamW, DistOpt, DistOptConfig, OneBitAdam, OneBitAdamConfig, OptimError, Optimizer,
    ParamSpec, StrategyConfig, StrategyError,
};
use gradwire_tensor::Tensor;

const SHAPES: &[&[usize]] = &[&[20, 30], &[30], &[10, 20]];
const FREEZE: u64 = 4;

fn specs() -> Vec<ParamSpec> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(k, d)| ParamSpec::new(format!("p{k}"), d.to_vec()))
        .collect()
}

/// AdamW's settings (decoupled decay 1e-2).
fn adam() -> AdamConfig {
    AdamConfig::adamw().lr(0.01)
}

/// Without weight decay: a parameter without gradients does not move.
fn adam_without_decay() -> AdamConfig {
    adam().weight_decay(0.0)
}

/// The gradient of `0.5 |p - target_rank|^2`, with entry 0 of every
/// tensor always zero (never any gradient there).
fn gradient(rank: usize, k: usize, p: &[f32]) -> Tensor {
    let g: Vec<f32> = p
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            if i == 0 {
                0.0
            } else {
                v - ((i * 7 + k * 3 + rank) % 11) as f32 * 0.1
            }
        })
        .collect();
    Tensor::from_vec(g, SHAPES[k].to_vec()).unwrap()
}

/// One rank's run: its parameters, the loss after each step, and its
/// optimizer's first moment of `p0`.
type Run = (Vec<Vec<f32>>, Vec<f64>, Option<Vec<f32>>);

/// Each rank's parameters after `steps` steps of `make`'s DistOpt, and the
/// loss of rank 0's parameters against the mean target after each step.
fn train<O: Optimizer + 'static>(
    world: usize,
    steps: usize,
    make: impl Fn(LocalComm) -> Result<DistOpt<O, LocalComm>, OptimError> + Sync,
) -> Vec<Run> {
    let results = local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let mut dist = make(comm)?;
        let mut params: Vec<Tensor> = SHAPES
            .iter()
            .map(|d| Tensor::from_vec(vec![0.5f32; d.iter().product()], d.to_vec()).unwrap())
            .collect();
        let mut losses = Vec::new();
        for _ in 0..steps {
            for (k, p) in params.iter().enumerate() {
                dist.push(&format!("p{k}"), gradient(rank, k, &p.to_vec::<f32>()?))?;
            }
            let names: Vec<String> = (0..SHAPES.len()).map(|k| format!("p{k}")).collect();
            dist.finish(names.iter().map(String::as_str).zip(params.iter_mut()))?;
            // Distance to the mean target (the ranks' average objective).
            let mut loss = 0.0;
            for (k, p) in params.iter().enumerate() {
                for (i, v) in p.to_vec::<f32>()?.iter().enumerate().skip(1) {
                    let target: f64 = (0..dist.world_size())
                        .map(|r| ((i * 7 + k * 3 + r) % 11) as f64 * 0.1)
                        .sum::<f64>()
                        / dist.world_size() as f64;
                    loss += (f64::from(*v) - target).powi(2);
                }
            }
            losses.push(loss);
        }
        let m = dist.optimizer().buffer_values("p0", "m")?;
        Ok::<_, OptimError>((
            params.iter().map(|p| p.to_vec::<f32>().unwrap()).collect(),
            losses,
            m,
        ))
    })
    .unwrap();
    results.into_iter().map(|r| r.unwrap()).collect()
}

#[test]
fn until_the_freeze_it_is_adamw_with_dense_averaging_bit_for_bit() {
    let config = OneBitAdamConfig::new(adam(), FREEZE);
    let mode = config.strategy().unwrap();
    let onebit = train(3, FREEZE as usize, |comm| {
        let dist = DistOptConfig {
            strategy: mode,
            ..DistOptConfig::default()
        };
        DistOpt::new(OneBitAdam::new(config.clone())?, comm, specs(), dist)
    });
    let adamw = train(3, FREEZE as usize, |comm| {
        DistOpt::new(AdamW::new(adam())?, comm, specs(), DistOptConfig::default())
    });
    for (a, b) in onebit.iter().zip(&adamw) {
        assert_eq!(a.0, b.0);
    }
}

#[test]
fn after_the_freeze_every_rank_holds_the_averaged_moment_and_it_descends() {
    for world in [1usize, 2, 4] {
        let config = OneBitAdamConfig::new(adam_without_decay(), FREEZE);
        let mode = config.strategy().unwrap();
        let runs = train(world, 40, |comm| {
            let dist = DistOptConfig {
                strategy: mode,
                ..DistOptConfig::default()
            };
            DistOpt::new(OneBitAdam::new(config.clone())?, comm, specs(), dist)
        });
        for (rank, (params, losses, m)) in runs.iter().enumerate() {
            assert_eq!(params, &runs[0].0, "W = {world}: rank {rank} differs");
            assert_eq!(m, &runs[0].2, "W = {world}: rank {rank}'s moment differs");
            // Never a gradient at entry 0: it stays, and its moment is zero.
            for p in params {
                assert_eq!(p[0], 0.5);
            }
            assert_eq!(m.as_ref().unwrap()[0], 0.0);
            // The compressed stage keeps descending.
            let (at_freeze, last) = (losses[FREEZE as usize], *losses.last().unwrap());
            assert!(last < 0.5 * at_freeze, "W = {world}: {at_freeze} -> {last}");
            assert!(losses.iter().all(|l| l.is_finite()));
        }
    }
}

#[test]
fn a_varying_beta1_or_a_bad_mode_is_refused() {
    let varying = AdamConfig {
        beta1: gradwire_optim::Schedule::StepDecay {
            init: 0.9,
            step_size: 10,
            gamma: 0.5,
        },
        ..adam()
    };
    assert!(matches!(
        OneBitAdamConfig::new(varying.clone(), 3).strategy(),
        Err(OptimError::InvalidArgument(_))
    ));
    assert!(matches!(
        OneBitAdam::new(OneBitAdamConfig::new(varying, 3)),
        Err(OptimError::InvalidArgument(_))
    ));
    let comm = LocalComm::create(1).unwrap().pop().unwrap();
    let bad = DistOptConfig {
        strategy: StrategyConfig::OneBitAdam {
            beta1: 1.5,
            freeze_step: 3,
        },
        ..DistOptConfig::default()
    };
    let optimizer = OneBitAdam::new(OneBitAdamConfig::new(adam(), 3)).unwrap();
    assert!(matches!(
        DistOpt::new(optimizer, comm, specs(), bad),
        Err(OptimError::Strategy(StrategyError::OutOfRange { .. }))
    ));
}
