//! Strategies given to DistOpt: a custom one plugs in unchanged, AdaSum by
//! gradient and by delta weight, and the registry's AdaSum equals a given one.

use gradwire_comm::LocalComm;
use gradwire_optim::{AnyLoop, DistOptConfig, Sgd, SgdConfig, StrategyConfig};
use gradwire_tensor::Tensor;

use super::{bits, max_diff, small_buckets, train_distributed, train_single, train_with};
use crate::common::{initial, specs};

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
