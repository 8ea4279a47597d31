//! `gradwire compare`: several strategies on the same seed and split, one
//! table and the plots; on a shaped network (`--network`) also the time
//! report, the cost model's prediction of every run and `profile.json`.

use crate::console::{RunBar, bar_style};
use gradwire_experiments::compare::{self, CompareArgs, Compared};
use gradwire_experiments::plot;
use gradwire_experiments::project;
use gradwire_experiments::train::{Observer, RunReport};
use gradwire_experiments::{ExperimentError, TrainConfig};
use indicatif::ProgressBar;
use std::path::Path;

/// Runs `gradwire compare` with its flags.
pub(crate) fn run(args: CompareArgs) -> Result<(), ExperimentError> {
    let base = &args.common.run;
    let json = args.common.json;
    let header = |world: usize, configs: &[TrainConfig]| {
        if !json {
            println!(
                "comparing {} strategies: {} workers, {} epochs, global batch {}, seed {}",
                configs.len(),
                world,
                base.epochs,
                TrainConfig {
                    world,
                    ..base.clone()
                }
                .global_batch(),
                base.seed
            );
        }
    };
    let bars = |_: usize, config: &TrainConfig| -> Box<dyn Observer> {
        // The length is set when the first epoch says how many steps it has.
        let bar = ProgressBar::new(0)
            .with_style(bar_style())
            .with_prefix(config.label());
        if json {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        Box::new(RunBar {
            bar,
            epochs: config.epochs,
            label: if json { String::new() } else { config.label() },
        })
    };
    // Only rank 0 reports (with --network, rank 0 of the ranks).
    let Some(Compared { runs, calibration }) = args.run(header, bars)? else {
        return Ok(());
    };
    let plots = plot::write_plots(&runs, &args.out);
    // Everything measured, beside the plots (`gradwire project --profile`
    // and later reports read it); the plots made the directory.
    let record = serde_json::json!({
        "type": "compare",
        "runs": runs,
        "calibration": calibration,
        "rate_bits_per_s": args.network.link_rate,
    });
    if plots.is_ok() {
        let path = args.out.join("compare.json");
        std::fs::write(&path, record.to_string()).map_err(|source| ExperimentError::Io {
            path: path.display().to_string(),
            source,
        })?;
    }
    if json {
        println!("{record}");
    } else {
        println!("{}", compare::table(&runs));
    }
    if let (Some(calibration), Some(bits)) = (&calibration, args.network.link_rate) {
        shaped_report(&runs, calibration, bits, &args.out, json)?;
    }
    let plots = plots?;
    if !json {
        let files: Vec<String> = [plots.by_epoch, plots.by_bytes, plots.by_time]
            .iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();
        println!("plots: {}", files.join(", "));
    }
    Ok(())
}

/// The time report of a shaped-network comparison (rank 0): the table,
/// with the cost model's prediction for every run, and `<out>/profile.json`
/// (what `gradwire project --profile` reads).
fn shaped_report(
    runs: &[RunReport],
    calibration: &compare::Calibration,
    bits: u64,
    out: &Path,
    json: bool,
) -> Result<(), ExperimentError> {
    let profile = project::profile_of(runs, calibration, bits)?;
    let predicted = project::predictions(&profile, runs);
    std::fs::create_dir_all(out).map_err(|source| ExperimentError::Io {
        path: out.display().to_string(),
        source,
    })?;
    let path = out.join("profile.json");
    std::fs::write(&path, serde_json::to_string_pretty(&profile)?).map_err(|source| {
        ExperimentError::Io {
            path: path.display().to_string(),
            source,
        }
    })?;
    if json {
        let rows: Vec<compare::ShapedRow> = runs.iter().map(compare::ShapedRow::of).collect();
        println!(
            "{}",
            serde_json::json!({
                "type": "shaped",
                "rate_bits_per_s": bits,
                "rows": rows,
                "predicted_s_per_step": predicted,
                "calibration": calibration,
                "profile": profile,
            })
        );
    } else {
        println!("{}", compare::shaped_table(runs, &predicted));
        println!(
            "links fitted to the calibration (a ring's rounds): gradwire {}; library {}; profile: {}",
            profile.link.describe(),
            profile
                .library_link
                .as_ref()
                .map_or("-".into(), project::ProfileLink::describe),
            path.display()
        );
        if let Some(burst) = &profile.burst {
            println!("burst: {}", burst.describe());
        }
        if let Some((before, after)) = profile.latency_before_after_s {
            println!(
                "latency: gradwire's all-reduce of {} B took {:.0} us before the runs, {:.0} us \
                 after them ({:+.0} %); the link's latency is fitted to both",
                compare::LATENCY_BYTES,
                before * 1e6,
                after * 1e6,
                (after / before - 1.0) * 100.0
            );
        }
    }
    // On stderr in either form: a model off by more than the bound names
    // its row.
    for line in project::model_warnings(&profile, runs) {
        eprintln!("{line}");
    }
    Ok(())
}
