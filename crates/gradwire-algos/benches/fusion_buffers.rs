//! The fused and half-precision all-reduce with buffers made for each call
//! (`fused_all_reduce`, `half_all_reduce`) against the same with buffers
//! kept from call to call (`*_with` and `FusionBuffers`, as DistOpt keeps
//! one per bucket), in one run: 4 M f32 in two tensors on 2 and 4
//! LocalComm ranks, the best of 8 calls each, and the ratio.
//!
//! `cargo bench -p gradwire-algos --bench fusion_buffers`

use gradwire_algos::{
    FusionBuffers, HalfOptions, HalfPrecision, fused_all_reduce, fused_all_reduce_with,
    half_all_reduce, half_all_reduce_with,
};
use gradwire_comm::{Communicator, ReduceOp, local};
use gradwire_tensor::Tensor;
use std::time::Instant;

const ELEMENTS: usize = 4 << 20;
const CALLS: usize = 8;

/// The best seconds of `CALLS` calls of `f`, every rank starting together.
fn best<C: Communicator>(comm: &C, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..CALLS {
        comm.barrier().expect("barrier");
        let start = Instant::now();
        f();
        best = best.min(start.elapsed().as_secs_f64());
    }
    best
}

fn main() {
    println!("{ELEMENTS} f32 in two tensors, best of {CALLS} calls, rank 0's time");
    println!(
        "{:<14} {:>3} {:>12} {:>12} {:>8}",
        "strategy", "W", "fresh ms", "reused ms", "ratio"
    );
    for world in [2usize, 4] {
        let times = local::run(world, |comm| {
            let half = ELEMENTS / 2;
            let mut tensors = vec![
                Tensor::from_vec(vec![0.5f32; half], half).expect("tensor"),
                Tensor::from_vec(vec![0.25f32; half], half).expect("tensor"),
            ];
            let options = HalfOptions {
                precision: HalfPrecision::F16,
                clip: None,
                op: ReduceOp::Avg,
            };
            let mut buffers = FusionBuffers::default();
            let mut run = |f: &mut dyn FnMut(&mut Vec<Tensor>, &mut FusionBuffers)| {
                best(&comm, || f(&mut tensors, &mut buffers))
            };
            [
                run(&mut |t, _| {
                    fused_all_reduce(&comm, t, ReduceOp::Avg, usize::MAX).expect("fused");
                }),
                run(&mut |t, b| {
                    fused_all_reduce_with(&comm, t, ReduceOp::Avg, usize::MAX, b).expect("fused");
                }),
                run(&mut |t, _| {
                    half_all_reduce(&comm, t, &options, usize::MAX).expect("half");
                }),
                run(&mut |t, b| {
                    half_all_reduce_with(&comm, t, &options, usize::MAX, b).expect("half");
                }),
            ]
        })
        .expect("ranks ran");
        let t = times[0];
        for (name, fresh, reused) in [("fused f32", t[0], t[1]), ("half f16", t[2], t[3])] {
            println!(
                "{name:<14} {world:>3} {:>12.2} {:>12.2} {:>8.2}",
                fresh * 1e3,
                reused * 1e3,
                fresh / reused
            );
        }
    }
}
