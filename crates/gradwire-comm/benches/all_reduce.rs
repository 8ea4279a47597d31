//! All-reduce of f32 buffers over LocalComm, beside a memcpy of the same size
//! measured in the same run.
//!
//! `cargo bench -p gradwire-comm` prints criterion's figures (time per
//! all-reduce, and algorithm bandwidth = bytes / time as its throughput), then
//! a summary table with the bus bandwidth as nccl-tests define it,
//! busbw = 2 (W - 1) / W x bytes / time, and its ratio to the memcpy
//! bandwidth (bytes copied / time, the buffer counted once).

use criterion::{BenchmarkId, Criterion, Throughput};
use gradwire_comm::{Communicator, LocalConfig, ReduceOp, local};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const SIZES: &[(usize, &str)] = &[
    (4 << 10, "4KiB"),
    (1 << 20, "1MiB"),
    (16 << 20, "16MiB"),
    (64 << 20, "64MiB"),
];
const WORLDS: &[usize] = &[2, 4];

/// Seconds per operation of the last (longest) measurement, by (bytes, world);
/// world 0 is the memcpy.
static BEST: Mutex<BTreeMap<(usize, usize), f64>> = Mutex::new(BTreeMap::new());

fn record(bytes: usize, world: usize, total: Duration, iters: u64) {
    let per_op = total.as_secs_f64() / iters.max(1) as f64;
    let mut best = BEST.lock().unwrap_or_else(|e| e.into_inner());
    let entry = best.entry((bytes, world)).or_insert(f64::INFINITY);
    *entry = entry.min(per_op);
}

/// `iters` all-reduces on `world` ranks, timed on rank 0 between two barriers.
fn time_all_reduce(bytes: usize, world: usize, iters: u64) -> Duration {
    let elems = bytes / 4;
    let config = LocalConfig::with_timeout(None);
    let times = local::run_with(world, &config, |comm| {
        // Zeros stay zeros under Sum, so no value drifts to inf over the run;
        // adding zeros costs what adding anything else costs.
        let mut buf = vec![0f32; elems];
        comm.all_reduce(&mut buf, ReduceOp::Sum)?; // touch pages, warm caches
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..iters {
            comm.all_reduce(black_box(&mut buf), ReduceOp::Sum)?;
        }
        comm.barrier()?;
        Ok::<_, gradwire_comm::CommError>(start.elapsed())
    })
    .expect("spawn ranks");
    let elapsed = times
        .into_iter()
        .next()
        .expect("rank 0")
        .expect("no panic")
        .expect("all_reduce");
    record(bytes, world, elapsed, iters);
    elapsed
}

fn time_memcpy(bytes: usize, iters: u64) -> Duration {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src);
    let start = Instant::now();
    for _ in 0..iters {
        black_box(&mut dst).copy_from_slice(black_box(&src));
    }
    let elapsed = start.elapsed();
    record(bytes, 0, elapsed, iters);
    elapsed
}

fn bench(c: &mut Criterion) {
    for &(bytes, name) in SIZES {
        let mut group = c.benchmark_group(format!("all_reduce_f32/{name}"));
        group.throughput(Throughput::Bytes(bytes as u64));
        if bytes >= 16 << 20 {
            group
                .sample_size(10)
                .measurement_time(Duration::from_secs(4));
        }
        group.bench_function("memcpy", |b| {
            b.iter_custom(|iters| time_memcpy(bytes, iters))
        });
        for &world in WORLDS {
            group.bench_with_input(
                BenchmarkId::new("local", format!("W{world}")),
                &world,
                |b, &w| b.iter_custom(|iters| time_all_reduce(bytes, w, iters)),
            );
        }
        group.finish();
    }
}

fn summary() {
    let best = BEST.lock().unwrap_or_else(|e| e.into_inner());
    println!("\nall-reduce of f32 over LocalComm ({} cores)", num_cores());
    println!(
        "{:>7} {:>3} {:>12} {:>12} {:>12} {:>12} {:>9}",
        "size", "W", "latency", "algbw GB/s", "busbw GB/s", "memcpy GB/s", "bus/mcpy"
    );
    for &(bytes, name) in SIZES {
        let Some(&memcpy) = best.get(&(bytes, 0)) else {
            continue;
        };
        let memcpy_bw = bytes as f64 / memcpy / 1e9;
        for &world in WORLDS {
            let Some(&t) = best.get(&(bytes, world)) else {
                continue;
            };
            let algbw = bytes as f64 / t / 1e9;
            let busbw = algbw * 2.0 * (world as f64 - 1.0) / world as f64;
            println!(
                "{name:>7} {world:>3} {:>10.1}us {algbw:>12.2} {busbw:>12.2} {memcpy_bw:>12.2} {:>8.0}%",
                t * 1e6,
                100.0 * busbw / memcpy_bw
            );
        }
    }
}

fn num_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
    summary();
}
