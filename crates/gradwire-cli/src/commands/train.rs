//! `gradwire train`: one strategy on LocalComm threads, MPI processes or
//! NCCL ranks (or, with `--network`, MPI ranks on a shaped network), a row
//! per epoch and a summary.

use super::over_network;
use crate::console::{Console, print_train_header};
use crate::{Backend, TrainArgs};
use gradwire_experiments::data::Digits;
use gradwire_experiments::train::{CheckpointPlan, TARGET_ACCURACY, train};
use gradwire_experiments::{ExperimentError, TrainConfig};
use std::sync::Mutex;

/// Runs `gradwire train` with its flags.
pub(crate) fn run(args: TrainArgs) -> Result<(), ExperimentError> {
    if let Some(rate) = &args.network.network {
        return over_network(rate, args.common.run.world, None);
    }
    let (strategy, baseline) = args.strategy;
    let mut config = TrainConfig {
        strategy,
        baseline,
        ..args.common.run.clone()
    };
    let data = Digits::load(args.common.split_seed);
    let json = args.common.json;
    let console = Console {
        json,
        bar: Mutex::new(None),
    };
    let plan = args.checkpoint.map(|dir| CheckpointPlan {
        dir,
        resume: args.resume,
    });
    let report = match args.backend {
        Backend::Local => {
            config.validate()?;
            print_train_header(&config, json);
            Some(train(&config, &data, &console, plan.as_ref())?)
        }
        Backend::Mpi => train_mpi(&mut config, &data, &console, plan.as_ref())?,
        Backend::Nccl => {
            config.validate()?;
            print_train_header(&config, json);
            Some(train_nccl(
                &config,
                &data,
                &console,
                plan.as_ref(),
                args.deterministic,
            )?)
        }
    };
    // Under MPI only rank 0 reports.
    let Some(report) = report else {
        return Ok(());
    };
    if json {
        let mut value = serde_json::to_value(&report)?;
        if let Some(map) = value.as_object_mut() {
            map.insert("type".into(), "summary".into());
        }
        println!("{value}");
    } else {
        println!(
            "final test accuracy {:.1} %, best {:.1} %, epochs to {:.0} %: {}, {:.3} MB sent per worker (dense / sent: {:.1}x), parameters {}",
            report.final_accuracy() * 100.0,
            report.best_accuracy() * 100.0,
            TARGET_ACCURACY * 100.0,
            report
                .epochs_to(TARGET_ACCURACY)
                .map_or("not reached".to_string(), |e| e.to_string()),
            report.bytes_per_worker() as f64 / 1e6,
            report.compression(),
            report.param_checksum
        );
    }
    Ok(())
}

/// This process's part of an MPI run: rank 0 returns the report.
#[cfg(feature = "mpi")]
fn train_mpi(
    config: &mut TrainConfig,
    data: &Digits,
    console: &Console,
    plan: Option<&CheckpointPlan>,
) -> Result<Option<gradwire_experiments::RunReport>, ExperimentError> {
    use gradwire_comm::{Communicator, MpiComm};
    let comm = MpiComm::world()?;
    config.world = comm.world_size();
    config.validate()?;
    if comm.rank() == 0 {
        print_train_header(config, console.json);
    }
    gradwire_experiments::train::train_rank(comm, config, data, console, plan)
}

#[cfg(not(feature = "mpi"))]
fn train_mpi(
    _: &mut TrainConfig,
    _: &Digits,
    _: &Console,
    _: Option<&CheckpointPlan>,
) -> Result<Option<gradwire_experiments::RunReport>, ExperimentError> {
    Err(super::mpi_missing())
}

#[cfg(feature = "nccl")]
fn train_nccl(
    config: &TrainConfig,
    data: &Digits,
    console: &Console,
    plan: Option<&CheckpointPlan>,
    deterministic: bool,
) -> Result<gradwire_experiments::RunReport, ExperimentError> {
    gradwire_experiments::train::train_nccl(config, data, console, plan, deterministic)
}

#[cfg(not(feature = "nccl"))]
fn train_nccl(
    _: &TrainConfig,
    _: &Digits,
    _: &Console,
    _: Option<&CheckpointPlan>,
    _: bool,
) -> Result<gradwire_experiments::RunReport, ExperimentError> {
    Err(super::nccl_missing())
}
