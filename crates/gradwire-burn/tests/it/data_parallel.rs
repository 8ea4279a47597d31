//! DataParallel trains a burn model on W workers as one process trains it
//! on the global batch: dense within f32 rounding for SGD with momentum
//! and Adam (W = 1..=8), ranks bitwise equal; every strategy of the
//! registry runs in its loop; a compressed strategy converges;
//! accumulation and uneven inputs (join) equal their single-process
//! counterparts; a checkpoint resumes bitwise; DimReduce's second stage
//! keeps the ranks equal.

use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer, SgdConfig};
use gradwire_algos::dimreduce::{DimReduceConfig, Pca};
use gradwire_burn::{DataParallel, Error, parameters_of};
use gradwire_comm::{Communicator, local};
use gradwire_optim::{DistOptConfig, OptimError, StrategyConfig, TrainingLoop};

use crate::support::{Mlp, batch, bits, device, params, seeded};

/// Samples per worker and step.
const SHARD: usize = 3;
/// Steps of each run.
const STEPS: usize = 5;
const LR: f64 = 0.05;

fn sgd() -> ModuleOptimizer {
    SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .init()
}

fn adam() -> ModuleOptimizer {
    AdamConfig::new().init()
}

fn config(strategy: &str) -> DistOptConfig {
    DistOptConfig {
        strategy: strategy.parse().expect("a registry strategy"),
        ..DistOptConfig::default()
    }
}

/// |a - b| within f32 rounding of a few steps, relative to the size.
fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            let tolerance = 1e-5 * (1.0 + b.abs()) * STEPS as f32;
            assert!((a - b).abs() <= tolerance, "{what}: {a} against {b}");
        }
    }
}

/// W workers with shards of the global batch end where one process on the
/// whole batch does (rank 0 trains that process beside its worker, from
/// the same broadcast weights); every rank bitwise equal.
#[test]
fn w_workers_equal_one_process_on_the_global_batch() {
    for (name, optimizer) in [("sgd", sgd as fn() -> ModuleOptimizer), ("adam", adam)] {
        for world in 1..=8 {
            let out = local::run(world, |comm| -> Result<_, Error> {
                let rank = comm.rank();
                let device = device();
                let mut model = Mlp::new(&device);
                let mut dp = DataParallel::new(&model, optimizer(), comm, config("dense"))?;
                dp.broadcast_parameters(&mut model, 0)?;
                let mut alone = (rank == 0).then(|| (model.clone(), optimizer()));
                for step in 0..STEPS {
                    let mine = batch(step, rank * SHARD..(rank + 1) * SHARD, &device);
                    let loss = model.loss(&mine);
                    let stats = dp.backward_step(LR, &mut model, &loss)?;
                    assert!(!stats.accumulated && !stats.non_finite);
                    if let Some((reference, opt)) = alone.as_mut() {
                        let all = batch(step, 0..world * SHARD, &device);
                        let grads =
                            GradientsParams::from_grads(reference.loss(&all).backward(), reference);
                        *reference = opt.step(LR, reference.clone(), grads);
                    }
                }
                Ok((bits(&model), params(&model), alone.map(|(m, _)| params(&m))))
            })
            .unwrap();
            let out: Vec<_> = out.into_iter().map(Result::unwrap).collect();
            let (bits0, params0, reference) = &out[0];
            assert_close(
                params0,
                reference.as_ref().unwrap(),
                &format!("{name}, W = {world}"),
            );
            for (rank, (b, _, _)) in out.iter().enumerate() {
                assert_eq!(
                    b, bits0,
                    "{name}, W = {world}: rank {rank} differs from rank 0"
                );
            }
        }
    }
}

/// Every strategy of the registry trains the MLP in its loop at W = 3
/// (`partial:state`, which averages an optimizer's private state, is
/// refused: `errors.rs`): the parameters stay finite, and wherever the
/// strategy makes replicas (every gradient strategy, AdaSum by delta
/// weight, DiLoCo after a round) the ranks end bitwise equal.
#[test]
fn every_strategy_trains_in_its_loop() {
    const WORLD: usize = 3;
    const STEPS: usize = 5;
    for strategy in StrategyConfig::examples() {
        if strategy
            == (StrategyConfig::Partial {
                average_state: true,
            })
        {
            continue;
        }
        let text = strategy.to_string();
        let out = local::run(WORLD, |comm| -> Result<_, Error> {
            let rank = comm.rank();
            let device = device();
            let mut model = Mlp::new(&device);
            let dist = DistOptConfig {
                strategy,
                ..DistOptConfig::default()
            };
            let mut dp = DataParallel::new(&model, sgd(), comm, dist)?;
            dp.broadcast_parameters(&mut model, 0)?;
            for step in 0..STEPS {
                let mine = batch(step, rank * SHARD..(rank + 1) * SHARD, &device);
                let loss = model.loss(&mine);
                dp.backward_step(LR, &mut model, &loss)?;
            }
            Ok(bits(&model))
        })
        .unwrap();
        let out: Vec<_> = out
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{text}: {e}")))
            .collect();
        for p in out.iter().flatten().flatten() {
            assert!(
                f32::from_bits(*p).is_finite(),
                "{text}: a parameter is not finite"
            );
        }
        let replicas = match strategy.training_loop() {
            TrainingLoop::Gradients | TrainingLoop::DimReduce => true,
            // AdaSum by delta weight every step; DiLoCo at the end of a
            // round (the registry's example: one warm-up round, then
            // rounds of 2 steps, so 5 end one).
            TrainingLoop::LocalSteps => match strategy {
                StrategyConfig::DeltaWeight { .. } => true,
                StrategyConfig::DiLoCo(diloco) => {
                    !diloco.is_streaming() && diloco.round_of(STEPS as u64 - 1).end == STEPS as u64
                }
                _ => false,
            },
        };
        if replicas {
            for (rank, b) in out.iter().enumerate() {
                assert_eq!(b, &out[0], "{text}: rank {rank} differs from rank 0");
            }
        }
    }
}

/// The loss on the whole data set after `steps` of `strategy` at W = 4.
fn final_loss(strategy: &str, steps: usize) -> (f32, f32) {
    const WORLD: usize = 4;
    let out = local::run(WORLD, |comm| -> Result<_, Error> {
        let rank = comm.rank();
        let device = device();
        let mut model = Mlp::new(&device);
        let mut dp = DataParallel::new(&model, sgd(), comm, config(strategy))?;
        dp.broadcast_parameters(&mut model, 0)?;
        let everything = batch(0, 0..64, &device);
        let before = model.loss(&everything).into_scalar::<f32>();
        for step in 0..steps {
            let mine = batch(step, rank * 8..(rank + 1) * 8, &device);
            let loss = model.loss(&mine);
            dp.backward_step(LR, &mut model, &loss)?;
        }
        Ok((before, model.loss(&everything).into_scalar::<f32>()))
    })
    .unwrap();
    out.into_iter().next().unwrap().unwrap()
}

/// Top-k at 30 % with error feedback, and 8-bit quantization, converge:
/// the loss falls to under a fifth of where it started, as dense does.
#[test]
fn a_compressed_strategy_converges() {
    for strategy in ["dense", "topk:0.3", "uint8"] {
        let (before, after) = final_loss(strategy, 60);
        assert!(
            after < 0.2 * before,
            "{strategy}: the loss went from {before} to {after}"
        );
    }
}

/// Rank 0's parameters after `steps` steps of `dist` at W = `world` from
/// the seeded weights, each worker's batch at each step the samples
/// `shard(step, rank)`, taken in micro-batches of `micro` samples.
fn run(
    world: usize,
    dist: DistOptConfig,
    steps: usize,
    shard: impl Fn(usize, usize) -> std::ops::Range<usize> + Sync,
    micro: usize,
) -> Vec<Vec<f32>> {
    let out = local::run(world, |comm| -> Result<_, Error> {
        let rank = comm.rank();
        let device = device();
        let mut model = seeded(&device);
        let mut dp = DataParallel::new(&model, sgd(), comm, dist.clone())?;
        let start_state = dp.checkpoint()?;
        for step in 0..steps {
            let samples = shard(step, rank);
            let mut start = samples.start;
            while start < samples.end {
                let end = (start + micro).min(samples.end);
                let loss = model.loss(&batch(step, start..end, &device));
                let stats = dp.backward_step(LR, &mut model, &loss)?;
                if stats.accumulated {
                    assert_eq!(stats.buckets, 0, "an accumulating micro-batch exchanged");
                    // Between the micro-batches of a step: neither a
                    // checkpoint nor a restore.
                    let mid_step = [dp.checkpoint().err(), dp.restore(&start_state).err()];
                    for refused in mid_step {
                        assert!(
                            matches!(
                                refused,
                                Some(Error::Gradwire(OptimError::InvalidArgument(_)))
                            ),
                            "{refused:?}"
                        );
                    }
                }
                start = end;
            }
        }
        Ok(params(&model))
    })
    .unwrap();
    out.into_iter().next().unwrap().unwrap()
}

/// Two micro-batches per step (`accumulate: 2`) equal one step on their
/// concatenation, within f32 rounding, in the gradient strategies (the
/// engine accumulates) and the loops of local steps (DataParallel sums
/// burn's gradients); the first micro-batch only accumulates, and a
/// checkpoint or a restore then is refused.
#[test]
fn accumulation_equals_the_step_on_the_concatenation() {
    for strategy in ["dense", "topk:0.3", "adasum-delta"] {
        let shard = |_: usize, rank: usize| rank * 2 * SHARD..(rank + 1) * 2 * SHARD;
        let accumulated = DistOptConfig {
            accumulate: 2,
            ..config(strategy)
        };
        let micro = run(2, accumulated, STEPS, shard, SHARD);
        let whole = run(2, config(strategy), STEPS, shard, 2 * SHARD);
        assert_close(&micro, &whole, strategy);
    }
}

/// Uneven inputs: worker r has 2 + r steps of data, weights its mean by
/// its samples, and joins when it runs out; the others go on. Every worker
/// ends bitwise equal (a joined worker stays a replica), and equal, within
/// f32 rounding, to one process training on the union of the shards still
/// in play at each step.
#[test]
fn joined_workers_stay_replicas_of_training_on_the_union() {
    for world in 1..=5 {
        let steps_of = |rank: usize| 2 + rank;
        let out = local::run(world, |comm| -> Result<_, Error> {
            let rank = comm.rank();
            let device = device();
            let mut model = seeded(&device);
            let mut dp = DataParallel::new(&model, sgd(), comm, config("dense"))?;
            for step in 0..steps_of(rank) {
                dp.set_samples(SHARD as u64)?;
                let mine = batch(step, rank * SHARD..(rank + 1) * SHARD, &device);
                let loss = model.loss(&mine);
                dp.backward_step(LR, &mut model, &loss)?;
            }
            let (steps, _) = dp.join(LR, &mut model)?;
            assert_eq!(steps as usize, steps_of(world - 1) - steps_of(rank));
            Ok(bits(&model))
        })
        .unwrap();
        let out: Vec<_> = out.into_iter().map(Result::unwrap).collect();
        for (rank, b) in out.iter().enumerate() {
            assert_eq!(b, &out[0], "W = {world}: rank {rank} differs from rank 0");
        }
        // One process on the union of the shards in play at each step.
        let device = device();
        let mut reference = seeded(&device);
        let mut opt = sgd();
        for step in 0..steps_of(world - 1) {
            let active = (0..world).filter(|&r| step < steps_of(r)).count();
            let first = world - active; // the ranks still training are the last ones
            let union = batch(step, first * SHARD..world * SHARD, &device);
            let grads = GradientsParams::from_grads(reference.loss(&union).backward(), &reference);
            reference = opt.step(LR, reference.clone(), grads);
        }
        let got: Vec<Vec<f32>> = out[0]
            .iter()
            .map(|p| p.iter().map(|b| f32::from_bits(*b)).collect())
            .collect();
        assert_close(&got, &params(&reference), &format!("W = {world}"));
    }
}

/// A checkpoint taken after 3 steps of top-k (error-feedback residuals)
/// with Adam (moments), restored beside burn's optimizer record and the
/// module, resumes bitwise: the next 2 steps equal those of the run that
/// went on.
#[test]
fn a_checkpoint_resumes_bitwise_beside_burns_records() {
    let out = local::run(2, |comm| -> Result<_, Error> {
        let rank = comm.rank();
        let device = device();
        let mut model = seeded(&device);
        let mut dp = DataParallel::new(&model, adam(), comm, config("topk:0.3"))?;
        let train = |dp: &mut DataParallel<_>, model: &mut Mlp, steps: std::ops::Range<usize>| {
            for step in steps {
                let loss = model.loss(&batch(step, rank * SHARD..(rank + 1) * SHARD, &device));
                dp.backward_step(LR, model, &loss)?;
            }
            Ok::<_, Error>(())
        };
        train(&mut dp, &mut model, 0..3)?;
        let bytes = gradwire_optim::checkpoint::to_bytes(&dp.checkpoint()?)?;
        let record = dp
            .optimizer()
            .into_bytes()
            .expect("burn's optimizer record");
        let saved = model.clone();
        train(&mut dp, &mut model, 3..5)?;
        let went_on = bits(&model);
        // Resume on the same communicator (a restarted run builds a fresh one).
        let mut model = saved;
        *dp.optimizer_mut() = adam().from_bytes(record).expect("the record loads");
        dp.restore(&gradwire_optim::checkpoint::from_bytes(&bytes)?)?;
        train(&mut dp, &mut model, 3..5)?;
        Ok((went_on, bits(&model)))
    })
    .unwrap();
    for (rank, r) in out.into_iter().enumerate() {
        let (went_on, resumed) = r.unwrap();
        assert_eq!(resumed, went_on, "rank {rank}");
    }
}

/// DimReduce: dense steps, then the second stage in the subspace of a PCA
/// of their trajectory, whose line search calls the loss on trial
/// modules; the ranks stay bitwise equal and the loss does not rise.
#[test]
fn dimreduce_runs_its_second_stage_on_burn_modules() {
    let out = local::run(2, |comm| -> Result<_, Error> {
        let rank = comm.rank();
        let device = device();
        let mut model = seeded(&device);
        let mut dp = DataParallel::new(&model, sgd(), comm, config("dimreduce"))?;
        let names = parameters_of(&model)?;
        let mut trajectory = Vec::new();
        for step in 0..6 {
            let loss = model.loss(&batch(step, rank * SHARD..(rank + 1) * SHARD, &device));
            dp.backward_step(LR, &mut model, &loss)?;
            trajectory.push(params(&model).concat());
        }
        assert_eq!(names.len(), params(&model).len());
        let pca = Pca::fit(&trajectory, 3).expect("a PCA of the trajectory");
        dp.start_dimreduce(&pca, DimReduceConfig::default())?;
        let mine = batch(9, rank * SHARD..(rank + 1) * SHARD, &device);
        let before = model.loss(&mine).into_scalar::<f32>();
        for _ in 0..3 {
            let loss = model.loss(&mine);
            let value = f64::from(loss.clone().into_scalar::<f32>());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            dp.step_dimreduce(&mut model, &grads, value, |trial: &Mlp| {
                Ok::<_, Error>(f64::from(trial.loss(&mine).into_scalar::<f32>()))
            })?;
        }
        let after = model.loss(&mine).into_scalar::<f32>();
        Ok((bits(&model), before, after))
    })
    .unwrap();
    let out: Vec<_> = out.into_iter().map(Result::unwrap).collect();
    for (rank, (b, _, _)) in out.iter().enumerate() {
        assert_eq!(b, &out[0].0, "rank {rank} differs from rank 0");
    }
    let (before, after): (f32, f32) = out
        .iter()
        .fold((0.0, 0.0), |(b, a), (_, x, y)| (b + x, a + y));
    assert!(
        after <= before * (1.0 + 1e-4),
        "the loss rose from {before} to {after}"
    );
}
