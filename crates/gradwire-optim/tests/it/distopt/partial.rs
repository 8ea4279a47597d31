//! The partial strategy on LocalSteps: each partition averaged in turn,
//! resuming bitwise, equal to local training, optionally averaging state.

use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::{
    DistOptConfig, LocalSteps, OptimError, Optimizer, Sgd, SgdConfig, StrategyConfig,
};
use gradwire_tensor::Tensor;

use super::{bits, run_mode, small_buckets, train_on, train_single};
use crate::common::{BATCH, BLOCKS, gradient, initial, specs};

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
