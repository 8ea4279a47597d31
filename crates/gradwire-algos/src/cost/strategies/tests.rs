//! The model against the strategies themselves, run in-process on
//! LocalComm (DistOpt's buckets and votes are checked against real
//! DistOpt steps in gradwire-experiments' tests, which can reach gradwire-optim).

use super::*;
use crate::cost::fragment_ranges;
use crate::cost::tests::refused;
use crate::dimreduce::{DimReduce, DimReduceConfig, Pca};
use crate::{AdaSum, PowerSgd, PowerSgdConfig, QuantizedAllReduce, sparse_all_reduce};
use gradwire_comm::{Communicator, local};
use gradwire_compress::{CompressError, SparseCodec};
use gradwire_tensor::Tensor;

/// Shapes with a conv kernel, matrices, vectors and an odd length.
fn shapes() -> Vec<Vec<usize>> {
    vec![
        vec![16, 3, 3, 3],
        vec![16],
        vec![300, 64],
        vec![300],
        vec![10, 300],
        vec![10],
        vec![7],
    ]
}

/// One bucket holding every tensor: the model's calls without the vote
/// (the step's first: its flags and every rank's arrival).
fn one_bucket(spec: &StrategySpec, shapes: &[Vec<usize>], world: usize) -> Vec<CollectiveCall> {
    let bucketing = Bucketing {
        fusion_threshold: usize::MAX,
        capacity: usize::MAX,
        vote_per_bucket: true,
    };
    let mut calls = step_collectives(spec, shapes, world, &bucketing).unwrap();
    let vote = calls.remove(0);
    assert_eq!(
        vote,
        CollectiveCall::all_reduce(shapes.len() + ARRIVAL_BYTES * world, world)
    );
    // The step ends with the agreement on the updates.
    assert_eq!(calls.pop(), Some(agreement(world)));
    calls
}

/// The agreement that ends every gradient step: a barrier.
fn agreement(world: usize) -> CollectiveCall {
    CollectiveCall::new(Collective::Barrier, world, 0)
}

/// Gradient-like tensors for `rank`, different on every rank.
fn tensors(shapes: &[Vec<usize>], rank: usize) -> Vec<Tensor> {
    shapes
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let n: usize = s.iter().product();
            let v = (0..n)
                .map(|i| (((i * 31 + k * 7 + rank * 13) % 101) as f32 - 50.0) * 1e-3)
                .collect();
            Tensor::from_vec(v, s.clone()).unwrap()
        })
        .collect()
}

/// Rank 0's `Traffic.sent` of `f` on `world` ranks (as the model's
/// per-step f64, which holds these counts exactly).
fn sent_by_rank0<F>(world: usize, f: F) -> f64
where
    F: Fn(&gradwire_comm::LocalComm, &mut Vec<Tensor>) -> Result<Traffic> + Sync,
{
    let out = local::run(world, |comm| {
        let mut t = tensors(&shapes(), comm.rank());
        f(&comm, &mut t)
    })
    .unwrap();
    out.into_iter().next().unwrap().unwrap().sent as f64
}

#[test]
fn buckets_follow_singas_grouping() {
    let lens = [5, 3, 10, 2, 2, 1];
    assert_eq!(plan_buckets(&lens, 6, 100).unwrap(), vec![0..2, 2..3, 3..6]);
    assert_eq!(plan_buckets(&lens, 100, 100).unwrap(), vec![0..6]);
    assert!(matches!(
        plan_buckets(&lens, 6, 9),
        Err(AlgoError::Capacity {
            needed: 10,
            capacity: 9
        })
    ));
    assert_eq!(plan_buckets(&[], 6, 9).unwrap(), Vec::<Range<usize>>::new());
}

#[test]
fn bad_settings_are_errors() {
    let b = Bucketing::default();
    let s = shapes();
    for (bad, what) in [
        (
            StrategySpec::TopK { ratio: 0.0 },
            "a sparse ratio must be in (0, 1], got 0",
        ),
        (
            StrategySpec::RandomK { ratio: 1.5 },
            "a sparse ratio must be in (0, 1], got 1.5",
        ),
        (
            StrategySpec::SampledTopK {
                ratio: 0.01,
                overshoot: 2.0,
            },
            "sampled top-k keeps 1 to 1.3 times k, got 2",
        ),
        (
            StrategySpec::PowerSgd {
                rank: 0,
                min_compression_rate: 2.0,
            },
            "PowerSGD's rank must be positive",
        ),
        (
            StrategySpec::Outer {
                sync_every: 0,
                fragments: 1,
                delay: 0,
                codec: Box::new(StrategySpec::Dense),
            },
            "a round takes at least one inner step",
        ),
        (
            StrategySpec::Outer {
                sync_every: 4,
                fragments: 1,
                delay: 0,
                codec: Box::new(StrategySpec::AdaSum),
            },
            "AdaSum cannot carry a pseudo-gradient",
        ),
        (
            StrategySpec::Outer {
                sync_every: 4,
                fragments: 1,
                delay: 0,
                codec: Box::new(StrategySpec::TopK { ratio: 2.0 }),
            },
            "a sparse ratio must be in (0, 1], got 2",
        ),
        (
            StrategySpec::Outer {
                sync_every: 6,
                fragments: 4,
                delay: 0,
                codec: Box::new(StrategySpec::Dense),
            },
            "4 fragments must divide a round of 6 steps",
        ),
        (
            StrategySpec::Outer {
                sync_every: 8,
                fragments: 2,
                delay: 4,
                codec: Box::new(StrategySpec::Dense),
            },
            "must come before the next fragment leaves, 4 steps later",
        ),
    ] {
        refused(step_collectives(&bad, &s, 4, &b), what);
    }
    // The quantizer's own check, the codec's error.
    let bad = StrategySpec::Quantized {
        quantizer: Quantizer::Qsgd {
            levels: 0,
            seed: 1,
            norm: gradwire_compress::QsgdNorm::L2,
        },
    };
    let result = step_collectives(&bad, &s, 4, &b);
    assert!(
        matches!(&result, Err(AlgoError::Compress(CompressError::InvalidArgument(m)))
            if m.contains("QSGD's levels must be 1 to 127, got 0")),
        "{result:?}"
    );
    refused(
        step_collectives(&StrategySpec::Dense, &s, 0, &b),
        "a world of 0 ranks",
    );
    refused(
        step_collectives(&StrategySpec::Dense, &[vec![usize::MAX, 2]], 2, &b),
        &format!("shape {:?} overflows", [usize::MAX, 2]),
    );
}

#[test]
fn one_rank_sends_nothing() {
    for spec in [
        StrategySpec::Dense,
        StrategySpec::TopK { ratio: 0.01 },
        StrategySpec::RandomK { ratio: 0.01 },
        StrategySpec::Quantized {
            quantizer: Quantizer::Sign,
        },
        StrategySpec::AdaSum,
        StrategySpec::DimReduce {
            components: 4,
            trials: 2,
        },
    ] {
        let calls = step_collectives(&spec, &shapes(), 1, &Bucketing::default()).unwrap();
        assert_eq!(bytes_sent(&calls), 0.0, "{spec:?}");
    }
}

#[test]
fn sparse_exchanges_match_the_model() {
    for world in 1..=5 {
        for (spec, codec) in [
            (StrategySpec::TopK { ratio: 0.01 }, SparseCodec::TopK(0.01)),
            (StrategySpec::TopK { ratio: 0.3 }, SparseCodec::TopK(0.3)),
            (
                StrategySpec::RandomK { ratio: 0.05 },
                SparseCodec::RandomK {
                    ratio: 0.05,
                    seed: 9,
                },
            ),
        ] {
            let want = bytes_sent(&one_bucket(&spec, &shapes(), world));
            let got = sent_by_rank0(world, |comm, t| sparse_all_reduce(comm, t, &codec, None));
            assert_eq!(got, want, "{spec:?} W = {world}");
        }
    }
}

#[test]
fn powersgd_matches_the_model() {
    for world in 1..=4 {
        for rank in [1, 4] {
            let spec = StrategySpec::PowerSgd {
                rank,
                min_compression_rate: 2.0,
            };
            let calls = one_bucket(&spec, &shapes(), world);
            let got = sent_by_rank0(world, |comm, t| {
                let config = PowerSgdConfig {
                    rank,
                    start_step: 0,
                    ..PowerSgdConfig::default()
                };
                let slots: Vec<usize> = (0..t.len()).collect();
                PowerSgd::new(config)?.all_reduce(comm, t, &slots, 0)
            });
            assert_eq!(got, bytes_sent(&calls), "rank {rank} W = {world}");
            assert_eq!(calls.len(), 2);
        }
    }
}

#[test]
fn quantized_all_reduce_matches_the_model() {
    for world in 1..=5 {
        for quantizer in [
            Quantizer::Sign,
            Quantizer::MinMaxU8,
            Quantizer::Qsgd {
                levels: 127,
                seed: 3,
                norm: gradwire_compress::QsgdNorm::L2,
            },
        ] {
            let spec = StrategySpec::Quantized { quantizer };
            let calls = one_bucket(&spec, &shapes(), world);
            let got = sent_by_rank0(world, |comm, t| {
                QuantizedAllReduce::new(quantizer, true)?.all_reduce(comm, t, 0)
            });
            assert_eq!(got, bytes_sent(&calls), "{quantizer:?} W = {world}");
            // A barrier, W - 1 exchanges, an all-gather.
            assert_eq!(calls.len(), world + 1);
        }
    }
}

#[test]
fn adasum_matches_the_model() {
    for world in 1..=7 {
        let calls = one_bucket(&StrategySpec::AdaSum, &shapes(), world);
        let got = sent_by_rank0(world, |comm, t| AdaSum::new(comm)?.combine(comm, t));
        assert_eq!(got, bytes_sent(&calls), "W = {world}");
    }
}

#[test]
fn dimreduce_matches_the_model() {
    let m = 1001;
    let snapshots: Vec<Vec<f32>> = (0..6)
        .map(|s| (0..m).map(|i| ((i * (s + 3)) % 17) as f32 * 0.01).collect())
        .collect();
    let pca = Pca::fit(&snapshots, 3).unwrap();
    for world in 1..=4 {
        let spec = StrategySpec::DimReduce {
            components: 3,
            trials: 0,
        };
        let calls = step_collectives(&spec, &[vec![m]], world, &Bucketing::default()).unwrap();
        let out = local::run(world, |comm| {
            let mut dr = DimReduce::new(&comm, &pca, DimReduceConfig::default())?;
            let mut w = vec![0.5f32; m];
            let g: Vec<f32> = (0..m).map(|i| (i % 5) as f32 * 1e-3).collect();
            // No collective in the closure: DistOpt's trial all-reduces
            // are the model's `trials`, 0 here.
            dr.step(&comm, &mut w, &g, 1.0, |_| Ok(0.5))
        })
        .unwrap();
        let step = out.into_iter().next().unwrap().unwrap();
        assert_eq!(step.traffic.sent as f64, bytes_sent(&calls), "W = {world}");
    }
    // The trials: DistOpt's one all-reduce of 8 x trials bytes.
    let with = StrategySpec::DimReduce {
        components: 3,
        trials: 2,
    };
    let calls = step_collectives(&with, &[vec![m]], 3, &Bucketing::default()).unwrap();
    let without = step_collectives(
        &StrategySpec::DimReduce {
            components: 3,
            trials: 0,
        },
        &[vec![m]],
        3,
        &Bucketing::default(),
    )
    .unwrap();
    assert_eq!(
        bytes_sent(&calls) - bytes_sent(&without),
        Traffic::all_reduce(16, 3).sent as f64
    );
    assert_eq!(calls.len(), without.len() + 2);
}

#[test]
fn dense_counts_one_vote_and_one_all_reduce_per_bucket() {
    let s = vec![vec![3_000_000], vec![1_000_000], vec![1_500_000], vec![10]];
    let calls = step_collectives(&StrategySpec::Dense, &s, 4, &Bucketing::default()).unwrap();
    // Buckets: [3 M] alone, then [1 M, 1.5 M] (past the threshold), [10];
    // then the agreement.
    assert_eq!(calls.len(), 7);
    assert_eq!(calls[6], agreement(4));
    assert_eq!(calls[1], CollectiveCall::all_reduce(12_000_000, 4));
    assert_eq!(calls[3], CollectiveCall::all_reduce(10_000_000, 4));
    let per_step = Bucketing {
        vote_per_bucket: false,
        ..Bucketing::default()
    };
    let calls = step_collectives(&StrategySpec::Dense, &s, 4, &per_step).unwrap();
    assert_eq!(calls.len(), 5);
    assert_eq!(
        calls[0],
        CollectiveCall::all_reduce(4 + ARRIVAL_BYTES * 4, 4)
    );
    // With a vote per bucket, the first carries the arrivals.
    let calls = step_collectives(&StrategySpec::Dense, &s, 4, &Bucketing::default()).unwrap();
    let votes: Vec<_> = [0, 2, 4].iter().map(|&i| calls[i]).collect();
    assert_eq!(
        votes,
        [
            CollectiveCall::all_reduce(1 + ARRIVAL_BYTES * 4, 4),
            CollectiveCall::all_reduce(2, 4),
            CollectiveCall::all_reduce(1, 4),
        ]
    );
}

/// DiLoCo's round: no call on the inner steps, the codec's calls of every
/// bucket (no vote) once a round; per step, a `1 / H` share of the round.
#[test]
fn outer_rounds_send_the_codecs_calls_once_every_h_steps() {
    let link = crate::cost::Link::new(20e-6, 1.25e8).unwrap();
    let bucketing = Bucketing {
        fusion_threshold: 5000,
        ..Bucketing::default()
    };
    let codecs = [
        StrategySpec::Dense,
        StrategySpec::Half,
        StrategySpec::TopK { ratio: 0.05 },
        StrategySpec::Quantized {
            quantizer: Quantizer::MinMaxU8,
        },
        StrategySpec::PowerSgd {
            rank: 2,
            min_compression_rate: 2.0,
        },
    ];
    for world in 1..=8 {
        for codec in &codecs {
            // The codec's step without its votes: what a round sends.
            let step = step_collectives(codec, &shapes(), world, &bucketing).unwrap();
            let buckets = plan_buckets(
                &shapes()
                    .iter()
                    .map(|s| s.iter().product())
                    .collect::<Vec<_>>(),
                bucketing.fusion_threshold,
                bucketing.capacity,
            )
            .unwrap();
            let votes: Vec<_> = buckets
                .iter()
                .enumerate()
                .map(|(k, b)| {
                    let arrivals = if k == 0 { ARRIVAL_BYTES * world } else { 0 };
                    CollectiveCall::all_reduce(b.len() + arrivals, world)
                })
                .collect();
            // DiLoCo's round has neither the votes nor the gradient step's
            // closing agreement (its combinations carry the round's fault).
            let mut step = step;
            assert_eq!(step.pop(), Some(agreement(world)));
            let round: Vec<_> = step.into_iter().filter(|c| !votes.contains(c)).collect();
            for h in [1u32, 2, 7, 50] {
                let outer = StrategySpec::Outer {
                    sync_every: h,
                    fragments: 1,
                    delay: 0,
                    codec: Box::new(codec.clone()),
                };
                let calls = step_collectives(&outer, &shapes(), world, &bucketing).unwrap();
                let h64 = u64::from(h);
                let wanted: Vec<_> = round
                    .iter()
                    .map(|c| c.once_every(h64).first_counted_at(h64 - 1))
                    .collect();
                assert_eq!(calls, wanted, "{codec:?} H = {h} W = {world}");
                let per_round: u64 = round.iter().map(|c| c.sent).sum();
                let mean = bytes_sent(&calls);
                assert!(
                    (mean * f64::from(h) - per_round as f64).abs() <= 1e-12 * per_round as f64,
                    "{codec:?} H = {h} W = {world}: {mean}"
                );
                let secs = |c: &[CollectiveCall]| {
                    crate::cost::communication_secs(c, world, &link, &crate::cost::Algorithm::Ring)
                        .unwrap()
                };
                let expected = secs(&round) / f64::from(h);
                let got = secs(&calls);
                assert!(
                    (got - expected).abs() <= 1e-12 * expected.max(1e-300),
                    "{codec:?} H = {h} W = {world}: {got} s, not {expected} s"
                );
            }
        }
    }
}

/// Streaming DiLoCo's fragments: contiguous ranges covering every
/// parameter once, each non-empty, cut where the running count first
/// reaches its share (or where the later fragments need the rest); `None`
/// with fewer parameters than fragments. Lengths 1, primes, a dominant
/// tensor; 1 to 5 fragments.
#[test]
fn fragments_tile_the_parameters_by_their_share() {
    let cases: [&[usize]; 5] = [
        &[7],
        &[3, 5, 7, 11, 13],
        &[1, 1, 1, 1],
        &[2, 1000, 3, 5],
        &[0, 4, 0, 4],
    ];
    for lens in cases {
        let total: usize = lens.iter().sum();
        for f in 1..=5usize {
            let Some(cuts) = fragment_ranges(lens, f) else {
                assert!(lens.len() < f, "{lens:?} F = {f}");
                continue;
            };
            assert_eq!(cuts.len(), f, "{lens:?} F = {f}");
            assert_eq!(cuts[0].start, 0);
            assert_eq!(cuts[f - 1].end, lens.len());
            for (k, w) in cuts.windows(2).enumerate() {
                assert_eq!(w[0].end, w[1].start);
                // The cut is where the share was first reached, unless the
                // later fragments forced it earlier.
                let running: usize = lens[..w[0].end].iter().sum();
                let before: usize = lens[..w[0].end - 1].iter().sum();
                let forced = lens.len() - w[0].end == f - (k + 1);
                assert!(
                    forced
                        || (running * f >= total * (k + 1) && before * f < total * (k + 1))
                        || w[0].len() == 1,
                    "{lens:?} F = {f}: {cuts:?}"
                );
            }
            assert!(cuts.iter().all(|c| !c.is_empty()), "{lens:?} F = {f}");
        }
    }
}

/// Streaming DiLoCo: each fragment's buckets one exchange of their own
/// every H steps; per step the same bytes as DiLoCo's round (up to each
/// call's rounding), a peak of the largest fragment's bytes, and in the
/// prediction each exchange hidden under the τ inner steps after it, for
/// W = 1 to 8, F = 1 to 4, τ = 0 to H / F - 1.
#[test]
fn streaming_fragments_exchange_in_turn_under_later_steps() {
    let link = crate::cost::Link::new(20e-6, 1.25e8).unwrap();
    let bucketing = Bucketing {
        fusion_threshold: 5000,
        ..Bucketing::default()
    };
    let lens: Vec<usize> = shapes().iter().map(|s| s.iter().product()).collect();
    let h = 12u32;
    for world in 1..=8 {
        let diloco = StrategySpec::Outer {
            sync_every: h,
            fragments: 1,
            delay: 0,
            codec: Box::new(StrategySpec::Dense),
        };
        let whole = step_collectives(&diloco, &shapes(), world, &bucketing).unwrap();
        for f in [1u32, 2, 3, 4] {
            for tau in 0..h / f {
                let spec = StrategySpec::Outer {
                    sync_every: h,
                    fragments: f,
                    delay: tau,
                    codec: Box::new(StrategySpec::Dense),
                };
                let calls = step_collectives(&spec, &shapes(), world, &bucketing).unwrap();
                let what = format!("W = {world} F = {f} tau = {tau}");
                assert!(
                    calls
                        .iter()
                        .all(|c| c.period == u64::from(h) && c.hidden_steps == tau)
                );
                // Each fragment's dense bytes, bucket by bucket.
                let cuts = fragment_ranges(&lens, f as usize).unwrap();
                let mut per_fragment = Vec::new();
                for (k, cut) in cuts.iter().enumerate() {
                    let planned =
                        plan_buckets(&lens[cut.clone()], 5000, bucketing.capacity).unwrap();
                    let sent: u64 = planned
                        .iter()
                        .map(|b| {
                            let n: usize = lens[cut.clone()][b.clone()].iter().sum();
                            Traffic::all_reduce(4 * n, world).sent
                        })
                        .sum();
                    let mine: u64 = calls
                        .iter()
                        .filter(|c| c.exchange == k as u32)
                        .map(|c| c.sent)
                        .sum();
                    assert_eq!(mine, sent, "{what}: fragment {k}");
                    per_fragment.push(sent);
                }
                assert_eq!(
                    peak_bytes(&calls),
                    per_fragment.iter().copied().max().unwrap(),
                    "{what}"
                );
                assert!(peak_bytes(&calls) <= peak_bytes(&whole), "{what}");
                // The same bytes per round as DiLoCo, up to a byte a call.
                let round: u64 = per_fragment.iter().sum();
                let diloco_round: u64 = whole.iter().map(|c| c.sent).sum();
                assert!(round.abs_diff(diloco_round) <= calls.len() as u64, "{what}");
                // Hidden under τ steps of enough compute: nothing exposed;
                // under none, all of it; in between, what outlasts them.
                let secs = |c: &[CollectiveCall]| {
                    crate::cost::communication_secs(c, world, &link, &crate::cost::Algorithm::Ring)
                        .unwrap()
                };
                let round_secs = secs(&calls) * f64::from(h);
                let step = |compute_s: f64| crate::cost::StepModel {
                    compute_s,
                    codec_s: 0.0,
                    other_s: 0.0,
                    overlap: 0.0,
                };
                let predict = |compute_s: f64| {
                    crate::cost::predict_step_secs(
                        &step(compute_s),
                        &calls,
                        world,
                        &link,
                        &crate::cost::Algorithm::Ring,
                    )
                    .unwrap()
                };
                if tau == 0 {
                    let got = predict(0.01);
                    let want = 0.01 + round_secs / f64::from(h);
                    assert!(
                        (got - want).abs() <= 1e-12 * want,
                        "{what}: {got} vs {want}"
                    );
                } else {
                    assert_eq!(predict(round_secs), round_secs, "{what}");
                    let compute = 1e-9;
                    let want: f64 = (0..f)
                        .map(|k| {
                            let one: Vec<_> =
                                calls.iter().copied().filter(|c| c.exchange == k).collect();
                            let t = secs(&one) * f64::from(h);
                            (t - f64::from(tau) * compute).max(0.0)
                        })
                        .sum::<f64>()
                        / f64::from(h)
                        + compute;
                    let got = predict(compute);
                    assert!(
                        (got - want).abs() <= 1e-12 * want,
                        "{what}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// The closed form of the bytes over a run is the sum of its steps', for
/// calls of every period and first step (partial averaging's turns,
/// DiLoCo's rounds, Streaming DiLoCo's merges), from 0 steps on.
#[test]
fn bytes_over_steps_sum_the_steps() {
    let shapes = shapes();
    let bucketing = Bucketing {
        fusion_threshold: 300,
        capacity: 1 << 20,
        vote_per_bucket: true,
    };
    let specs = [
        StrategySpec::Dense,
        StrategySpec::Partial { state_buffers: 2 },
        StrategySpec::DeltaWeight {
            codec: Box::new(StrategySpec::AdaSum),
        },
        StrategySpec::Outer {
            sync_every: 4,
            fragments: 2,
            delay: 1,
            codec: Box::new(StrategySpec::TopK { ratio: 0.1 }),
        },
    ];
    for spec in &specs {
        for world in 1..=4 {
            let calls = step_collectives(spec, &shapes, world, &bucketing).unwrap();
            let mut sum = 0;
            for steps in 0..=13u64 {
                assert_eq!(
                    sent_over_steps(&calls, steps),
                    sum,
                    "{spec:?} W = {world}, {steps} steps"
                );
                sum += sent_at_step(&calls, steps);
            }
        }
    }
}
