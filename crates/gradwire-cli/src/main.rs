//! `gradwire`: data-parallel training with every gradwire strategy
//! (`train`), several strategies side by side with plots (`compare`), and
//! the benchmarks (`bench`). Flags are parsed and results printed here; the
//! work is in the `gradwire_cli` library.

#![deny(missing_docs)]

use clap::{Args, Parser, Subcommand};
use gradwire_cli::bench::{self, Budget};
use gradwire_cli::compare;
use gradwire_cli::data::Digits;
use gradwire_cli::network::{self, MpiLaunch, Rate, ShapedNetwork};
use gradwire_cli::plot;
use gradwire_cli::project;
use gradwire_cli::train::{CheckpointPlan, RunReport, TARGET_ACCURACY, train};
use gradwire_cli::{CliError, ModelKind, OptimizerKind, ScheduleKind, Strategy, TrainConfig};
use indicatif::ProgressBar;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;

mod console;

use console::{Console, RunBar, bar_style, print_train_header};

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

/// The settings every training run shares.
#[derive(Args, Debug, Clone)]
struct Common {
    /// Workers (threads of the in-process backend).
    #[arg(long, short = 'w', default_value_t = TrainConfig::default().world)]
    world: usize,
    /// Passes over the training set.
    #[arg(long, default_value_t = TrainConfig::default().epochs)]
    epochs: usize,
    /// Samples per worker per step (the global batch is world x batch).
    #[arg(long, default_value_t = TrainConfig::default().batch)]
    batch: usize,
    /// The network: an MLP (--hidden) or a convolutional network
    /// (--channels), built with candle.
    #[arg(long, value_enum, default_value_t = ModelKind::Mlp)]
    model: ModelKind,
    /// MLP hidden layer widths, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "128")]
    hidden: Vec<usize>,
    /// CNN channels per 3x3 convolution (one to three), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16,32")]
    channels: Vec<usize>,
    /// Fraction sent by topk, sampled-topk and randomk, in (0, 1].
    #[arg(long, default_value_t = TrainConfig::default().ratio)]
    ratio: f64,
    /// Magnitude threshold of the threshold strategy.
    #[arg(long, default_value_t = TrainConfig::default().threshold)]
    threshold: f32,
    /// Drop what sparsification does not send instead of keeping it.
    #[arg(long)]
    no_error_feedback: bool,
    /// Clamp gradients to [-clip, clip] before fp16/bf16.
    #[arg(long)]
    clip: Option<f32>,
    /// Elements above which a fusion bucket is closed (small by default, so
    /// that the small model has several buckets; on a shaped network it is
    /// also the fastest measured: a large tensor is reduced in place, see
    /// README).
    #[arg(long, default_value_t = TrainConfig::default().fusion_threshold)]
    fusion_threshold: usize,
    /// Partial averaging: also average the optimizer's buffers.
    #[arg(long)]
    average_state: bool,
    /// The local optimizer.
    #[arg(long, value_enum, default_value_t = OptimizerKind::Sgd)]
    optimizer: OptimizerKind,
    /// Peak learning rate.
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    lr: f64,
    /// SGD momentum.
    #[arg(long, default_value_t = TrainConfig::default().momentum)]
    momentum: f64,
    /// Learning-rate schedule.
    #[arg(long, value_enum, default_value_t = ScheduleKind::Constant)]
    schedule: ScheduleKind,
    /// Seed of the initial weights and of random-k.
    #[arg(long, default_value_t = TrainConfig::default().seed)]
    seed: u64,
    /// Seed of the train/test split.
    #[arg(long, default_value_t = 42)]
    split_seed: u64,
    /// AdaSum: average within groups of this many ranks first, then AdaSum
    /// across groups (hierarchical, as on nodes of several GPUs).
    #[arg(long)]
    adasum_group: Option<usize>,
    /// DimReduce: dense epochs recording the trajectory (default: half).
    #[arg(long)]
    dimreduce_dense_epochs: Option<usize>,
    /// DimReduce: principal components.
    #[arg(long, default_value_t = TrainConfig::default().components)]
    components: usize,
    /// DimReduce: start from this PCA file instead of a dense stage.
    #[arg(long)]
    pca: Option<PathBuf>,
    /// PowerSGD: the rank of the approximation.
    #[arg(long, default_value_t = TrainConfig::default().powersgd_rank)]
    powersgd_rank: usize,
    /// PowerSGD: steps averaged dense before compression starts.
    #[arg(long, default_value_t = TrainConfig::default().powersgd_start_step)]
    powersgd_start_step: u64,
    /// 1-bit Adam: steps of plain Adam before the variance is frozen.
    #[arg(long, default_value_t = TrainConfig::default().freeze_step)]
    freeze_step: u64,
    /// Machine-readable JSON on stdout instead of tables.
    #[arg(long)]
    json: bool,
}

impl Common {
    fn config(&self, strategy: Strategy) -> TrainConfig {
        TrainConfig {
            strategy,
            world: self.world,
            epochs: self.epochs,
            batch: self.batch,
            model: self.model,
            hidden: self.hidden.clone(),
            channels: self.channels.clone(),
            ratio: self.ratio,
            threshold: self.threshold,
            error_feedback: !self.no_error_feedback,
            clip: self.clip,
            fusion_threshold: self.fusion_threshold,
            average_state: self.average_state,
            optimizer: self.optimizer,
            lr: self.lr,
            momentum: self.momentum,
            schedule: self.schedule,
            seed: self.seed,
            adasum_group: self.adasum_group,
            dimreduce_dense_epochs: self.dimreduce_dense_epochs,
            components: self.components,
            pca: self.pca.clone(),
            powersgd_rank: self.powersgd_rank,
            powersgd_start_step: self.powersgd_start_step,
            freeze_step: self.freeze_step,
        }
    }
}

#[derive(Args, Debug)]
struct TrainArgs {
    /// How workers combine their work.
    #[arg(long, short = 's', value_enum, default_value_t = Strategy::Dense)]
    strategy: Strategy,
    /// The communicator.
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    backend: Backend,
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
    /// Strategies as name[:ratio][:ef|:no-ef], comma-separated (default:
    /// dense, fp16, topk 1 % with and without error feedback, sampled-topk
    /// 0.1 %, partial, adasum-delta, dimreduce).
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
        /// Strategies as in compare (name[:ratio|rank][:ef|:no-ef]).
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(args) => run_train(args),
        Command::Compare(args) => run_compare(args),
        Command::Bench(command) => run_bench(command),
        Command::Faults(args) => run_faults(args),
        Command::Project(args) => project::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                CliError::Usage(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

fn run_train(args: TrainArgs) -> Result<(), CliError> {
    if let Some(rate) = &args.network.network {
        return over_network(rate, args.common.world, None);
    }
    let mut config = args.common.config(args.strategy);
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
            Some(train_nccl(&config, &data, &console, plan.as_ref())?)
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
) -> Result<Option<gradwire_cli::RunReport>, CliError> {
    use gradwire_comm::{Communicator, MpiComm};
    let comm = MpiComm::world()?;
    config.world = comm.world_size();
    config.validate()?;
    if comm.rank() == 0 {
        print_train_header(config, console.json);
    }
    gradwire_cli::train::train_rank(comm, config, data, console, plan)
}

#[cfg(not(feature = "mpi"))]
fn train_mpi(
    _: &mut TrainConfig,
    _: &Digits,
    _: &Console,
    _: Option<&CheckpointPlan>,
) -> Result<Option<gradwire_cli::RunReport>, CliError> {
    Err(mpi_missing())
}

#[cfg(feature = "nccl")]
fn train_nccl(
    config: &TrainConfig,
    data: &Digits,
    console: &Console,
    plan: Option<&CheckpointPlan>,
) -> Result<gradwire_cli::RunReport, CliError> {
    gradwire_cli::train::train_nccl(config, data, console, plan)
}

#[cfg(not(feature = "nccl"))]
fn train_nccl(
    _: &TrainConfig,
    _: &Digits,
    _: &Console,
    _: Option<&CheckpointPlan>,
) -> Result<gradwire_cli::RunReport, CliError> {
    Err(nccl_missing())
}

/// The error for `--backend nccl` in a build without NCCL support.
#[cfg(not(feature = "nccl"))]
fn nccl_missing() -> CliError {
    CliError::Usage(
        "this gradwire was built without NCCL: cargo build --release -p gradwire-cli --features nccl"
            .into(),
    )
}

/// The error for `--backend mpi` in a build without MPI.
#[cfg(not(feature = "mpi"))]
fn mpi_missing() -> CliError {
    CliError::Usage(
        "this gradwire was built without MPI: cargo build --release -p gradwire-cli --features mpi, \
         then run it under mpirun"
            .into(),
    )
}

fn run_faults(args: FaultsArgs) -> Result<(), CliError> {
    use gradwire_cli::faults;
    let deadline = std::time::Duration::from_secs(args.deadline);
    match args.backend {
        Backend::Local => {}
        Backend::Mpi => return faults_mpi(deadline),
        Backend::Nccl => {
            return Err(CliError::Usage(
                "faults runs on --backend local or mpi".into(),
            ));
        }
    }
    let reports = faults::run_local(args.world, deadline)?;
    println!("{}", faults::table(&reports, "local", args.world));
    let terminal = faults::run_local_terminal(args.world, deadline)?;
    println!("{}", faults::terminal_table(&terminal, "local", args.world));
    let total = reports.len() + terminal.len();
    let broken = reports.iter().filter(|r| !r.holds()).count()
        + terminal.iter().filter(|r| !r.holds()).count();
    if broken > 0 {
        return Err(CliError::Usage(format!(
            "{broken} of {total} scenarios break the failure model"
        )));
    }
    println!("all {total} scenarios keep the failure model");
    Ok(())
}

/// The fault matrix on `MpiComm::world()` under mpirun; rank 0 prints.
#[cfg(feature = "mpi")]
fn faults_mpi(deadline: std::time::Duration) -> Result<(), CliError> {
    use gradwire_cli::faults;
    use gradwire_comm::{Communicator, MpiComm, MpiConfig};
    let comm = MpiComm::world_with(&MpiConfig::with_timeout(Some(deadline)))?;
    let reports = faults::run_on(&comm)?;
    let broken = reports.iter().filter(|r| !r.holds()).count();
    if comm.rank() == 0 {
        println!("{}", faults::table(&reports, "mpi", comm.world_size()));
    }
    if broken > 0 {
        return Err(CliError::Usage(format!(
            "{broken} of {} scenarios break the failure model",
            reports.len()
        )));
    }
    if comm.rank() == 0 {
        println!("all {} scenarios keep the failure model", reports.len());
    }
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn faults_mpi(_: std::time::Duration) -> Result<(), CliError> {
    Err(mpi_missing())
}

fn run_compare(args: CompareArgs) -> Result<(), CliError> {
    if let Some(rate) = &args.network.network {
        return over_network(rate, args.common.world, Some(&args.out));
    }
    let entries = if args.strategies.is_empty() {
        compare::default_entries()
    } else {
        args.strategies
            .iter()
            .map(|s| compare::parse_entry(s))
            .collect::<Result<_, _>>()?
    };
    let base = args.common.config(Strategy::Dense);
    let configs = compare::configs(&base, &entries)?;
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
    let bars = |_: usize, config: &TrainConfig| -> Box<dyn gradwire_cli::train::Observer> {
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
            return Err(CliError::Usage(
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
        std::fs::write(&path, record.to_string()).map_err(|source| CliError::Io {
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
) -> Result<(), CliError> {
    let profile = project::profile_of(runs, calibration, bits)?;
    let predicted = project::predictions(&profile, runs);
    std::fs::create_dir_all(out).map_err(|source| CliError::Io {
        path: out.display().to_string(),
        source,
    })?;
    let path = out.join("profile.json");
    std::fs::write(&path, serde_json::to_string_pretty(&profile)?).map_err(|source| {
        CliError::Io {
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
    bars: impl Fn(usize, &TrainConfig) -> Box<dyn gradwire_cli::train::Observer + 'o>,
) -> Result<Option<Compared>, CliError> {
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
    _: impl Fn(usize, &TrainConfig) -> Box<dyn gradwire_cli::train::Observer + 'o>,
) -> Result<Option<Compared>, CliError> {
    Err(mpi_missing())
}

/// `--network RATE`: this command again, as `world` MPI ranks on a shaped
/// network made for the run and removed after it (`out` made absolute: the
/// ranks may start elsewhere).
fn over_network(rate: &str, world: usize, out: Option<&Path>) -> Result<(), CliError> {
    let rate = Rate::parse(rate)?;
    if cfg!(not(feature = "mpi")) {
        return Err(CliError::Usage(
            "--network starts MPI ranks: build with --features mpi".into(),
        ));
    }
    let program = std::env::current_exe().map_err(|source| CliError::Io {
        path: "(this program)".into(),
        source,
    })?;
    let mut args = Vec::new();
    let mut given = std::env::args_os().skip(1);
    while let Some(arg) = given.next() {
        let text = arg.to_string_lossy();
        if ["--network", "--backend", "--link-rate", "--out"].contains(&text.as_ref()) {
            given.next();
        } else if ["--network=", "--backend=", "--link-rate=", "--out="]
            .iter()
            .any(|p| text.starts_with(p))
        {
        } else {
            args.push(arg);
        }
    }
    args.extend(["--backend", "mpi", "--link-rate"].map(OsString::from));
    args.push(rate.bits_per_s.to_string().into());
    if let Some(out) = out {
        let out = std::path::absolute(out).map_err(|source| CliError::Io {
            path: out.display().to_string(),
            source,
        })?;
        args.push("--out".into());
        args.push(out.into_os_string());
    }
    let net = ShapedNetwork::create(world, rate)?;
    eprintln!(
        "shaped network: {world} ranks, one namespace each, linked to a bridge at {rate} each way (tc tbf); Open MPI over TCP"
    );
    network::run_under_mpi(
        &net,
        &MpiLaunch {
            program,
            args,
            env: Vec::new(),
        },
    )
}

fn run_bench(command: BenchCommand) -> Result<(), CliError> {
    let budget = |secs: f64| Budget {
        min_runs: 5,
        min_secs: secs,
    };
    match command {
        BenchCommand::Allreduce {
            sizes,
            world,
            backend,
            secs,
            json,
        } => {
            let sizes = parse_sizes(&sizes)?;
            let rows = match backend {
                Backend::Local => Some(bench::all_reduce(&sizes, &world, budget(secs))?),
                Backend::Mpi => bench_mpi(&sizes, budget(secs))?,
                Backend::Nccl => Some(bench_nccl(&sizes, &world, budget(secs))?),
            };
            // Under MPI only rank 0 prints.
            let Some(rows) = rows else {
                return Ok(());
            };
            bench::print_rows(json, &rows)
        }
        BenchCommand::Strategies {
            strategies,
            model,
            world,
            steps,
            json,
        } => {
            let entries = strategies
                .iter()
                .map(|e| compare::parse_entry(e))
                .collect::<Result<Vec<_>, _>>()?;
            let shapes = match model {
                ShapeModel::Resnet50 => bench::strategies::resnet50_shapes(),
                ShapeModel::Mlp => bench::strategies::mlp_shapes(&[128]),
            };
            let rows = bench::strategies::strategies(&entries, &shapes, world, 1, steps)?;
            bench::print_rows(json, &rows)
        }
        BenchCommand::Compress {
            codecs,
            sizes,
            secs,
            json,
        } => {
            let rows = bench::compress(&codecs, &parse_sizes(&sizes)?, budget(secs))?;
            bench::print_rows(json, &rows)
        }
    }
}

/// The all-reduce bench on this MPI process's world: rank 0's rows.
#[cfg(feature = "mpi")]
fn bench_mpi(
    sizes: &[usize],
    budget: Budget,
) -> Result<Option<Vec<bench::AllReduceRow>>, CliError> {
    use gradwire_comm::{Communicator, MpiComm};
    let comm = MpiComm::world()?;
    let rows = bench::all_reduce_on(&comm, "mpi", sizes, budget, |bytes| {
        bench::memcpy_secs(bytes, budget)
    })?;
    Ok((comm.rank() == 0).then_some(rows))
}

#[cfg(not(feature = "mpi"))]
fn bench_mpi(_: &[usize], _: Budget) -> Result<Option<Vec<bench::AllReduceRow>>, CliError> {
    Err(mpi_missing())
}

/// The all-reduce bench on NcclComm, one rank per GPU for each world size:
/// host buffers (each call copies to and from the device), labelled so.
#[cfg(feature = "nccl")]
fn bench_nccl(
    sizes: &[usize],
    worlds: &[usize],
    budget: Budget,
) -> Result<Vec<bench::AllReduceRow>, CliError> {
    use gradwire_comm::nccl::{self, NcclConfig};
    let memcpy: Vec<f64> = sizes
        .iter()
        .map(|&bytes| bench::memcpy_secs(bytes, budget))
        .collect::<Result<_, _>>()?;
    let memcpy_of = |bytes: usize| {
        let i = sizes.iter().position(|&b| b == bytes).unwrap_or(0);
        Ok(memcpy[i])
    };
    let mut rows = Vec::new();
    for &w in worlds {
        let devices: Vec<usize> = (0..w).collect();
        let results = nccl::run(&devices, NcclConfig::default(), |comm| {
            Ok(bench::all_reduce_on(
                &comm,
                "nccl (host buffers)",
                sizes,
                budget,
                memcpy_of,
            ))
        })?;
        for (rank, result) in results.into_iter().enumerate() {
            let ranks_rows = result??;
            if rank == 0 {
                rows.extend(ranks_rows);
            }
        }
    }
    Ok(rows)
}

#[cfg(not(feature = "nccl"))]
fn bench_nccl(_: &[usize], _: &[usize], _: Budget) -> Result<Vec<bench::AllReduceRow>, CliError> {
    Err(nccl_missing())
}

fn parse_sizes(sizes: &[String]) -> Result<Vec<usize>, CliError> {
    sizes.iter().map(|s| bench::parse_size(s)).collect()
}
