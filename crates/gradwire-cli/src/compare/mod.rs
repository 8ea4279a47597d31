//! `gradwire compare`: several strategies on the same seed, split and model,
//! one after the other, summarised in one table (final and best accuracy,
//! epochs to 95 %, bytes per worker, compression against dense, wall time).
//! On a shaped network (`--network`, ranks under MPI) the report is about
//! time: `shaped.rs`.

use crate::config::{Strategy, TrainConfig};
use crate::data::Digits;
use crate::engine::Backend;
use crate::error::{CliError, Result};
use crate::train::{Observer, RunReport, TARGET_ACCURACY, train, train_rank};
use comfy_table::{Cell, CellAlignment, Table, presets::UTF8_FULL_CONDENSED};

/// One strategy to compare, with what it overrides of the shared settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry {
    /// The strategy.
    pub strategy: Strategy,
    /// The fraction sent (sparse strategies), if not the shared one.
    pub ratio: Option<f64>,
    /// Error feedback on or off, if not the shared setting.
    pub error_feedback: Option<bool>,
    /// PowerSGD's rank, if not the shared one.
    pub rank: Option<usize>,
}

impl Entry {
    fn plain(strategy: Strategy) -> Entry {
        Entry {
            strategy,
            ratio: None,
            error_feedback: None,
            rank: None,
        }
    }
}

/// The default line-up: dense, fp16, top-k 1 % with and without error
/// feedback, sampled top-k 0.1 %, PowerSGD at rank 2, 1-bit and min-max
/// uint8 (error feedback), partial averaging, AdaSum by delta weight and
/// DimReduce.
pub fn default_entries() -> Vec<Entry> {
    vec![
        Entry::plain(Strategy::Dense),
        Entry::plain(Strategy::Fp16),
        Entry {
            strategy: Strategy::Topk,
            ratio: Some(0.01),
            error_feedback: Some(true),
            rank: None,
        },
        Entry {
            strategy: Strategy::Topk,
            ratio: Some(0.01),
            error_feedback: Some(false),
            rank: None,
        },
        Entry {
            strategy: Strategy::SampledTopk,
            ratio: Some(0.001),
            error_feedback: Some(true),
            rank: None,
        },
        Entry {
            rank: Some(2),
            ..Entry::plain(Strategy::Powersgd)
        },
        Entry::plain(Strategy::Onebit),
        Entry::plain(Strategy::Uint8),
        Entry::plain(Strategy::Partial),
        Entry::plain(Strategy::AdasumDelta),
        Entry::plain(Strategy::Dimreduce),
    ]
}

/// Parses `name[:ratio][:ef|:no-ef]`, e.g. `topk:0.01:no-ef`; PowerSGD's
/// number is its rank (`powersgd:4`).
pub fn parse_entry(text: &str) -> Result<Entry> {
    let mut parts = text.split(':');
    let name = parts.next().unwrap_or_default();
    let strategy = Strategy::ALL
        .into_iter()
        .find(|s| s.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
            CliError::Usage(format!(
                "unknown strategy {name:?} in {text:?} (one of: {})",
                names.join(", ")
            ))
        })?;
    let mut entry = Entry::plain(strategy);
    for part in parts {
        match part {
            "ef" => entry.error_feedback = Some(true),
            "no-ef" => entry.error_feedback = Some(false),
            number if strategy == Strategy::Powersgd => {
                let rank: usize = number.parse().map_err(|_| {
                    CliError::Usage(format!("{text:?}: {number:?} is not a rank (1, 2, ...)"))
                })?;
                if rank == 0 {
                    return Err(CliError::Usage(format!(
                        "{text:?}: the rank must be at least 1"
                    )));
                }
                entry.rank = Some(rank);
            }
            number => {
                let ratio: f64 = number.parse().map_err(|_| {
                    CliError::Usage(format!(
                        "{text:?}: {number:?} is neither a ratio nor ef / no-ef"
                    ))
                })?;
                if !(ratio > 0.0 && ratio <= 1.0) {
                    return Err(CliError::Usage(format!(
                        "{text:?}: the ratio must be in (0, 1], got {ratio}"
                    )));
                }
                entry.ratio = Some(ratio);
            }
        }
    }
    Ok(entry)
}

/// The configuration of each entry: `base` with the entry's overrides.
pub fn configs(base: &TrainConfig, entries: &[Entry]) -> Result<Vec<TrainConfig>> {
    entries
        .iter()
        .map(|e| {
            let config = TrainConfig {
                strategy: e.strategy,
                ratio: e.ratio.unwrap_or(base.ratio),
                error_feedback: e.error_feedback.unwrap_or(base.error_feedback),
                powersgd_rank: e.rank.unwrap_or(base.powersgd_rank),
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
    data: &Digits,
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
    data: &Digits,
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

/// The summary table.
pub fn table(runs: &[RunReport]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "strategy",
        "final acc %",
        "best acc %",
        "epochs to 95 %",
        "MB sent / worker",
        "vs dense",
        "wall s",
    ]);
    for r in runs {
        let right = |text: String| Cell::new(text).set_alignment(CellAlignment::Right);
        table.add_row(vec![
            Cell::new(&r.label),
            right(format!("{:.1}", r.final_accuracy() * 100.0)),
            right(format!("{:.1}", r.best_accuracy() * 100.0)),
            right(
                r.epochs_to(TARGET_ACCURACY)
                    .map_or("-".to_string(), |e| e.to_string()),
            ),
            right(format!("{:.3}", r.bytes_per_worker() as f64 / 1e6)),
            right(format!("{:.1}x", r.compression())),
            right(format!("{:.1}", r.wall_secs())),
        ]);
    }
    table
}

mod shaped;

pub use shaped::{CALIBRATION_BYTES, Calibration, ShapedRow, calibrate, shaped_table};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_with_their_overrides() {
        let e = parse_entry("topk:0.01:no-ef").unwrap();
        assert_eq!(e.strategy, Strategy::Topk);
        assert_eq!(e.ratio, Some(0.01));
        assert_eq!(e.error_feedback, Some(false));
        assert_eq!(
            parse_entry("adasum-delta").unwrap().strategy,
            Strategy::AdasumDelta
        );
        assert_eq!(parse_entry("powersgd:4").unwrap().rank, Some(4));
        for bad in [
            "topk:2",
            "topk:0",
            "nope",
            "topk:fast",
            "",
            "powersgd:0",
            "powersgd:0.5",
        ] {
            assert!(matches!(parse_entry(bad), Err(CliError::Usage(_))), "{bad}");
        }
    }

    #[test]
    fn the_default_line_up_differs_only_where_it_says() {
        let base = TrainConfig::default();
        let configs = configs(&base, &default_entries()).unwrap();
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
