//! DistOpt on LocalComm, one concern a module; this one holds the training
//! runs they share (data-parallel, single-process, checkpointed).

mod buckets;
mod custom;
mod equivalence;
mod errors;
mod partial;
mod skipping;
mod sparse;

use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::{AnyLoop, DistOptConfig, OptimError, Optimizer, Sgd, SgdConfig};
use gradwire_tensor::Tensor;

use crate::common::{BATCH, BLOCKS, gradient, initial, specs};

/// `steps` data-parallel steps on `world` ranks; rank 0's parameters.
fn train_distributed<O: Optimizer + 'static>(
    world: usize,
    steps: usize,
    config: DistOptConfig,
    make: &(impl Fn() -> O + Sync),
) -> Vec<Vec<f32>> {
    train_on(world, steps, config, make, false)
}

/// [`train_distributed`], each rank on its shard of the batch or, with
/// `whole_batch`, on all of it.
fn train_on<O: Optimizer + 'static>(
    world: usize,
    steps: usize,
    config: DistOptConfig,
    make: &(impl Fn() -> O + Sync),
    whole_batch: bool,
) -> Vec<Vec<f32>> {
    train_with(world, steps, whole_batch, |comm| {
        AnyLoop::new(make(), comm, specs(), config.clone())
    })
}

/// `steps` steps of the front end `build` makes on each rank's communicator,
/// each rank on its shard of the batch or, with `whole_batch`, on all of it;
/// checks the ranks agree bitwise and returns rank 0's parameters.
fn train_with<O: Optimizer + 'static>(
    world: usize,
    steps: usize,
    whole_batch: bool,
    build: impl Fn(LocalComm) -> Result<AnyLoop<O, LocalComm>, OptimError> + Sync,
) -> Vec<Vec<f32>> {
    let results = local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let mut dist = build(comm)?;
        let mut w: Vec<Tensor> = initial()
            .iter()
            .map(|v| Tensor::from_vec(v.clone(), v.len()).unwrap())
            .collect();
        let shard = BATCH / world;
        for _ in 0..steps {
            let values: Vec<Vec<f32>> = w.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
            let samples = if whole_batch {
                0..BATCH
            } else {
                rank * shard..(rank + 1) * shard
            };
            let g = gradient(&values, samples);
            // Backward order, pushed one by one (buckets start as they fill).
            for k in (0..BLOCKS.len()).rev() {
                let gk: Vec<f32> = g[k].iter().map(|&v| v as f32).collect();
                dist.push(&format!("w{k}"), Tensor::from_vec(gk, BLOCKS[k]).unwrap())?;
            }
            let names: Vec<String> = (0..BLOCKS.len()).map(|k| format!("w{k}")).collect();
            dist.finish(names.iter().map(String::as_str).zip(w.iter_mut()))?;
        }
        Ok::<_, OptimError>(
            w.iter()
                .map(|t| t.to_vec::<f32>().unwrap())
                .collect::<Vec<_>>(),
        )
    })
    .unwrap();
    let results: Vec<Vec<Vec<f32>>> = results.into_iter().map(|r| r.unwrap()).collect();
    for r in &results {
        assert_eq!(bits(r), bits(&results[0]), "ranks diverged");
    }
    results.into_iter().next().unwrap()
}

/// The same steps in one process on the whole batch.
fn train_single<O: Optimizer>(steps: usize, mut opt: O) -> Vec<Vec<f32>> {
    let mut w: Vec<Tensor> = initial()
        .iter()
        .map(|v| Tensor::from_vec(v.clone(), v.len()).unwrap())
        .collect();
    for _ in 0..steps {
        let values: Vec<Vec<f32>> = w.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
        let g = gradient(&values, 0..BATCH);
        for (k, t) in w.iter_mut().enumerate() {
            let gk: Vec<f32> = g[k].iter().map(|&v| v as f32).collect();
            opt.update(
                &format!("w{k}"),
                t,
                &Tensor::from_vec(gk, BLOCKS[k]).unwrap(),
            )
            .unwrap();
        }
        opt.step();
    }
    w.iter().map(|t| t.to_vec::<f32>().unwrap()).collect()
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn small_buckets() -> DistOptConfig {
    DistOptConfig {
        fusion_threshold: 16,
        ..DistOptConfig::default()
    }
}

/// One training run of the linear model with every rank's shard; returns each
/// rank's parameters after every step (checkpointing after `save_at` steps into
/// a fresh front end when given).
fn run_mode(
    world: usize,
    steps: usize,
    config: DistOptConfig,
    save_at: Option<usize>,
) -> Vec<Vec<Vec<Vec<f32>>>> {
    use gradwire_optim::checkpoint;
    let results = local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let make = || Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9)).unwrap();
        let mut dist = Some(AnyLoop::new(make(), comm, specs(), config.clone())?);
        let mut w: Vec<Tensor> = initial()
            .iter()
            .map(|v| Tensor::from_vec(v.clone(), v.len()).unwrap())
            .collect();
        let shard = BATCH / world;
        let mut history = Vec::new();
        for step in 0..steps {
            if Some(step) == save_at {
                // Through the file format, into a brand-new front end.
                let old = dist.take().unwrap();
                let bytes = checkpoint::to_bytes(&old.checkpoint()?)?;
                let comm = old.into_comm();
                let mut fresh = AnyLoop::new(make(), comm, specs(), config.clone())?;
                fresh.restore(&checkpoint::from_bytes(&bytes)?)?;
                dist = Some(fresh);
            }
            let dist = dist.as_mut().unwrap();
            let values: Vec<Vec<f32>> = w.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
            let g = gradient(&values, rank * shard..(rank + 1) * shard);
            let names: Vec<String> = (0..BLOCKS.len()).map(|k| format!("w{k}")).collect();
            let grads: Vec<Option<Tensor>> = (0..BLOCKS.len())
                .map(|k| {
                    Some(
                        Tensor::from_vec(g[k].iter().map(|&v| v as f32).collect(), BLOCKS[k])
                            .unwrap(),
                    )
                })
                .collect();
            dist.step(
                names
                    .iter()
                    .map(String::as_str)
                    .zip(w.iter_mut())
                    .zip(grads)
                    .map(|((n, p), g)| (n, p, g)),
            )?;
            history.push(
                w.iter()
                    .map(|t| t.to_vec::<f32>().unwrap())
                    .collect::<Vec<_>>(),
            );
        }
        Ok::<_, OptimError>(history)
    })
    .unwrap();
    results.into_iter().map(|r| r.unwrap()).collect()
}

fn bits(v: &[Vec<f32>]) -> Vec<u32> {
    v.iter().flatten().map(|x| x.to_bits()).collect()
}
