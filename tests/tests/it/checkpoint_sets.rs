//! A run's checkpoints as sets: a set is complete only when every rank
//! wrote its part, a write that fails on one rank stops every rank, and a
//! resume takes the newest set every rank holds intact (falling back to
//! the one before when a rank's newest is missing or corrupt), bitwise as
//! a straight run, or fails alike on every rank; a set resumes at another
//! world size too (every strategy: `registry.rs`).

use gradwire_comm::{LocalComm, local};
use gradwire_experiments::TrainConfig;
use gradwire_experiments::data::{Dataset, Digits};
use gradwire_experiments::train::{CheckpointPlan, Silent, train, train_rank};
use std::path::Path;

/// A small run whose ranks keep per-rank state (top-k's residuals).
fn config(world: usize, epochs: usize) -> TrainConfig {
    TrainConfig {
        strategy: "topk:0.1".parse().expect("a strategy"),
        world,
        epochs,
        batch: 64,
        hidden: vec![8],
        ..TrainConfig::default()
    }
}

fn file(dir: &Path, rank: usize, epoch: usize) -> std::path::PathBuf {
    dir.join(format!("rank{rank}.epoch{epoch}.ckpt"))
}

fn plan(dir: &Path, resume: bool) -> CheckpointPlan {
    CheckpointPlan {
        dir: dir.to_path_buf(),
        resume,
    }
}

/// Every rank's outcome of `config` on `plan` (not only the first error).
fn every_rank(config: &TrainConfig, data: &Dataset, plan: &CheckpointPlan) -> Vec<String> {
    local::run(config.world, |comm: LocalComm| {
        train_rank(comm, config, data, &Silent, Some(plan))
    })
    .expect("the ranks ran")
    .into_iter()
    .map(|r| match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => format!("{e:?}"),
    })
    .collect()
}

#[test]
fn a_resume_takes_the_newest_set_every_rank_holds_intact() {
    let data = Dataset::Digits(Digits::load(42));
    for world in [2, 3] {
        let last = world - 1;
        let straight = train(&config(world, 3), &data, &Silent, None).unwrap();
        // Rank `last` stopped before writing epoch 2 (its file is missing);
        // then rank 0's epoch-2 file is corrupt, the others intact.
        for damage in ["missing", "corrupt"] {
            let what = format!("W = {world}, {damage}");
            let dir = tempfile::tempdir().unwrap();
            train(
                &config(world, 2),
                &data,
                &Silent,
                Some(&plan(dir.path(), false)),
            )
            .unwrap();
            for rank in 0..world {
                for epoch in [1, 2] {
                    assert!(
                        file(dir.path(), rank, epoch).is_file(),
                        "{what}: rank {rank}"
                    );
                }
            }
            match damage {
                "missing" => std::fs::remove_file(file(dir.path(), last, 2)).unwrap(),
                _ => {
                    let path = file(dir.path(), 0, 2);
                    let mut bytes = std::fs::read(&path).unwrap();
                    let at = bytes.len() - 5;
                    bytes[at] ^= 0x10;
                    std::fs::write(&path, bytes).unwrap();
                }
            }
            let resumed = train(
                &config(world, 3),
                &data,
                &Silent,
                Some(&plan(dir.path(), true)),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                resumed.param_checksum, straight.param_checksum,
                "{what}: resumed from epoch 1, bitwise the straight run"
            );
            assert_eq!(resumed.epochs.len(), 3, "{what}: the history came back");
            // Epochs 2 and 3 were written again; epoch 1's set went.
            for rank in 0..world {
                assert!(!file(dir.path(), rank, 1).exists(), "{what}: rank {rank}");
                assert!(file(dir.path(), rank, 3).is_file(), "{what}: rank {rank}");
            }
        }
    }
}

#[test]
fn without_a_set_every_rank_holds_every_rank_fails_alike() {
    let data = Dataset::Digits(Digits::load(42));
    let world = 3;
    let dir = tempfile::tempdir().unwrap();
    train(
        &config(world, 1),
        &data,
        &Silent,
        Some(&plan(dir.path(), false)),
    )
    .unwrap();
    // Rank 1's only file is garbage.
    std::fs::write(file(dir.path(), 1, 1), b"not a checkpoint").unwrap();
    let outcomes = every_rank(&config(world, 2), &data, &plan(dir.path(), true));
    for (rank, outcome) in outcomes.iter().enumerate() {
        assert!(
            outcome.starts_with("Resume(") && outcome.contains("no epoch has an intact checkpoint"),
            "rank {rank}: {outcome}"
        );
    }
}

#[test]
fn a_write_that_fails_on_one_rank_stops_every_rank() {
    let data = Dataset::Digits(Digits::load(42));
    for world in [2, 3] {
        let dir = tempfile::tempdir().unwrap();
        // Rank 1 cannot write its epoch-1 file: a directory is in the way.
        std::fs::create_dir(file(dir.path(), 1, 1)).unwrap();
        let outcomes = every_rank(&config(world, 2), &data, &plan(dir.path(), false));
        for (rank, outcome) in outcomes.iter().enumerate() {
            if rank == 1 {
                assert!(!outcome.starts_with("ok"), "W = {world}, rank 1: {outcome}");
            } else {
                assert_eq!(
                    outcome, r#"Peer { rank: 1, what: "write its checkpoint of epoch 1" }"#,
                    "W = {world}, rank {rank}"
                );
            }
        }
        // No rank went on to epoch 2.
        for rank in 0..world {
            assert!(
                !file(dir.path(), rank, 2).exists(),
                "W = {world}, rank {rank}"
            );
        }
    }
}

#[test]
fn dimreduce_resumes_at_another_world_size_with_its_sharded_momentum() {
    let data = Dataset::Digits(Digits::load(42));
    let config = |world: usize, epochs: usize| TrainConfig {
        strategy: "dimreduce".parse().expect("a strategy"),
        dimreduce_dense_epochs: Some(1),
        components: 4,
        ..config(world, epochs)
    };
    let dir = tempfile::tempdir().unwrap();
    // Saved after an epoch of DimReduce proper: its residual momentum is
    // sharded over the three ranks.
    let saved = train(
        &config(3, 2),
        &data,
        &Silent,
        Some(&plan(dir.path(), false)),
    )
    .unwrap();
    for (new, epochs) in [(2, 2), (4, 3)] {
        let what = format!("W = 3 -> {new}");
        let resumed = train(
            &config(new, epochs),
            &data,
            &Silent,
            Some(&plan(dir.path(), true)),
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(resumed.epochs.len(), epochs, "{what}");
        assert!(
            resumed.epochs.iter().all(|e| e.train_loss.is_finite()),
            "{what}"
        );
        if epochs == 2 {
            // Nothing left to train: every rank held these parameters.
            assert_eq!(resumed.param_checksum, saved.param_checksum, "{what}");
        }
    }
}

#[test]
fn a_run_resumed_at_fewer_ranks_resumes_again_at_more() {
    // 4 -> 2 leaves the 4-rank set's files of ranks 2 and 3 behind; the
    // resume at 4 again goes on from the newer 2-rank set.
    let data = Dataset::Digits(Digits::load(42));
    let dir = tempfile::tempdir().unwrap();
    for (world, epochs, resume) in [(4, 1, false), (2, 2, true), (4, 3, true), (3, 4, true)] {
        let report = train(
            &config(world, epochs),
            &data,
            &Silent,
            Some(&plan(dir.path(), resume)),
        )
        .unwrap_or_else(|e| panic!("W = {world}, {epochs} epochs: {e}"));
        assert_eq!(report.epochs.len(), epochs, "W = {world}");
        for rank in 0..world {
            assert!(
                file(dir.path(), rank, epochs).is_file(),
                "W = {world}, rank {rank}"
            );
        }
    }
    // Two sets of the last world's own since it began: what the larger
    // worlds before it left is gone, and no fallback was lost.
    train(&config(3, 6), &data, &Silent, Some(&plan(dir.path(), true))).unwrap();
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "rank0.epoch5.ckpt",
            "rank0.epoch6.ckpt",
            "rank1.epoch5.ckpt",
            "rank1.epoch6.ckpt",
            "rank2.epoch5.ckpt",
            "rank2.epoch6.ckpt",
        ]
    );
}
