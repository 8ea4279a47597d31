//! The configuration's tests: the flags reach their fields, bad values
//! name their flag, labels, and the first saved format.

use super::threads::compute_threads_per_rank;
use super::*;
use crate::error::ExperimentError;
use gradwire_compress::SparseCodec;

fn with(strategy: &str) -> TrainConfig {
    TrainConfig {
        strategy: strategy.parse().unwrap(),
        ..TrainConfig::default()
    }
}

/// The flags a binary flattens from [`TrainConfig`].
#[derive(clap::Parser, Debug)]
struct Flags {
    #[command(flatten)]
    run: TrainConfig,
}

#[test]
fn no_flags_is_the_default_run_and_every_flag_reaches_its_field() {
    use clap::Parser;
    let none = Flags::try_parse_from(["gradwire"]).unwrap();
    assert_eq!(none.run, TrainConfig::default());
    let all = Flags::try_parse_from([
        "gradwire",
        "-w",
        "3",
        "--epochs",
        "2",
        "--batch",
        "8",
        "--model",
        "cnn",
        "--hidden",
        "5,6",
        "--channels",
        "2",
        "--fusion-threshold",
        "99",
        "--optimizer",
        "adamw",
        "--lr",
        "0.5",
        "--momentum",
        "0.1",
        "--schedule",
        "cosine",
        "--seed",
        "11",
        "--dimreduce-dense-epochs",
        "1",
        "--components",
        "3",
        "--pca",
        "p.pca",
    ])
    .unwrap();
    let want = TrainConfig {
        world: 3,
        epochs: 2,
        batch: 8,
        model: ModelKind::Cnn,
        hidden: vec![5, 6],
        channels: vec![2],
        fusion_threshold: 99,
        optimizer: OptimizerKind::Adamw,
        lr: 0.5,
        momentum: 0.1,
        schedule: ScheduleKind::Cosine,
        seed: 11,
        dimreduce_dense_epochs: Some(1),
        components: 3,
        pca: Some("p.pca".into()),
        ..TrainConfig::default()
    };
    assert_eq!(all.run, want);
}

#[test]
fn bad_values_name_their_flag() {
    let cases: Vec<(TrainConfig, &str)> = vec![
        (
            TrainConfig {
                world: 0,
                ..TrainConfig::default()
            },
            "--world",
        ),
        (
            TrainConfig {
                epochs: 0,
                ..TrainConfig::default()
            },
            "--epochs",
        ),
        (
            TrainConfig {
                lr: -1.0,
                ..TrainConfig::default()
            },
            "--lr",
        ),
        (
            TrainConfig {
                strategy: StrategyConfig::Sparse {
                    codec: SparseCodec::TopK(1.5),
                    error_feedback: true,
                },
                ..TrainConfig::default()
            },
            "--strategy",
        ),
        (
            TrainConfig {
                world: 3,
                ..with("adasum-delta:group=2")
            },
            "--world",
        ),
        (
            TrainConfig {
                dimreduce_dense_epochs: Some(0),
                ..with("dimreduce")
            },
            "--dimreduce-dense-epochs",
        ),
        (with("onebit-adam"), "--optimizer"),
        (
            TrainConfig {
                timeline: Some("/no/such/directory/trace.json".into()),
                ..TrainConfig::default()
            },
            "--timeline",
        ),
    ];
    for (config, flag) in cases {
        match config.validate() {
            Err(ExperimentError::Usage(m)) => assert!(m.contains(flag), "{m}"),
            other => panic!("{flag}: {other:?}"),
        }
    }
    assert!(TrainConfig::default().validate().is_ok());
    assert!(with("topk:1").validate().is_ok());
    // A file in the working directory, or in one that exists.
    for path in ["trace.json", "/tmp/trace.json"] {
        let config = TrainConfig {
            timeline: Some(path.into()),
            ..TrainConfig::default()
        };
        assert!(config.validate().is_ok(), "{path}");
    }
    assert!(matches!(
        parse_strategy("topk:2"),
        Err(ExperimentError::Usage(m)) if m.contains("the ratio must be in (0, 1]")
    ));
    assert_eq!(
        parse_strategy("baseline").unwrap(),
        (StrategyConfig::Dense, true)
    );
}

#[test]
fn the_16_bit_baseline_parses_labels_and_saves() {
    let (strategy, baseline) = parse_strategy("baseline:bf16").unwrap();
    assert!(baseline);
    let config = TrainConfig {
        strategy,
        baseline,
        ..TrainConfig::default()
    };
    assert_eq!(
        config.baseline_precision(),
        Some(gradwire_algos::HalfPrecision::BF16)
    );
    assert_eq!(config.label(), "baseline bf16");
    assert!(config.validate().is_ok());
    let back: TrainConfig = serde_json::from_value(serde_json::to_value(&config).unwrap()).unwrap();
    assert_eq!(back, config);
    for bad in [
        "baseline:topk:0.01",
        "baseline:fp16:clip=1",
        "baseline:",
        "baseline:dense",
    ] {
        assert!(
            matches!(parse_strategy(bad), Err(ExperimentError::Usage(m)) if m.contains("16-bit")),
            "{bad}"
        );
    }
    let clipped = TrainConfig {
        strategy: "fp16:clip=1".parse().unwrap(),
        baseline: true,
        ..TrainConfig::default()
    };
    assert!(matches!(clipped.validate(), Err(ExperimentError::Usage(m)) if m.contains("16-bit")));
    assert_eq!(TrainConfig::default().baseline_precision(), None);
}

#[test]
fn labels_and_dense_epochs() {
    assert_eq!(with("topk:0.01:no-ef").label(), "topk 1 %, no EF");
    assert_eq!(with("sampled-topk:0.001").label(), "sampled-topk 0.1 %");
    assert_eq!(with("powersgd:4").label(), "powersgd rank 4");
    assert_eq!(with("uint8:no-ef").label(), "uint8, no EF");
    assert_eq!(with("diloco:8:uint8").label(), "diloco 8:uint8");
    assert_eq!(with("diloco:16").label(), "diloco 16");
    assert_eq!(with("dimreduce").dense_epochs(), 10);
    assert_eq!(TrainConfig::default().dense_epochs(), 0);
}

#[test]
fn the_first_format_reads_as_the_same_run() {
    let old = serde_json::json!({
        "adasum_group": null, "average_state": false, "batch": 16,
        "channels": [16, 32], "clip": null, "components": 32,
        "dimreduce_dense_epochs": null, "epochs": 1, "error_feedback": false,
        "freeze_step": 100, "fusion_threshold": 2048, "hidden": [8],
        "lr": 0.05, "model": "mlp", "momentum": 0.9, "optimizer": "sgd",
        "pca": null, "powersgd_rank": 2, "powersgd_start_step": 10,
        "ratio": 0.05, "schedule": "constant", "seed": 7,
        "strategy": "topk", "threshold": 0.009999999776482582, "world": 2
    });
    let config: TrainConfig = serde_json::from_value(old).unwrap();
    assert_eq!(
        config,
        TrainConfig {
            world: 2,
            epochs: 1,
            hidden: vec![8],
            ..with("topk:0.05:no-ef")
        }
    );
    let baseline: TrainConfig =
        serde_json::from_value(serde_json::json!({"strategy": "baseline"})).unwrap();
    assert!(baseline.baseline && baseline.strategy == StrategyConfig::Dense);
    // Today's format: the printed strategy, round trip.
    let now = with("powersgd:4:start=1:no-ef");
    let back: TrainConfig = serde_json::from_value(serde_json::to_value(&now).unwrap()).unwrap();
    assert_eq!(back, now);
    let unreadable =
        serde_json::from_value::<TrainConfig>(serde_json::json!({"strategy": "gzip"})).unwrap_err();
    assert!(
        unreadable.to_string().contains("unknown strategy \"gzip\""),
        "{unreadable}"
    );
}

#[test]
fn batch_and_epochs_are_bounded_so_their_products_cannot_overflow() {
    use super::{MAX_BATCH, MAX_EPOCHS};
    for (batch, epochs, flag) in [
        (0, 1, "--batch"),
        (MAX_BATCH + 1, 1, "--batch"),
        (usize::MAX, 1, "--batch"),
        (1, 0, "--epochs"),
        (1, MAX_EPOCHS + 1, "--epochs"),
        (1, usize::MAX, "--epochs"),
    ] {
        let config = TrainConfig {
            batch,
            epochs,
            ..TrainConfig::default()
        };
        let result = config.validate();
        assert!(
            matches!(&result, Err(ExperimentError::Usage(m)) if m.starts_with(flag)),
            "batch {batch}, epochs {epochs}: {result:?}"
        );
    }
    let largest = TrainConfig {
        batch: MAX_BATCH,
        epochs: MAX_EPOCHS,
        world: 256,
        ..TrainConfig::default()
    };
    largest.validate().unwrap();
    assert!(
        (largest.world * largest.batch)
            .checked_mul(largest.epochs)
            .is_some()
    );
}

/// The cores shared out among the ranks of one machine: at least one
/// thread a rank, all of them for one rank, none left over unless the
/// division leaves them.
#[test]
fn ranks_share_the_cores_as_compute_threads() {
    for (ranks, cores, threads) in [
        (1, 2, 2),
        (2, 2, 1),
        (4, 2, 1),
        (3, 8, 2),
        (4, 16, 4),
        (0, 8, 8),
        (5, 1, 1),
    ] {
        assert_eq!(
            compute_threads_per_rank(ranks, cores),
            threads,
            "{ranks} ranks, {cores} cores"
        );
    }
}

/// A value is set for every count of in-process ranks, one included (the
/// whole machine), and never over the user's own choice of either
/// variable; nothing where the ranks are not known.
#[test]
fn the_compute_threads_are_set_for_ranks_sharing_a_process_unless_chosen() {
    let unset = |_: &str| None;
    assert_eq!(
        compute_threads_to_set(Some(4), 2, unset).as_deref(),
        Some("1")
    );
    assert_eq!(
        compute_threads_to_set(Some(2), 16, unset).as_deref(),
        Some("8")
    );
    assert_eq!(
        compute_threads_to_set(Some(1), 2, unset).as_deref(),
        Some("2")
    );
    assert_eq!(compute_threads_to_set(None, 2, unset), None);
    for chosen in CHOSEN_THREADS_VARS {
        let get = |name: &str| (name == chosen).then(|| "3".into());
        assert_eq!(compute_threads_to_set(Some(4), 2, get), None, "{chosen}");
    }
}
