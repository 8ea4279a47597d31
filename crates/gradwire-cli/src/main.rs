//! `gradwire`: data-parallel training with every gradwire strategy
//! (`train`), several strategies side by side with plots (`compare`), and
//! the benchmarks (`bench`). The commands are declared here, each with its
//! flags, which are the `gradwire_experiments` library's types (clap
//! derive, next to the code that runs them); `commands/` calls the library,
//! where the work is, and prints what it returns.

#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]
#![deny(unsafe_code)]

use clap::{Parser, Subcommand};
use gradwire_experiments::bench::BenchCommand;
use gradwire_experiments::compare::CompareArgs;
use gradwire_experiments::faults::FaultsArgs;
use gradwire_experiments::project::{self, ProjectArgs};
use gradwire_experiments::train::TrainArgs;
use gradwire_experiments::{COMPUTE_THREADS_VAR, ExperimentError, compute_threads_to_set};
use std::env;
use std::process::ExitCode;
use std::thread;

mod commands;
mod console;

/// mimalloc keeps freed memory for reuse: candle's backward allocates every
/// gradient afresh each step (a zeroed buffer per parameter, then the sum
/// into another), which glibc's allocator serves from fresh pages at large
/// sizes, so that a step of the 4.35 M-parameter MLP (W = 4, two cores) spent
/// 38 % of its time in page faults; with mimalloc the two epochs of
/// `gradwire train -w 4 --epochs 2 --hidden 2048,2048 -s diloco:16:uint8`
/// took 3.9 and 2.7 s instead of 4.7 and 5.0, the same bits.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    Project(ProjectArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    share_cores_among_ranks(&cli.command);
    let result = match cli.command {
        Command::Train(args) => commands::train::run(args),
        Command::Compare(args) => commands::compare::run(args),
        Command::Bench(command) => command.run(),
        Command::Faults(args) => args.run(),
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

/// Gives each in-process rank of a `train` or `compare` run its share of
/// the cores as candle's compute threads, unless the user chose
/// ([`gradwire_experiments::compute_threads_to_set`]); one rank gets every
/// core. Candle's pool reads the variable when it is first built, so this
/// runs first; its matrix products read it again each time.
/// Shaped-network ranks get theirs from the launcher's environment.
#[allow(unsafe_code)]
fn share_cores_among_ranks(command: &Command) {
    let ranks = match command {
        Command::Train(args) => args.in_process_ranks(),
        Command::Compare(args) => args.in_process_ranks(),
        _ => None,
    };
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    if let Some(threads) = compute_threads_to_set(ranks, cores, |name| env::var_os(name)) {
        // SAFETY: the process has one thread: main has only parsed its
        // arguments (clap starts none), so nothing reads the environment
        // while it changes.
        unsafe { env::set_var(COMPUTE_THREADS_VAR, threads) };
    }
}
