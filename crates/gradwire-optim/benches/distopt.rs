//! One DistOpt step over 4 LocalComm ranks for ResNet-50's 25.6 M parameters
//! (161 tensors of mixed sizes): dense, half (f16) and sparse top-k 1 % with
//! error feedback; and, for each, with overlap off (the whole backward first,
//! then every gradient) and on (each gradient pushed as backward produces it,
//! so buckets travel while backward goes on).
//!
//! Backward is simulated by sleeping 40 ms per step in total, spread over the
//! tensors in proportion to their sizes: a sleeping rank leaves the CPU to the
//! communication threads, as a GPU computing backward would. With overlap,
//! a step should take less than the backward time plus the communication time.
//!
//! `cargo bench -p gradwire-optim --bench distopt` prints time per step, the
//! wait in `finish`, and the bytes each rank sent per step.

mod common;

use gradwire_algos::HalfPrecision;
use gradwire_comm::{Communicator, LocalConfig, local};
use gradwire_compress::SparseCodec;
use gradwire_optim::{DistOpt, DistOptConfig, ParamSpec, Sgd, SgdConfig, StrategyConfig};
use gradwire_tensor::Tensor;
use std::time::{Duration, Instant};

const WORLD: usize = 4;
const STEPS: usize = 5;
const BACKWARD: Duration = Duration::from_millis(40);

/// ResNet-50's parameter tensors in backward order.
fn shapes() -> Vec<Vec<usize>> {
    let mut shapes = common::resnet50_shapes();
    shapes.reverse();
    shapes
}

struct Outcome {
    step: Duration,
    wait: Duration,
    sent: u64,
}

fn run(mode: StrategyConfig, overlap: bool) -> Outcome {
    let shapes = shapes();
    let total: usize = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    let specs: Vec<ParamSpec> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| ParamSpec::new(format!("p{i}"), s.clone()))
        .collect();
    let config = LocalConfig::with_timeout(None);
    let results = local::run_with(WORLD, &config, |comm| {
        let rank = comm.rank();
        let sgd = Sgd::new(SgdConfig::default().lr(1e-3).momentum(0.9)).expect("sgd");
        let dist_config = DistOptConfig {
            strategy: mode,
            ..DistOptConfig::default()
        };
        let mut dist = DistOpt::new(sgd, comm, specs.clone(), dist_config).expect("distopt");
        let mut params: Vec<Tensor> = shapes
            .iter()
            .map(|s| {
                Tensor::full(
                    0.01,
                    s.clone(),
                    gradwire_tensor::DType::F32,
                    gradwire_tensor::Device::Cpu,
                )
                .expect("param")
            })
            .collect();
        let grads: Vec<Tensor> = shapes
            .iter()
            .map(|s| {
                let n: usize = s.iter().product();
                let v: Vec<f32> = (0..n)
                    .map(|i| ((i * 7 + rank * 13) % 101) as f32 * 1e-4 - 5e-3)
                    .collect();
                Tensor::from_vec(v, s.clone()).expect("grad")
            })
            .collect();
        let names: Vec<String> = (0..shapes.len()).map(|i| format!("p{i}")).collect();
        let mut best = Outcome {
            step: Duration::MAX,
            wait: Duration::ZERO,
            sent: 0,
        };
        for _ in 0..STEPS {
            dist.comm().barrier().expect("barrier");
            let start = Instant::now();
            if !overlap {
                std::thread::sleep(BACKWARD);
            }
            let mut owed = Duration::ZERO;
            for (i, g) in grads.iter().enumerate() {
                if overlap {
                    owed += BACKWARD.mul_f64(g.len() as f64 / total as f64);
                    if owed >= Duration::from_millis(1) {
                        std::thread::sleep(owed);
                        owed = Duration::ZERO;
                    }
                }
                dist.push(&names[i], g.clone()).expect("push");
            }
            let stats = dist
                .finish(names.iter().map(String::as_str).zip(params.iter_mut()))
                .expect("finish");
            let step = start.elapsed();
            if step < best.step {
                best = Outcome {
                    step,
                    wait: stats.wait,
                    sent: stats.traffic.sent,
                };
            }
        }
        best
    })
    .expect("ranks");
    results
        .into_iter()
        .next()
        .expect("rank 0")
        .expect("no panic")
}

fn main() {
    let modes = [
        ("dense", StrategyConfig::Dense),
        (
            "half f16",
            StrategyConfig::Half {
                precision: HalfPrecision::F16,
                clip: None,
            },
        ),
        (
            "sparse top-k 1% + EF",
            StrategyConfig::Sparse {
                codec: SparseCodec::TopK(0.01),
                error_feedback: true,
            },
        ),
    ];
    // `cargo test --benches` runs benches once in test mode: keep that quick.
    if std::env::args().any(|a| a == "--test") {
        return;
    }
    println!(
        "one DistOpt step, ResNet-50 (25.6 M parameters, 161 tensors), {WORLD} LocalComm ranks,"
    );
    println!(
        "backward simulated as {} ms of sleep; best of {STEPS} steps",
        BACKWARD.as_millis()
    );
    println!(
        "{:<22} {:>8} {:>11} {:>11} {:>14}",
        "mode", "overlap", "step ms", "wait ms", "MB sent/rank"
    );
    for (name, mode) in modes {
        for overlap in [false, true] {
            let o = run(mode, overlap);
            println!(
                "{name:<22} {:>8} {:>11.1} {:>11.1} {:>14.1}",
                if overlap { "on" } else { "off" },
                o.step.as_secs_f64() * 1e3,
                o.wait.as_secs_f64() * 1e3,
                o.sent as f64 / 1e6
            );
        }
    }
}
