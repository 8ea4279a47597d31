//! `gradwire compare`: several strategies on the same seed, split and model,
//! one after the other, summarised in one table (final and best accuracy,
//! or test loss for the GPT; epochs to the target; bytes per worker,
//! compression against dense, wall time).
//! On a shaped network (`--network`, ranks under MPI) the report is about
//! time: `shaped.rs`, the links timed first (and the latency again
//! after the runs) by `calibrate.rs`. `gradwire
//! compare`'s flags and the backend they choose: `command.rs`.

use crate::config::{TrainConfig, parse_strategy};
use crate::data::Dataset;
use crate::engine::Backend;
use crate::error::Result;
use crate::train::{Observer, RunReport, train, train_rank};
use comfy_table::{Cell, CellAlignment, Table, presets::UTF8_FULL_CONDENSED};

/// The default line-up, in the registry's printed forms: dense, fp16,
/// top-k 1 % with and without error feedback, sampled top-k 0.1 %,
/// PowerSGD at rank 2, 1-bit and min-max uint8 (error feedback), partial
/// averaging, AdaSum by delta weight and DimReduce.
pub const DEFAULT_LINE_UP: [&str; 11] = [
    "dense",
    "fp16",
    "topk:0.01",
    "topk:0.01:no-ef",
    "sampled-topk:0.001",
    "powersgd:2",
    "onebit",
    "uint8",
    "partial",
    "adasum-delta",
    "dimreduce",
];

/// The configuration of each strategy (a registry form such as
/// `topk:0.01:no-ef`, or `baseline`): `base` with that strategy, and with
/// `--timeline FILE` a file of its own (`FILE`'s stem, the strategy with
/// `:` as `_`, `FILE`'s extension: `trace.topk_0.01.json`).
pub fn configs(base: &TrainConfig, strategies: &[impl AsRef<str>]) -> Result<Vec<TrainConfig>> {
    strategies
        .iter()
        .map(|text| {
            let text = text.as_ref().trim();
            let (strategy, baseline) = parse_strategy(text)?;
            let timeline = base.timeline.as_ref().map(|path| {
                let stem = path.file_stem().unwrap_or_default().to_string_lossy();
                let mut name = format!("{stem}.{}", text.replace(':', "_"));
                if let Some(ext) = path.extension() {
                    name = format!("{name}.{}", ext.to_string_lossy());
                }
                path.with_file_name(name)
            });
            let config = TrainConfig {
                strategy,
                baseline,
                timeline,
                ..base.clone()
            };
            config.validate()?;
            Ok(config)
        })
        .collect()
}

/// Runs every configuration in turn; `observer(i)` watches run `i`.
pub fn run<'o>(
    configs: &[TrainConfig],
    data: &Dataset,
    observer: impl Fn(usize, &TrainConfig) -> Box<dyn Observer + 'o>,
) -> Result<Vec<RunReport>> {
    configs
        .iter()
        .enumerate()
        .map(|(i, config)| {
            let watcher = observer(i, config);
            train(config, data, watcher.as_ref(), None)
        })
        .collect()
}

/// Runs every configuration in turn on this process's rank of a
/// communicator `make_comm` makes afresh for each run (under MPI, each
/// `MpiComm::world()` is a new duplicate), its world size taken for the
/// configurations'. Rank 0 returns the reports, the others `None`.
pub fn run_on<'o, C: Backend + 'static>(
    configs: &[TrainConfig],
    data: &Dataset,
    mut make_comm: impl FnMut() -> Result<C>,
    observer: impl Fn(usize, &TrainConfig) -> Box<dyn Observer + 'o>,
) -> Result<Option<Vec<RunReport>>> {
    let mut reports = Vec::with_capacity(configs.len());
    for (i, config) in configs.iter().enumerate() {
        let comm = make_comm()?;
        let config = TrainConfig {
            world: comm.world_size(),
            ..config.clone()
        };
        let watcher = observer(i, &config);
        if let Some(report) = train_rank(comm, &config, data, watcher.as_ref(), None)? {
            reports.push(report);
        }
    }
    Ok((reports.len() == configs.len()).then_some(reports))
}

/// The summary table (accuracy on the digits, test loss for the GPT).
pub fn table(runs: &[RunReport]) -> Table {
    let target = runs.first().map(RunReport::target).unwrap_or_default();
    let measure = target.measure_name();
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "strategy".into(),
        format!("final {measure}"),
        format!("best {measure}"),
        format!("epochs to {target}"),
        "MB sent / worker".into(),
        "vs dense".into(),
        "train s".into(),
    ]);
    let quality = |m: Option<f64>| m.map_or("-".to_string(), |m| target.show(m));
    for r in runs {
        let right = |text: String| Cell::new(text).set_alignment(CellAlignment::Right);
        table.add_row(vec![
            Cell::new(&r.label),
            right(quality(r.final_measure())),
            right(quality(r.best_measure())),
            right(
                r.epochs_to_target()
                    .map_or("-".to_string(), |e| e.to_string()),
            ),
            right(format!("{:.3}", r.bytes_per_worker() as f64 / 1e6)),
            right(format!("{:.1}x", r.compression())),
            right(format!("{:.1}", r.wall_secs())),
        ]);
    }
    table
}

mod calibrate;
mod command;
mod shaped;

pub use calibrate::{
    BurstTimings, Calibration, LATENCY_BYTES, RATE_BYTES, ShaperBucket, calibrate, recheck_latency,
};
pub use command::{CompareArgs, Compared};
pub use shaped::{ShapedRow, shaped_table};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ExperimentError;

    #[test]
    fn strategies_parse_in_the_registrys_forms() {
        let base = TrainConfig::default();
        let got = configs(&base, &["topk:0.01:no-ef", "adasum-delta", "baseline"]).unwrap();
        assert_eq!(got[0].label(), "topk 1 %, no EF");
        assert_eq!(got[1].strategy.name(), "adasum-delta");
        assert!(got[2].baseline);
        for bad in [
            "topk:2",
            "topk:0",
            "nope",
            "topk:fast",
            "",
            "powersgd:0",
            "powersgd:0.5",
        ] {
            assert!(
                matches!(configs(&base, &[bad]), Err(ExperimentError::Usage(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_default_line_up_differs_only_where_it_says() {
        let base = TrainConfig::default();
        let configs = configs(&base, &DEFAULT_LINE_UP).unwrap();
        assert_eq!(configs.len(), 11);
        assert!(
            configs
                .iter()
                .all(|c| c.seed == base.seed && c.epochs == base.epochs)
        );
        let labels: Vec<String> = configs.iter().map(TrainConfig::label).collect();
        assert_eq!(labels[2], "topk 1 %");
        assert_eq!(labels[3], "topk 1 %, no EF");
        assert_eq!(labels[4], "sampled-topk 0.1 %");
        assert_eq!(labels[5], "powersgd rank 2");
        assert_eq!(labels[6], "onebit");
        assert_eq!(labels[7], "uint8");
    }
}
