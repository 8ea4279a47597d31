//! `gradwire compare`'s flags ([`CompareArgs`]) and the runs they ask for:
//! every strategy in turn on LocalComm threads or MPI processes, or (with
//! `--network`) this command again as MPI ranks on a shaped network, whose
//! links are calibrated first.

use super::{Calibration, DEFAULT_LINE_UP, configs, run};
use crate::config::{BackendKind, RunArgs, TrainConfig};
use crate::data::Dataset;
use crate::error::{ExperimentError, Result};
use crate::network::{NetworkArgs, run_shaped};
use crate::train::{Observer, RunReport};
use std::path::PathBuf;

/// `gradwire compare`'s flags.
#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// Strategies as in `train -s` (e.g. topk:0.01:no-ef, powersgd:4,
    /// baseline), comma-separated (default: dense, fp16, topk 1 % with and
    /// without error feedback, sampled-topk 0.1 %, powersgd rank 2, onebit,
    /// uint8, partial, adasum-delta, dimreduce).
    #[arg(long, value_delimiter = ',')]
    pub strategies: Vec<String>,
    /// The runs and how they are shown.
    #[command(flatten)]
    pub common: RunArgs,
    /// Directory for the plots (and, on a shaped network, the profile that
    /// `gradwire project --profile` reads).
    #[arg(long, default_value = "target/gradwire-compare")]
    pub out: PathBuf,
    /// Where the ranks run: `local` threads, or `mpi` processes under
    /// mpirun (rank 0 reports; build with --features mpi).
    #[arg(long, value_enum, default_value_t = BackendKind::Local)]
    pub backend: BackendKind,
    /// `--network`.
    #[command(flatten)]
    pub network: NetworkArgs,
}

/// A comparison's reports and, on a shaped network, the links' calibration.
#[derive(Debug)]
pub struct Compared {
    /// Every strategy's report, in the order of `--strategies`.
    pub runs: Vec<RunReport>,
    /// The links' calibration (on a shaped network only).
    pub calibration: Option<Calibration>,
}

impl CompareArgs {
    /// How many ranks the run puts in this process: `--world` on
    /// `--backend local` without `--network`, none otherwise.
    pub fn in_process_ranks(&self) -> Option<usize> {
        self.network
            .in_process_ranks(self.backend, self.common.run.world)
    }

    /// Runs the comparison the flags ask for. With `--network`, this
    /// command again as MPI ranks on a shaped network (which report
    /// themselves: `None`); otherwise every strategy in turn on
    /// `--backend`, `started(world, configs)` called on the rank that
    /// reports before the first run and `observer(i, config)` watching run
    /// `i`. Rank 0 returns the reports, the other MPI ranks `None`.
    pub fn run<'o>(
        &self,
        started: impl FnOnce(usize, &[TrainConfig]),
        observer: impl Fn(usize, &TrainConfig) -> Box<dyn Observer + 'o>,
    ) -> Result<Option<Compared>> {
        if let Some(rate) = &self.network.network {
            return run_shaped(rate, self.common.run.world, Some(&self.out)).map(|()| None);
        }
        let base = &self.common.run;
        let configs = if self.strategies.is_empty() {
            configs(base, &DEFAULT_LINE_UP)?
        } else {
            configs(base, &self.strategies)?
        };
        let data = Dataset::load(&self.common.run, self.common.split_seed)?;
        match self.backend {
            BackendKind::Local => {
                started(base.world, &configs);
                Ok(Some(Compared {
                    runs: run(&configs, &data, observer)?,
                    calibration: None,
                }))
            }
            BackendKind::Mpi => {
                let bucket = self
                    .network
                    .link_rate
                    .map(|bits_per_s| crate::network::Rate { bits_per_s }.bucket());
                run_mpi(&configs, &data, bucket, started, observer)
            }
            BackendKind::Nccl => Err(ExperimentError::Usage(
                "compare runs on --backend local or mpi (or --network)".into(),
            )),
        }
    }
}

/// This process's part of a comparison under MPI (one run after the other,
/// each on a new duplicate of the world); on a shaped network (given its
/// token `bucket`) the link is calibrated first (the bucket's burst too),
/// and its latency timed again last. Rank 0 returns the reports.
#[cfg(feature = "mpi")]
fn run_mpi<'o>(
    configs: &[TrainConfig],
    data: &Dataset,
    bucket: Option<super::ShaperBucket>,
    started: impl FnOnce(usize, &[TrainConfig]),
    observer: impl Fn(usize, &TrainConfig) -> Box<dyn Observer + 'o>,
) -> Result<Option<Compared>> {
    use gradwire_comm::{Communicator, MpiComm};
    let world = MpiComm::world()?;
    let rank = world.rank();
    if rank == 0 {
        started(world.world_size(), configs);
    }
    let mut calibration = if let Some(bucket) = bucket {
        if rank == 0 {
            eprintln!(
                "calibrating the links: all-reduces of 256 B (latency) and 1 to 16 MiB (rate), gradwire's and MPI's (MPI's also at the baselines' sizes), and the shaper's burst"
            );
        }
        let baselines = configs
            .iter()
            .filter(|c| c.baseline)
            .map(crate::project::baseline_bytes)
            .collect::<Result<Vec<usize>>>()?;
        Some(super::calibrate(&world, &baselines, Some(bucket))?)
    } else {
        None
    };
    let config = gradwire_comm::MpiConfig {
        timeline: configs.iter().any(|c| c.timeline.is_some()),
        ..gradwire_comm::MpiConfig::default()
    };
    let make_comm = || Ok(MpiComm::world_with(&config)?);
    let runs = super::run_on(configs, data, make_comm, observer)?;
    if let Some(calibration) = &mut calibration {
        super::recheck_latency(&world, calibration)?;
    }
    Ok(runs.map(|runs| Compared { runs, calibration }))
}

#[cfg(not(feature = "mpi"))]
fn run_mpi<'o>(
    _: &[TrainConfig],
    _: &Dataset,
    _: Option<super::ShaperBucket>,
    _: impl FnOnce(usize, &[TrainConfig]),
    _: impl Fn(usize, &TrainConfig) -> Box<dyn Observer + 'o>,
) -> Result<Option<Compared>> {
    Err(ExperimentError::mpi_missing())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::Silent;
    use clap::Parser;

    /// The flags as the binary declares them.
    #[derive(clap::Parser, Debug)]
    struct Flags {
        #[command(flatten)]
        args: CompareArgs,
    }

    /// MPI in a build without it names the feature; NCCL is no backend of
    /// a comparison; neither starts a run.
    #[test]
    fn backends_built_without_or_unfit_to_compare_are_usage_errors() {
        let run = |backend: &str| {
            let flags = ["compare", "--backend", backend, "--strategies", "dense"];
            let args = Flags::try_parse_from(flags).unwrap().args;
            args.run(
                |_, _| panic!("{backend}: nothing starts"),
                |_, _| Box::new(Silent),
            )
        };
        if !cfg!(feature = "mpi") {
            assert!(run("mpi").is_err_and(|e| e.is_built_without("mpi")));
        }
        assert!(
            matches!(run("nccl"), Err(ExperimentError::Usage(m)) if m.contains("local or mpi"))
        );
    }
}
