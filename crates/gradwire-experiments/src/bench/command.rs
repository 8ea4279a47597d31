//! `gradwire bench`'s subcommands and their flags ([`BenchCommand`]), and
//! what each measures and prints: all-reduce on LocalComm, MPI or NCCL,
//! the strategies' bytes per step, what DistOpt adds to an optimizer's
//! step, the codecs on the CPU and (feature `cuda`) on a GPU.

use super::distopt::{BenchDevice, distopt_steps};
use super::strategies::{ShapeModel, strategies};
use super::{AllReduceRow, Budget, all_reduce, compress, print_rows};
use crate::config::BackendKind;
use crate::error::{ExperimentError, Result};

/// `gradwire bench`'s subcommands, each with its flags.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
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
        #[arg(long, value_enum, default_value_t = BackendKind::Local)]
        backend: BackendKind,
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
        /// Gradient strategies as in `train -s`, comma-separated (DiLoCo's
        /// too: its mean over the measured steps; give whole rounds).
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
    /// What DataParallel costs a candle loop: an MLP (784-512-256-10)
    /// stepped by candle's SGD alone, then through DataParallel (dense) at
    /// W = 1 and on LocalComm at W = 2, in turns.
    Overhead {
        /// Samples per step (per worker).
        #[arg(long, default_value_t = 256)]
        batch: usize,
        /// Steps per round.
        #[arg(long, default_value_t = 20)]
        steps: usize,
        /// Rounds (each loop takes a turn per round; medians over them).
        #[arg(long, default_value_t = 7)]
        rounds: usize,
        /// JSON on stdout instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// What DistOpt adds to an optimizer's step on one device: every
    /// strategy's step (fresh gradients pushed in backward order, then
    /// `finish`, W = 1) in turns with the optimizer alone on the same
    /// gradients; on a GPU (features `cuda`, `nccl`), the counterpart of
    /// the GPU bundle's `torch_ddp_bench.py`.
    Distopt {
        /// Gradient strategies as in `train -s`, comma-separated (dense
        /// always runs, first).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "fp16,topk:0.01,powersgd:4"
        )]
        strategies: Vec<String>,
        /// The shapes: ResNet-50's (25.6 M parameters) or the digits MLP's.
        #[arg(long, value_enum, default_value_t = ShapeModel::Resnet50)]
        model: ShapeModel,
        /// Where the tensors live: host memory (LocalComm), or CUDA device
        /// 0 (NcclComm).
        #[arg(long, value_enum, default_value_t = BenchDevice::Cpu)]
        device: BenchDevice,
        /// Steps per round.
        #[arg(long, default_value_t = 10)]
        steps: usize,
        /// Measured rounds (each side takes a turn per round; medians over
        /// them), after one unmeasured round.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
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
            default_value = "f16,bf16,threshold,topk,sampled-topk,ef-topk,onebit,qsgd,qsgd4,e3m0,uint8,powersgd"
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

impl BenchCommand {
    /// Measures what the subcommand asks for and prints the rows (a table,
    /// or JSON); under MPI only rank 0 prints.
    pub fn run(self) -> Result<()> {
        let budget = |secs: f64| Budget {
            min_runs: 5,
            min_secs: secs,
        };
        match self {
            BenchCommand::Allreduce {
                sizes,
                world,
                backend,
                secs,
                json,
            } => {
                let sizes = parse_sizes(&sizes)?;
                let rows = match backend {
                    BackendKind::Local => Some(all_reduce(&sizes, &world, budget(secs))?),
                    BackendKind::Mpi => all_reduce_mpi(&sizes, budget(secs))?,
                    BackendKind::Nccl => Some(all_reduce_nccl(&sizes, &world, budget(secs))?),
                };
                // Under MPI only rank 0 prints.
                let Some(rows) = rows else {
                    return Ok(());
                };
                print_rows(json, &rows)
            }
            BenchCommand::Strategies {
                strategies: entries,
                model,
                world,
                steps,
                json,
            } => {
                let entries = parse_strategies(&entries)?;
                let rows = strategies(
                    &entries,
                    &model.shapes(),
                    &gradwire_algos::cost::Bucketing::default(),
                    world,
                    1,
                    steps,
                )?;
                print_rows(json, &rows)
            }
            BenchCommand::Distopt {
                strategies: entries,
                model,
                device,
                steps,
                rounds,
                json,
            } => {
                let entries = parse_strategies(&entries)?;
                let rows = distopt_steps(&entries, &model.shapes(), device, steps, rounds)?;
                print_rows(json, &rows)
            }
            BenchCommand::Overhead {
                batch,
                steps,
                rounds,
                json,
            } => print_rows(json, &super::overhead::overhead(batch, steps, rounds)?),
            BenchCommand::Compress {
                codecs,
                sizes,
                secs,
                json,
            } => {
                let rows = compress(&codecs, &parse_sizes(&sizes)?, budget(secs))?;
                print_rows(json, &rows)
            }
            BenchCommand::Kernels {
                codecs,
                sizes,
                secs,
                json,
            } => {
                let rows = kernels(&codecs, &parse_sizes(&sizes)?, budget(secs))?;
                print_rows(json, &rows)
            }
        }
    }
}

/// Every strategy of `--strategies`.
fn parse_strategies(entries: &[String]) -> Result<Vec<gradwire_optim::StrategyConfig>> {
    entries
        .iter()
        .map(|e| {
            e.parse()
                .map_err(|err| ExperimentError::Usage(format!("--strategies: {err}")))
        })
        .collect()
}

/// Every size of `--sizes` ([`parse_size`]).
fn parse_sizes(sizes: &[String]) -> Result<Vec<usize>> {
    sizes.iter().map(|s| parse_size(s)).collect()
}

/// Parses a size such as `4KiB`, `16MiB`, `1M` (elements or bytes alike:
/// K = 1000, KiB = 1024) or a plain number.
pub fn parse_size(text: &str) -> Result<usize> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let value: usize = digits
        .parse()
        .map_err(|_| ExperimentError::Usage(format!("{text:?} is not a size like 4KiB or 1M")))?;
    let factor: usize = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" => 1_000,
        "kib" | "ki" => 1 << 10,
        "m" => 1_000_000,
        "mib" | "mi" => 1 << 20,
        "g" => 1_000_000_000,
        "gib" | "gi" => 1 << 30,
        _ => {
            return Err(ExperimentError::Usage(format!(
                "{text:?}: unknown unit {unit:?}"
            )));
        }
    };
    value
        .checked_mul(factor)
        .ok_or_else(|| ExperimentError::Usage(format!("{text:?} is too large")))
}

#[cfg(feature = "cuda")]
use super::device::kernels;

#[cfg(not(feature = "cuda"))]
fn kernels(_: &[String], _: &[usize], _: Budget) -> Result<Vec<super::CompressRow>> {
    Err(ExperimentError::cuda_missing())
}

/// The all-reduce bench on this MPI process's world: rank 0's rows.
#[cfg(feature = "mpi")]
fn all_reduce_mpi(sizes: &[usize], budget: Budget) -> Result<Option<Vec<AllReduceRow>>> {
    use gradwire_comm::{Communicator, MpiComm};
    let comm = MpiComm::world()?;
    let rows = super::all_reduce_on(&comm, "mpi", sizes, budget, |bytes| {
        super::memcpy_secs(bytes, budget)
    })?;
    Ok((comm.rank() == 0).then_some(rows))
}

#[cfg(not(feature = "mpi"))]
fn all_reduce_mpi(_: &[usize], _: Budget) -> Result<Option<Vec<AllReduceRow>>> {
    Err(ExperimentError::mpi_missing())
}

/// The all-reduce bench on NcclComm, one rank per GPU for each world size:
/// host buffers (each call copies to and from the device), CUDA tensors,
/// and NCCL's own `ncclAllReduce` called directly, labelled so.
#[cfg(feature = "nccl")]
fn all_reduce_nccl(sizes: &[usize], worlds: &[usize], budget: Budget) -> Result<Vec<AllReduceRow>> {
    use gradwire_comm::nccl::{self, NcclConfig};
    let memcpy: Vec<f64> = sizes
        .iter()
        .map(|&bytes| super::memcpy_secs(bytes, budget))
        .collect::<Result<_>>()?;
    let memcpy_of = |bytes: usize| {
        let i = sizes.iter().position(|&b| b == bytes).unwrap_or(0);
        Ok(memcpy[i])
    };
    let mut rows = Vec::new();
    for &w in worlds {
        let devices: Vec<usize> = (0..w).collect();
        let results = nccl::run(&devices, NcclConfig::default(), |comm| {
            Ok(
                super::all_reduce_on(&comm, "nccl (host buffers)", sizes, budget, memcpy_of)
                    .and_then(|mut rows| {
                        rows.extend(super::device::nccl_device_rows(
                            &comm, sizes, budget, memcpy_of,
                        )?);
                        Ok(rows)
                    }),
            )
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
fn all_reduce_nccl(_: &[usize], _: &[usize], _: Budget) -> Result<Vec<AllReduceRow>> {
    Err(ExperimentError::nccl_missing())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend or a device this build lacks is a usage error that names
    /// the feature to build with.
    #[test]
    fn what_is_built_without_names_its_feature() {
        let all_reduce = |backend| BenchCommand::Allreduce {
            sizes: vec!["4KiB".into()],
            world: vec![2],
            backend,
            secs: 0.0,
            json: true,
        };
        let cases = [
            (cfg!(feature = "mpi"), "mpi", all_reduce(BackendKind::Mpi)),
            (
                cfg!(feature = "nccl"),
                "nccl",
                all_reduce(BackendKind::Nccl),
            ),
            (
                cfg!(feature = "cuda"),
                "cuda",
                BenchCommand::Kernels {
                    codecs: vec!["f16".into()],
                    sizes: vec!["4K".into()],
                    secs: 0.0,
                    json: true,
                },
            ),
        ];
        for (built, feature, command) in cases {
            if !built {
                assert!(command.run().is_err_and(|e| e.is_built_without(feature)));
            }
        }
    }

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("1M").unwrap(), 1_000_000);
        assert_eq!(parse_size("12").unwrap(), 12);
        for (bad, what) in [
            ("", "\"\" is not a size"),
            ("MiB", "\"MiB\" is not a size"),
            ("4XB", "unknown unit \"XB\""),
            ("99999999999999999999G", "is not a size"),
            ("17179869184GiB", "is too large"),
        ] {
            crate::error::assert_usage(parse_size(bad), what);
        }
    }
}
