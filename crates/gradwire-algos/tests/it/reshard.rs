//! Resuming at another world size (`Strategy::reshard_state`): after a
//! few steps on W ranks, the state every rank saved is resharded for W'
//! ranks, and what the new ranks still owe the combined result equals, up
//! to the rounding of one f32 mean, what the old ones owed: per entry,
//! `(1 / W) sum_r e_r` of the error-feedback residuals (sparse, PowerSGD,
//! the quantized worker residuals) plus, for the quantized all-reduce, the
//! server residual every old rank kept for its chunk; the local momentum's
//! average is kept. The resharded state loads into a fresh strategy on
//! every new rank, and the next step combines alike on all of them.

use gradwire_algos::{
    BucketView, PowerSgd, PowerSgdConfig, QuantizedAllReduce, SparseSelect, StateDict, Strategy,
};
use gradwire_comm::{Communicator, LocalComm, chunk_range, local};
use gradwire_compress::{Quantizer, SparseCodec};
use gradwire_tensor::Tensor;

use crate::common::vector;

/// The bucket: vectors of lengths 0, 1, 7, a prime, and two matrices
/// (which PowerSGD compresses).
const SHAPES: &[&[usize]] = &[&[0], &[1], &[7], &[257], &[32, 16], &[24, 20]];

fn lens() -> Vec<usize> {
    SHAPES.iter().map(|s| s.iter().product()).collect()
}

type Make = fn() -> Box<dyn Strategy<LocalComm>>;

fn strategies() -> Vec<(&'static str, Make)> {
    vec![
        ("top-k with error feedback", || {
            let n = lens().iter().sum();
            Box::new(SparseSelect::new(SparseCodec::TopK(0.05), Some(n)))
        }),
        ("1-bit with error feedback", || {
            Box::new(QuantizedAllReduce::new(Quantizer::Sign, true).unwrap())
        }),
        ("uint8 with error feedback and momentum", || {
            Box::new(
                QuantizedAllReduce::new(Quantizer::MinMaxU8, true)
                    .unwrap()
                    .with_momentum(0.9)
                    .unwrap(),
            )
        }),
        ("PowerSGD rank 2", || {
            Box::new(
                PowerSgd::new(PowerSgdConfig {
                    rank: 2,
                    start_step: 0,
                    ..PowerSgdConfig::default()
                })
                .unwrap(),
            )
        }),
    ]
}

/// `steps` steps of `make`'s strategy on `world` ranks (each from `state`
/// if given, the same on every rank), then every rank's saved state and
/// its last combined tensors.
fn run(
    make: Make,
    world: usize,
    steps: u64,
    first_step: u64,
    state: Option<&StateDict>,
) -> Vec<(StateDict, Vec<Vec<f32>>)> {
    local::run(world, |comm: LocalComm| {
        let mut strategy = make();
        if let Some(state) = state {
            strategy.load_state(0, state, false)?;
            strategy.load_state(0, state, true)?;
        }
        let lens = lens();
        let written = vec![true; lens.len()];
        let mut combined = Vec::new();
        for step in first_step..first_step + steps {
            let mut tensors: Vec<Tensor> = SHAPES
                .iter()
                .enumerate()
                .map(|(i, dims)| {
                    let n = dims.iter().product();
                    let seed = step * 31 + i as u64;
                    Tensor::from_vec(vector(seed, comm.rank(), n), dims.to_vec())
                })
                .collect::<Result<_, _>>()?;
            let view = BucketView {
                index: 0,
                lens: &lens,
                written: &written,
                step,
                capacity: usize::MAX,
            };
            strategy.combine(&comm, &view, &mut tensors)?;
            strategy.end_step(0, true);
            combined = tensors
                .iter()
                .map(|t| t.to_f32_vec())
                .collect::<Result<_, _>>()?;
        }
        let mut saved = StateDict::default();
        strategy.save_state(0, &mut saved)?;
        Ok::<_, gradwire_algos::AlgoError>((saved, combined))
    })
    .expect("the ranks ran")
    .into_iter()
    .map(|r| r.expect("a rank's steps"))
    .collect()
}

/// Per entry of every per-rank tensor, what the ranks whose states are
/// `saved` still owe the combined result, in f64: each rank's residual (or
/// momentum) divided by the world size, plus the quantized all-reduce's
/// server residuals (whole, at the entries of the layout they belong to).
fn owed(saved: &[&StateDict]) -> Vec<(String, Vec<f64>)> {
    let world = saved.len() as f64;
    let mut owed: Vec<(String, Vec<f64>)> = Vec::new();
    for key in saved[0].tensors.keys() {
        let per_rank = key.ends_with("/residual")
            || key.starts_with("residual/")
            || key.ends_with("/worker")
            || key.ends_with("/momentum");
        if !per_rank {
            continue;
        }
        let mut sum = vec![0f64; saved[0].f32s(key).unwrap().len()];
        for state in saved {
            for (s, v) in sum.iter_mut().zip(state.f32s(key).unwrap()) {
                *s += f64::from(v) / world;
            }
        }
        if let Some(prefix) = key.strip_suffix("/worker") {
            for (rank, state) in saved.iter().enumerate() {
                let server = state.f32s(&format!("{prefix}/server")).unwrap();
                let layout: Vec<[usize; 2]> =
                    serde_json::from_value(state.values[&format!("{prefix}/layout")].clone())
                        .unwrap();
                let sent: usize = layout.iter().map(|[a, b]| b - a).sum();
                let own = chunk_range(sent, saved.len(), rank);
                let entries = layout.iter().flat_map(|&[a, b]| a..b);
                for (p, full) in entries.enumerate() {
                    if own.contains(&p) {
                        sum[full] += f64::from(server[p - own.start]);
                    }
                }
            }
        }
        owed.push((key.clone(), sum));
    }
    owed
}

#[test]
fn resharding_keeps_what_the_ranks_owe_and_the_next_step_agrees() {
    for (name, make) in strategies() {
        for old in [2usize, 3, 5] {
            let before = run(make, old, 3, 0, None);
            let saved: Vec<&StateDict> = before.iter().map(|(s, _)| s).collect();
            let expected = owed(&saved);
            assert!(
                expected.iter().any(|(_, v)| v.iter().any(|&x| x != 0.0)),
                "{name}, W = {old}: no state to reshard"
            );
            for new in [1usize, 2, 4, 7] {
                let what = format!("{name}, W = {old} -> {new}");
                let mut resharded = saved[0].clone();
                make()
                    .reshard_state(0, &saved, &mut resharded)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                // Every new rank holds `resharded`: it owes it W' times.
                let copies = vec![&resharded; new];
                for ((key, want), (_, got)) in expected.iter().zip(owed(&copies)) {
                    let scale = want.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
                    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                        assert!(
                            (w - g).abs() <= 4.0 * f64::from(f32::EPSILON) * scale,
                            "{what}: {key}[{i}] owes {g}, the old ranks owed {w}"
                        );
                    }
                }
                // It loads, and the next step combines alike everywhere.
                let after = run(make, new, 1, 3, Some(&resharded));
                for (rank, (_, combined)) in after.iter().enumerate() {
                    assert_eq!(combined, &after[0].1, "{what}: rank {rank}");
                    assert!(
                        combined.iter().flatten().all(|v| v.is_finite()),
                        "{what}: rank {rank}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_residual_saved_by_only_some_ranks_is_a_state_mismatch() {
    let (_, make) = strategies()[0];
    let before = run(make, 3, 2, 0, None);
    let mut saved: Vec<StateDict> = before.into_iter().map(|(s, _)| s).collect();
    saved[1].tensors.clear();
    let saved: Vec<&StateDict> = saved.iter().collect();
    let mut out = saved[0].clone();
    let result = make().reshard_state(0, &saved, &mut out);
    assert!(
        matches!(result, Err(gradwire_algos::AlgoError::StateMismatch(_))),
        "{result:?}"
    );
}
