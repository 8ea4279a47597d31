//! A run's checkpoints resumed at another world size
//! (`LocalSteps::resharded`, `DistOpt::resharded`): in a loop of local
//! steps every new rank starts from the mean of the old ranks' parameters
//! and optimizer state (an f64 reference computed here), in a gradient loop
//! from rank 0's; the configuration becomes the new rank's; a set that is
//! not one world's, in rank order, and DimReduce's sharded state are
//! refused, naming the error's kind.

use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::checkpoint::{Checkpoint, PARAM_PREFIX};
use gradwire_optim::{
    DistOpt, DistOptConfig, LocalSteps, OptimError, Sgd, SgdConfig, StrategyConfig,
};
use gradwire_tensor::Tensor;

use crate::common::{BATCH, BLOCKS, gradient, initial, specs};

fn sgd() -> Sgd {
    Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9)).unwrap()
}

fn config(strategy: StrategyConfig) -> DistOptConfig {
    DistOptConfig {
        strategy,
        fusion_threshold: 8,
        ..DistOptConfig::default()
    }
}

/// Three local steps of partial averaging on `world` ranks, each on its
/// shard of the batch; every rank's checkpoint, with its parameters saved
/// beside the state.
fn partial_run(world: usize) -> Vec<Checkpoint> {
    local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let strategy = StrategyConfig::Partial {
            average_state: false,
        };
        let mut dist = LocalSteps::new(sgd(), comm, specs(), config(strategy))?;
        let mut w: Vec<Tensor> = initial()
            .iter()
            .map(|v| Tensor::from_vec(v.clone(), v.len()).unwrap())
            .collect();
        let names: Vec<String> = (0..BLOCKS.len()).map(|b| format!("w{b}")).collect();
        let shard = BATCH / world;
        for _ in 0..3 {
            let values: Vec<Vec<f32>> = w.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
            let g = gradient(&values, rank * shard..(rank + 1) * shard);
            let grads = (0..BLOCKS.len()).map(|b| {
                Some(Tensor::from_vec(g[b].iter().map(|&v| v as f32).collect(), BLOCKS[b]).unwrap())
            });
            dist.step(
                names
                    .iter()
                    .map(String::as_str)
                    .zip(w.iter_mut())
                    .zip(grads)
                    .map(|((n, p), g)| (n, p, g)),
            )?;
        }
        let mut ckpt = dist.checkpoint()?;
        ckpt.set_parameters(names.iter().map(String::as_str).zip(w.iter()));
        Ok::<_, OptimError>(ckpt)
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

/// The f64 mean over ranks of what `values` reads from each checkpoint.
fn mean(saved: &[Checkpoint], values: impl Fn(&Checkpoint) -> Vec<f32>) -> Vec<f32> {
    let all: Vec<Vec<f32>> = saved.iter().map(values).collect();
    (0..all[0].len())
        .map(|i| (all.iter().map(|v| f64::from(v[i])).sum::<f64>() / all.len() as f64) as f32)
        .collect()
}

#[test]
fn local_steps_resume_from_the_mean_of_the_old_ranks() {
    for old in [2usize, 3] {
        let saved = partial_run(old);
        for new in [1usize, 2, 4, 7] {
            let what = format!("W = {old} -> {new}");
            let outcomes = local::run(new, |comm: LocalComm| {
                let rank = comm.rank();
                let strategy = StrategyConfig::Partial {
                    average_state: false,
                };
                let mut dist = LocalSteps::new(sgd(), comm, specs(), config(strategy))?;
                let own = dist.resharded(&saved)?;
                dist.restore(&own)?;
                Ok::<_, OptimError>((rank, own))
            })
            .unwrap();
            for outcome in outcomes {
                let (rank, own) = outcome.unwrap_or_else(|e| panic!("{what}: {e}"));
                if new == old {
                    // At the same size, each rank's own checkpoint as it was.
                    assert_eq!(own.optimizer, saved[rank].optimizer, "{what}");
                    assert_eq!(own.state.values, saved[rank].state.values, "{what}");
                    continue;
                }
                let value = |key: &str| own.state.values[key].as_u64();
                assert_eq!(value("distopt/world_size"), Some(new as u64), "{what}");
                assert_eq!(value("distopt/rank"), Some(rank as u64), "{what}");
                for b in 0..BLOCKS.len() {
                    let name = format!("w{b}");
                    let key = format!("{PARAM_PREFIX}{name}");
                    let param = |c: &Checkpoint| c.state.tensors[&key].to_vec::<f32>().unwrap();
                    assert_eq!(param(&own), mean(&saved, param), "{what}: {key}");
                    let momentum =
                        |c: &Checkpoint| c.optimizer.params[&name].buffers["momentum"].clone();
                    assert_eq!(momentum(&own), mean(&saved, momentum), "{what}: {name}");
                }
            }
        }
    }
}

#[test]
fn a_gradient_loop_resumes_from_rank_zero() {
    let saved: Vec<Checkpoint> = local::run(3, |comm: LocalComm| {
        let dist = DistOpt::new(sgd(), comm, specs(), config(StrategyConfig::Dense))?;
        dist.checkpoint()
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    let comm = LocalComm::create(2).unwrap().pop().unwrap();
    let dist = DistOpt::new(sgd(), comm, specs(), config(StrategyConfig::Dense)).unwrap();
    let own = dist.resharded(&saved).unwrap();
    assert_eq!(own.optimizer, saved[0].optimizer);
    assert_eq!(own.state.values["distopt/rank"].as_u64(), Some(1));
}

#[test]
fn a_set_that_is_not_one_worlds_in_rank_order_is_refused() {
    let saved = partial_run(3);
    let comm = LocalComm::create(2).unwrap().pop().unwrap();
    let strategy = StrategyConfig::Partial {
        average_state: false,
    };
    let dist = LocalSteps::new(sgd(), comm, specs(), config(strategy)).unwrap();
    let result = dist.resharded(&[]);
    assert!(
        matches!(result, Err(OptimError::InvalidArgument(_))),
        "{result:?}"
    );
    let swapped = [saved[1].clone(), saved[0].clone(), saved[2].clone()];
    let result = dist.resharded(&swapped);
    assert!(
        matches!(result, Err(OptimError::StateMismatch(_))),
        "{result:?}"
    );
    let result = dist.resharded(&saved[..2]);
    assert!(
        matches!(result, Err(OptimError::StateMismatch(_))),
        "{result:?}"
    );
    // Another strategy's checkpoints: the restore compares the mode.
    let dense: Vec<Checkpoint> = local::run(3, |comm: LocalComm| {
        DistOpt::new(sgd(), comm, specs(), config(StrategyConfig::Dense))?.checkpoint()
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    let comm = LocalComm::create(2).unwrap().pop().unwrap();
    let strategy = StrategyConfig::Partial {
        average_state: false,
    };
    let mut dist = LocalSteps::new(sgd(), comm, specs(), config(strategy)).unwrap();
    let own = dist.resharded(&dense).unwrap();
    let result = dist.restore(&own);
    assert!(
        matches!(result, Err(OptimError::StateMismatch(_))),
        "{result:?}"
    );
}
