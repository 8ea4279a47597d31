//! `gradwire bench`: all-reduce (LocalComm, MPI, NCCL), the strategies'
//! bytes per step, and the codecs (on the CPU, and on a GPU with the `cuda`
//! feature), each beside a memcpy of the same bytes.

use crate::{Backend, BenchCommand, ShapeModel};
use gradwire_experiments::ExperimentError;
use gradwire_experiments::bench::{self, Budget};

/// Runs one `gradwire bench` subcommand.
pub(crate) fn run(command: BenchCommand) -> Result<(), ExperimentError> {
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
                .map(|e| {
                    e.parse()
                        .map_err(|err| ExperimentError::Usage(format!("--strategies: {err}")))
                })
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
        BenchCommand::Kernels {
            codecs,
            sizes,
            secs,
            json,
        } => {
            let rows = bench_kernels(&codecs, &parse_sizes(&sizes)?, budget(secs))?;
            bench::print_rows(json, &rows)
        }
    }
}

/// The device codecs on CUDA device 0.
#[cfg(feature = "cuda")]
fn bench_kernels(
    codecs: &[String],
    sizes: &[usize],
    budget: Budget,
) -> Result<Vec<bench::CompressRow>, ExperimentError> {
    bench::device::kernels(codecs, sizes, budget)
}

#[cfg(not(feature = "cuda"))]
fn bench_kernels(
    _: &[String],
    _: &[usize],
    _: Budget,
) -> Result<Vec<bench::CompressRow>, ExperimentError> {
    Err(super::cuda_missing())
}

/// The all-reduce bench on this MPI process's world: rank 0's rows.
#[cfg(feature = "mpi")]
fn bench_mpi(
    sizes: &[usize],
    budget: Budget,
) -> Result<Option<Vec<bench::AllReduceRow>>, ExperimentError> {
    use gradwire_comm::{Communicator, MpiComm};
    let comm = MpiComm::world()?;
    let rows = bench::all_reduce_on(&comm, "mpi", sizes, budget, |bytes| {
        bench::memcpy_secs(bytes, budget)
    })?;
    Ok((comm.rank() == 0).then_some(rows))
}

#[cfg(not(feature = "mpi"))]
fn bench_mpi(_: &[usize], _: Budget) -> Result<Option<Vec<bench::AllReduceRow>>, ExperimentError> {
    Err(super::mpi_missing())
}

/// The all-reduce bench on NcclComm, one rank per GPU for each world size:
/// host buffers (each call copies to and from the device), CUDA tensors,
/// and NCCL's own `ncclAllReduce` called directly, labelled so.
#[cfg(feature = "nccl")]
fn bench_nccl(
    sizes: &[usize],
    worlds: &[usize],
    budget: Budget,
) -> Result<Vec<bench::AllReduceRow>, ExperimentError> {
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
            Ok(
                bench::all_reduce_on(&comm, "nccl (host buffers)", sizes, budget, memcpy_of)
                    .and_then(|mut rows| {
                        rows.extend(bench::device::nccl_device_rows(
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
fn bench_nccl(
    _: &[usize],
    _: &[usize],
    _: Budget,
) -> Result<Vec<bench::AllReduceRow>, ExperimentError> {
    Err(super::nccl_missing())
}

fn parse_sizes(sizes: &[String]) -> Result<Vec<usize>, ExperimentError> {
    sizes.iter().map(|s| bench::parse_size(s)).collect()
}
