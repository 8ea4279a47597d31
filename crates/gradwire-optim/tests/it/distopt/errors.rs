//! DistOpt's refusals and faults: mismatched checkpoints, overflowing
//! declarations, strategies of another loop, and one rank's failed allocation.

use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::{
    AnyLoop, DistOpt, DistOptConfig, LocalSteps, OptimError, ParamSpec, Sgd, SgdConfig,
    StrategyConfig,
};
use gradwire_tensor::Tensor;

use crate::common::specs;

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
