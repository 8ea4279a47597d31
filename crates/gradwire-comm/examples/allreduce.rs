//! Averages a model's gradients across W in-process ranks, the way a
//! data-parallel step does: pack the per-layer gradients into one fusion
//! buffer, all-reduce it (f32, then bf16 on the wire with f32 accumulation),
//! unpack, and check every rank holds the same average.
//!
//! `cargo run --release -p gradwire-comm --example allreduce -- [W] [hidden]`

use gradwire_comm::{CommError, Communicator, LocalComm, ReduceOp, local};
use gradwire_tensor::{DType, Tensor, flat};
use std::time::Instant;

/// Layer shapes of an MLP 784 -> hidden -> hidden -> 10 (weights and biases).
fn layer_shapes(hidden: usize) -> Vec<Vec<usize>> {
    vec![
        vec![hidden, 784],
        vec![hidden],
        vec![hidden, hidden],
        vec![hidden],
        vec![10, hidden],
        vec![10],
    ]
}

/// Rank r's gradient of layer l: a deterministic pattern, different per rank.
fn gradient(rank: usize, layer: usize, shape: &[usize]) -> Result<Tensor, CommError> {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|i| (((i * 31 + layer * 7 + rank * 13) % 97) as f32 - 48.0) / 48.0)
        .collect();
    Ok(Tensor::from_f32(&values, shape.to_vec(), DType::F32)?)
}

/// One averaging step on `comm` with the buffer in `wire` precision; returns
/// the averaged gradients and the seconds the all-reduce took.
fn average(comm: &LocalComm, hidden: usize, wire: DType) -> Result<(Vec<Tensor>, f64), CommError> {
    let shapes = layer_shapes(hidden);
    let mut grads = shapes
        .iter()
        .enumerate()
        .map(|(l, s)| gradient(comm.rank(), l, s))
        .collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<&Tensor> = grads.iter().collect();
    let (mut bucket, layout) = flat::pack_new(&refs, wire)?;
    comm.barrier()?;
    let start = Instant::now();
    comm.all_reduce_tensor(&mut bucket, ReduceOp::Avg)?;
    let seconds = start.elapsed().as_secs_f64();
    let mut outs: Vec<&mut Tensor> = grads.iter_mut().collect();
    flat::unpack(&bucket, &layout, &mut outs)?;
    Ok((grads, seconds))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let world: usize = args.next().map_or(Ok(4), |a| a.parse())?;
    let hidden: usize = args.next().map_or(Ok(1024), |a| a.parse())?;
    let params: usize = layer_shapes(hidden)
        .iter()
        .map(|s| s.iter().product::<usize>())
        .sum();
    println!(
        "averaging {params} gradients ({:.1} MiB in f32) over {world} ranks",
        params as f64 * 4.0 / 1048576.0
    );

    for wire in [DType::F32, DType::BF16] {
        // Three steps; the first warms caches, the best is reported.
        let results = local::run(world, |comm| {
            let mut best = f64::INFINITY;
            for _ in 0..2 {
                best = best.min(average(&comm, hidden, wire)?.1);
            }
            average(&comm, hidden, wire).map(|(grads, s)| (grads, s.min(best)))
        })?;
        let results = results.into_iter().collect::<Result<Vec<_>, _>>()?;
        // Every rank holds bitwise the same average ...
        for (rank, (grads, _)) in results.iter().enumerate() {
            for (a, b) in grads.iter().zip(&results[0].0) {
                assert_eq!(a.to_f32_vec()?, b.to_f32_vec()?, "rank {rank} differs");
            }
        }
        // ... which is the mean of the ranks' gradients, within the wire's precision.
        let mut worst = 0f64;
        for (l, shape) in layer_shapes(hidden).iter().enumerate() {
            let got = results[0].0[l].to_f32_vec()?;
            let ranks = (0..world)
                .map(|r| gradient(r, l, shape)?.to_f32_vec().map_err(CommError::from))
                .collect::<Result<Vec<_>, _>>()?;
            for (i, &g) in got.iter().enumerate() {
                let mean = ranks.iter().map(|x| f64::from(x[i])).sum::<f64>() / world as f64;
                worst = worst.max((f64::from(g) - mean).abs());
            }
        }
        let slowest = results.iter().map(|(_, s)| *s).fold(0.0, f64::max);
        let bytes = params * if wire == DType::F32 { 4 } else { 2 };
        println!(
            "{wire:>5} on the wire: all-reduce {:>8.3} ms, {:>6.2} GB/s bus bandwidth, largest error vs f64 mean {worst:.2e}",
            slowest * 1e3,
            2.0 * (world as f64 - 1.0) / world as f64 * bytes as f64 / slowest / 1e9
        );
    }
    Ok(())
}
