//! The epoch's straggler in `train`'s records, on LocalComm: every epoch of
//! a run of two or more workers names a rank the others waited for, with
//! its share of the exchanging steps and how late it was; one worker, or
//! uneven shards (different steps per rank), name none. (Which rank from
//! which waits is tested on fixed waits in `train::straggler`.)

use gradwire_experiments::TrainConfig;
use gradwire_experiments::data::{Dataset, Digits};
use gradwire_experiments::train::{Silent, train};

fn config(world: usize, uneven_shards: bool) -> TrainConfig {
    TrainConfig {
        world,
        epochs: 2,
        hidden: vec![16],
        uneven_shards,
        ..TrainConfig::default()
    }
}

#[test]
fn every_epoch_names_the_rank_waited_for() {
    let data = Dataset::Digits(Digits::load(42));
    for world in 2..=4 {
        let report = train(&config(world, false), &data, &Silent, None).unwrap();
        for e in &report.epochs {
            let s = e
                .straggler
                .unwrap_or_else(|| panic!("W = {world}, epoch {}", e.epoch));
            assert!(s.rank < world, "W = {world}: {s:?}");
            assert!(s.share > 0.0 && s.share <= 1.0, "W = {world}: {s:?}");
            // At least its share of the steps, and the others waited.
            assert!(s.share * world as f64 >= 1.0 - 1e-9, "W = {world}: {s:?}");
            assert!(
                s.late_secs > 0.0 && s.late_secs.is_finite(),
                "W = {world}: {s:?}"
            );
        }
    }
    for (world, uneven) in [(1, false), (3, true)] {
        let report = train(&config(world, uneven), &data, &Silent, None).unwrap();
        assert!(
            report.epochs.iter().all(|e| e.straggler.is_none()),
            "W = {world}, uneven {uneven}"
        );
    }
}
