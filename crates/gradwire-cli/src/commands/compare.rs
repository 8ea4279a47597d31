//! `gradwire compare`: several strategies on the same seed and split, one
//! table and the plots; on a shaped network (`--network`) also the time
//! report, the cost model's prediction of every run and `profile.json`.

use super::over_network;
use crate::console::{RunBar, bar_style};
use crate::{Backend, CompareArgs};
use gradwire_experiments::compare;
use gradwire_experiments::data::Digits;
use gradwire_experiments::plot;
use gradwire_experiments::project;
use gradwire_experiments::train::RunReport;
use gradwire_experiments::{ExperimentError, TrainConfig};
use indicatif::ProgressBar;
use std::path::Path;

/// Runs `gradwire compare` with its flags.
pub(crate) fn run(args: CompareArgs) -> Result<(), ExperimentError> {
    if let Some(rate) = &args.network.network {
        return over_network(rate, args.common.run.world, Some(&args.out));
    }
    let base = args.common.run.clone();
    let configs = if args.strategies.is_empty() {
        compare::configs(&base, &compare::DEFAULT_LINE_UP)?
    } else {
        compare::configs(&base, &args.strategies)?
    };
    let data = Digits::load(args.common.split_seed);
    let json = args.common.json;
    let header = |world: usize| {
        if !json {
            println!(
                "comparing {} strategies: {} workers, {} epochs, global batch {}, seed {}",
                configs.len(),
                world,
                base.epochs,
                world * base.batch,
                base.seed
            );
        }
    };
    let bars = |_: usize, config: &TrainConfig| -> Box<dyn gradwire_experiments::train::Observer> {
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
    let (runs, calibration) = match args.backend {
        Backend::Local => {
            header(base.world);
            (compare::run(&configs, &data, bars)?, None)
        }
        Backend::Mpi => {
            match compare_mpi(
                &configs,
                &data,
                args.network.link_rate.is_some(),
                header,
                bars,
            )? {
                Some(done) => done,
                // Only rank 0 reports.
                None => return Ok(()),
            }
        }
        Backend::Nccl => {
            return Err(ExperimentError::Usage(
                "compare runs on --backend local or mpi (or --network)".into(),
            ));
        }
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
        let files: Vec<String> = [
            plots.accuracy_vs_epoch,
            plots.accuracy_vs_bytes,
            plots.accuracy_vs_time,
        ]
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
        let link = |l: &project::ProfileLink| {
            format!(
                "{:.0} us + bytes / {:.1} MB/s",
                l.latency_s * 1e6,
                l.bytes_per_s / 1e6
            )
        };
        println!(
            "links fitted to the calibration (a ring's rounds): gradwire {}, {} library; profile: {}",
            link(&profile.link),
            profile.library_link.as_ref().map_or("-".into(), link),
            path.display()
        );
    }
    Ok(())
}

/// A comparison's reports and, on a shaped network, the links' calibration.
type Compared = (Vec<RunReport>, Option<compare::Calibration>);

/// This process's part of a comparison under MPI (one run after the other,
/// each on a new duplicate of the world); on a shaped network (`shaped`)
/// the link is calibrated first. Rank 0 returns the reports.
#[cfg(feature = "mpi")]
fn compare_mpi<'o>(
    configs: &[TrainConfig],
    data: &Digits,
    shaped: bool,
    header: impl Fn(usize),
    bars: impl Fn(usize, &TrainConfig) -> Box<dyn gradwire_experiments::train::Observer + 'o>,
) -> Result<Option<Compared>, ExperimentError> {
    use gradwire_comm::{Communicator, MpiComm};
    let world = MpiComm::world()?;
    let rank = world.rank();
    if rank == 0 {
        header(world.world_size());
    }
    let calibration = if shaped {
        if rank == 0 {
            eprintln!(
                "calibrating the links: all-reduces of 64 KiB to 16 MiB, gradwire's and MPI's"
            );
        }
        Some(compare::calibrate(&world)?)
    } else {
        None
    };
    let runs = compare::run_on(configs, data, || Ok(MpiComm::world()?), bars)?;
    Ok(runs.map(|runs| (runs, calibration)))
}

#[cfg(not(feature = "mpi"))]
fn compare_mpi<'o>(
    _: &[TrainConfig],
    _: &Digits,
    _: bool,
    _: impl Fn(usize),
    _: impl Fn(usize, &TrainConfig) -> Box<dyn gradwire_experiments::train::Observer + 'o>,
) -> Result<Option<Compared>, ExperimentError> {
    Err(super::mpi_missing())
}
