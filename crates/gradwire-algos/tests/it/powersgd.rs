//! PowerSGD over LocalComm against an f64 reference power iteration, for
//! W in 1..=8 and mixed shapes (vectors of length 0, 1 and primes sent
//! dense beside compressed matrices): the same bits on every rank, error
//! feedback conserving every rank's mass, dense steps before `start_step`,
//! and faults ending the call on every rank with the next call working.

use gradwire_algos::powersgd::{PowerSgd, PowerSgdConfig, Slot};
use gradwire_algos::{AlgoError, FaultKind};
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_compress::lowrank;
use gradwire_tensor::Tensor;
use proptest::prelude::*;

use crate::common::vector;

fn config(rank: usize) -> PowerSgdConfig {
    PowerSgdConfig {
        rank,
        start_step: 0,
        ..PowerSgdConfig::default()
    }
}

/// The f64 reference of one compressed step from `q0` (per matrix, `Qᵀ`:
/// rank x cols) and
/// zero residuals: the average of the dense tensors, and `P Qᵀ` for the
/// matrices (P summed then orthonormalised in f64, Q averaged).
fn reference(
    inputs: &[Vec<Vec<f32>>],
    shapes: &[Vec<usize>],
    q0: &[Vec<f32>],
    rank: usize,
) -> Vec<Vec<f64>> {
    let world = inputs.len() as f64;
    shapes
        .iter()
        .enumerate()
        .map(|(t, dims)| {
            let n: usize = dims.iter().product();
            match lowrank::matrix_shape(dims, rank, 2.0) {
                None => (0..n)
                    .map(|i| inputs.iter().map(|r| f64::from(r[t][i])).sum::<f64>() / world)
                    .collect(),
                Some((rows, cols)) => {
                    let q = &q0[t];
                    // P = sum_r M_r Q.
                    let mut p = vec![0.0f64; rows * rank];
                    for r in inputs {
                        for i in 0..rows {
                            for k in 0..rank {
                                p[i * rank + k] += (0..cols)
                                    .map(|j| {
                                        f64::from(r[t][i * cols + j]) * f64::from(q[k * cols + j])
                                    })
                                    .sum::<f64>();
                            }
                        }
                    }
                    // Gram-Schmidt in f64.
                    for k in 0..rank {
                        for l in 0..k {
                            let dot: f64 =
                                (0..rows).map(|i| p[i * rank + k] * p[i * rank + l]).sum();
                            for i in 0..rows {
                                p[i * rank + k] -= dot * p[i * rank + l];
                            }
                        }
                        let norm = (0..rows)
                            .map(|i| p[i * rank + k].powi(2))
                            .sum::<f64>()
                            .sqrt();
                        for i in 0..rows {
                            p[i * rank + k] /= norm;
                        }
                    }
                    // Q = mean_r M_rᵀ P.
                    let mut q = vec![0.0f64; cols * rank];
                    for r in inputs {
                        for j in 0..cols {
                            for k in 0..rank {
                                q[j * rank + k] += (0..rows)
                                    .map(|i| f64::from(r[t][i * cols + j]) * p[i * rank + k])
                                    .sum::<f64>()
                                    / world;
                            }
                        }
                    }
                    (0..rows * cols)
                        .map(|x| {
                            let (i, j) = (x / cols, x % cols);
                            (0..rank).map(|k| p[i * rank + k] * q[j * rank + k]).sum()
                        })
                        .collect()
                }
            }
        })
        .collect()
}

/// Every rank's tensors after one call of `all_reduce` with `q0` preset.
fn run_step(
    inputs: &[Vec<Vec<f32>>],
    shapes: &[Vec<usize>],
    q0: &[Vec<f32>],
    rank: usize,
) -> Vec<Vec<Vec<f32>>> {
    let results = local::run(inputs.len(), |comm: LocalComm| {
        let mut powersgd = PowerSgd::new(config(rank))?;
        powersgd.state_mut().slots = shapes
            .iter()
            .zip(q0)
            .map(|(dims, q)| {
                Some(Slot {
                    dims: dims.clone(),
                    q: q.clone(),
                    residual: Vec::new(),
                })
            })
            .collect();
        let mut tensors: Vec<Tensor> = shapes
            .iter()
            .zip(&inputs[comm.rank()])
            .map(|(dims, v)| Tensor::from_vec(v.clone(), dims.clone()))
            .collect::<Result<_, _>>()?;
        let slots: Vec<usize> = (0..shapes.len()).collect();
        powersgd.all_reduce(&comm, &mut tensors, &slots, 0)?;
        tensors
            .iter()
            .map(|t| Ok(t.to_vec::<f32>()?))
            .collect::<Result<Vec<_>, AlgoError>>()
    })
    .unwrap();
    results.into_iter().map(|r| r.unwrap()).collect()
}

fn shapes_strategy() -> impl Strategy<Value = Vec<Vec<usize>>> {
    prop::collection::vec(
        prop::sample::select(vec![
            vec![0],
            vec![1],
            vec![13],
            vec![3, 2],
            vec![31, 17],
            vec![64, 7],
            vec![8, 4, 3, 3],
            vec![1, 97],
        ]),
        1..5,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn one_step_matches_the_reference_power_iteration(
        world in 1usize..=8,
        rank in 1usize..=3,
        shapes in shapes_strategy(),
        seed: u64,
    ) {
        let inputs: Vec<Vec<Vec<f32>>> = (0..world)
            .map(|r| shapes.iter().enumerate().map(|(t, d)| {
                vector(seed ^ t as u64, r, d.iter().product())
            }).collect())
            .collect();
        let q0: Vec<Vec<f32>> = shapes.iter().enumerate().map(|(t, d)| {
            let cols: usize = d[1..].iter().product();
            let mut q = vec![0.0; cols * rank];
            lowrank::init_q(seed.wrapping_add(t as u64), &mut q);
            q
        }).collect();
        let got = run_step(&inputs, &shapes, &q0, rank);
        // The same bits on every rank.
        for (r, tensors) in got.iter().enumerate() {
            for (a, b) in tensors.iter().flatten().zip(got[0].iter().flatten()) {
                prop_assert_eq!(a.to_bits(), b.to_bits(), "rank {} differs", r);
            }
        }
        let want = reference(&inputs, &shapes, &q0, rank);
        for (t, (g, w)) in got[0].iter().zip(&want).enumerate() {
            // f32 sums of `rows` and `cols` terms per rank, over `world`
            // ranks, through both products (the orthonormalisation's
            // rounding is of the same order): a few ulps per term.
            let dims = &shapes[t];
            let rows = dims.first().copied().unwrap_or(1);
            let cols: usize = dims.iter().skip(1).product();
            let k = (rows + cols) * world;
            let bound = 4.0 * k as f64 * f64::from(f32::EPSILON);
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                prop_assert!((f64::from(*a) - b).abs() <= bound * (1.0 + b.abs()),
                    "tensor {} {:?} index {}: {} vs {}", t, dims, i, a, b);
            }
        }
    }

    #[test]
    fn error_feedback_conserves_every_ranks_mass(
        world in 1usize..=5,
        seed: u64,
    ) {
        // Over three steps: sum of results + final residual = sum of inputs,
        // on every rank (result_r + residual_r = input_r + residual_before_r).
        let shape = vec![19usize, 11];
        let n = 19 * 11;
        let results = local::run(world, |comm: LocalComm| {
            let mut powersgd = PowerSgd::new(config(1))?;
            let mut sent = vec![0.0f64; n];
            let mut given = vec![0.0f64; n];
            for step in 0..3u64 {
                let input = vector(seed ^ step, comm.rank(), n);
                for (g, v) in given.iter_mut().zip(&input) {
                    *g += f64::from(*v);
                }
                let mut t = [Tensor::from_vec(input, shape.clone())?];
                powersgd.all_reduce(&comm, &mut t, &[0], step)?;
                for (s, v) in sent.iter_mut().zip(t[0].to_vec::<f32>()?) {
                    *s += f64::from(v);
                }
            }
            let residual = &powersgd.state().slots[0].as_ref().unwrap().residual;
            Ok::<_, AlgoError>((0..n).map(|i| (given[i] - sent[i] - f64::from(residual[i])).abs()).fold(0.0, f64::max))
        }).unwrap();
        for r in results {
            let err = r.unwrap();
            prop_assert!(err < 1e-5, "mass lost: {}", err);
        }
    }
}

#[test]
fn dense_average_before_start_step() {
    let world = 3;
    let results = local::run(world, |comm: LocalComm| {
        let mut powersgd = PowerSgd::new(PowerSgdConfig {
            start_step: 5,
            ..config(2)
        })?;
        let input = vector(1, comm.rank(), 30 * 20);
        let mut t = [Tensor::from_vec(input, vec![30, 20])?];
        let traffic = powersgd.all_reduce(&comm, &mut t, &[0], 4)?;
        Ok::<_, AlgoError>((t[0].to_vec::<f32>()?, traffic))
    })
    .unwrap();
    let want: Vec<f32> = (0..600)
        .map(|i| {
            let s: f32 = (0..world).map(|r| vector(1, r, 600)[i]).sum();
            s / world as f32
        })
        .collect();
    for r in results {
        let (got, traffic) = r.unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 2.0 * f32::EPSILON, "{g} vs {w}");
        }
        assert_eq!(
            traffic.sent,
            gradwire_algos::Traffic::all_reduce(600 * 4, world).sent
        );
    }
}

#[test]
fn a_compressed_step_moves_the_factors_only() {
    let world = 4;
    let results = local::run(world, |comm: LocalComm| {
        let mut powersgd = PowerSgd::new(config(2))?;
        let mut t = [
            Tensor::from_vec(vector(3, comm.rank(), 256 * 128), vec![256, 128])?,
            Tensor::from_vec(vector(4, comm.rank(), 7), 7)?,
        ];
        let traffic = powersgd.all_reduce(&comm, &mut t, &[0, 1], 0)?;
        Ok::<_, AlgoError>(traffic)
    })
    .unwrap();
    let first = (256 * 2 + 7) * 4;
    let second = 128 * 2 * 4;
    let want = gradwire_algos::Traffic::all_reduce(first, world)
        + gradwire_algos::Traffic::all_reduce(second, world);
    for r in results {
        assert_eq!(r.unwrap(), want);
    }
}

#[test]
fn a_low_rank_average_is_learned_by_the_warm_start() {
    // Every rank's gradient is the same rank-2 matrix: after a few warm
    // steps the approximation is exact (the power iteration converged).
    let (rows, cols) = (40, 30);
    let u = vector(5, 0, rows * 2);
    let v = vector(6, 0, cols * 2);
    let mut m = vec![0.0f32; rows * cols];
    lowrank::reconstruct(&u, &v, rows, cols, &mut m).unwrap();
    let results = local::run(3, |comm: LocalComm| {
        let mut powersgd = PowerSgd::new(PowerSgdConfig {
            error_feedback: false,
            ..config(2)
        })?;
        let mut last = Vec::new();
        for step in 0..4 {
            let mut t = [Tensor::from_vec(m.clone(), vec![rows, cols])?];
            powersgd.all_reduce(&comm, &mut t, &[0], step)?;
            last = t[0].to_vec::<f32>()?;
        }
        Ok::<_, AlgoError>(last)
    })
    .unwrap();
    for r in results {
        for (a, b) in r.unwrap().iter().zip(&m) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
}

#[test]
fn a_fault_on_one_rank_ends_the_call_on_every_rank_and_the_next_works() {
    for world in [2usize, 3, 5] {
        let results = local::run(world, |comm: LocalComm| {
            let mut powersgd = PowerSgd::new(config(1))?;
            let mut input = vector(8, comm.rank(), 12 * 10);
            if comm.rank() == world - 1 {
                input[17] = f32::NAN;
            }
            let mut t = [Tensor::from_vec(input, vec![12, 10])?];
            let first = powersgd.all_reduce(&comm, &mut t, &[0], 0);
            // A slot whose shape changed: refused on that rank alone.
            let shape = if comm.rank() == 0 {
                vec![10, 12]
            } else {
                vec![12, 10]
            };
            let mut t = [Tensor::from_vec(vector(9, comm.rank(), 120), shape)?];
            let second = powersgd.all_reduce(&comm, &mut t, &[0], 1);
            let mut t = [Tensor::from_vec(
                vector(10, comm.rank(), 120),
                vec![12, 10],
            )?];
            let mut fresh = PowerSgd::new(config(1))?;
            let third = fresh.all_reduce(&comm, &mut t, &[0], 2);
            Ok::<_, AlgoError>((first, second, third.map(|_| ())))
        })
        .unwrap();
        for (r, result) in results.into_iter().enumerate() {
            let (first, second, third) = result.unwrap();
            match first {
                Err(AlgoError::Fault(f)) => {
                    assert_eq!((f.rank, f.kind), (Some(world - 1), FaultKind::NonFinite))
                }
                Err(e) if r == world - 1 => assert_eq!(e.fault_kind(), FaultKind::NonFinite),
                other => panic!("rank {r}: {other:?}"),
            }
            match second {
                Err(AlgoError::Fault(f)) => {
                    assert_eq!((f.rank, f.kind), (Some(0), FaultKind::InvalidArgument))
                }
                Err(e) if r == 0 => assert_eq!(e.fault_kind(), FaultKind::InvalidArgument),
                other => panic!("rank {r}: {other:?}"),
            }
            third.unwrap();
        }
    }
}

#[test]
fn bad_settings_are_refused() {
    let result = PowerSgd::new(config(0));
    assert!(
        matches!(&result, Err(AlgoError::InvalidArgument(m)) if m.contains("PowerSGD's rank must be positive")),
        "{:?}",
        result.err()
    );
    let result = PowerSgd::new(PowerSgdConfig {
        min_compression_rate: f64::NAN,
        ..config(1)
    });
    assert!(
        matches!(&result, Err(AlgoError::InvalidArgument(m))
            if m.contains("min_compression_rate must be finite and at least 1, got NaN")),
        "{:?}",
        result.err()
    );
}
