//! The benches' unit tests: the overhead bench measures every setup,
//! and small runs report consistent ratios.

use super::*;
use crate::error::assert_usage;

#[test]
fn the_overhead_bench_measures_every_setup() {
    let rows = overhead::overhead(4, 1, 1).unwrap();
    let setups: Vec<(&str, usize)> = rows.iter().map(|r| (r.setup.as_str(), r.world)).collect();
    assert_eq!(
        setups,
        [
            ("candle SGD alone", 1),
            ("DataParallel, dense", 1),
            ("DataParallel, dense (LocalComm)", 2)
        ]
    );
    for r in &rows {
        assert!(r.ms_per_step > 0.0 && r.ms_per_step.is_finite(), "{r:?}");
        assert!(r.step_ms > 0.0 && r.step_ms <= r.ms_per_step, "{r:?}");
        assert!(r.vs_candle.is_finite(), "{r:?}");
    }
    assert_eq!(rows[0].vs_candle, 1.0);
    assert_usage(overhead::overhead(0, 1, 1), "--batch");
}

#[test]
fn small_runs_report_consistent_ratios() {
    let quick = Budget {
        min_runs: 2,
        min_secs: 0.0,
    };
    let rows = all_reduce(&[4096], &[1, 2], quick).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].busbw_gbs, 0.0, "one rank moves nothing");
    for r in &rows {
        assert!(r.secs > 0.0 && r.memcpy_gbs > 0.0);
        assert!((r.ratio - r.busbw_gbs / r.memcpy_gbs).abs() < 1e-12);
    }
    let codecs: Vec<String> = CODECS.iter().map(|c| c.to_string()).collect();
    let rows = compress(&codecs, &[1000], quick).unwrap();
    assert_eq!(rows.len(), CODECS.len());
    assert_usage(
        compress(&["zip".into()], &[10], quick),
        "unknown codec \"zip\"",
    );
    assert_usage(
        all_reduce(&[5], &[2], quick),
        "5 bytes is not a multiple of 4",
    );
}
