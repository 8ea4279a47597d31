//! `gradwire train`'s flags ([`TrainArgs`]) and the run they ask for: one
//! strategy on LocalComm threads, MPI processes or NCCL ranks, or (with
//! `--network`) this command again as MPI ranks on a shaped network.

use super::{CheckpointPlan, Observer, RunReport, train};
use crate::config::{BackendKind, RunArgs, TrainConfig, parse_strategy};
use crate::data::Dataset;
use crate::error::{ExperimentError, Result};
use crate::network::{NetworkArgs, run_shaped};
use gradwire_optim::StrategyConfig;
use std::path::PathBuf;

/// `gradwire train`'s flags.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// How workers combine their work: a strategy of the registry
    /// (`topk:0.01:no-ef`, `powersgd:4`, ...) or baseline.
    #[arg(
        long,
        short = 's',
        default_value = "dense",
        value_parser = strategy_arg,
        long_help = strategy_help()
    )]
    pub strategy: (StrategyConfig, bool),
    /// The communicator.
    #[arg(long, value_enum, default_value_t = BackendKind::Local)]
    pub backend: BackendKind,
    /// With `--backend nccl`: reduce in rank order (NcclReduction::
    /// RankOrdered), so the run is bitwise the local and MPI runs, instead
    /// of NCCL's own collectives (faster, NCCL's rounding). The other
    /// backends always reduce in rank order.
    #[arg(long)]
    pub deterministic: bool,
    /// The run and how it is shown.
    #[command(flatten)]
    pub common: RunArgs,
    /// Save a checkpoint per worker into this directory after every epoch.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Continue from the checkpoints in --checkpoint (bitwise).
    #[arg(long, requires = "checkpoint")]
    pub resume: bool,
    /// `--network`.
    #[command(flatten)]
    pub network: NetworkArgs,
}

/// `-s`'s long help, from the registry's forms.
fn strategy_help() -> String {
    format!(
        "How workers combine their work: a strategy of the registry, \
         `name[:value][:key=value|:flag]...` (`:no-ef` drops what is not sent), \
         one of:\n{}\nor baseline (the gradients summed by the backend library's own \
         all-reduce), or baseline:fp16 / baseline:bf16 (the same in 16 bits: Horovod's fp16 \
         compression).",
        StrategyConfig::forms()
    )
}

/// `-s`'s parser: a registry strategy or `baseline` (clap reports the
/// error with the flag).
fn strategy_arg(text: &str) -> Result<(StrategyConfig, bool), String> {
    parse_strategy(text).map_err(|e| match e {
        ExperimentError::Usage(m) => m,
        other => other.to_string(),
    })
}

impl TrainArgs {
    /// How many ranks the run puts in this process: `--world` on
    /// `--backend local` without `--network`, none otherwise.
    pub fn in_process_ranks(&self) -> Option<usize> {
        self.network
            .in_process_ranks(self.backend, self.common.run.world)
    }

    /// Runs the training the flags ask for. With `--network`, this command
    /// again as MPI ranks on a shaped network (which report themselves:
    /// `None`); otherwise on `--backend`, `started` called with the checked
    /// configuration (under MPI, with MPI's world size) on the rank that
    /// reports, before the first epoch. Rank 0 returns the report, the
    /// other MPI ranks `None`.
    pub fn run(
        &self,
        observer: &dyn Observer,
        started: impl FnOnce(&TrainConfig),
    ) -> Result<Option<RunReport>> {
        if let Some(rate) = &self.network.network {
            return run_shaped(rate, self.common.run.world, None).map(|()| None);
        }
        let (strategy, baseline) = self.strategy;
        let mut config = TrainConfig {
            strategy,
            baseline,
            ..self.common.run.clone()
        };
        // The flags checked before the corpus is read (its errors would
        // hide theirs).
        config.validate()?;
        let data = Dataset::load(&config, self.common.split_seed)?;
        let plan = self.checkpoint.clone().map(|dir| CheckpointPlan {
            dir,
            resume: self.resume,
        });
        let plan = plan.as_ref();
        match self.backend {
            BackendKind::Local => {
                started(&config);
                train(&config, &data, observer, plan).map(Some)
            }
            BackendKind::Mpi => train_mpi(&mut config, &data, observer, plan, started),
            BackendKind::Nccl => {
                started(&config);
                train_nccl(&config, &data, observer, plan, self.deterministic).map(Some)
            }
        }
    }
}

/// This process's part of an MPI run: rank 0 returns the report.
#[cfg(feature = "mpi")]
fn train_mpi(
    config: &mut TrainConfig,
    data: &Dataset,
    observer: &dyn Observer,
    plan: Option<&CheckpointPlan>,
    started: impl FnOnce(&TrainConfig),
) -> Result<Option<RunReport>> {
    use gradwire_comm::{Communicator, MpiComm, MpiConfig};
    let comm = MpiComm::world_with(&MpiConfig {
        timeline: config.timeline.is_some(),
        ..MpiConfig::default()
    })?;
    config.world = comm.world_size();
    config.validate()?;
    if comm.rank() == 0 {
        started(config);
    }
    super::train_rank(comm, config, data, observer, plan)
}

#[cfg(not(feature = "mpi"))]
fn train_mpi(
    _: &mut TrainConfig,
    _: &Dataset,
    _: &dyn Observer,
    _: Option<&CheckpointPlan>,
    _: impl FnOnce(&TrainConfig),
) -> Result<Option<RunReport>> {
    Err(ExperimentError::mpi_missing())
}

#[cfg(feature = "nccl")]
use super::train_nccl;

#[cfg(not(feature = "nccl"))]
fn train_nccl(
    _: &TrainConfig,
    _: &Dataset,
    _: &dyn Observer,
    _: Option<&CheckpointPlan>,
    _: bool,
) -> Result<RunReport> {
    Err(ExperimentError::nccl_missing())
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
        args: TrainArgs,
    }

    /// Only `--backend local` without `--network` puts the ranks in this
    /// process.
    #[test]
    fn only_local_runs_put_their_ranks_in_this_process() {
        let ranks = |flags: &[&str]| {
            let line = ["train"].iter().chain(flags).copied();
            Flags::try_parse_from(line).unwrap().args.in_process_ranks()
        };
        assert_eq!(ranks(&["-w", "3"]), Some(3));
        assert_eq!(ranks(&[]), Some(TrainConfig::default().world));
        assert_eq!(ranks(&["-w", "3", "--backend", "mpi"]), None);
        assert_eq!(ranks(&["-w", "2", "--backend", "nccl"]), None);
        assert_eq!(ranks(&["-w", "2", "--network", "1gbit"]), None);
    }

    /// A backend this build lacks is a usage error that names the feature
    /// to build with, before any rank starts.
    #[test]
    fn a_backend_built_without_names_its_feature() {
        for (built, backend) in [
            (cfg!(feature = "mpi"), "mpi"),
            (cfg!(feature = "nccl"), "nccl"),
        ] {
            if built {
                continue;
            }
            let flags = ["train", "--backend", backend, "--epochs", "1", "-w", "2"];
            let args = Flags::try_parse_from(flags).unwrap().args;
            let result = args.run(&Silent, |_| {});
            assert!(
                result.is_err_and(|e| e.is_built_without(backend)),
                "{backend}"
            );
        }
    }
}
