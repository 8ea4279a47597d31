//! DistOpt on LocalComm: data-parallel training equals single-process
//! training on the whole batch; bucketing changes no bit; half precision
//! stays within its rounding; skipping never touches an unwritten parameter
//! and never desynchronises ranks; clipping and the non-finite check act on
//! every rank alike.

use gradwire_algos::HalfPrecision;
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::{
    AdaGrad, AdaGradConfig, Adam, AdamConfig, AdamW, AnyLoop, DistOpt, DistOptConfig, LocalSteps,
    OptimError, Optimizer, ParamSpec, RmsProp, RmsPropConfig, Schedule, Sgd, SgdConfig, SkipVote,
    StrategyConfig,
};
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

/// Checks DistOpt against single-process training for every world size.
fn equivalent<O: Optimizer + 'static>(name: &str, make: impl Fn() -> O + Sync, scale: f32) {
    let want = train_single(5, make());
    for world in 1..=8 {
        // Each rank's shard mean, averaged: the batch mean up to the f32
        // rounding of W partial gradients; adaptive optimizers normalise the
        // step, which amplifies relative errors of tiny gradients (`scale`).
        let tol = 2e-6 * world as f32 * scale;
        let got = train_distributed(world, 5, small_buckets(), &make);
        let diff = max_diff(&got, &want);
        assert!(diff <= tol, "{name}, world {world}: {diff} > {tol}");
    }
}

#[test]
fn data_parallel_equals_single_process_for_every_optimizer_and_world_size() {
    equivalent(
        "sgd",
        || {
            Sgd::new(
                SgdConfig::default()
                    .lr(0.05)
                    .momentum(0.9)
                    .weight_decay(1e-3),
            )
            .unwrap()
        },
        1.0,
    );
    equivalent(
        "adam",
        || Adam::new(AdamConfig::default().lr(0.01)).unwrap(),
        50.0,
    );
    equivalent(
        "adamw",
        || AdamW::new(AdamConfig::adamw().lr(0.01)).unwrap(),
        50.0,
    );
    let rms = RmsPropConfig {
        lr: Schedule::constant(0.01),
        ..RmsPropConfig::default()
    };
    equivalent("rmsprop", || RmsProp::new(rms.clone()).unwrap(), 50.0);
    let ada = AdaGradConfig {
        lr: Schedule::constant(0.01),
        ..AdaGradConfig::default()
    };
    equivalent("adagrad", || AdaGrad::new(ada.clone()).unwrap(), 50.0);
}

#[test]
fn any_fusion_threshold_gives_the_same_bits() {
    let sgd = || Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9)).unwrap();
    let reference = train_distributed(
        3,
        4,
        DistOptConfig {
            fusion_threshold: 0,
            ..DistOptConfig::default()
        },
        &sgd,
    );
    for threshold in [1, 7, 16, 40, usize::MAX / 2] {
        let config = DistOptConfig {
            fusion_threshold: threshold,
            capacity: usize::MAX,
            ..DistOptConfig::default()
        };
        let got = train_distributed(3, 4, config, &sgd);
        let bits = |v: &[Vec<f32>]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&reference), "threshold {threshold}");
    }
}

#[test]
fn half_precision_stays_within_its_rounding() {
    let sgd = || Sgd::new(SgdConfig::default().lr(0.05)).unwrap();
    let dense = train_distributed(4, 3, small_buckets(), &sgd);
    for (precision, u) in [
        (HalfPrecision::F16, 2f32.powi(-11)),
        (HalfPrecision::BF16, 2f32.powi(-8)),
    ] {
        let config = DistOptConfig {
            strategy: StrategyConfig::Half {
                precision,
                clip: None,
            },
            ..small_buckets()
        };
        let half = train_distributed(4, 3, config, &sgd);
        // Three steps of lr 0.05 with gradients of magnitude below ~10, each
        // gradient off by at most two roundings.
        let bound = 3.0 * 0.05 * 2.0 * u * 10.0;
        assert!(
            max_diff(&half, &dense) <= bound,
            "{precision:?}: {}",
            max_diff(&half, &dense)
        );
        assert!(
            max_diff(&half, &dense) > 0.0,
            "{precision:?} should round something"
        );
    }
}

#[test]
fn buckets_follow_singas_rule_and_respect_the_capacity() {
    let comm = LocalComm::create(1).unwrap().pop().unwrap();
    let specs = vec![
        ParamSpec::new("a", vec![4]),
        ParamSpec::new("b", vec![4]),
        ParamSpec::new("big", vec![20]),
        ParamSpec::new("c", vec![3]),
        ParamSpec::new("d", vec![9]),
        ParamSpec::new("e", vec![1]),
    ];
    let config = DistOptConfig {
        fusion_threshold: 10,
        capacity: 20,
        ..DistOptConfig::default()
    };
    let dist = DistOpt::new(
        Sgd::new(SgdConfig::default()).unwrap(),
        comm,
        specs.clone(),
        config,
    )
    .unwrap();
    // a+b = 8 (open) | big alone | c+d = 12 > 10 closes | e trails.
    assert_eq!(dist.buckets(), &[0..2, 2..3, 3..5, 5..6]);
    let comm = LocalComm::create(1).unwrap().pop().unwrap();
    let tight = DistOptConfig {
        fusion_threshold: 10,
        capacity: 19,
        ..DistOptConfig::default()
    };
    assert!(matches!(
        DistOpt::new(Sgd::new(SgdConfig::default()).unwrap(), comm, specs, tight),
        Err(OptimError::InvalidArgument(_))
    ));
}

#[test]
fn skipping_leaves_unwritten_parameters_alone_and_never_desynchronises() {
    let per_bucket = skipping_run(SkipVote::PerBucket);
    let per_step = skipping_run(SkipVote::PerStep);
    assert_eq!(per_bucket, per_step, "the vote's timing changes nothing");
}

type SkipOutcome = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, bool, usize);

fn skipping_run(vote: SkipVote) -> SkipOutcome {
    let world = 4;
    let results = local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let specs = vec![
            ParamSpec::new("shared", vec![3]),
            ParamSpec::new("unused", vec![2]),
            ParamSpec::new("rank0only", vec![2]),
            ParamSpec::new("sometimes", vec![5]),
        ];
        let sgd = Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9).weight_decay(0.1)).unwrap();
        let config = DistOptConfig {
            fusion_threshold: 4,
            vote,
            ..DistOptConfig::default()
        };
        let mut dist = DistOpt::new(sgd, comm, specs, config)?;
        let mut shared = Tensor::from_vec(vec![1f32; 3], 3)?;
        let mut unused = Tensor::from_vec(vec![0.5f32, -0.5], 2)?;
        let mut only = Tensor::from_vec(vec![1f32; 2], 2)?;
        let mut sometimes = Tensor::from_vec(vec![1f32; 5], 5)?;
        let mut skipped = 0;
        for step in 0..10 {
            let g = |v: f32, n: usize| Some(Tensor::from_vec(vec![v; n], n).unwrap());
            // Each rank writes a different subset: never a hang.
            let stats = dist.step([
                ("shared", &mut shared, g(1.0, 3)),
                ("unused", &mut unused, None),
                (
                    "rank0only",
                    &mut only,
                    if rank == 0 { g(4.0, 2) } else { None },
                ),
                (
                    "sometimes",
                    &mut sometimes,
                    if (step + rank).is_multiple_of(3) {
                        g(2.0, 5)
                    } else {
                        None
                    },
                ),
            ])?;
            skipped += stats.skipped;
        }
        let has_state = dist.optimizer().param_state("unused").is_some();
        Ok::<_, OptimError>((
            shared.to_vec::<f32>()?,
            unused.to_vec::<f32>()?,
            only.to_vec::<f32>()?,
            sometimes.to_vec::<f32>()?,
            has_state,
            skipped,
        ))
    })
    .unwrap();
    let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    for r in &results {
        assert_eq!(r, &results[0], "ranks diverged");
    }
    let (_, unused, only, _, has_state, skipped) = &results[0];
    assert_eq!(unused, &vec![0.5, -0.5], "never written, so never decayed");
    assert!(
        !has_state,
        "no optimizer state for a parameter never updated"
    );
    assert_eq!(*skipped, 10);
    // rank0only: averaged gradient 4/4 = 1 each step, same update as "shared".
    assert_eq!(only, &results[0].0[..2].to_vec());
    results.into_iter().next().unwrap()
}

#[test]
fn clipping_and_the_non_finite_check_act_on_every_rank_alike() {
    let results = local::run(2, |comm: LocalComm| {
        let rank = comm.rank();
        let config = DistOptConfig {
            clip_global_norm: Some(1.0),
            skip_non_finite: true,
            ..DistOptConfig::default()
        };
        let mut dist = DistOpt::new(
            Sgd::new(SgdConfig::default().lr(1.0)).unwrap(),
            comm,
            vec![ParamSpec::new("p", vec![2])],
            config,
        )?;
        let mut p = Tensor::from_vec(vec![0f32, 0.0], 2)?;
        // Averaged gradient (3, 4): norm 5, clipped to (0.6, 0.8).
        dist.step([(
            "p",
            &mut p,
            Some(Tensor::from_vec(
                vec![3f32 * 2.0 * rank as f32, 4.0 * 2.0 * rank as f32],
                2,
            )?),
        )])?;
        let after_clip = p.to_vec::<f32>()?;
        let bad = if rank == 1 { f32::NAN } else { 1.0 };
        let stats = dist.step([("p", &mut p, Some(Tensor::from_vec(vec![bad, 1.0], 2)?))])?;
        Ok::<_, OptimError>((after_clip, stats.non_finite, p.to_vec::<f32>()?))
    })
    .unwrap();
    for r in results {
        let (after_clip, non_finite, after_nan) = r.unwrap();
        assert!(
            (after_clip[0] + 0.6).abs() < 1e-6 && (after_clip[1] + 0.8).abs() < 1e-6,
            "{after_clip:?}"
        );
        assert!(non_finite);
        assert_eq!(
            after_nan, after_clip,
            "the non-finite step is skipped everywhere"
        );
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

#[test]
fn sparse_with_everything_selected_equals_dense() {
    use gradwire_compress::SparseCodec;
    let dense = run_mode(3, 3, small_buckets(), None);
    for (codec, error_feedback) in [
        (SparseCodec::Threshold(0.0), false),
        (SparseCodec::TopK(1.0), true),
        (SparseCodec::TopK(1.0), false),
    ] {
        let config = DistOptConfig {
            strategy: StrategyConfig::Sparse {
                codec,
                error_feedback,
            },
            ..small_buckets()
        };
        let sparse = run_mode(3, 3, config, None);
        assert_eq!(bits(&sparse[0][2]), bits(&dense[0][2]), "{codec:?}");
    }
}

#[test]
fn sparse_top_k_trains_and_its_checkpoint_resumes_bitwise() {
    use gradwire_compress::SparseCodec;
    let config = DistOptConfig {
        strategy: StrategyConfig::Sparse {
            codec: SparseCodec::TopK(0.2),
            error_feedback: true,
        },
        ..small_buckets()
    };
    let straight = run_mode(4, 6, config.clone(), None);
    let resumed = run_mode(4, 6, config, Some(3));
    for rank in 0..4 {
        assert_eq!(
            bits(&straight[rank][5]),
            bits(&resumed[rank][5]),
            "rank {rank}"
        );
        assert_eq!(
            bits(&straight[rank][5]),
            bits(&straight[0][5]),
            "ranks diverged"
        );
    }
}

#[test]
fn partial_averages_each_partition_in_turn_and_resumes_bitwise() {
    let config = DistOptConfig {
        strategy: StrategyConfig::Partial {
            average_state: false,
        },
        ..small_buckets()
    };
    let specs_order = specs();
    let comm = LocalComm::create(1).unwrap().pop().unwrap();
    let buckets = LocalSteps::new(
        Sgd::new(SgdConfig::default()).unwrap(),
        comm,
        specs(),
        config.clone(),
    )
    .unwrap()
    .buckets()
    .to_vec();
    let k = buckets.len();
    assert!(k >= 3, "the test wants several partitions, got {k}");
    let history = run_mode(4, 2 * k, config.clone(), None);
    for step in 0..2 * k {
        let averaged = &buckets[step % k];
        for i in averaged.clone() {
            // specs are in backward order: w{last} first.
            let block = BLOCKS.len() - 1 - i;
            assert_eq!(specs_order[i].name, format!("w{block}"));
            for rank in 1..4 {
                assert_eq!(
                    history[rank][step][block], history[0][step][block],
                    "step {step}, w{block}"
                );
            }
        }
    }
    // Some parameter differs across ranks somewhere: it really is local SGD.
    assert!((0..4).any(|r| history[r][0] != history[0][0]));
    let resumed = run_mode(4, 2 * k, config, Some(k + 1));
    for rank in 0..4 {
        assert_eq!(
            bits(&resumed[rank][2 * k - 1]),
            bits(&history[rank][2 * k - 1]),
            "rank {rank}"
        );
    }
}

#[test]
fn partial_with_identical_gradients_equals_local_training() {
    let make = || Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9)).unwrap();
    let want = train_single(6, make());
    // Two ranks, both on the whole batch: averaging equal values is exact.
    let config = DistOptConfig {
        strategy: StrategyConfig::Partial {
            average_state: false,
        },
        ..small_buckets()
    };
    let got = train_on(2, 6, config, &make, true);
    assert_eq!(bits(&got), bits(&want));
}

/// Trains like [`train_on`] but with a strategy made on each rank's communicator.
fn train_with_strategy<K: gradwire_optim::Strategy<LocalComm>>(
    world: usize,
    steps: usize,
    mode: StrategyConfig,
    whole_batch: bool,
    strategy: impl Fn(&LocalComm) -> K + Sync,
) -> Vec<Vec<f32>> {
    train_with(world, steps, whole_batch, |comm| {
        let k = strategy(&comm);
        let config = DistOptConfig {
            strategy: mode,
            ..small_buckets()
        };
        let sgd = Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9)).unwrap();
        AnyLoop::with_strategy(sgd, comm, specs(), config, k)
    })
}

/// A strategy of our own: the plain sum, to show the hook is the whole story.
struct PlainSum;

impl gradwire_optim::Strategy<LocalComm> for PlainSum {
    fn combine(
        &mut self,
        comm: &LocalComm,
        _bucket: &gradwire_optim::BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<gradwire_optim::Combined> {
        let traffic = gradwire_algos::fused_all_reduce(
            comm,
            tensors,
            gradwire_comm::ReduceOp::Sum,
            usize::MAX,
        )?;
        Ok(gradwire_optim::Combined {
            traffic,
            averaged: false,
        })
    }
}

#[test]
fn a_custom_strategy_plugs_in_without_changing_distopt() {
    let sgd = || Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9)).unwrap();
    let dense = train_distributed(3, 4, small_buckets(), &sgd);
    let custom = train_with_strategy(3, 4, StrategyConfig::Custom, false, |_| PlainSum);
    assert_eq!(bits(&custom), bits(&dense));
}

#[test]
fn adasum_by_gradient_and_by_delta_weight_through_distopt() {
    use gradwire_algos::AdaSum;
    let local_training = train_single(
        4,
        Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9)).unwrap(),
    );
    for world in [2usize, 3, 5] {
        // Identical gradients everywhere: AdaSum gives the gradient back, so
        // both modes reduce to local training.
        for mode in [
            StrategyConfig::Custom,
            StrategyConfig::DeltaWeight { group: None },
        ] {
            let got = train_with_strategy(world, 4, mode, true, |c| AdaSum::new(c).unwrap());
            let diff = max_diff(&got, &local_training);
            assert!(diff <= 1e-5, "{mode:?}, world {world}: {diff}");
        }
        // Different shards: the ranks still agree (checked inside) and train.
        let sharded = train_with_strategy(
            world,
            4,
            StrategyConfig::DeltaWeight { group: None },
            false,
            |c| AdaSum::new(c).unwrap(),
        );
        assert!(sharded.iter().flatten().all(|v| v.is_finite()));
        assert!(max_diff(&sharded, &initial()) > 0.0);
    }
}

#[test]
fn the_registry_prepares_adasum_as_a_given_strategy_does() {
    use gradwire_algos::AdaSum;
    let sgd = || Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9)).unwrap();
    for world in [1usize, 2, 3, 4, 6] {
        for group in [None, Some(1), Some(2)] {
            if group.is_some_and(|g| world % g != 0) {
                continue;
            }
            let prepared = |comm: &LocalComm| match group {
                Some(g) => AdaSum::hierarchical(comm, g).unwrap(),
                None => AdaSum::new(comm).unwrap(),
            };
            for (built, given) in [
                (StrategyConfig::AdaSum { group }, StrategyConfig::Custom),
                (
                    StrategyConfig::DeltaWeight { group },
                    StrategyConfig::DeltaWeight { group: None },
                ),
            ] {
                let config = DistOptConfig {
                    strategy: built,
                    ..small_buckets()
                };
                let got = train_distributed(world, 3, config, &sgd);
                let want = train_with_strategy(world, 3, given, false, prepared);
                assert_eq!(bits(&got), bits(&want), "{built}, W = {world}");
            }
        }
    }
}

#[test]
fn partial_can_average_the_optimizer_state_too() {
    let world = 4;
    let config = DistOptConfig {
        strategy: StrategyConfig::Partial {
            average_state: true,
        },
        ..small_buckets()
    };
    let k = {
        let comm = LocalComm::create(1).unwrap().pop().unwrap();
        LocalSteps::new(
            Sgd::new(SgdConfig::default()).unwrap(),
            comm,
            specs(),
            config.clone(),
        )
        .unwrap()
        .buckets()
        .to_vec()
    };
    let results = local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let sgd = Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9)).unwrap();
        let mut dist = LocalSteps::new(sgd, comm, specs(), config.clone())?;
        let mut w: Vec<Tensor> = initial()
            .iter()
            .map(|v| Tensor::from_vec(v.clone(), v.len()).unwrap())
            .collect();
        let shard = BATCH / world;
        let mut momenta = Vec::new();
        for _ in 0..2 * k.len() {
            let values: Vec<Vec<f32>> = w.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
            let g = gradient(&values, rank * shard..(rank + 1) * shard);
            let names: Vec<String> = (0..BLOCKS.len()).map(|b| format!("w{b}")).collect();
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
            let step_momenta: Vec<Vec<f32>> = specs()
                .iter()
                .map(|s| dist.optimizer().param_state(&s.name).unwrap().buffers["momentum"].clone())
                .collect();
            momenta.push(step_momenta);
        }
        Ok::<_, OptimError>(momenta)
    })
    .unwrap();
    let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    for step in 0..2 * k.len() {
        for i in k[step % k.len()].clone() {
            for rank in 1..world {
                assert_eq!(
                    results[rank][step][i], results[0][step][i],
                    "step {step}, param {i}"
                );
            }
        }
    }
    // And the others are still local: some differ right after step 0.
    let not_averaged: Vec<usize> = (0..specs().len()).filter(|i| !k[0].contains(i)).collect();
    assert!(
        not_averaged
            .iter()
            .any(|&i| results[1][0][i] != results[0][0][i])
    );
}

/// Rank r's gradient of parameter k at a step: deterministic, signed.
fn synthetic_grad(rank: usize, step: usize, k: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7 + k * 13 + rank * 29 + step * 3) % 17) as f32 - 8.0) / 8.0)
        .collect()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..proptest::prelude::ProptestConfig::default() })]

    /// Many mixes of tensor sizes around the fusion threshold (16): the
    /// averaged SGD step equals an f64 reference of the mean gradient.
    #[test]
    fn any_size_mix_around_the_threshold_averages_correctly(
        world in 1usize..=8,
        sizes in proptest::collection::vec(proptest::sample::select(vec![1usize, 2, 15, 16, 17, 31, 33, 64]), 1..8),
    ) {
        let specs: Vec<ParamSpec> = sizes.iter().enumerate().map(|(k, &n)| ParamSpec::new(format!("p{k}"), vec![n])).collect();
        let steps = 3;
        let lr = 0.1f64;
        let results = local::run(world, |comm: LocalComm| {
            let rank = comm.rank();
            let sgd = Sgd::new(SgdConfig::default().lr(lr)).unwrap();
            let mut dist = DistOpt::new(sgd, comm, specs.clone(), small_buckets())?;
            let mut params: Vec<Tensor> = sizes.iter().map(|&n| Tensor::from_vec(vec![0.5f32; n], n).unwrap()).collect();
            let names: Vec<String> = (0..sizes.len()).map(|k| format!("p{k}")).collect();
            for step in 0..steps {
                for (k, &n) in sizes.iter().enumerate() {
                    dist.push(&names[k], Tensor::from_vec(synthetic_grad(rank, step, k, n), n).unwrap())?;
                }
                dist.finish(names.iter().map(String::as_str).zip(params.iter_mut()))?;
            }
            Ok::<_, OptimError>(params.iter().map(|t| t.to_vec::<f32>().unwrap()).collect::<Vec<_>>())
        }).unwrap();
        for (k, &n) in sizes.iter().enumerate() {
            for i in 0..n {
                let mut want = 0.5f64;
                for step in 0..steps {
                    let mean = (0..world).map(|r| f64::from(synthetic_grad(r, step, k, n)[i])).sum::<f64>() / world as f64;
                    want -= lr * mean;
                }
                for r in &results {
                    let got = f64::from(r.as_ref().unwrap()[k][i]);
                    proptest::prop_assert!((got - want).abs() <= 1e-6 * world as f64, "p{} [{}]: {} vs {}", k, i, got, want);
                }
            }
        }
    }
}

#[test]
fn random_k_without_error_feedback_draws_anew_every_step() {
    use gradwire_compress::SparseCodec;
    let changed = local::run(2, |comm: LocalComm| {
        let config = DistOptConfig {
            strategy: StrategyConfig::Sparse {
                codec: SparseCodec::RandomK {
                    ratio: 0.1,
                    seed: 5,
                },
                error_feedback: false,
            },
            ..DistOptConfig::default()
        };
        let sgd = Sgd::new(SgdConfig::default().lr(1.0)).unwrap();
        let mut dist = DistOpt::new(sgd, comm, vec![ParamSpec::new("p", vec![200])], config)?;
        let mut p = Tensor::from_vec(vec![0f32; 200], 200).unwrap();
        let mut sets = Vec::new();
        for _ in 0..3 {
            let before = p.to_vec::<f32>().unwrap();
            dist.push("p", Tensor::from_vec(vec![1f32; 200], 200).unwrap())?;
            dist.finish([("p", &mut p)])?;
            let after = p.to_vec::<f32>().unwrap();
            let set: Vec<usize> = (0..200).filter(|&i| before[i] != after[i]).collect();
            sets.push(set);
        }
        Ok::<_, OptimError>(sets)
    })
    .unwrap();
    let sets = changed[0].as_ref().unwrap();
    assert_eq!(sets, changed[1].as_ref().unwrap(), "ranks drew differently");
    for set in sets {
        assert_eq!(set.len(), 20, "ceil(0.1 x 200) entries each step");
    }
    assert!(
        sets[0] != sets[1] && sets[1] != sets[2],
        "the same draw twice"
    );
}

/// A checkpoint records the configuration it was saved with: restoring it
/// into another mode, codec, world size, rank or parameter list is a
/// `StateMismatch` naming the difference, and changes nothing.
#[test]
fn restoring_into_another_configuration_names_the_difference() {
    use gradwire_compress::SparseCodec;
    let sparse = |ratio| DistOptConfig {
        strategy: StrategyConfig::Sparse {
            codec: SparseCodec::TopK(ratio),
            error_feedback: true,
        },
        ..DistOptConfig::default()
    };
    let results = local::run(2, |comm: LocalComm| {
        let sgd = || Sgd::new(SgdConfig::default());
        let saved = DistOpt::new(sgd()?, comm, specs(), sparse(0.1))?;
        let ckpt = saved.checkpoint()?;
        let comm = saved.into_comm();
        let expect = |what: &str, r: Result<(), OptimError>| match r {
            Err(OptimError::StateMismatch(m)) => assert!(m.contains(what), "{what}: {m}"),
            other => panic!("{what}: {other:?}"),
        };
        // Another codec, then another mode.
        let mut other = DistOpt::new(sgd()?, comm, specs(), sparse(0.2))?;
        expect("distopt/mode", other.restore(&ckpt));
        let comm = other.into_comm();
        let mut dense = DistOpt::new(sgd()?, comm, specs(), DistOptConfig::default())?;
        expect("distopt/mode", dense.restore(&ckpt));
        let comm = dense.into_comm();
        // Another parameter list (one shape changed).
        let mut changed = specs();
        changed[0].shape = vec![changed[0].shape.iter().product::<usize>() + 1];
        let mut params = DistOpt::new(sgd()?, comm, changed, sparse(0.1))?;
        expect("distopt/params", params.restore(&ckpt));
        let comm = params.into_comm();
        // The same configuration restores.
        let mut same = DistOpt::new(sgd()?, comm, specs(), sparse(0.1))?;
        same.restore(&ckpt)?;
        Ok::<_, OptimError>(ckpt)
    })
    .unwrap();
    let ckpts: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    local::run(2, |comm: LocalComm| {
        let mut dist = DistOpt::new(Sgd::new(SgdConfig::default())?, comm, specs(), sparse(0.1))?;
        let theirs = &ckpts[1 - dist.rank()];
        match dist.restore(theirs) {
            Err(OptimError::StateMismatch(m)) => assert!(m.contains("distopt/rank"), "{m}"),
            other => panic!("{other:?}"),
        }
        Ok::<_, OptimError>(())
    })
    .unwrap();
    local::run(1, |comm: LocalComm| {
        let mut dist = DistOpt::new(Sgd::new(SgdConfig::default())?, comm, specs(), sparse(0.1))?;
        match dist.restore(&ckpts[0]) {
            Err(OptimError::StateMismatch(m)) => assert!(m.contains("distopt/world_size"), "{m}"),
            other => panic!("{other:?}"),
        }
        Ok::<_, OptimError>(())
    })
    .unwrap();
}

/// Sizes computed from declared shapes are checked: a shape whose product
/// overflows, or parameters whose total does, is an error at construction
/// (neither a panic in debug nor a wrapped size in release).
#[test]
fn overflowing_declarations_are_errors() {
    local::run(1, |comm: LocalComm| {
        let sgd = || Sgd::new(SgdConfig::default());
        let huge = vec![ParamSpec::new("w", [usize::MAX, 2])];
        let err = DistOpt::new(sgd()?, comm, huge, DistOptConfig::default()).err();
        assert!(
            matches!(err, Some(OptimError::InvalidArgument(ref m)) if m.contains("w")),
            "{err:?}"
        );
        let comm = LocalComm::create(1)
            .map_err(|e| OptimError::InvalidArgument(e.to_string()))?
            .pop()
            .expect("one rank");
        let total = vec![ParamSpec::new("a", [usize::MAX]), ParamSpec::new("b", [2])];
        let err = DistOpt::new(sgd()?, comm, total, DistOptConfig::default()).err();
        assert!(
            matches!(err, Some(OptimError::InvalidArgument(_))),
            "{err:?}"
        );
        Ok::<_, OptimError>(())
    })
    .unwrap();
}

#[test]
fn each_front_end_takes_only_the_strategies_of_its_loop() {
    use gradwire_optim::{DimReduceOpt, REGISTRY, StrategyError, TrainingLoop};
    let sgd = || Sgd::new(SgdConfig::default()).unwrap();
    let comm = || LocalComm::create(1).unwrap().pop().unwrap();
    for strategy in REGISTRY {
        let config = DistOptConfig {
            strategy,
            ..DistOptConfig::default()
        };
        let outcomes = [
            (
                TrainingLoop::Gradients,
                DistOpt::new(sgd(), comm(), specs(), config.clone()).err(),
            ),
            (
                TrainingLoop::LocalSteps,
                LocalSteps::new(sgd(), comm(), specs(), config.clone()).err(),
            ),
            (
                TrainingLoop::DimReduce,
                DimReduceOpt::new(sgd(), comm(), specs(), config.clone()).err(),
            ),
        ];
        for (front, err) in outcomes {
            if front == strategy.training_loop() {
                assert!(
                    err.is_none(),
                    "{strategy} on {}: {err:?}",
                    front.front_end()
                );
                continue;
            }
            match err {
                Some(OptimError::Strategy(StrategyError::WrongLoop {
                    runs_on, given_to, ..
                })) => {
                    assert_eq!(runs_on, strategy.training_loop().front_end());
                    assert_eq!(given_to, front.front_end());
                }
                other => panic!("{strategy} on {}: {other:?}", front.front_end()),
            }
        }
        // The loop chosen at run time is the strategy's.
        let any = AnyLoop::new(sgd(), comm(), specs(), config).unwrap();
        assert_eq!(any.training_loop(), strategy.training_loop());
    }
}

/// A zero one rank cannot allocate for a gradient it never pushed (here a
/// parameter that rank declares on a CUDA device this machine lacks) is
/// that rank's fault, carried by the bucket's collective: every rank's
/// finish fails with it, naming that rank, instead of that rank returning
/// alone while the others wait for its bucket; nothing changes, W = 2..4.
#[test]
fn a_zero_one_rank_cannot_allocate_fails_the_step_on_every_rank() {
    use gradwire_comm::Fault;
    use gradwire_tensor::Device;
    for world in 2..=4 {
        let last = world - 1;
        let outcomes = local::run(world, |comm: LocalComm| {
            let rank = comm.rank();
            let device = if rank == last {
                Device::Cuda(0)
            } else {
                Device::Cpu
            };
            let specs = vec![
                ParamSpec::new("w", vec![3]),
                ParamSpec::new("g", vec![2]).on_device(device),
            ];
            let config = DistOptConfig {
                fusion_threshold: 1,
                ..DistOptConfig::default()
            };
            let mut dist =
                DistOpt::new(Sgd::new(SgdConfig::default().lr(0.5))?, comm, specs, config)?;
            let mut w = Tensor::from_vec(vec![1f32, 2.0, 3.0], 3)?;
            let mut g = Tensor::from_vec(vec![4f32, 5.0], 2)?;
            dist.push("w", Tensor::from_vec(vec![1f32; 3], 3)?)?;
            let result = dist.finish([("w", &mut w), ("g", &mut g)]);
            Ok::<_, OptimError>((result.err(), w.to_vec::<f32>()?, g.to_vec::<f32>()?))
        });
        let outcomes = outcomes.expect("the ranks ran");
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            let (err, w, g) = outcome.unwrap_or_else(|e| panic!("W={world} rank {rank}: {e}"));
            assert!(
                matches!(
                    &err,
                    Some(OptimError::Fault(Fault { rank: Some(r), .. })) if *r == last
                ),
                "W={world} rank {rank}: {err:?}"
            );
            assert_eq!(
                (w, g),
                (vec![1.0, 2.0, 3.0], vec![4.0, 5.0]),
                "W={world} rank {rank}"
            );
        }
    }
}
