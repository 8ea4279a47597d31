//! `--uneven-shards` through the CLI's harness on LocalComm: worker r holds
//! a shard of every epoch in proportion to r + 1, runs out of data first
//! when it holds least, and joins; training converges, checkpoints resume
//! bitwise, and strategies that do not average gradients are usage errors.
//! (The mean over the samples seen is checked against f64 in
//! gradwire-optim's `join` tests.)

use gradwire_experiments::data::{Dataset, Digits};
use gradwire_experiments::train::{CheckpointPlan, Silent, train};
use gradwire_experiments::{ExperimentError, TrainConfig};
use gradwire_optim::StrategyConfig;

fn config(strategy: &str, world: usize, epochs: usize) -> TrainConfig {
    TrainConfig {
        strategy: strategy.parse().unwrap(),
        world,
        epochs,
        batch: 16,
        uneven_shards: true,
        hidden: vec![32],
        fusion_threshold: 400,
        ..TrainConfig::default()
    }
}

#[test]
fn uneven_shards_train_and_resume_bitwise() {
    let data = Dataset::Digits(Digits::load(42));
    for strategy in ["dense", "topk:0.05", "powersgd:2"] {
        for world in 1..=3 {
            let what = format!("{strategy}, W = {world}");
            let straight = train(&config(strategy, world, 3), &data, &Silent, None)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let last = straight.epochs.last().unwrap();
            assert!(last.train_loss.is_finite(), "{what}");
            assert!(last.test_accuracy > 0.8, "{what}: {}", last.test_accuracy);
            let dir = tempfile::tempdir().unwrap();
            let mut plan = CheckpointPlan {
                dir: dir.path().to_path_buf(),
                resume: false,
            };
            train(&config(strategy, world, 2), &data, &Silent, Some(&plan)).unwrap();
            plan.resume = true;
            let resumed = train(&config(strategy, world, 3), &data, &Silent, Some(&plan)).unwrap();
            assert_eq!(resumed.param_checksum, straight.param_checksum, "{what}");
        }
    }
}

#[test]
fn strategies_that_do_not_average_are_usage_errors() {
    let data = Dataset::Digits(Digits::load(42));
    for strategy in ["partial", "adasum-grad", "diloco:4", "dimreduce"] {
        match train(&config(strategy, 2, 1), &data, &Silent, None) {
            Err(ExperimentError::Usage(m)) => assert!(m.contains("--uneven-shards"), "{m}"),
            other => panic!("{strategy}: {:?}", other.map(|r| r.label)),
        }
    }
    let baseline = TrainConfig {
        strategy: StrategyConfig::Dense,
        baseline: true,
        ..config("dense", 2, 1)
    };
    assert!(matches!(
        train(&baseline, &data, &Silent, None),
        Err(ExperimentError::Usage(m)) if m.contains("--uneven-shards")
    ));
}
