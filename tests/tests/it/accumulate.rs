//! `--accumulate K` through the CLI's harness on LocalComm: a step of K
//! micro-batches of B samples trains as a step of one batch of K x B
//! (the same steps, the same bytes, the same losses up to the rounding of
//! the mean and the epoch's shorter last step), for gradwire's dense
//! strategy and the baseline, at W = 1..=3; compressed and local-step
//! strategies checkpoint and resume bitwise with accumulation; bad values
//! are usage errors.

use gradwire_experiments::data::{Dataset, Digits};
use gradwire_experiments::train::{CheckpointPlan, RunReport, Silent, train};
use gradwire_experiments::{ExperimentError, TrainConfig};
use gradwire_optim::StrategyConfig;

fn config(strategy: StrategyConfig, world: usize, batch: usize, accumulate: u32) -> TrainConfig {
    TrainConfig {
        strategy,
        world,
        epochs: 2,
        batch,
        accumulate,
        hidden: vec![16],
        fusion_threshold: 200,
        ..TrainConfig::default()
    }
}

fn run(config: &TrainConfig, data: &Dataset) -> RunReport {
    train(config, data, &Silent, None).unwrap_or_else(|e| panic!("{config:?}: {e}"))
}

#[test]
fn micro_batches_train_as_their_concatenation() {
    let data = Dataset::Digits(Digits::load(42));
    for world in 1..=3 {
        for baseline in [false, true] {
            let mut one = config(StrategyConfig::Dense, world, 32, 1);
            let mut four = config(StrategyConfig::Dense, world, 8, 4);
            one.baseline = baseline;
            four.baseline = baseline;
            let (one, four) = (run(&one, &data), run(&four, &data));
            let what = format!("W = {world}, baseline: {baseline}");
            for (a, b) in one.epochs.iter().zip(&four.epochs) {
                assert_eq!(a.steps, b.steps, "{what}: steps per epoch");
                assert_eq!(a.bytes_sent, b.bytes_sent, "{what}: one exchange per step");
                // Equal micro-batches average to the batch's mean; only
                // the epoch's last step, split unevenly, weighs differently.
                for (name, one, four) in [
                    ("train loss", a.train_loss, b.train_loss),
                    ("test loss", a.test_loss, b.test_loss),
                ] {
                    let gap = (one - four).abs() / one;
                    assert!(gap < 0.01, "{what}: {name} {one} against {four}");
                }
            }
        }
    }
}

#[test]
fn accumulating_runs_resume_bitwise() {
    let data = Dataset::Digits(Digits::load(42));
    for text in ["topk:0.05", "powersgd:2", "partial", "diloco:3:uint8"] {
        let strategy: StrategyConfig = text.parse().unwrap();
        let straight = run(&config(strategy, 2, 16, 3), &data);
        let dir = tempfile::tempdir().unwrap();
        let mut plan = CheckpointPlan {
            dir: dir.path().to_path_buf(),
            resume: false,
        };
        let mut first = config(strategy, 2, 16, 3);
        first.epochs = 1;
        train(&first, &data, &Silent, Some(&plan)).unwrap();
        plan.resume = true;
        let resumed = train(&config(strategy, 2, 16, 3), &data, &Silent, Some(&plan)).unwrap();
        assert_eq!(resumed.param_checksum, straight.param_checksum, "{text}");
    }
}

#[test]
fn bad_accumulation_is_a_usage_error() {
    let data = Dataset::Digits(Digits::load(42));
    let usage = |config: TrainConfig, want: &str| match train(&config, &data, &Silent, None) {
        Err(ExperimentError::Usage(m)) => assert!(m.contains(want), "{m}"),
        other => panic!("{config:?}: {:?}", other.map(|r| r.label)),
    };
    usage(
        config(StrategyConfig::Dense, 1, 8, 0),
        "--accumulate must be between 1",
    );
    usage(
        config(StrategyConfig::DimReduce, 1, 8, 2),
        "--accumulate: DimReduce",
    );
}
