//! The strategies on LocalComm against references computed in the test:
//! fused equals per-tensor, half within its rounding bound, sparse equal to
//! the rank-ordered sum of every rank's selection, the dense fallback, error
//! feedback's conservation, async equal to blocking, and the capacity check.

use gradwire_algos::{
    AlgoError, HalfOptions, HalfPrecision, all_reduce, fused_all_reduce, fused_all_reduce_async,
    half_all_reduce, sparse_all_reduce, sparse_all_reduce_async,
};
use gradwire_comm::{Communicator, ReduceOp, local};
use gradwire_compress::{ErrorFeedback, SparseCodec, select};
use gradwire_tensor::{DType, Tensor};
use proptest::prelude::*;

const SIZES: &[usize] = &[0, 1, 2, 3, 7, 31, 257, 1031];

/// Rank r's gradients for a list of sizes: deterministic, signed, spread.
fn grads(seed: u64, rank: usize, sizes: &[usize]) -> Vec<Vec<f32>> {
    let mut s = seed ^ (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    sizes
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
                })
                .collect()
        })
        .collect()
}

fn tensors(values: &[Vec<f32>], dtype: DType) -> Vec<Tensor> {
    values
        .iter()
        .map(|v| Tensor::from_f32(v, v.len(), dtype).unwrap())
        .collect()
}

fn bits(ts: &[Tensor]) -> Vec<Vec<u32>> {
    ts.iter()
        .map(|t| {
            t.to_f32_vec()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

fn setup() -> impl Strategy<Value = (usize, Vec<usize>, u64)> {
    (
        1usize..=8,
        prop::collection::vec(prop::sample::select(SIZES), 1..6),
        any::<u64>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn fused_equals_one_all_reduce_per_tensor((world, sizes, seed) in setup(), mixed: bool) {
        let results = local::run(world, |comm| {
            let mine = grads(seed, comm.rank(), &sizes);
            // Mixed dtypes fuse through an f32 buffer; compare like with like.
            let dtype_of = |i: usize| if mixed && i % 2 == 1 { DType::BF16 } else { DType::F32 };
            let make = || mine.iter().enumerate().map(|(i, v)| Tensor::from_f32(v, v.len(), dtype_of(i)).unwrap()).collect::<Vec<_>>();
            let mut fused = make();
            fused_all_reduce(&comm, &mut fused, ReduceOp::Sum, 1 << 20)?;
            // Per tensor, in f32 (what the fused buffer holds for a mixed list).
            let mut single: Vec<Tensor> = mine.iter().map(|v| Tensor::from_f32(v, v.len(), DType::F32).unwrap()).collect();
            if mixed {
                for (i, t) in single.iter_mut().enumerate() {
                    *t = t.to_dtype(dtype_of(i)).unwrap().to_dtype(DType::F32).unwrap();
                }
            }
            for t in &mut single {
                all_reduce(&comm, t, ReduceOp::Sum)?;
            }
            let single: Vec<Tensor> = single.iter().enumerate().map(|(i, t)| t.to_dtype(dtype_of(i)).unwrap()).collect();
            let async_fused = fused_all_reduce_async(&comm, make(), ReduceOp::Sum, 1 << 20)?.wait()?.value;
            Ok::<_, AlgoError>((bits(&fused), bits(&single), bits(&async_fused)))
        }).unwrap();
        let first = results[0].as_ref().unwrap().0.clone();
        for r in results {
            let (fused, single, async_fused) = r.unwrap();
            prop_assert_eq!(&fused, &single);
            prop_assert_eq!(&fused, &async_fused);
            prop_assert_eq!(&fused, &first, "ranks differ");
        }
    }

    #[test]
    fn half_is_dense_within_one_rounding((world, sizes, seed) in setup(), bf: bool) {
        let precision = if bf { HalfPrecision::BF16 } else { HalfPrecision::F16 };
        let u_half = if bf { 2f64.powi(-8) } else { 2f64.powi(-11) };
        let results = local::run(world, |comm| {
            let mine = grads(seed, comm.rank(), &sizes);
            let mut half = tensors(&mine, DType::F32);
            let options = HalfOptions { precision, clip: None, op: ReduceOp::Avg };
            half_all_reduce(&comm, &mut half, &options, 1 << 20)?;
            Ok::<_, AlgoError>(half.iter().map(|t| t.to_vec::<f32>().unwrap()).collect::<Vec<_>>())
        }).unwrap();
        let inputs: Vec<Vec<Vec<f32>>> = (0..world).map(|r| grads(seed, r, &sizes)).collect();
        for r in results {
            let got = r.unwrap();
            for (t, values) in got.iter().enumerate() {
                for (i, &g) in values.iter().enumerate() {
                    let column: Vec<f64> = inputs.iter().map(|x| f64::from(x[t][i])).collect();
                    let mean = column.iter().sum::<f64>() / world as f64;
                    let abs_mean = column.iter().map(|v| v.abs()).sum::<f64>() / world as f64;
                    // Each input rounded once to the wire, the f32 sum, one final rounding.
                    let bound = 2.0 * u_half * abs_mean + world as f64 * f64::from(f32::EPSILON) * abs_mean + 1e-7;
                    prop_assert!((f64::from(g) - mean).abs() <= bound, "{g} vs {mean} (bound {bound})");
                }
            }
        }
    }

    #[test]
    fn half_of_f32_tensors_equals_half_of_the_same_values_packed((world, sizes, seed) in setup(), bf: bool, clip: bool) {
        // f32 tensors are encoded straight into the wire; f16 ones are
        // packed into an f32 buffer first (as are zeroed tensors of any
        // dtype). The same values (f16s, so the f16 tensors hold them
        // exactly) must reduce to the same f32 bits either way, which the
        // f16 tensors then hold rounded.
        let precision = if bf { HalfPrecision::BF16 } else { HalfPrecision::F16 };
        let options = HalfOptions { precision, clip: clip.then_some(1.5), op: ReduceOp::Sum };
        let as_f16 = |values: &[Vec<f32>]| -> Vec<Vec<f32>> {
            tensors(values, DType::F16).iter().map(|t| t.to_f32_vec().unwrap()).collect()
        };
        let results = local::run(world, |comm| {
            let mine = as_f16(&grads(seed, comm.rank(), &sizes));
            let run = |dtype| -> Result<Vec<Vec<f32>>, AlgoError> {
                let mut list = tensors(&mine, dtype);
                half_all_reduce(&comm, &mut list, &options, 1 << 20)?;
                Ok(list.iter().map(|t| t.to_f32_vec().unwrap()).collect())
            };
            Ok::<_, AlgoError>((run(DType::F32)?, run(DType::F16)?))
        }).unwrap();
        for r in results {
            let (direct, packed) = r.unwrap();
            let to_bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
                v.iter().map(|t| t.iter().map(|x| x.to_bits()).collect()).collect()
            };
            prop_assert_eq!(to_bits(&as_f16(&direct)), to_bits(&packed));
        }
    }

    #[test]
    fn sparse_top_k_is_the_rank_ordered_sum_of_every_selection((world, sizes, seed) in setup(), ratio in prop_oneof![Just(0.01), Just(0.1), Just(0.3)]) {
        let codec = SparseCodec::TopK(ratio);
        let results = local::run(world, |comm| {
            let mut mine = tensors(&grads(seed, comm.rank(), &sizes), DType::F32);
            sparse_all_reduce(&comm, &mut mine, &codec, None)?;
            Ok::<_, AlgoError>(mine.iter().flat_map(|t| t.to_vec::<f32>().unwrap()).collect::<Vec<_>>())
        }).unwrap();
        // The reference: each rank's top-k of its flattened list, added into
        // zeros in rank order (or, if any selection is too dense, the dense sum).
        let flat: Vec<Vec<f32>> = (0..world).map(|r| grads(seed, r, &sizes).concat()).collect();
        let n = flat[0].len();
        let selections: Vec<_> = flat.iter().map(|x| select::top_k(x, ratio).unwrap()).collect();
        let largest = selections.iter().map(|s| s.nnz()).max().unwrap_or(0);
        let mut want = vec![0f32; n];
        if gradwire_algos::sparse_costs_more(largest, n, world) {
            for (i, w) in want.iter_mut().enumerate() {
                // LocalComm sums in rank order, starting from rank 0's value.
                *w = flat.iter().skip(1).fold(flat[0][i], |acc, x| acc + x[i]);
            }
        } else {
            for s in &selections {
                s.scatter_add(&mut want).unwrap();
            }
        }
        for r in results {
            let got = r.unwrap();
            prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
    }

    /// Random-k from one seed selects the same indices on every rank: the
    /// values alone are all-reduced (k entries, rank-ordered sum), and the
    /// traffic is that of an all-reduce of k values. From a seed of its own
    /// per rank, the selections differ and are all-gathered as before.
    #[test]
    fn shared_random_k_all_reduces_its_values_only((world, sizes, seed) in setup(), ratio in prop_oneof![Just(0.05), Just(0.2), Just(1.0)]) {
        let n: usize = sizes.iter().sum();
        let flat: Vec<Vec<f32>> = (0..world).map(|r| grads(seed, r, &sizes).concat()).collect();
        for own_seeds in [false, true] {
            let codec_of = |rank: usize| SparseCodec::RandomK {
                ratio,
                seed: if own_seeds { seed ^ rank as u64 } else { seed },
            };
            let results = local::run(world, |comm| {
                let mut mine = tensors(&grads(seed, comm.rank(), &sizes), DType::F32);
                let traffic = sparse_all_reduce(&comm, &mut mine, &codec_of(comm.rank()), None)?;
                Ok::<_, AlgoError>((mine.iter().flat_map(|t| t.to_vec::<f32>().unwrap()).collect::<Vec<_>>(), traffic))
            }).unwrap();
            let selections: Vec<_> = (0..world)
                .map(|r| codec_of(r).select(&flat[r]).unwrap())
                .collect();
            // Seeds of their own may still draw the same indices (small n):
            // what counts is that every selection is the same.
            let shared = world > 1 && selections.iter().all(|s| s.indices() == selections[0].indices());
            prop_assert!(own_seeds || world == 1 || shared);
            let mut want = vec![0f32; n];
            if shared {
                // The values' rank-ordered sum, starting from rank 0's.
                for (j, &i) in selections[0].indices().iter().enumerate() {
                    want[i as usize] = selections.iter().skip(1).fold(selections[0].values()[j], |acc, s| acc + s.values()[j]);
                }
            } else {
                let largest = selections.iter().map(|s| s.nnz()).max().unwrap_or(0);
                if gradwire_algos::sparse_costs_more(largest, n, world) {
                    for (i, w) in want.iter_mut().enumerate() {
                        *w = flat.iter().skip(1).fold(flat[0][i], |acc, x| acc + x[i]);
                    }
                } else {
                    for sel in &selections {
                        sel.scatter_add(&mut want).unwrap();
                    }
                }
            }
            for r in results {
                let (got, traffic) = r.unwrap();
                prop_assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                if shared {
                    let k = selections[0].nnz();
                    let expected = gradwire_algos::Traffic::all_reduce(24, world) + gradwire_algos::Traffic::all_reduce(4 * k, world);
                    prop_assert_eq!(traffic, expected);
                }
            }
        }
    }

    /// The sparse-or-dense decision: an all-gather of the largest payload
    /// from every rank against a ring all-reduce of the dense buffer.
    #[test]
    fn sparse_costs_more_is_the_world_aware_byte_count(largest in 0usize..1 << 20, n in 0usize..1 << 22, world in 1usize..=1024) {
        let payload = (24 + 8 * largest) as u128;
        let dense = 4 * n as u128;
        let want = if world == 1 { payload > dense } else { world as u128 * payload >= 2 * dense };
        prop_assert_eq!(gradwire_algos::sparse_costs_more(largest, n, world), want);
    }

    #[test]
    fn threshold_zero_and_ratio_one_fall_back_to_dense_exactly((world, sizes, seed) in setup()) {
        let results = local::run(world, |comm| {
            let mine = grads(seed, comm.rank(), &sizes);
            let mut dense = tensors(&mine, DType::F32);
            fused_all_reduce(&comm, &mut dense, ReduceOp::Sum, 1 << 20)?;
            let mut zero = tensors(&mine, DType::F32);
            sparse_all_reduce(&comm, &mut zero, &SparseCodec::Threshold(0.0), None)?;
            let mut all = tensors(&mine, DType::F32);
            let mut memory = ErrorFeedback::new(mine.iter().map(Vec::len).sum());
            sparse_all_reduce(&comm, &mut all, &SparseCodec::TopK(1.0), Some(&mut memory))?;
            let flushed = memory.residual().iter().all(|r| *r == 0.0);
            Ok::<_, AlgoError>((bits(&dense), bits(&zero), bits(&all), flushed))
        }).unwrap();
        for r in results {
            let (dense, zero, all, flushed) = r.unwrap();
            prop_assert_eq!(&zero, &dense);
            prop_assert_eq!(&all, &dense);
            prop_assert!(flushed);
        }
    }
}

#[test]
fn error_feedback_conserves_mass_across_steps_and_ranks() {
    let world = 4;
    let sizes = [1031, 257, 7];
    let n: usize = sizes.iter().sum();
    let steps = 6;
    let results = local::run(world, |comm| {
        let mut memory = Some(ErrorFeedback::new(n));
        let mut applied = vec![0f64; n];
        for step in 0..steps {
            let mine = tensors(&grads(step, comm.rank(), &sizes), DType::F32);
            let handle =
                sparse_all_reduce_async(&comm, mine, SparseCodec::TopK(0.05), memory.take())?;
            let reduced = handle.wait()?;
            let (sums, back) = reduced.value;
            memory = back;
            for (a, v) in applied
                .iter_mut()
                .zip(sums.iter().flat_map(|t| t.to_vec::<f32>().unwrap()))
            {
                *a += f64::from(v);
            }
        }
        let residual = memory.map(|m| m.residual().to_vec()).unwrap_or_default();
        Ok::<_, AlgoError>((applied, residual))
    })
    .unwrap();
    let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    // applied (the same on every rank) + every rank's residual == every gradient ever.
    for i in 0..n {
        let total: f64 = (0..world)
            .flat_map(|r| (0..steps).map(move |s| f64::from(grads(s, r, &sizes).concat()[i])))
            .sum();
        let residuals: f64 = results.iter().map(|(_, res)| f64::from(res[i])).sum();
        let got = results[0].0[i] + residuals;
        assert!(
            (got - total).abs() <= 1e-4 * (1.0 + total.abs()),
            "index {i}: {got} vs {total}"
        );
    }
    for (applied, _) in &results {
        assert_eq!(applied, &results[0].0, "ranks applied different sums");
    }
}

#[test]
fn a_list_beyond_the_capacity_is_refused_before_anything_is_sent() {
    let results = local::run(2, |comm| {
        let mut list = vec![
            Tensor::from_vec(vec![1f32; 10], 10).unwrap(),
            Tensor::from_vec(vec![1f32; 7], 7).unwrap(),
        ];
        let refused = fused_all_reduce(&comm, &mut list, ReduceOp::Sum, 16);
        let half = half_all_reduce(
            &comm,
            &mut list,
            &HalfOptions {
                precision: HalfPrecision::F16,
                clip: None,
                op: ReduceOp::Sum,
            },
            16,
        );
        // Nothing was sent: the next collective still pairs up.
        comm.barrier().map_err(AlgoError::from)?;
        Ok::<_, AlgoError>((refused, half, list[0].to_vec::<f32>().unwrap()))
    })
    .unwrap();
    for r in results {
        let (refused, half, untouched) = r.unwrap();
        assert!(matches!(
            refused,
            Err(AlgoError::Capacity {
                needed: 17,
                capacity: 16
            })
        ));
        assert!(matches!(half, Err(AlgoError::Capacity { .. })));
        assert_eq!(untouched, vec![1.0; 10]);
    }
}

#[test]
fn the_clip_clamps_what_is_reduced() {
    let results = local::run(2, |comm| {
        let mut list = vec![Tensor::from_vec(vec![1000f32, -1000.0, 0.5], 3).unwrap()];
        let options = HalfOptions {
            precision: HalfPrecision::F16,
            clip: Some(10.0),
            op: ReduceOp::Sum,
        };
        half_all_reduce(&comm, &mut list, &options, 16)?;
        Ok::<_, AlgoError>(list[0].to_vec::<f32>().unwrap())
    })
    .unwrap();
    for r in results {
        assert_eq!(r.unwrap(), vec![20.0, -20.0, 1.0]);
    }
}
