//! The strategy registry walked through every consumer: each example of
//! `StrategyConfig::examples()` (one per registered name) prints and
//! parses back, trains on LocalComm at W = 1..=4 through the CLI's
//! harness, checkpoints and resumes bitwise, is costed by the cost model
//! (or is one of the strategies it says it does not model), and is in the
//! fault matrix. A new strategy is its module and its registry entry: this
//! test then covers it with nothing else to edit.

use gradwire_experiments::data::{Dataset, Digits};
use gradwire_experiments::faults;
use gradwire_experiments::project::{Selection, collectives_of, entry_of, shapes_of};
use gradwire_experiments::train::{CheckpointPlan, Silent, train};
use gradwire_experiments::{ExperimentError, OptimizerKind, TrainConfig};
use gradwire_optim::{REGISTRY, StrategyConfig, TrainingLoop};

/// A run of `strategy` small enough to take twice per world size.
fn config(strategy: StrategyConfig, world: usize, epochs: usize) -> TrainConfig {
    TrainConfig {
        strategy,
        world,
        epochs,
        batch: 64,
        hidden: vec![8],
        fusion_threshold: 40,
        dimreduce_dense_epochs: Some(1),
        components: 4,
        // 1-bit Adam is Adam's own.
        optimizer: match strategy {
            StrategyConfig::OneBitAdam { .. } => OptimizerKind::Adam,
            _ => OptimizerKind::Sgd,
        },
        lr: match strategy {
            StrategyConfig::OneBitAdam { .. } => 0.01,
            _ => 0.05,
        },
        ..TrainConfig::default()
    }
}

#[test]
fn every_strategy_prints_and_parses_back() {
    let examples = StrategyConfig::examples();
    let names: Vec<&str> = examples.iter().map(StrategyConfig::name).collect();
    assert_eq!(
        names,
        REGISTRY.map(|s| s.name()),
        "one example per registered name"
    );
    for strategy in examples {
        let text = strategy.to_string();
        assert_eq!(text.parse::<StrategyConfig>(), Ok(strategy), "{text}");
    }
}

#[test]
fn every_strategy_trains_checkpoints_and_resumes_bitwise_on_1_to_4_ranks() {
    let data = Dataset::Digits(Digits::load(42));
    for strategy in StrategyConfig::examples() {
        for world in 1..=4 {
            let what = format!("{strategy}, W = {world}");
            let straight = train(&config(strategy, world, 2), &data, &Silent, None)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                straight.epochs.iter().all(|e| e.train_loss.is_finite()),
                "{what}: a loss is not finite"
            );
            let dir = tempfile::tempdir().unwrap();
            let mut plan = CheckpointPlan {
                dir: dir.path().to_path_buf(),
                resume: false,
            };
            train(&config(strategy, world, 1), &data, &Silent, Some(&plan))
                .unwrap_or_else(|e| panic!("{what}, first epoch: {e}"));
            plan.resume = true;
            let resumed = train(&config(strategy, world, 2), &data, &Silent, Some(&plan))
                .unwrap_or_else(|e| panic!("{what}, resumed: {e}"));
            assert_eq!(
                resumed.param_checksum, straight.param_checksum,
                "{what}: the resumed run went elsewhere"
            );
        }
    }
}

#[test]
fn every_strategy_resumes_at_another_world_size() {
    let data = Dataset::Digits(Digits::load(42));
    for strategy in StrategyConfig::examples() {
        let old = 4;
        let dir = tempfile::tempdir().unwrap();
        let mut plan = CheckpointPlan {
            dir: dir.path().to_path_buf(),
            resume: false,
        };
        let saved = train(&config(strategy, old, 1), &data, &Silent, Some(&plan))
            .unwrap_or_else(|e| panic!("{strategy}, W = {old}: {e}"));
        plan.resume = true;
        for (new, epochs) in [(2, 1), (8, 2), (1, 2)] {
            let what = format!("{strategy}, W = {old} -> {new}");
            let resumed = train(&config(strategy, new, epochs), &data, &Silent, Some(&plan));
            let resumed = resumed.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(resumed.epochs.len(), epochs, "{what}: the history");
            assert!(
                resumed.epochs.iter().all(|e| e.train_loss.is_finite()),
                "{what}: a loss is not finite"
            );
            if epochs == 2 {
                // It saved its own set, at its size.
                for rank in 0..new {
                    let file = dir.path().join(format!("rank{rank}.epoch2.ckpt"));
                    assert!(file.is_file(), "{what}: rank {rank}");
                }
            }
            if epochs == 1 && strategy.training_loop() == TrainingLoop::Gradients {
                // Nothing left to train: the parameters are rank 0's, which
                // every rank of a gradient loop held.
                assert_eq!(
                    resumed.param_checksum, saved.param_checksum,
                    "{what}: the parameters moved"
                );
            }
        }
    }
}

/// Every strategy the registry names is costed: the threshold, whose count
/// depends on the data, at a density a run measured (without one it is
/// named as not modelled).
#[test]
fn every_strategy_is_costed() {
    for strategy in StrategyConfig::examples() {
        let config = config(strategy, 4, 1);
        let shapes = shapes_of(&config).unwrap();
        let by_data = strategy.name() == "threshold";
        if by_data {
            assert!(
                matches!(entry_of(&config, None), Err(ExperimentError::Usage(m)) if m.contains("is not modelled")),
                "{strategy}"
            );
            assert!(
                collectives_of(&config, &shapes, None).unwrap().is_none(),
                "{strategy}"
            );
        }
        let density = by_data.then_some(Selection::Density(0.05));
        let entry = entry_of(&config, density).unwrap_or_else(|e| panic!("{strategy}: {e}"));
        assert_eq!(entry.label, config.label());
        let calls = collectives_of(&config, &shapes, density)
            .unwrap()
            .unwrap_or_else(|| panic!("{strategy}: no collectives"));
        assert!(!calls.is_empty(), "{strategy}: a step that sends nothing");
    }
}

#[test]
fn the_fault_matrix_runs_every_strategy() {
    let examples = StrategyConfig::examples();
    let mut in_matrix: Vec<StrategyConfig> = Vec::new();
    for (strategy, _, _) in faults::scenarios() {
        if !in_matrix.contains(&strategy) {
            in_matrix.push(strategy);
        }
    }
    assert_eq!(in_matrix, examples);
    let mut terminal: Vec<StrategyConfig> = Vec::new();
    for (strategy, _) in faults::terminal_scenarios() {
        if !terminal.contains(&strategy) {
            terminal.push(strategy);
        }
    }
    assert_eq!(terminal, examples);
}
