//! One update of a 25 M-parameter model (ResNet-50's tensor sizes) for each
//! optimizer, beside a memcpy measured in the same run.
//!
//! `cargo bench -p gradwire-optim` prints criterion's figures, then a summary:
//! per optimizer the bandwidth of parameter state touched (parameters,
//! gradients and buffers, each counted once) and its ratio to the memcpy
//! bandwidth (bytes copied / time, the buffer counted once).

mod common;

use common::resnet50_shapes;
use criterion::{Criterion, Throughput};
use gradwire_optim::{
    AdaGrad, AdaGradConfig, Adam, AdamConfig, AdamW, Optimizer, RmsProp, RmsPropConfig, Sgd,
    SgdConfig,
};
use gradwire_tensor::Tensor;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

static BEST: Mutex<BTreeMap<String, (f64, f64)>> = Mutex::new(BTreeMap::new());

fn record(name: &str, bytes: f64, elapsed: Duration, iters: u64) {
    let per = elapsed.as_secs_f64() / iters.max(1) as f64;
    let mut best = BEST.lock().unwrap_or_else(|e| e.into_inner());
    let entry = best
        .entry(name.to_string())
        .or_insert((f64::INFINITY, bytes));
    entry.0 = entry.0.min(per);
}

struct Model {
    params: Vec<Tensor>,
    grads: Vec<Tensor>,
    total: usize,
}

fn model() -> Model {
    let shapes = resnet50_shapes();
    let total = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    let make = |scale: f32| {
        shapes
            .iter()
            .map(|s| {
                let n: usize = s.iter().product();
                let v: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) * scale).collect();
                Tensor::from_vec(v, s.clone()).expect("tensor")
            })
            .collect::<Vec<_>>()
    };
    Model {
        params: make(1e-2),
        grads: make(1e-4),
        total,
    }
}

fn bench_one<O: Optimizer>(
    c: &mut Criterion,
    name: &str,
    arrays: usize,
    mut opt: O,
    model: &mut Model,
) {
    let names: Vec<String> = (0..model.params.len()).map(|i| format!("p{i}")).collect();
    let bytes = (arrays * 4 * model.total) as f64;
    let mut group = c.benchmark_group("optimizer_update_resnet50");
    group
        .throughput(Throughput::Bytes(bytes as u64))
        .sample_size(10)
        .measurement_time(Duration::from_secs(3));
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                for ((name, p), g) in names.iter().zip(&mut model.params).zip(&model.grads) {
                    opt.update(name, p, g).expect("update");
                }
                opt.step();
            }
            let elapsed = start.elapsed();
            record(name, bytes, elapsed, iters);
            elapsed
        })
    });
    group.finish();
}

fn bench(c: &mut Criterion) {
    let mut model = model();
    let src = vec![1u8; 64 << 20];
    let mut dst = vec![0u8; 64 << 20];
    let mut group = c.benchmark_group("optimizer_update_resnet50");
    group
        .throughput(Throughput::Bytes(src.len() as u64))
        .sample_size(10);
    group.bench_function("memcpy 64MiB", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                black_box(&mut dst).copy_from_slice(black_box(&src));
            }
            let elapsed = start.elapsed();
            record("memcpy 64MiB", src.len() as f64, elapsed, iters);
            elapsed
        })
    });
    group.finish();
    bench_one(
        c,
        "sgd",
        2,
        Sgd::new(SgdConfig::default().lr(0.01)).expect("sgd"),
        &mut model,
    );
    let momentum = SgdConfig::default()
        .lr(0.01)
        .momentum(0.9)
        .weight_decay(1e-4);
    bench_one(
        c,
        "sgd momentum",
        3,
        Sgd::new(momentum).expect("sgd"),
        &mut model,
    );
    bench_one(
        c,
        "rmsprop",
        3,
        RmsProp::new(RmsPropConfig::default()).expect("rmsprop"),
        &mut model,
    );
    bench_one(
        c,
        "adagrad",
        3,
        AdaGrad::new(AdaGradConfig::default()).expect("adagrad"),
        &mut model,
    );
    bench_one(
        c,
        "adam",
        4,
        Adam::new(AdamConfig::default().lr(1e-3)).expect("adam"),
        &mut model,
    );
    bench_one(
        c,
        "adamw",
        4,
        AdamW::new(AdamConfig::adamw()).expect("adamw"),
        &mut model,
    );
}

fn summary() {
    let best = BEST.lock().unwrap_or_else(|e| e.into_inner());
    let Some(&(memcpy, memcpy_bytes)) = best.get("memcpy 64MiB") else {
        return;
    };
    let memcpy_bw = memcpy_bytes / memcpy / 1e9;
    println!(
        "\none update of ResNet-50's 25.6 M parameters, one thread; memcpy {memcpy_bw:.2} GB/s"
    );
    println!(
        "{:<16} {:>10} {:>16} {:>10}",
        "optimizer", "ms", "state GB/s", "vs memcpy"
    );
    for (name, &(t, bytes)) in best.iter().filter(|(k, _)| !k.starts_with("memcpy")) {
        let bw = bytes / t / 1e9;
        println!(
            "{name:<16} {:>10.2} {bw:>16.2} {:>9.0}%",
            t * 1e3,
            100.0 * bw / memcpy_bw
        );
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
    summary();
}
