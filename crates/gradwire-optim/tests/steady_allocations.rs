//! A test binary of its own: it installs a counting global allocator.
//!
//! In steady state a GradSync step allocates nothing at all, on any thread:
//! the gradient buffers, the fusion and wire buffers, the sparse selection,
//! its scratch, payload and gathered payloads, the error-feedback residual
//! and its copy from before the step, AdaSum's packed vector and scratch,
//! PowerSGD's factors, warm start, residuals and their copies, the
//! quantized modes' chunks and residuals,
//! DistOpt's lists, the buckets' job slots on the communication thread and
//! LocalComm's round bookkeeping and message buffers are all reused from
//! step to step (every gradient-combining mode, the local-step modes'
//! copies of the parameters, and DimReduce's flat vectors, trial tensors
//! and subspace arithmetic, 1 to 4 ranks). A recording
//! global allocator counts every allocation of every thread during the
//! measured steps but the test's own (which only spawns the ranks and
//! collects their results, at moments the scheduler picks).
//!
//! One test in this binary, so that no other test allocates meanwhile.

use gradwire_algos::{HalfPrecision, PowerSgdConfig};
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_compress::{Quantizer, SparseCodec};
use gradwire_optim::{
    DiLoCoConfig, DistOptConfig, GradSync, OuterCodec, ParamSpec, StrategyConfig, WarmupBy,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The system allocator, recording the count and the largest size of the
/// allocations made while `MEASURING` is set.
struct Recording;

static MEASURING: AtomicBool = AtomicBool::new(false);

std::thread_local! {
    /// Set on the test's own thread, which only spawns the ranks and
    /// collects their results: its allocations are the harness's, made at
    /// whatever moment the scheduler runs it, and never counted.
    static HARNESS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether an allocation now is one of the measured steps'.
fn measured() -> bool {
    MEASURING.load(Ordering::Relaxed) && !HARNESS.with(std::cell::Cell::get)
}
static COUNT: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator, which
// upholds GlobalAlloc's contract; the bookkeeping only touches atomics.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if measured() {
            COUNT.fetch_add(1, Ordering::Relaxed);
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: the caller's layout, passed on as GlobalAlloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if measured() {
            COUNT.fetch_add(1, Ordering::Relaxed);
            LARGEST.fetch_max(new_size, Ordering::Relaxed);
        }
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Recording = Recording;

/// 128 x 128 weights and 128 biases: 66 KB of f32, one fusion bucket.
const W: usize = 128 * 128;
const B: usize = 128;
/// Enough for every thread to have waited once (a lock's first wait on a
/// thread may set up its bookkeeping) and every buffer to have grown (the
/// top-k family reserves its O(k) memory on first use; a threshold's
/// selection grows with what the data holds above it).
const WARM_UP: usize = 10;
const MEASURED: usize = 10;

/// Runs `rank` on `world` ranks with the count reset; returns (allocations,
/// largest) of what the ranks measured with [`switch_measuring`].
fn counted(world: usize, rank: impl Fn(LocalComm) + Sync) -> (usize, usize) {
    COUNT.store(0, Ordering::Relaxed);
    LARGEST.store(0, Ordering::Relaxed);
    HARNESS.with(|h| h.set(true));
    local::run(world, rank).expect("ranks ran");
    (
        COUNT.load(Ordering::Relaxed),
        LARGEST.load(Ordering::Relaxed),
    )
}

/// Turns the count on or off between steps, with every rank between steps
/// (rank 0 switches it between two barriers).
fn switch_measuring(comm: &LocalComm, on: bool) {
    comm.barrier().expect("barrier");
    if comm.rank() == 0 {
        MEASURING.store(on, Ordering::SeqCst);
    }
    comm.barrier().expect("barrier");
}

/// Runs `world` ranks through warm-up and measured steps of `mode` (with
/// AdaSum prepared by DistOpt for `StrategyConfig::AdaSum`); returns (allocations,
/// largest) over the measured steps. With `skip_bias`, no rank writes the
/// bias after the warm-up's first step (a partly written bucket). With
/// `micro_batches` above 1, each step accumulates that many micro-batches,
/// each weighted by its samples (the all-reduce of the step's sample count
/// at the last one).
fn measure(
    world: usize,
    mode: StrategyConfig,
    skip_bias: bool,
    micro_batches: u32,
) -> (usize, usize) {
    let specs = vec![ParamSpec::new("w", [128, 128]), ParamSpec::new("b", [B])];
    let config = DistOptConfig {
        strategy: mode,
        accumulate: micro_batches,
        ..DistOptConfig::default()
    };
    counted(world, |comm| {
        let rank = comm.rank();
        // AdaSum's strategies as the registry builds them.
        let mut sync = GradSync::new(comm, specs.clone(), config.clone()).expect("a GradSync");
        // Gradients that change from step to step (a sparse selection
        // moves), refilled in place: a cycle of four steps, so that the
        // warm-up has seen every size a selection takes (its buffers grow
        // to the largest seen, then stay).
        let mut gw = vec![0f32; W];
        let mut gb = vec![0f32; B];
        for step in 0..WARM_UP + MEASURED {
            // Every rank is between steps here: the switch covers exactly
            // the measured steps of every rank.
            switch_measuring(sync.comm(), step >= WARM_UP);
            for micro in 0..micro_batches as usize {
                for (i, g) in gw.iter_mut().enumerate() {
                    *g =
                        (((i * 7 + (step % 4) * 13 + micro + rank * 5) % 101) as f32 - 50.0) * 1e-2;
                }
                gb.iter_mut()
                    .for_each(|g| *g = 0.5 + (step % 4 + micro) as f32);
                if micro_batches > 1 {
                    sync.set_samples(1 + ((rank + micro) % 3) as u64)
                        .expect("samples");
                }
                if !(skip_bias && step > 0) {
                    sync.push("b", &gb).expect("push");
                }
                sync.push("w", &gw).expect("push");
                sync.finish(&mut [&mut gw[..], &mut gb[..]])
                    .expect("finish");
            }
        }
        switch_measuring(sync.comm(), false);
    })
}

/// [`measure`] for the modes that step locally first (`Partial`, and
/// `DeltaWeight` with AdaSum), through `GradSync::step_locally` with a
/// caller's SGD step.
fn measure_local(world: usize, mode: StrategyConfig) -> (usize, usize) {
    let specs = vec![ParamSpec::new("w", [128, 128]), ParamSpec::new("b", [B])];
    let config = DistOptConfig {
        strategy: mode,
        // Several buckets: partial averaging cycles through them.
        fusion_threshold: 4096,
        ..DistOptConfig::default()
    };
    counted(world, |comm| {
        let rank = comm.rank();
        // AdaSum's strategies as the registry builds them.
        let mut sync = GradSync::new(comm, specs.clone(), config.clone()).expect("a GradSync");
        let mut w = vec![0.5f32; W];
        let mut b = vec![0.1f32; B];
        for step in 0..WARM_UP + MEASURED {
            switch_measuring(sync.comm(), step >= WARM_UP);
            let mut params: [&mut [f32]; 2] = [&mut w[..], &mut b[..]];
            sync.step_locally(&mut params[..], |params| {
                // The caller's own SGD step on its own gradient.
                for (k, p) in params.iter_mut().enumerate() {
                    for (i, v) in p.iter_mut().enumerate() {
                        let g =
                            (((i * 7 + k + (step % 4) * 13 + rank * 5) % 101) as f32 - 50.0) * 1e-3;
                        *v -= 0.1 * g;
                    }
                }
                Ok(())
            })
            .expect("step");
        }
        switch_measuring(sync.comm(), false);
    })
}

/// [`measure`] for DiLoCo through `LocalSteps` with the engine's own inner
/// optimizer (Adam: two buffers per parameter, which every round's start
/// copies aside in case the round is skipped). Each step's gradient
/// tensors are made before the count is switched on.
fn measure_outer(world: usize, diloco: DiLoCoConfig) -> (usize, usize) {
    use gradwire_optim::{Adam, AdamConfig, LocalSteps};
    use gradwire_tensor::Tensor;
    let specs = vec![ParamSpec::new("w", [128, 128]), ParamSpec::new("b", [B])];
    let config = DistOptConfig {
        strategy: StrategyConfig::DiLoCo(diloco),
        fusion_threshold: 4096,
        ..DistOptConfig::default()
    };
    counted(world, |comm| {
        let rank = comm.rank();
        let adam = Adam::new(AdamConfig::default().lr(1e-3)).expect("adam");
        let mut dist = LocalSteps::new(adam, comm, specs.clone(), config.clone()).expect("steps");
        let mut w = Tensor::from_vec(vec![0.5f32; W], [128, 128]).expect("w");
        let mut b = Tensor::from_vec(vec![0.1f32; B], B).expect("b");
        for step in 0..WARM_UP + MEASURED {
            let gw: Vec<f32> = (0..W)
                .map(|i| (((i * 7 + (step % 4) * 13 + rank * 5) % 101) as f32 - 50.0) * 1e-2)
                .collect();
            let gw = Tensor::from_vec(gw, [128, 128]).expect("gw");
            let gb = Tensor::from_vec(vec![0.5 + (step % 4) as f32; B], B).expect("gb");
            switch_measuring(dist.comm(), step >= WARM_UP);
            dist.step([("w", &mut w, Some(gw)), ("b", &mut b, Some(gb))])
                .expect("step");
            switch_measuring(dist.comm(), false);
        }
    })
}

/// [`measure`] for DimReduce mode (DimReduceOpt: the gradients are the caller's
/// tensors, made before each measured step begins), on a least-squares
/// loss whose line search the closure evaluates without allocating.
fn measure_dimreduce(world: usize) -> (usize, usize) {
    use gradwire_algos::dimreduce::{DimReduceConfig, Pca};
    use gradwire_optim::{DimReduceOpt, Sgd, SgdConfig};
    use gradwire_tensor::Tensor;
    let specs = vec![ParamSpec::new("w", [64, 32]), ParamSpec::new("b", [B])];
    let total = 64 * 32 + B;
    // Components from a made-up trajectory (every rank alike).
    let snapshots: Vec<Vec<f32>> = (0..6)
        .map(|t| {
            (0..total)
                .map(|i| ((i * 31 + t * 7) % 17) as f32 * 0.01 * t as f32)
                .collect()
        })
        .collect();
    let pca = Pca::fit(&snapshots, 4).expect("a PCA");
    counted(world, |comm| {
        let rank = comm.rank();
        let sgd = Sgd::new(SgdConfig::default().lr(0.1)).expect("sgd");
        let dimreduce = DistOptConfig {
            strategy: StrategyConfig::DimReduce,
            ..DistOptConfig::default()
        };
        let mut dist =
            DimReduceOpt::new(sgd, comm, specs.clone(), dimreduce).expect("DimReduceOpt");
        dist.start(&pca, DimReduceConfig::default())
            .expect("DimReduce");
        let mut w = Tensor::from_vec(vec![0.5f32; 64 * 32], vec![64, 32]).expect("w");
        let mut b = Tensor::from_vec(vec![0.1f32; B], vec![B]).expect("b");
        let loss_of = |t: &[(&str, &Tensor)]| -> gradwire_optim::Result<f64> {
            let mut sum = 0.0;
            for (_, t) in t {
                sum += t
                    .as_slice::<f32>()?
                    .iter()
                    .map(|v| f64::from(*v - 0.3).powi(2))
                    .sum::<f64>();
            }
            Ok(sum)
        };
        for step in 0..WARM_UP + MEASURED {
            // The caller's gradients, made outside the measured window.
            let gw: Vec<f32> = w
                .as_slice::<f32>()
                .expect("w")
                .iter()
                .map(|v| 2.0 * (v - 0.3) + rank as f32 * 1e-3)
                .collect();
            let gb: Vec<f32> = b
                .as_slice::<f32>()
                .expect("b")
                .iter()
                .map(|v| 2.0 * (v - 0.3))
                .collect();
            let gw = Tensor::from_vec(gw, vec![64, 32]).expect("gw");
            let gb = Tensor::from_vec(gb, vec![B]).expect("gb");
            let loss = loss_of(&[("w", &w), ("b", &b)]).expect("loss");
            switch_measuring(dist.comm(), step >= WARM_UP);
            dist.push("b", gb).expect("push");
            dist.push("w", gw).expect("push");
            dist.finish_dimreduce([("w", &mut w), ("b", &mut b)], loss, loss_of)
                .expect("finish");
            // Off before the next step's gradients are made.
            switch_measuring(dist.comm(), false);
        }
        switch_measuring(dist.comm(), false);
    })
}

#[test]
fn a_steady_step_allocates_nothing() {
    // parking_lot's process-wide table of parked threads is made the first
    // time any thread parks, and grown with the number of threads: once
    // per process, not per step. Make it now, for more threads than any
    // measurement runs (rank 0 sleeps, so the other 15 park).
    local::run(16, |comm| {
        if comm.rank() == 0 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        comm.barrier()
    })
    .expect("ranks ran");
    let powersgd = |error_feedback| PowerSgdConfig {
        rank: 2,
        start_step: 3,
        error_feedback,
        ..PowerSgdConfig::default()
    };
    let quantized = |quantizer, error_feedback| StrategyConfig::Quantized {
        quantizer,
        error_feedback,
        momentum: error_feedback.then_some(0.9),
    };
    let sparse = |codec, error_feedback| StrategyConfig::Sparse {
        codec,
        error_feedback,
    };
    let modes = [
        (StrategyConfig::Dense, false),
        (
            StrategyConfig::Half {
                precision: HalfPrecision::F16,
                clip: None,
            },
            false,
        ),
        (
            StrategyConfig::Half {
                precision: HalfPrecision::BF16,
                clip: Some(1.0),
            },
            false,
        ),
        // Sparse enough to be sent sparse at every world size (5 %), and
        // dense (50 %: the W-aware cost decides so from two ranks on).
        (sparse(SparseCodec::TopK(0.05), true), false),
        (sparse(SparseCodec::TopK(0.05), true), true),
        // Error feedback far from settled (1 % takes ~100 steps): top-k's
        // memory is bounded by k, not by the data.
        (sparse(SparseCodec::TopK(0.01), true), true),
        (sparse(SparseCodec::TopK(0.5), true), false),
        (sparse(SparseCodec::TopK(0.05), false), false),
        (sparse(SparseCodec::SampledTopK(0.05), true), false),
        (sparse(SparseCodec::Threshold(0.45), true), false),
        (
            sparse(
                SparseCodec::RandomK {
                    ratio: 0.05,
                    seed: 3,
                },
                true,
            ),
            false,
        ),
        (
            sparse(
                SparseCodec::RandomK {
                    ratio: 0.05,
                    seed: 3,
                },
                false,
            ),
            false,
        ),
        (StrategyConfig::AdaSum { group: None }, false),
        // PowerSGD: the matrix compressed, the bias dense beside it; dense
        // steps first, then compressed ones (the switch in the warm-up).
        (StrategyConfig::PowerSgd(powersgd(true)), false),
        (StrategyConfig::PowerSgd(powersgd(true)), true),
        (StrategyConfig::PowerSgd(powersgd(false)), false),
        // Quantized both ways, with and without error feedback.
        (quantized(Quantizer::Sign, true), false),
        (quantized(Quantizer::Sign, true), true),
        (
            quantized(
                Quantizer::Qsgd {
                    levels: 127,
                    seed: 1,
                    norm: gradwire_compress::QsgdNorm::L2,
                },
                true,
            ),
            false,
        ),
        (quantized(Quantizer::E3m0 { seed: 1 }, true), false),
        (quantized(Quantizer::MinMaxU8, false), false),
        // 1-bit Adam: dense steps, then the 1-bit moment (in the warm-up).
        (
            StrategyConfig::OneBitAdam {
                beta1: 0.9,
                freeze_step: 3,
            },
            false,
        ),
        (
            StrategyConfig::OneBitAdam {
                beta1: 0.9,
                freeze_step: 3,
            },
            true,
        ),
    ];
    let mut failures = Vec::new();
    for (mode, skip_bias) in modes {
        for world in 1..=4 {
            let (count, largest) = measure(world, mode, skip_bias, 1);
            if count != 0 {
                failures.push(format!(
                    "{mode:?} (bias skipped: {skip_bias}), W = {world}: {count} allocations in {MEASURED} steady steps, the largest {largest} bytes"
                ));
            }
        }
    }
    for mode in [
        StrategyConfig::Dense,
        sparse(SparseCodec::TopK(0.05), true),
        StrategyConfig::PowerSgd(powersgd(true)),
    ] {
        for world in 1..=4 {
            let (count, largest) = measure(world, mode, false, 3);
            if count != 0 {
                failures.push(format!(
                    "{mode:?} accumulating 3 micro-batches, W = {world}: {count} allocations in {MEASURED} steady steps, the largest {largest} bytes"
                ));
            }
        }
    }
    let diloco = |codec| {
        StrategyConfig::DiLoCo(DiLoCoConfig {
            sync_every: 2,
            codec,
            ..DiLoCoConfig::DEFAULT
        })
    };
    for mode in [
        StrategyConfig::Partial {
            average_state: false,
        },
        StrategyConfig::DeltaWeight { group: None },
        // Inner steps and rounds' ends, the outer state made in the warm-up.
        diloco(OuterCodec::Dense),
        diloco(OuterCodec::TopK(0.05)),
        diloco(OuterCodec::Quantized(Quantizer::Sign)),
    ] {
        for world in 1..=4 {
            let (count, largest) = measure_local(world, mode);
            if count != 0 {
                failures.push(format!(
                    "{mode:?}, W = {world}: {count} allocations in {MEASURED} steady local steps, the largest {largest} bytes"
                ));
            }
        }
    }
    for codec in [
        OuterCodec::Dense,
        OuterCodec::TopK(0.05),
        OuterCodec::Quantized(Quantizer::Sign),
    ] {
        // A warm-up step by gradients first: the rounds after it allocate
        // nothing either.
        let plain = DiLoCoConfig {
            sync_every: 2,
            codec,
            warmup: 1,
            warmup_by: WarmupBy::Gradients,
            ..DiLoCoConfig::DEFAULT
        };
        // Two fragments (one per parameter), one leaving every 2 steps and
        // merged a step later.
        let streaming = DiLoCoConfig {
            sync_every: 4,
            fragments: 2,
            delay: 1,
            ..plain
        };
        for diloco in [plain, streaming] {
            for world in 1..=4 {
                let (count, largest) = measure_outer(world, diloco);
                if count != 0 {
                    failures.push(format!(
                        "{} with the engine's Adam, W = {world}: {count} allocations in {MEASURED} steady steps, the largest {largest} bytes",
                        StrategyConfig::DiLoCo(diloco)
                    ));
                }
            }
        }
    }
    for world in 1..=4 {
        let (count, largest) = measure_dimreduce(world);
        if count != 0 {
            failures.push(format!(
                "DimReduce, W = {world}: {count} allocations in {MEASURED} steady steps, the largest {largest} bytes"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
