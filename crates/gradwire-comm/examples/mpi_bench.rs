//! All-reduce of f32 buffers over MpiComm beside rsmpi's raw
//! `all_reduce_into` (`MPI_Allreduce` with `MPI_SUM`), in the same run, on the
//! same processes: latency, bandwidth, and what the wrapper costs.
//!
//! ```sh
//! cargo build --release -p gradwire-comm --features mpi --example mpi_bench
//! mpirun --oversubscribe -np 2 target/release/examples/mpi_bench [rounds]
//! ```
//!
//! For each size the two are measured alternately, `rounds` times (default
//! 7), each time for about 0.3 s of back-to-back calls between two barriers;
//! the median per-call time of each is reported, with the algorithm bandwidth
//! (bytes / time), the bus bandwidth as nccl-tests define it
//! (2 (W - 1) / W x bytes / time) and the wrapper's overhead over the raw call.
//! The wrapper does more than `MPI_Allreduce`: a header exchange (a 72-byte
//! all-gather) and a rank-ordered reduction by gradwire, which makes the
//! result bitwise reproducible; the overhead column shows its price.

use gradwire_comm::{CommError, Communicator, MpiComm, ReduceOp};
use mpi::collective::SystemOperation;
use mpi::traits::*;
use std::hint::black_box;
use std::time::Instant;

const SIZES: &[(usize, &str)] = &[
    (4 << 10, "4KiB"),
    (64 << 10, "64KiB"),
    (1 << 20, "1MiB"),
    (4 << 20, "4MiB"),
    (16 << 20, "16MiB"),
];

/// Seconds per call of `iters` calls of `f`, timed on this rank between two
/// barriers (so every rank's calls are inside the window).
fn time(
    comm: &MpiComm,
    iters: usize,
    mut f: impl FnMut() -> Result<(), CommError>,
) -> Result<f64, CommError> {
    comm.barrier()?;
    let start = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    comm.barrier()?;
    Ok(start.elapsed().as_secs_f64() / iters as f64)
}

/// The same iteration count on every rank: rank 0's estimate, broadcast.
fn iterations(comm: &MpiComm, per_call: f64) -> Result<usize, CommError> {
    let mut iters = [((0.3 / per_call.max(1e-7)) as u64).clamp(3, 100_000)];
    comm.broadcast(&mut iters, 0)?;
    Ok(usize::try_from(iters[0]).unwrap_or(3))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> Result<(), CommError> {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(7)
        .max(1);
    let comm = MpiComm::world()?;
    let raw = mpi::topology::SimpleCommunicator::world();
    let (rank, w) = (comm.rank(), comm.world_size());
    if rank == 0 {
        println!(
            "all-reduce (sum) of f32 over MPI, {w} process(es), {} core(s), median of {rounds} rounds",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
        println!(
            "{:>7} {:>13} {:>13} {:>11} {:>11} {:>9}",
            "size", "MpiComm", "raw MPI", "algbw GB/s", "busbw GB/s", "overhead"
        );
    }
    for &(bytes, name) in SIZES {
        let n = bytes / 4;
        // Zeros stay zeros under Sum: nothing drifts to inf over the run,
        // and adding zeros costs what adding anything else costs.
        let mut buf = vec![0f32; n];
        let send = vec![0f32; n];
        let mut recv = vec![0f32; n];
        // Warm up both (pages touched, scratch grown, connections made).
        let warm = time(&comm, 3, || {
            comm.all_reduce(black_box(&mut buf), ReduceOp::Sum)
        })?;
        time(&comm, 3, || {
            raw.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
            Ok(())
        })?;
        let iters = iterations(&comm, warm)?;
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            ours.push(time(&comm, iters, || {
                comm.all_reduce(black_box(&mut buf), ReduceOp::Sum)
            })?);
            theirs.push(time(&comm, iters, || {
                raw.all_reduce_into(black_box(&send[..]), &mut recv[..], SystemOperation::sum());
                Ok(())
            })?);
        }
        let (ours, theirs) = (median(ours), median(theirs));
        if rank == 0 {
            let algbw = bytes as f64 / ours / 1e9;
            let busbw = algbw * 2.0 * (w as f64 - 1.0) / w as f64;
            println!(
                "{name:>7} {:>11.1}us {:>11.1}us {algbw:>11.2} {busbw:>11.2} {:>+8.1}%",
                ours * 1e6,
                theirs * 1e6,
                100.0 * (ours / theirs - 1.0)
            );
        }
    }
    Ok(())
}
