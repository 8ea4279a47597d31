//! `gradwire bench`: all-reduce and compression throughput, each beside a
//! memcpy of the same bytes measured in the same run, so that the figures
//! are ratios that mean something on any machine; and every strategy's
//! bytes per step on a model's shapes beside dense ([`strategies`]); a
//! candle loop's step through DataParallel beside candle alone
//! ([`overhead`]); with
//! the `cuda` feature, the device codecs beside a device-to-device copy
//! (`device`). `gradwire bench`'s subcommands and their flags:
//! [`BenchCommand`].
//!
//! Every figure is the median of repeated timings (at least `min_runs`, and
//! until `min_secs` have passed; for a collective, the median of `min_runs`
//! batches of back-to-back runs whose length rank 0 calibrates), after one
//! warm-up run that touches the pages. All-reduce reports the bus bandwidth as nccl-tests define it,
//! `busbw = 2 (W - 1) / W x bytes / time`; the memcpy bandwidth counts the
//! buffer once.

mod command;
#[cfg(feature = "cuda")]
pub mod device;
pub mod distopt;
pub mod overhead;
pub mod strategies;

pub use command::{BenchCommand, parse_size};

use crate::error::{ExperimentError, Result};
use gradwire_comm::{Communicator, LocalConfig, ReduceOp, local};
use gradwire_compress::cast::{self, CastOptions};
use gradwire_compress::{ErrorFeedback, Quantizer, SparseCodec, lowrank, select};
use gradwire_tensor::{WithDType, bf16, f16};
use serde::Serialize;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// How long and how often to measure.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Timed runs at least.
    pub min_runs: usize,
    /// Seconds of timed runs at least.
    pub min_secs: f64,
}

/// The longest measurement a budget may ask for, in seconds (`--secs`).
pub const MAX_BUDGET_SECS: f64 = 3600.0;

/// The most f32 elements a bench buffer may hold (`--sizes`): 4 GiB.
pub const MAX_ELEMENTS: usize = 1 << 30;

impl Budget {
    /// Checks the budget: `min_secs` a number of seconds from 0 to
    /// [`MAX_BUDGET_SECS`] (NaN or infinity would never end a measurement).
    pub fn check(&self) -> Result<()> {
        if (0.0..=MAX_BUDGET_SECS).contains(&self.min_secs) {
            Ok(())
        } else {
            Err(ExperimentError::Usage(format!(
                "--secs must be between 0 and {MAX_BUDGET_SECS}, got {}",
                self.min_secs
            )))
        }
    }
}

/// Checks element counts: each from 1 to [`MAX_ELEMENTS`].
pub(crate) fn check_elements(elements: impl IntoIterator<Item = usize>) -> Result<()> {
    match elements.into_iter().find(|&n| n == 0 || n > MAX_ELEMENTS) {
        Some(n) => Err(ExperimentError::Usage(format!(
            "--sizes must be from 1 to {MAX_ELEMENTS} elements, got {n}"
        ))),
        None => Ok(()),
    }
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            min_runs: 5,
            min_secs: 0.3,
        }
    }
}

/// Rank 0's result out of a run's per-rank results (`local::run` and
/// `nccl::run` give them in rank order).
pub(crate) fn rank_zero<T>(per_rank: Vec<T>) -> Result<T> {
    per_rank
        .into_iter()
        .next()
        .ok_or_else(|| ExperimentError::Usage("no rank ran".into()))
}

/// The median of `f`'s durations under `budget`, after one warm-up.
pub(crate) fn median_time(budget: Budget, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::new();
    let started = Instant::now();
    while times.len() < budget.min_runs.max(1)
        || started.elapsed() < Duration::from_secs_f64(budget.min_secs)
    {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64());
        if times.len() >= 10_000 {
            break;
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// A collective's seconds per run on every rank of `comm`, the median over
/// `min_runs` batches of back-to-back runs (as nccl-tests time them: a
/// barrier per run would measure thread wake-ups, not the collective). The
/// ranks must run it the same number of times, so rank 0 calibrates the batch
/// length (about `min_secs / min_runs`) and broadcasts it.
pub(crate) fn time_collective<C: Communicator>(
    comm: &C,
    budget: Budget,
    mut collective: impl FnMut() -> Result<()>,
) -> Result<f64> {
    collective()?; // warm-up: touch the pages
    comm.barrier()?;
    let calibration = Instant::now();
    for _ in 0..3 {
        collective()?;
    }
    let each = calibration.elapsed().as_secs_f64() / 3.0;
    let batches = budget.min_runs.max(1);
    let per_batch = budget.min_secs / batches as f64;
    let mut count = [((per_batch / each.max(1e-9)).ceil() as u64).clamp(1, 100_000)];
    comm.broadcast(&mut count, 0)?;
    let mut means = Vec::with_capacity(batches);
    for _ in 0..batches {
        comm.barrier()?;
        let t = Instant::now();
        for _ in 0..count[0] {
            collective()?;
        }
        means.push(t.elapsed().as_secs_f64() / count[0] as f64);
    }
    means.sort_by(f64::total_cmp);
    Ok(means[means.len() / 2])
}

/// Seconds to copy `bytes` once (single thread, `copy_from_slice`).
pub fn memcpy_secs(bytes: usize, budget: Budget) -> Result<f64> {
    budget.check()?;
    check_elements([bytes.div_ceil(4).max(1)])?;
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    median_time(budget, || {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
        Ok(())
    })
}

/// One all-reduce measurement.
#[derive(Debug, Clone, Serialize)]
pub struct AllReduceRow {
    /// The backend.
    pub backend: String,
    /// Ranks.
    pub world: usize,
    /// Bytes of f32 per rank.
    pub bytes: usize,
    /// Median seconds per all-reduce.
    pub secs: f64,
    /// bytes / time, GB/s.
    pub algbw_gbs: f64,
    /// 2 (W - 1) / W x algbw, GB/s.
    pub busbw_gbs: f64,
    /// memcpy of the same bytes, GB/s.
    pub memcpy_gbs: f64,
    /// busbw / memcpy.
    pub ratio: f64,
}

/// All-reduce (f32 sum) over LocalComm for each world size and size.
pub fn all_reduce(sizes: &[usize], worlds: &[usize], budget: Budget) -> Result<Vec<AllReduceRow>> {
    budget.check()?;
    check_sizes(sizes)?;
    for &world in worlds {
        crate::config::check_local_world("--world", world)?;
    }
    // memcpy first, alone: rank threads waiting in a collective would share
    // the cores with it.
    let memcpy: Vec<f64> = sizes
        .iter()
        .map(|&bytes| memcpy_secs(bytes, budget))
        .collect::<Result<_>>()?;
    let memcpy_of = |bytes: usize| {
        let i = sizes.iter().position(|&b| b == bytes).unwrap_or(0);
        Ok(memcpy[i])
    };
    let mut rows = Vec::new();
    for &world in worlds {
        let config = LocalConfig::with_timeout(None);
        let per_rank = local::run_with(world, &config, |comm| {
            all_reduce_on(&comm, "local", sizes, budget, memcpy_of)
        })?;
        rows.extend(rank_zero(per_rank)???);
    }
    // By size, then world, as the table reads best.
    rows.sort_by_key(|r| (r.bytes, r.world));
    Ok(rows)
}

fn check_sizes(sizes: &[usize]) -> Result<()> {
    match sizes.iter().find(|&&b| b % 4 != 0) {
        Some(bytes) => Err(ExperimentError::Usage(format!(
            "all-reduce sizes are f32 buffers: {bytes} bytes is not a multiple of 4"
        ))),
        None => check_elements(sizes.iter().map(|b| b / 4)),
    }
}

/// All-reduce (f32 sum) of each size on `comm`, every rank calling it
/// (collective); every rank returns the rows, with rank 0's timings and the
/// memcpy seconds `memcpy(bytes)` gives on rank 0 (called before the size's
/// collectives). `backend` names the communicator in the rows.
pub fn all_reduce_on<C: Communicator>(
    comm: &C,
    backend: &str,
    sizes: &[usize],
    budget: Budget,
    memcpy: impl Fn(usize) -> Result<f64>,
) -> Result<Vec<AllReduceRow>> {
    budget.check()?;
    check_sizes(sizes)?;
    let world = comm.world_size();
    let mut rows = Vec::new();
    for &bytes in sizes {
        let mut memcpy = [if comm.rank() == 0 {
            memcpy(bytes)?
        } else {
            0.0
        }];
        // Zeros stay zeros under Sum: nothing drifts to inf.
        let mut buf = vec![0f32; bytes / 4];
        let mut secs = [time_collective(comm, budget, || {
            comm.all_reduce(black_box(&mut buf), ReduceOp::Sum)?;
            Ok(())
        })?];
        // Every rank reports rank 0's figures.
        comm.broadcast(&mut secs, 0)?;
        comm.broadcast(&mut memcpy, 0)?;
        rows.push(AllReduceRow::new(backend, world, bytes, secs[0], memcpy[0]));
    }
    Ok(rows)
}

impl AllReduceRow {
    /// The row of an all-reduce of `bytes` per rank on `world` ranks taking
    /// `secs`, beside a copy of the same bytes taking `memcpy_secs`.
    pub(crate) fn new(
        backend: &str,
        world: usize,
        bytes: usize,
        secs: f64,
        memcpy_secs: f64,
    ) -> AllReduceRow {
        let algbw = bytes as f64 / secs / 1e9;
        let busbw = algbw * 2.0 * (world as f64 - 1.0) / world as f64;
        let memcpy_gbs = bytes as f64 / memcpy_secs / 1e9;
        AllReduceRow {
            backend: backend.into(),
            world,
            bytes,
            secs,
            algbw_gbs: algbw,
            busbw_gbs: busbw,
            memcpy_gbs,
            ratio: busbw / memcpy_gbs,
        }
    }
}

/// The 4-bit QSGD of `bench compress` and `bench kernels`: 7 levels,
/// scaled by the largest magnitude (DiLoCo's `:qsgd=7:max-norm`).
const QSGD_4BIT: Quantizer = Quantizer::Qsgd {
    levels: gradwire_compress::quant::QSGD_NIBBLE_LEVELS,
    seed: 7,
    norm: gradwire_compress::QsgdNorm::Max,
};

/// The E3M0 of `bench compress` and `bench kernels` (DiLoCo's `:e3m0`).
const E3M0: Quantizer = Quantizer::E3m0 { seed: 7 };

/// The codecs `gradwire bench compress` knows.
pub const CODECS: &[&str] = &[
    "f16",
    "bf16",
    "threshold",
    "topk",
    "sampled-topk",
    "randomk",
    "ef-topk",
    "onebit",
    "qsgd",
    "qsgd4",
    "e3m0",
    "uint8",
    "powersgd",
];

/// One compression measurement.
#[derive(Debug, Clone, Serialize)]
pub struct CompressRow {
    /// The codec (`f16` and `bf16` are an encode and a decode).
    pub codec: String,
    /// Input f32 elements.
    pub elements: usize,
    /// Median seconds per call.
    pub secs: f64,
    /// Input bytes / time, GB/s.
    pub gbs: f64,
    /// A copy of the input bytes (memcpy on the CPU; device to device for
    /// `gradwire bench kernels`), GB/s.
    pub memcpy_gbs: f64,
    /// gbs / memcpy_gbs.
    pub ratio: f64,
}

impl CompressRow {
    /// The row of `codec` on `elements` f32 values taking `secs`, beside a
    /// copy of the same bytes taking `copy_secs`.
    pub(crate) fn new(codec: &str, elements: usize, secs: f64, copy_secs: f64) -> CompressRow {
        let gbs = 4.0 * elements as f64 / secs / 1e9;
        let memcpy_gbs = 4.0 * elements as f64 / copy_secs / 1e9;
        CompressRow {
            codec: codec.into(),
            elements,
            secs,
            gbs,
            memcpy_gbs,
            ratio: gbs / memcpy_gbs,
        }
    }
}

/// Median seconds of an encode to `H` and a decode back of `x`.
fn cast_round_trip<H: WithDType>(x: &[f32], budget: Budget) -> Result<f64> {
    let mut half = H::zeros_vec(x.len());
    let mut back = vec![0f32; x.len()];
    median_time(budget, || {
        cast::encode(black_box(x), &mut half, &CastOptions::default())?;
        cast::decode(&half, &mut back)?;
        Ok(())
    })
}

/// Median seconds of a quantization of `x` and its decoding.
fn quantize_round_trip(q: Quantizer, x: &[f32], budget: Budget) -> Result<f64> {
    let mut payload = vec![0u8; q.encoded_len(x.len())];
    let mut back = vec![0f32; x.len()];
    let mut stream = 0;
    median_time(budget, || {
        stream += 1;
        q.encode(black_box(x), stream, &mut payload)?;
        q.decode(&payload, &mut back)?;
        Ok(())
    })
}

/// PowerSGD's local work on `x` viewed as a matrix of 1024 rows (the
/// entries beyond a multiple of 1024 left out) at rank 4: `P = M Q`, the
/// orthonormalisation, `Qᵀ = Pᵀ M` and `M ≈ P Qᵀ`, what a step computes
/// besides its two all-reduces.
fn powersgd_step(x: &[f32], budget: Budget) -> Result<f64> {
    const ROWS: usize = 1024;
    const RANK: usize = 4;
    let cols = (x.len() / ROWS).max(1);
    let rows = x.len().min(ROWS * cols) / cols;
    let m = &x[..rows * cols];
    let mut qt = vec![0f32; RANK * cols];
    lowrank::init_q(3, &mut qt);
    let mut p = vec![0f32; rows * RANK];
    let mut approx = vec![0f32; rows * cols];
    median_time(budget, || {
        lowrank::project(black_box(m), rows, cols, &qt, &mut p)?;
        lowrank::orthonormalize(&mut p, rows, RANK)?;
        lowrank::project_back(m, rows, cols, &p, &mut qt)?;
        lowrank::reconstruct(&p, &qt, rows, cols, &mut approx)?;
        Ok(())
    })
}

/// Gradient-like data: seeded, roughly normal, a few large entries.
pub(crate) fn gradient(n: usize) -> Vec<f32> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 40) as f32 / (1u64 << 24) as f32;
            // A cheap bell shape: the cube of a uniform in [-1, 1].
            let v = 2.0 * u - 1.0;
            v * v * v * 0.01
        })
        .collect()
}

/// Each codec on `elements` f32 values (ratio 1 % for the selections; the
/// threshold keeps about 1 % of this data).
pub fn compress(codecs: &[String], elements: &[usize], budget: Budget) -> Result<Vec<CompressRow>> {
    budget.check()?;
    check_elements(elements.iter().copied())?;
    let mut rows = Vec::new();
    for &n in elements {
        let x = gradient(n);
        let memcpy = memcpy_secs(4 * n, budget)?;
        for codec in codecs {
            let secs = match codec.as_str() {
                "f16" => cast_round_trip::<f16>(&x, budget)?,
                "bf16" => cast_round_trip::<bf16>(&x, budget)?,
                "threshold" => median_time(budget, || {
                    black_box(select::threshold(black_box(&x), 0.0097)?);
                    Ok(())
                })?,
                "topk" => median_time(budget, || {
                    black_box(select::top_k(black_box(&x), 0.01)?);
                    Ok(())
                })?,
                "sampled-topk" => median_time(budget, || {
                    black_box(select::sampled_top_k(black_box(&x), 0.01)?);
                    Ok(())
                })?,
                "randomk" => median_time(budget, || {
                    black_box(select::random_k(black_box(&x), 0.01, 7, false)?);
                    Ok(())
                })?,
                "ef-topk" => {
                    let mut memory = ErrorFeedback::new(n);
                    let codec = SparseCodec::TopK(0.01);
                    median_time(budget, || {
                        black_box(memory.compress(black_box(&x), &codec)?);
                        Ok(())
                    })?
                }
                "onebit" => quantize_round_trip(Quantizer::Sign, &x, budget)?,
                "qsgd" => quantize_round_trip(
                    Quantizer::Qsgd {
                        levels: 127,
                        seed: 7,
                        norm: gradwire_compress::QsgdNorm::L2,
                    },
                    &x,
                    budget,
                )?,
                "qsgd4" => quantize_round_trip(QSGD_4BIT, &x, budget)?,
                "e3m0" => quantize_round_trip(E3M0, &x, budget)?,
                "uint8" => quantize_round_trip(Quantizer::MinMaxU8, &x, budget)?,
                "powersgd" => powersgd_step(&x, budget)?,
                other => {
                    return Err(ExperimentError::Usage(format!(
                        "unknown codec {other:?} (one of: {})",
                        CODECS.join(", ")
                    )));
                }
            };
            rows.push(CompressRow::new(codec, n, secs, memcpy));
        }
    }
    Ok(rows)
}

/// A row of a `gradwire bench` table: its columns' names and cells.
pub trait TableRow: Serialize {
    /// The columns.
    const HEADER: &'static [&'static str];
    /// This row's cells.
    fn cells(&self) -> Vec<String>;
}

impl TableRow for AllReduceRow {
    const HEADER: &'static [&'static str] = &[
        "backend",
        "W",
        "bytes",
        "latency us",
        "algbw GB/s",
        "busbw GB/s",
        "memcpy GB/s",
        "busbw / memcpy",
    ];

    fn cells(&self) -> Vec<String> {
        vec![
            self.backend.clone(),
            self.world.to_string(),
            self.bytes.to_string(),
            format!("{:.1}", self.secs * 1e6),
            format!("{:.2}", self.algbw_gbs),
            format!("{:.2}", self.busbw_gbs),
            format!("{:.2}", self.memcpy_gbs),
            format!("{:.0} %", self.ratio * 100.0),
        ]
    }
}

impl TableRow for CompressRow {
    const HEADER: &'static [&'static str] = &[
        "codec",
        "elements",
        "ms",
        "GB/s",
        "memcpy GB/s",
        "vs memcpy",
    ];

    fn cells(&self) -> Vec<String> {
        vec![
            self.codec.clone(),
            self.elements.to_string(),
            format!("{:.3}", self.secs * 1e3),
            format!("{:.2}", self.gbs),
            format!("{:.2}", self.memcpy_gbs),
            format!("{:.0} %", self.ratio * 100.0),
        ]
    }
}

impl TableRow for strategies::StrategyRow {
    const HEADER: &'static [&'static str] = &[
        "strategy",
        "params",
        "W",
        "MB sent / step",
        "vs dense",
        "step ms",
    ];

    fn cells(&self) -> Vec<String> {
        vec![
            self.strategy.clone(),
            self.params.to_string(),
            self.world.to_string(),
            format!("{:.3}", self.bytes_per_step / 1e6),
            format!("{:.1}x", self.vs_dense),
            format!("{:.1}", self.step_secs * 1e3),
        ]
    }
}

/// `rows` on stdout: one JSON array, or a table.
pub fn print_rows<T: TableRow>(json: bool, rows: &[T]) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(rows)?);
        return Ok(());
    }
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::UTF8_FULL_CONDENSED)
        .set_header(T::HEADER.to_vec());
    for r in rows {
        table.add_row(r.cells());
    }
    println!("{table}");
    Ok(())
}

#[cfg(test)]
mod tests;
