//! In steady state a GradSync step allocates nothing at all, on any thread:
//! the gradient buffers, the fusion and wire buffers, DistOpt's lists, the
//! buckets' job slots on the communication thread and LocalComm's round
//! bookkeeping are all reused from step to step (dense and half precision,
//! 1 to 4 ranks). A recording global allocator counts every allocation of
//! every thread during the measured steps.
//!
//! One test in this binary, so that no other test allocates meanwhile.

use gradwire_algos::HalfPrecision;
use gradwire_comm::{Communicator, local};
use gradwire_optim::{DistOptConfig, GradSync, Mode, ParamSpec};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The system allocator, recording the count and the largest size of the
/// allocations made while `MEASURING` is set.
struct Recording;

static MEASURING: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator, which
// upholds GlobalAlloc's contract; the bookkeeping only touches atomics.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if MEASURING.load(Ordering::Relaxed) {
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
        if MEASURING.load(Ordering::Relaxed) {
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
/// thread may set up its bookkeeping) and every buffer to have grown.
const WARM_UP: usize = 10;
const MEASURED: usize = 10;

/// Runs `world` ranks through warm-up and measured steps of `mode`;
/// returns (allocations, largest) over the measured steps.
fn measure(world: usize, mode: Mode) -> (usize, usize) {
    let specs = vec![ParamSpec::new("w", [128, 128]), ParamSpec::new("b", [B])];
    let config = DistOptConfig {
        mode,
        ..DistOptConfig::default()
    };
    COUNT.store(0, Ordering::Relaxed);
    LARGEST.store(0, Ordering::Relaxed);
    local::run(world, |comm| {
        let rank = comm.rank();
        let mut sync = GradSync::new(comm, specs.clone(), config.clone()).expect("a GradSync");
        let mut gw = vec![0.25 + rank as f32; W];
        let mut gb = vec![0.5; B];
        for step in 0..WARM_UP + MEASURED {
            // Every rank is between steps here: the switch covers exactly
            // the measured steps of every rank.
            sync.comm().barrier().expect("barrier");
            if rank == 0 {
                MEASURING.store(step >= WARM_UP, Ordering::SeqCst);
            }
            sync.comm().barrier().expect("barrier");
            sync.push("b", &gb).expect("push");
            sync.push("w", &gw).expect("push");
            sync.finish(&mut [&mut gw[..], &mut gb[..]])
                .expect("finish");
        }
        sync.comm().barrier().expect("barrier");
        MEASURING.store(false, Ordering::SeqCst);
    })
    .expect("ranks ran");
    (
        COUNT.load(Ordering::Relaxed),
        LARGEST.load(Ordering::Relaxed),
    )
}

#[test]
fn a_steady_step_allocates_nothing() {
    let modes = [
        Mode::Dense,
        Mode::Half {
            precision: HalfPrecision::F16,
            clip: None,
        },
        Mode::Half {
            precision: HalfPrecision::BF16,
            clip: Some(1.0),
        },
    ];
    for mode in modes {
        for world in 1..=4 {
            let (count, largest) = measure(world, mode);
            assert_eq!(
                count, 0,
                "{mode:?}, W = {world}: {count} allocations in {MEASURED} steady steps, the largest {largest} bytes"
            );
        }
    }
}
