//! The quantized all-reduce over LocalComm, W in 1..=8, lengths 0, 1,
//! primes and chunk boundaries: the same bits on every rank; min-max uint8
//! within its two roundings of the true average; error feedback on both
//! sides conserving the mass of every step (the outputs plus the residuals
//! are exactly what was given); QSGD unbiased through the exchange; the
//! bytes of a ring all-reduce of the payload; a fault on one rank ending
//! the call everywhere with the next call working.

use gradwire_algos::quantized::QuantizedAllReduce;
use gradwire_algos::{AlgoError, FaultKind, Traffic};
use gradwire_comm::{Communicator, LocalComm, chunk_range, local};
use gradwire_compress::Quantizer;
use gradwire_tensor::{DType, Tensor};
use proptest::prelude::*;

use crate::common::vector;

/// Splits `v` into tensors of `sizes`.
fn tensors(v: &[f32], sizes: &[usize]) -> Vec<Tensor> {
    let mut at = 0;
    sizes
        .iter()
        .map(|&n| {
            let t = Tensor::from_vec(v[at..at + n].to_vec(), n).unwrap();
            at += n;
            t
        })
        .collect()
}

fn flatten(ts: &[Tensor]) -> Vec<f32> {
    ts.iter().flat_map(|t| t.to_vec::<f32>().unwrap()).collect()
}

fn sizes_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(
        prop::sample::select(vec![0usize, 1, 2, 13, 511, 512, 513, 1031]),
        1..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn min_max_is_the_average_within_two_roundings_on_every_rank_alike(
        world in 1usize..=8, sizes in sizes_strategy(), seed: u64,
    ) {
        let n: usize = sizes.iter().sum();
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| vector(seed, r, n)).collect();
        let results = local::run(world, |comm: LocalComm| {
            let mut q = QuantizedAllReduce::new(Quantizer::MinMaxU8, false)?;
            let mut ts = tensors(&inputs[comm.rank()], &sizes);
            q.all_reduce(&comm, &mut ts, 0)?;
            Ok::<_, AlgoError>(flatten(&ts))
        }).unwrap();
        let results: Vec<Vec<f32>> = results.into_iter().map(|r| r.unwrap()).collect();
        for r in &results {
            prop_assert!(r.iter().zip(&results[0]).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        // Inputs in [-0.5, 0.5): a chunk's range is at most 1, a step 1/255;
        // each of the two roundings is at most half a step.
        for (i, got) in results[0].iter().enumerate() {
            let want: f64 = inputs.iter().map(|v| f64::from(v[i])).sum::<f64>() / world as f64;
            prop_assert!((f64::from(*got) - want).abs() <= 1.0 / 255.0 + 1e-6, "{}: {} vs {}", i, got, want);
        }
    }

    #[test]
    fn error_feedback_conserves_the_mass_of_every_step(
        world in 1usize..=6, n in prop::sample::select(vec![1usize, 7, 97, 1031]), seed: u64,
        quantizer in prop::sample::select(vec![
            Quantizer::Sign, Quantizer::MinMaxU8, Quantizer::Qsgd { levels: 2, seed: 4, norm: gradwire_compress::QsgdNorm::L2 },
        ]),
    ) {
        // sum_t out_t + mean_r worker_r + server = sum_t mean_r g_{r,t}.
        let steps = 5u64;
        let results = local::run(world, |comm: LocalComm| {
            let mut q = QuantizedAllReduce::new(quantizer, true)?;
            let mut out = vec![0f64; n];
            for step in 0..steps {
                let mut ts = [Tensor::from_vec(vector(seed ^ step, comm.rank(), n), n)?];
                q.all_reduce(&comm, &mut ts, step)?;
                for (o, v) in out.iter_mut().zip(ts[0].to_vec::<f32>()?) {
                    *o += f64::from(v);
                }
            }
            Ok::<_, AlgoError>((out, q.state().clone()))
        }).unwrap();
        let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
        for i in 0..n {
            let given: f64 = (0..steps)
                .map(|step| (0..world).map(|r| f64::from(vector(seed ^ step, r, n)[i])).sum::<f64>() / world as f64)
                .sum();
            let owner = (0..world).find(|&c| chunk_range(n, world, c).contains(&i)).unwrap();
            let server = f64::from(results[owner].1.server[i - chunk_range(n, world, owner).start]);
            let worker: f64 = results.iter().map(|(_, s)| f64::from(s.worker[i])).sum::<f64>() / world as f64;
            let kept = results[0].0[i] + worker + server;
            prop_assert!((kept - given).abs() <= 1e-5 * steps as f64, "{:?} entry {}: {} vs {}", quantizer, i, kept, given);
        }
    }
}

#[test]
fn qsgd_is_unbiased_through_the_exchange() {
    // The same inputs every step, fresh streams: the mean output converges
    // to the true average (5 standard errors; levels 4 of the max-norm, so
    // a level is at most 0.125 of the inputs' scale of 0.5, twice rounded;
    // the 2-norm's coarser levels are the codec tests').
    let (world, n, steps) = (3, 600, 600u64);
    let results = local::run(world, |comm: LocalComm| {
        let mut q = QuantizedAllReduce::new(
            Quantizer::Qsgd {
                levels: 4,
                seed: 8,
                norm: gradwire_compress::QsgdNorm::Max,
            },
            false,
        )?;
        let mut sum = vec![0f64; n];
        for step in 0..steps {
            let mut ts = [Tensor::from_vec(vector(21, comm.rank(), n), n)?];
            q.all_reduce(&comm, &mut ts, step)?;
            for (s, v) in sum.iter_mut().zip(ts[0].to_vec::<f32>()?) {
                *s += f64::from(v);
            }
        }
        Ok::<_, AlgoError>(sum)
    })
    .unwrap();
    let sum = results.into_iter().next().unwrap().unwrap();
    // Per entry: a worker rounding of sd <= level/2 per rank, averaged
    // over W, and a server rounding of sd <= level/2.
    let level = 0.5 / 4.0;
    let sd = (level / 2.0) * (1.0 / world as f64 + 1.0).sqrt();
    let bound = 5.0 * sd / (steps as f64).sqrt();
    for (i, s) in sum.iter().enumerate() {
        let want: f64 = (0..world)
            .map(|r| f64::from(vector(21, r, n)[i]))
            .sum::<f64>()
            / world as f64;
        let mean = s / steps as f64;
        assert!(
            (mean - want).abs() <= bound,
            "{i}: {mean} vs {want} (bound {bound})"
        );
    }
}

#[test]
fn one_bit_moves_a_32nd_of_a_dense_ring() {
    for world in [2usize, 4, 8] {
        let n = 1 << 16;
        let results = local::run(world, |comm: LocalComm| {
            let mut q = QuantizedAllReduce::new(Quantizer::Sign, true)?;
            let mut ts = [Tensor::from_vec(vector(1, comm.rank(), n), n)?];
            q.all_reduce(&comm, &mut ts, 0)
        })
        .unwrap();
        let dense = Traffic::all_reduce(n * 4, world);
        for r in results {
            let t = r.unwrap();
            let ratio = dense.sent as f64 / t.sent as f64;
            // 32x less, but for the scales (4 bytes per chunk).
            assert!((30.0..=32.0).contains(&ratio), "W = {world}: {ratio}");
            assert_eq!(t.sent, t.received, "W = {world}");
        }
    }
}

#[test]
fn a_fault_on_one_rank_ends_the_call_on_every_rank_and_the_next_works() {
    for world in [1usize, 2, 3, 5] {
        let results = local::run(world, |comm: LocalComm| {
            let mut q = QuantizedAllReduce::new(Quantizer::Sign, true)?;
            let mut v = vector(2, comm.rank(), 100);
            if comm.rank() == world - 1 {
                v[50] = f32::NAN;
            }
            let first = q.all_reduce(&comm, &mut [Tensor::from_vec(v, 100)?], 0);
            let mut ts = [Tensor::from_vec(vector(3, comm.rank(), 100), 100)?];
            let second = q.all_reduce(&comm, &mut ts, 1).map(|_| flatten(&ts));
            Ok::<_, AlgoError>((first.err(), second))
        })
        .unwrap();
        let mut outputs = Vec::new();
        for (r, result) in results.into_iter().enumerate() {
            let (first, second) = result.unwrap();
            match first {
                Some(AlgoError::Fault(f)) => {
                    assert_eq!((f.rank, f.kind), (Some(world - 1), FaultKind::NonFinite))
                }
                Some(e) if r == world - 1 => assert_eq!(e.fault_kind(), FaultKind::NonFinite),
                other => panic!("W = {world}, rank {r}: {other:?}"),
            }
            outputs.push(second.unwrap());
        }
        assert!(outputs.iter().all(|o| o == &outputs[0]));
    }
}

/// Ranks whose tensors differ in length (primes, one rank off by one) all
/// get the same `Mismatch` before any paired exchange, instead of waiting
/// for partners that never match; the next call of equal lengths works.
#[test]
fn lengths_that_differ_are_a_mismatch_on_every_rank() {
    for world in 2..=5usize {
        let results = local::run(world, |comm: LocalComm| {
            let mut q = QuantizedAllReduce::new(Quantizer::MinMaxU8, true)?;
            let n = if comm.rank() == world - 1 { 102 } else { 101 };
            let mut ts = [Tensor::from_vec(vector(4, comm.rank(), n), n)?];
            let first = q.all_reduce(&comm, &mut ts, 0).map(|_| ());
            let mut ts = [Tensor::from_vec(vector(5, comm.rank(), 13), 13)?];
            let second = q.all_reduce(&comm, &mut ts, 1).map(|_| flatten(&ts));
            Ok::<_, AlgoError>((first, second))
        })
        .unwrap();
        let mut outputs = Vec::new();
        for (r, result) in results.into_iter().enumerate() {
            let (first, second) = result.unwrap();
            assert_eq!(
                first.as_ref().err().map(AlgoError::kind),
                Some(gradwire_tensor::ErrorKind::Mismatch),
                "W = {world}, rank {r}: {first:?}"
            );
            outputs.push(second.unwrap());
        }
        assert!(outputs.iter().all(|o| o == &outputs[0]));
    }
}

/// A reversed range in a layout is refused as an invalid argument on every
/// rank (it underflowed in the length check before).
#[test]
fn a_reversed_range_is_refused_alike() {
    let results = local::run(2, |comm: LocalComm| {
        let mut q = QuantizedAllReduce::new(Quantizer::MinMaxU8, false)?;
        let mut ts = [Tensor::from_vec(vec![1.0f32; 4], 4)?];
        // Ends before it starts.
        let reversed = [std::ops::Range { start: 6, end: 2 }];
        Ok::<_, AlgoError>(q.all_reduce_in(&comm, &mut ts, &reversed, 8, 0).map(|_| ()))
    })
    .unwrap();
    for r in results {
        let err = r.unwrap().unwrap_err();
        assert_eq!(
            err.kind(),
            gradwire_tensor::ErrorKind::InvalidArgument,
            "{err}"
        );
    }
}

#[test]
fn device_or_half_tensors_are_refused_alike() {
    let results = local::run(2, |comm: LocalComm| {
        let mut q = QuantizedAllReduce::new(Quantizer::MinMaxU8, false)?;
        let t = if comm.rank() == 0 {
            Tensor::from_vec(vec![half::f16::from_f32(1.0); 4], 4)?
        } else {
            Tensor::from_vec(vec![1.0f32; 4], 4)?
        };
        Ok::<_, AlgoError>(q.all_reduce(&comm, &mut [t], 0).map(|_| ()))
    })
    .unwrap();
    // Rank 0 refuses its f16 tensor; rank 1 gets rank 0's fault.
    for (rank, r) in results.into_iter().enumerate() {
        let result = r.unwrap();
        match (rank, &result) {
            (
                0,
                Err(
                    e @ AlgoError::Tensor(gradwire_tensor::Error::DTypeMismatch {
                        got: DType::F16,
                        ..
                    }),
                ),
            ) => assert_eq!(e.fault_kind(), FaultKind::InvalidArgument),
            (1, Err(AlgoError::Fault(f)))
                if (f.rank, f.kind) == (Some(0), FaultKind::InvalidArgument) => {}
            _ => panic!("rank {rank}: {result:?}"),
        }
    }
}

#[test]
fn state_follows_each_tensor_when_only_some_take_part() {
    // Three tensors of a 9 + 5 + 7 layout; steps send all, then the first
    // and last, then the middle one, then all again. Per entry of the full
    // layout: what came out over the steps it was sent, plus the mean of
    // the worker residuals, plus the server residual (of the last step's
    // layout), is what was given, for every quantizer and world size.
    let sizes = [9usize, 5, 7];
    let full: Vec<std::ops::Range<usize>> = vec![0..9, 9..14, 14..21];
    let schedule: [&[usize]; 4] = [&[0, 1, 2], &[0, 2], &[1], &[0, 1, 2]];
    for quantizer in [Quantizer::Sign, Quantizer::MinMaxU8] {
        for world in [1usize, 2, 3] {
            let results = local::run(world, |comm: LocalComm| {
                let mut q = QuantizedAllReduce::new(quantizer, true)?;
                let mut out = vec![0f64; 21];
                let mut given = vec![0f64; 21];
                for (step, sent) in schedule.iter().enumerate() {
                    let mut ts = Vec::new();
                    let mut ranges = Vec::new();
                    for &k in sent.iter() {
                        let v = vector(step as u64 * 7 + k as u64, comm.rank(), sizes[k]);
                        ts.push(Tensor::from_vec(v, sizes[k])?);
                        ranges.push(full[k].clone());
                    }
                    q.all_reduce_in(&comm, &mut ts, &ranges, 21, step as u64)?;
                    for (t, r) in ts.iter().zip(&ranges) {
                        for (o, v) in out[r.clone()].iter_mut().zip(t.to_vec::<f32>()?) {
                            *o += f64::from(v);
                        }
                    }
                    for &k in sent.iter() {
                        for r in 0..comm.world_size() {
                            let v = vector(step as u64 * 7 + k as u64, r, sizes[k]);
                            for (g, x) in given[full[k].clone()].iter_mut().zip(v) {
                                *g += f64::from(x) / comm.world_size() as f64;
                            }
                        }
                    }
                }
                Ok::<_, AlgoError>((out, given, q.state().clone()))
            })
            .unwrap();
            let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
            let layout = &results[0].2.layout;
            let n: usize = layout.iter().map(|r| r.len()).sum();
            for e in 0..21 {
                let worker: f64 = results
                    .iter()
                    .map(|(_, _, s)| f64::from(s.worker[e]))
                    .sum::<f64>()
                    / world as f64;
                // The server residual of the packed position of `e`, if sent last.
                let mut server = 0.0;
                let mut packed = 0;
                for r in layout {
                    if r.contains(&e) {
                        let p = packed + (e - r.start);
                        let owner = (0..world)
                            .find(|&c| chunk_range(n, world, c).contains(&p))
                            .unwrap();
                        server = f64::from(
                            results[owner].2.server[p - chunk_range(n, world, owner).start],
                        );
                    }
                    packed += r.len();
                }
                let (out, given) = (results[0].0[e], results[0].1[e]);
                assert!(
                    (out + worker + server - given).abs() < 1e-5,
                    "{quantizer:?}, W = {world}, entry {e}: {} vs {given}",
                    out + worker + server
                );
            }
        }
    }
}
