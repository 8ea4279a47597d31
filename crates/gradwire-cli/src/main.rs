//! `gradwire`: data-parallel training with every gradwire strategy
//! (`train`), several strategies side by side with plots (`compare`), and
//! the benchmarks (`bench`). Flags are parsed here; `commands/` calls the
//! `gradwire_experiments` library, where the work is, and prints what it returns.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use clap::{Args, Parser, Subcommand};
use gradwire_experiments::project;
use gradwire_experiments::{ExperimentError, TrainConfig};
use gradwire_optim::StrategyConfig;
use std::path::PathBuf;
use std::process::ExitCode;

mod commands;
mod console;

#[derive(Parser, Debug)]
#[command(
    name = "gradwire",
    version,
    about = "Communication-efficient data-parallel training: train, compare strategies, benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train the digits MLP data-parallel with one strategy.
    Train(TrainArgs),
    /// Train with several strategies on the same seed and split; print one
    /// table and write plots.
    Compare(CompareArgs),
    /// Measure all-reduce or compression throughput against memcpy.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Inject faults into DistOpt (a NaN, a bad call, an optimizer error, a
    /// panic, a dropped communicator on one rank) in every mode and print
    /// whether every rank saw the same outcome and the run went on (the
    /// failure model).
    Faults(FaultsArgs),
    /// Project seconds per step and speedups to clusters this machine does
    /// not have (ResNet-50, BERT-Large; 8 to 1024 workers; 10 to 100
    /// Gbit/s) with the alpha-beta cost model, optionally fed by a shaped
    /// run's profile.json.
    Project(project::ProjectArgs),
}

/// `gradwire faults`'s flags.
#[derive(Args, Debug, Clone)]
struct FaultsArgs {
    /// Ranks (threads of the in-process backend).
    #[arg(long, short = 'w', default_value_t = 4)]
    world: usize,
    /// The communicator's deadline, in seconds.
    #[arg(long, default_value_t = 60)]
    deadline: u64,
    /// Where the ranks run: `local` threads (`--world` of them), or `mpi`
    /// processes under `mpirun` (build with `--features mpi`; rank 0
    /// prints; the terminal faults, which end a process, run on `local`
    /// only).
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    backend: Backend,
}

/// Which communicator the workers use.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// Threads of this process (`--world` of them).
    Local,
    /// One rank per MPI process: run under `mpirun -np W` (build with
    /// `--features mpi`); `--world` is taken from MPI.
    Mpi,
    /// One rank per GPU over NCCL, threads of this process on devices 0 to
    /// W-1 (build with `--features nccl`; needs W GPUs and NCCL).
    Nccl,
}

/// The settings every training run shares: the run's (the library's
/// [`TrainConfig`], whose fields are the flags) and how it is shown.
#[derive(Args, Debug, Clone)]
struct Common {
    #[command(flatten)]
    run: TrainConfig,
    /// Seed of the train/test split.
    #[arg(long, default_value_t = 42)]
    split_seed: u64,
    /// Machine-readable JSON on stdout instead of tables.
    #[arg(long)]
    json: bool,
}

/// `-s`'s long help, from the registry's forms.
fn strategy_help() -> String {
    format!(
        "How workers combine their work: a strategy of the registry, \
         `name[:value][:key=value|:flag]...` (`:no-ef` drops what is not sent), \
         one of:\n{}\nor baseline (the gradients summed by the backend library's own \
         all-reduce).",
        StrategyConfig::forms()
    )
}

/// `-s`'s parser: a registry strategy or `baseline` (clap reports the
/// error with the flag).
fn strategy_arg(text: &str) -> Result<(StrategyConfig, bool), String> {
    gradwire_experiments::parse_strategy(text).map_err(|e| match e {
        ExperimentError::Usage(m) => m,
        other => other.to_string(),
    })
}

#[derive(Args, Debug)]
struct TrainArgs {
    /// How workers combine their work: a strategy of the registry
    /// (`topk:0.01:no-ef`, `powersgd:4`, ...) or baseline.
    #[arg(
        long,
        short = 's',
        default_value = "dense",
        value_parser = strategy_arg,
        long_help = strategy_help()
    )]
    strategy: (StrategyConfig, bool),
    /// The communicator.
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    backend: Backend,
    /// With `--backend nccl`: reduce in rank order (NcclReduction::
    /// RankOrdered), so the run is bitwise the local and MPI runs, instead
    /// of NCCL's own collectives (faster, NCCL's rounding). The other
    /// backends always reduce in rank order.
    #[arg(long)]
    deterministic: bool,
    #[command(flatten)]
    common: Common,
    /// Save a checkpoint per worker into this directory after every epoch.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Continue from the checkpoints in --checkpoint (bitwise).
    #[arg(long, requires = "checkpoint")]
    resume: bool,
    #[command(flatten)]
    network: NetworkArgs,
}

/// `--network`: the run's ranks as MPI processes on a shaped network.
#[derive(Args, Debug)]
struct NetworkArgs {
    /// Run the --world ranks as MPI processes (Open MPI over TCP only), one
    /// per network namespace, each linked to a bridge at this rate in both
    /// directions (tc tbf): 100mbit to 100gbit. Needs root, iproute2, Open
    /// MPI and a build with --features mpi; the namespaces are removed on
    /// every exit.
    #[arg(long, value_name = "RATE")]
    network: Option<String>,
    /// Set by --network for the ranks it starts: the links' rate, bit/s.
    #[arg(long, hide = true)]
    link_rate: Option<u64>,
}

#[derive(Args, Debug)]
struct CompareArgs {
    /// Strategies as in `train -s` (e.g. topk:0.01:no-ef, powersgd:4,
    /// baseline), comma-separated (default: dense, fp16, topk 1 % with and
    /// without error feedback, sampled-topk 0.1 %, powersgd rank 2, onebit,
    /// uint8, partial, adasum-delta, dimreduce).
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    #[command(flatten)]
    common: Common,
    /// Directory for the plots (and, on a shaped network, the profile that
    /// `gradwire project --profile` reads).
    #[arg(long, default_value = "target/gradwire-compare")]
    out: PathBuf,
    /// Where the ranks run: `local` threads, or `mpi` processes under
    /// mpirun (rank 0 reports; build with --features mpi).
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    backend: Backend,
    #[command(flatten)]
    network: NetworkArgs,
}

/// The parameter shapes of `bench strategies`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ShapeModel {
    /// torchvision's ResNet-50 (161 tensors, 25.6 M parameters).
    Resnet50,
    /// The digits MLP (one hidden layer of 128).
    Mlp,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// All-reduce of f32 buffers: latency, algorithm and bus bandwidth.
    Allreduce {
        /// Buffer sizes in bytes (4KiB, 1MiB, ...).
        #[arg(long, value_delimiter = ',', default_value = "4KiB,1MiB,16MiB")]
        sizes: Vec<String>,
        /// World sizes.
        #[arg(long, short = 'w', value_delimiter = ',', default_value = "2,4")]
        world: Vec<usize>,
        /// The communicator (with mpi, run under mpirun; --world is MPI's;
        /// with nccl, one rank per GPU).
        #[arg(long, value_enum, default_value_t = Backend::Local)]
        backend: Backend,
        /// Seconds of timing per measurement, at least.
        #[arg(long, default_value_t = 0.5)]
        secs: f64,
        /// JSON on stdout instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Every gradient strategy's bytes per step on a model's parameter
    /// shapes, beside dense f32 (and the time of a step of W in-process
    /// ranks on this machine).
    Strategies {
        /// Gradient strategies as in `train -s`, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "fp16,topk:0.01,sampled-topk:0.001,randomk:0.01,powersgd:1,powersgd:4,onebit,qsgd,uint8,adasum-grad"
        )]
        strategies: Vec<String>,
        /// The shapes: ResNet-50's (25.6 M parameters) or the digits MLP's.
        #[arg(long, value_enum, default_value_t = ShapeModel::Resnet50)]
        model: ShapeModel,
        /// Ranks (threads of this process).
        #[arg(long, short = 'w', default_value_t = 4)]
        world: usize,
        /// Measured steps per strategy (after one unmeasured step).
        #[arg(long, default_value_t = 2)]
        steps: usize,
        /// JSON on stdout instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Casts and sparsifiers: throughput against memcpy.
    Compress {
        /// Codecs, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "f16,bf16,threshold,topk,sampled-topk,randomk,ef-topk"
        )]
        codecs: Vec<String>,
        /// Elements per call (1M, 16M, ...).
        #[arg(long, value_delimiter = ',', default_value = "1M,16M")]
        sizes: Vec<String>,
        /// Seconds of timing per measurement, at least.
        #[arg(long, default_value_t = 0.5)]
        secs: f64,
        /// JSON on stdout instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The device codecs on CUDA device 0 (feature `cuda`): throughput
    /// against a device-to-device copy of the same bytes.
    Kernels {
        /// Codecs, comma-separated (f16 and bf16 are an encode).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "f16,bf16,threshold,topk,sampled-topk,ef-topk,onebit,qsgd,uint8,powersgd"
        )]
        codecs: Vec<String>,
        /// Elements per call (1M, 16M, ...).
        #[arg(long, value_delimiter = ',', default_value = "1M,16M,64M")]
        sizes: Vec<String>,
        /// Seconds of timing per measurement, at least.
        #[arg(long, default_value_t = 0.5)]
        secs: f64,
        /// JSON on stdout instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(args) => commands::train::run(args),
        Command::Compare(args) => commands::compare::run(args),
        Command::Bench(command) => commands::bench::run(command),
        Command::Faults(args) => commands::faults::run(args),
        Command::Project(args) => project::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                ExperimentError::Usage(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}
