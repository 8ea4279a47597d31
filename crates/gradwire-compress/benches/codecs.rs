//! The codecs on 16 Mi f32 elements (64 MiB), single thread, beside a memcpy
//! of the same buffer measured in the same run.
//!
//! `cargo bench -p gradwire-compress` prints criterion's figures (throughput
//! is GB/s of f32 input), then a summary: each codec's input bandwidth and
//! its ratio to the memcpy bandwidth (bytes copied / time).

use criterion::{Criterion, Throughput};
use gradwire_compress::cast::{self, CastOptions};
use gradwire_compress::{ErrorFeedback, SelectScratch, SparseCodec, SparseVec, select};
use half::{bf16, f16};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const N: usize = 16 << 20;

/// Best seconds per call, by benchmark name.
static BEST: Mutex<BTreeMap<String, f64>> = Mutex::new(BTreeMap::new());

/// Times `iters` calls of `f`, records the per-call time.
fn timed(name: &str, iters: u64, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let elapsed = start.elapsed();
    let per_call = elapsed.as_secs_f64() / iters.max(1) as f64;
    let mut best = BEST.lock().unwrap_or_else(|e| e.into_inner());
    let entry = best.entry(name.to_string()).or_insert(f64::INFINITY);
    *entry = entry.min(per_call);
    elapsed
}

/// Gradient-like data: heavy-tailed, signed, deterministic.
fn gradient() -> Vec<f32> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    (0..N)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            u * u * u * 8.0
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let x = gradient();
    // The magnitude that ~1 % of the entries reach.
    let t1 = select::top_k(&x, 0.01)
        .expect("top-k")
        .values()
        .iter()
        .map(|v| v.abs())
        .fold(f32::INFINITY, f32::min);
    let mut group = c.benchmark_group("codecs_16Mi_f32");
    group
        .throughput(Throughput::Bytes((N * 4) as u64))
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));

    let mut dst = vec![0f32; N];
    group.bench_function("memcpy", |b| {
        b.iter_custom(|it| timed("memcpy", it, || dst.copy_from_slice(black_box(&x))))
    });
    let mut h = vec![f16::ZERO; N];
    let mut back = vec![0f32; N];
    group.bench_function("f32->f16->f32", |b| {
        b.iter_custom(|it| {
            timed("f32->f16->f32", it, || {
                cast::encode(black_box(&x), &mut h, &CastOptions::default()).expect("cast");
                cast::decode(&h, &mut back).expect("cast");
            })
        })
    });
    let mut bh = vec![bf16::ZERO; N];
    group.bench_function("f32->bf16->f32", |b| {
        b.iter_custom(|it| {
            timed("f32->bf16->f32", it, || {
                cast::encode(black_box(&x), &mut bh, &CastOptions::default()).expect("cast");
                cast::decode(&bh, &mut back).expect("cast");
            })
        })
    });
    group.bench_function("threshold ~1%", |b| {
        b.iter_custom(|it| {
            timed("threshold ~1%", it, || {
                drop(black_box(select::threshold(&x, t1)))
            })
        })
    });
    for (name, ratio) in [("top-k 1%", 0.01), ("top-k 0.1%", 0.001)] {
        group.bench_function(name, |b| {
            b.iter_custom(|it| timed(name, it, || drop(black_box(select::top_k(&x, ratio)))))
        });
    }
    // Few distinct magnitudes: the k-th is tied with ~1 % of the entries,
    // more candidates than the sampled bracket keeps (the radix path).
    let tied: Vec<f32> = x.iter().map(|v| (v * 64.0).round() / 64.0).collect();
    group.bench_function("top-k 1% tied", |b| {
        b.iter_custom(|it| {
            timed("top-k 1% tied", it, || {
                drop(black_box(select::top_k(&tied, 0.01)))
            })
        })
    });
    // The form a caller selecting every step uses: its buffers reused.
    let (mut out, mut scratch) = (SparseVec::default(), SelectScratch::default());
    group.bench_function("top-k 1% reused buffers", |b| {
        b.iter_custom(|it| {
            timed("top-k 1% reused buffers", it, || {
                SparseCodec::TopK(0.01)
                    .select_into(black_box(&x), &mut out, &mut scratch)
                    .expect("top-k")
            })
        })
    });
    for (name, ratio) in [("sampled top-k 1%", 0.01), ("sampled top-k 0.1%", 0.001)] {
        group.bench_function(name, |b| {
            b.iter_custom(|it| {
                timed(name, it, || {
                    drop(black_box(select::sampled_top_k(&x, ratio)))
                })
            })
        });
    }
    let mut memory = ErrorFeedback::new(N);
    let grad: Vec<f32> = x.iter().map(|v| v * 0.01).collect();
    group.bench_function("error feedback top-k 1%", |b| {
        b.iter_custom(|it| {
            timed("error feedback top-k 1%", it, || {
                drop(black_box(memory.compress(&grad, &SparseCodec::TopK(0.01))))
            })
        })
    });
    group.finish();
}

fn summary() {
    let best = BEST.lock().unwrap_or_else(|e| e.into_inner());
    let Some(&memcpy) = best.get("memcpy") else {
        return;
    };
    let bytes = (N * 4) as f64;
    println!(
        "\ncodecs on {N} f32 elements (64 MiB), one thread; memcpy {:.2} GB/s",
        bytes / memcpy / 1e9
    );
    println!(
        "{:<26} {:>10} {:>12} {:>10}",
        "codec", "ms", "GB/s input", "vs memcpy"
    );
    for (name, &t) in best.iter() {
        println!(
            "{name:<26} {:>10.2} {:>12.2} {:>9.0}%",
            t * 1e3,
            bytes / t / 1e9,
            100.0 * memcpy / t
        );
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
    summary();
}
