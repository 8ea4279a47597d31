//! Property tests of the codecs against plain references: exact top-k
//! against a sort, threshold against a filter, sampled top-k's bounds,
//! random-k's determinism, the casts' rounding, error feedback's
//! conservation, and the refusal of non-finite input.

use gradwire_compress::cast::{self, CastOptions};
use gradwire_compress::select::{self, count_for_ratio};
use gradwire_compress::{CompressError, ErrorFeedback, SelectScratch, SparseCodec, SparseVec};
use half::{bf16, f16};
use proptest::prelude::*;

const LENGTHS: &[usize] = &[0, 1, 2, 3, 5, 7, 13, 31, 127, 257, 1031, 5003];

/// Gradients: random magnitudes over many binades, or values from a small set
/// (many exact ties), with zeros, negatives and subnormals.
fn gradient() -> impl Strategy<Value = Vec<f32>> {
    prop::sample::select(LENGTHS).prop_flat_map(|n| {
        prop_oneof![
            prop::collection::vec(
                prop_oneof![
                    4 => -1e3f32..1e3f32,
                    2 => -1e-3f32..1e-3f32,
                    1 => Just(0.0f32),
                    1 => Just(-0.0f32),
                    1 => (1u32..0x007f_ffff).prop_map(f32::from_bits),
                ],
                n
            ),
            prop::collection::vec(
                prop::sample::select(vec![0.0f32, 0.5, -0.5, 1.0, -2.0, 2.0]),
                n
            ),
        ]
    })
}

fn ratio() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(1.0),
        Just(0.5),
        Just(0.01),
        Just(0.001),
        0.0001f64..=1.0
    ]
}

/// The reference top-k: sort by (magnitude descending, index ascending).
fn reference_top_k(x: &[f32], k: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..x.len() as u32).collect();
    order.sort_by(|&a, &b| {
        x[b as usize]
            .abs()
            .total_cmp(&x[a as usize].abs())
            .then(a.cmp(&b))
    });
    let mut kept = order[..k].to_vec();
    kept.sort_unstable();
    kept
}

fn values_at(x: &[f32], idx: &[u32]) -> Vec<u32> {
    idx.iter().map(|&i| x[i as usize].to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn top_k_keeps_exactly_the_k_largest(x in gradient(), r in ratio()) {
        let k = count_for_ratio(r, x.len()).unwrap();
        let got = select::top_k(&x, r).unwrap();
        let want = reference_top_k(&x, k);
        prop_assert_eq!(got.indices(), &want[..]);
        prop_assert_eq!(got.values().iter().map(|v| v.to_bits()).collect::<Vec<_>>(), values_at(&x, &want));
    }

    #[test]
    fn threshold_keeps_exactly_the_large_magnitudes(x in gradient(), t in prop_oneof![Just(0.0f32), 0.0f32..2.0]) {
        let got = select::threshold(&x, t).unwrap();
        let want: Vec<u32> = (0..x.len() as u32).filter(|&i| x[i as usize].abs() >= t).collect();
        prop_assert_eq!(got.indices(), &want[..]);
        prop_assert_eq!(got.values().iter().map(|v| v.to_bits()).collect::<Vec<_>>(), values_at(&x, &want));
    }

    #[test]
    fn sampled_top_k_keeps_between_k_and_1_3_k_of_the_largest(
        n in prop::sample::select(vec![10_000usize, 65_537, 200_003]),
        seed: u64,
        r in prop_oneof![Just(0.01), Just(0.001), 0.0005f64..0.2],
    ) {
        let mut s = seed | 1;
        let x: Vec<f32> = (0..n).map(|_| {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            // Heavy tails, as gradients have.
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            u * u * u * 100.0
        }).collect();
        let k = count_for_ratio(r, n).unwrap();
        let got = select::sampled_top_k(&x, r).unwrap();
        prop_assert!(got.nnz() >= k && got.nnz() as f64 <= (k as f64 * select::SAMPLED_TOP_K_SLACK).ceil(),
            "kept {} for k = {k}", got.nnz());
        let kept_min = got.values().iter().map(|v| v.abs()).fold(f32::INFINITY, f32::min);
        let mut is_kept = vec![false; n];
        for &i in got.indices() { is_kept[i as usize] = true; }
        let dropped_max = x.iter().zip(&is_kept).filter(|(_, k)| !**k).map(|(v, _)| v.abs()).fold(0.0, f32::max);
        prop_assert!(kept_min >= dropped_max, "kept {kept_min} < dropped {dropped_max}");
        prop_assert!(got.indices().windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn random_k_is_seeded_distinct_and_unbiased_when_asked(x in gradient(), r in ratio(), seed: u64) {
        let k = count_for_ratio(r, x.len()).unwrap();
        let a = select::random_k(&x, r, seed, true).unwrap();
        let b = select::random_k(&x, r, seed, true).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a.nnz(), k);
        prop_assert!(a.indices().windows(2).all(|w| w[0] < w[1]));
        let scale = if k > 0 { x.len() as f32 / k as f32 } else { 1.0 };
        for (&i, &v) in a.indices().iter().zip(a.values()) {
            prop_assert_eq!(v.to_bits(), (x[i as usize] * scale).to_bits());
        }
        let plain = select::random_k(&x, r, seed, false).unwrap();
        prop_assert_eq!(plain.indices(), a.indices());
    }

    #[test]
    fn casts_round_to_nearest_even_and_back_exactly(bits in prop::collection::vec(any::<u32>(), 0..600)) {
        let x: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let mut h = vec![f16::ZERO; x.len()];
        let mut b = vec![bf16::ZERO; x.len()];
        cast::encode(&x, &mut h, &CastOptions::default()).unwrap();
        cast::encode(&x, &mut b, &CastOptions::default()).unwrap();
        let mut back = vec![0f32; x.len()];
        cast::decode(&h, &mut back).unwrap();
        for ((&v, hv), &w) in x.iter().zip(&h).zip(&back) {
            let want = f16::from_f32(v);
            if v.is_nan() { prop_assert!(hv.is_nan() && w.is_nan()); continue; }
            prop_assert_eq!(hv.to_bits(), want.to_bits());
            prop_assert_eq!(w.to_bits(), want.to_f32().to_bits());
            // Within half an ulp of f16 wherever f16 can represent v.
            if w.is_finite() && v.abs() >= 6.103_515_6e-5 {
                let ulp = f32::from_bits((w.abs().to_bits() & 0x7f80_0000).max(0x3880_0000)) * 2f32.powi(-10);
                prop_assert!((w - v).abs() <= ulp / 2.0, "{v} -> {w}");
            }
        }
        cast::decode(&b, &mut back).unwrap();
        for (&v, &w) in x.iter().zip(&back) {
            if v.is_nan() { prop_assert!(w.is_nan()); continue; }
            prop_assert_eq!(w.to_bits(), bf16::from_f32(v).to_f32().to_bits());
        }
    }

    #[test]
    fn error_feedback_conserves_every_bit(steps in prop::collection::vec(gradient(), 1..4), r in ratio(), mu in prop_oneof![Just(None), Just(Some(0.9f32))]) {
        let n = steps[0].len();
        let steps: Vec<Vec<f32>> = steps.into_iter().map(|mut g| { g.resize(n, 0.25); g }).collect();
        for codec in [SparseCodec::TopK(r), SparseCodec::Threshold(0.5), SparseCodec::SampledTopK(r), SparseCodec::RandomK { ratio: r, seed: 7 }] {
            let mut memory = match mu {
                None => ErrorFeedback::new(n),
                Some(mu) => ErrorFeedback::with_momentum(n, mu).unwrap(),
            };
            let mut velocity = vec![0f32; n];
            for g in &steps {
                // The accumulator as the memory should compute it.
                let acc: Vec<f32> = match mu {
                    None => memory.residual().iter().zip(g).map(|(r, g)| r + g).collect(),
                    Some(mu) => {
                        for (u, g) in velocity.iter_mut().zip(g) { *u = mu * *u + g; }
                        memory.residual().iter().zip(&velocity).map(|(r, u)| r + u).collect()
                    }
                };
                let sent = memory.compress(g, &codec).unwrap();
                for &i in sent.indices() { velocity[i as usize] = 0.0; }
                let dense = sent.to_dense();
                for i in 0..n {
                    let sent_here = sent.indices().binary_search(&(i as u32)).is_ok();
                    let (s, res) = (dense[i], memory.residual()[i]);
                    // Exactly one of them holds acc, the other is zero.
                    let (whole, zero) = if sent_here { (s, res) } else { (res, s) };
                    prop_assert_eq!(whole.to_bits(), acc[i].to_bits(), "{:?} index {}", codec, i);
                    prop_assert_eq!(zero, 0.0);
                }
            }
        }
    }

    #[test]
    fn error_feedback_of_parts_is_error_feedback_of_the_whole(steps in prop::collection::vec(gradient(), 1..4), cuts in prop::collection::vec(0usize..1 << 16, 0..6), r in ratio(), mu in prop_oneof![Just(None), Just(Some(0.9f32))]) {
        // The same gradient whole and cut into consecutive parts (empty
        // parts included): the same selection and the same memory, bit for
        // bit, step after step.
        let n = steps[0].len();
        let steps: Vec<Vec<f32>> = steps.into_iter().map(|mut g| { g.resize(n, 0.25); g }).collect();
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (n + 1)).collect();
        bounds.extend([0, n]);
        bounds.sort_unstable();
        let memory = || match mu {
            None => ErrorFeedback::new(n),
            Some(mu) => ErrorFeedback::with_momentum(n, mu).unwrap(),
        };
        let (mut whole, mut parted) = (memory(), memory());
        let (mut scratch, mut sent, mut sent_parts) = (SelectScratch::default(), SparseVec::default(), SparseVec::default());
        let codec = SparseCodec::TopK(r);
        for g in &steps {
            whole.compress_into(g, &codec, &mut sent, &mut scratch).unwrap();
            let parts = bounds.windows(2).map(|w| &g[w[0]..w[1]]);
            parted.compress_parts_into(parts, &codec, &mut sent_parts, &mut scratch).unwrap();
            prop_assert_eq!(&sent_parts, &sent);
            prop_assert_eq!(parted.state(), whole.state());
        }
        // A non-finite entry: refused with its index across the parts, the
        // memory unchanged.
        if n > 0 {
            let mut bad = steps[0].clone();
            let at = cuts.first().map_or(n - 1, |c| c % n);
            bad[at] = f32::NAN;
            let before = parted.state();
            let parts = bounds.windows(2).map(|w| &bad[w[0]..w[1]]);
            match parted.compress_parts_into(parts, &codec, &mut sent_parts, &mut scratch) {
                Err(CompressError::NonFinite { index, .. }) => prop_assert_eq!(index, at),
                other => prop_assert!(false, "{:?}", other),
            }
            prop_assert_eq!(parted.state(), before);
        }
    }

    #[test]
    fn error_feedback_of_a_cast_loses_at_most_one_rounding(g in gradient(), clip in prop_oneof![Just(None), Just(Some(1.0f32))]) {
        let n = g.len();
        let mut memory = ErrorFeedback::new(n);
        let opts = CastOptions { clip, scale: 0.25 };
        let mut sent = vec![f16::ZERO; n];
        memory.compress_cast(&g, &mut sent, &opts).unwrap();
        for i in 0..n {
            let decoded = sent[i].to_f32() / 0.25;
            let total = f64::from(decoded) + f64::from(memory.residual()[i]);
            // acc - decoded is rounded once in f32.
            prop_assert!((total - f64::from(g[i])).abs() <= f64::from(g[i].abs()) * f64::from(f32::EPSILON),
                "{} + {} vs {}", decoded, memory.residual()[i], g[i]);
        }
    }
}

#[test]
fn non_finite_input_is_refused_and_leaves_the_memory_alone() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = vec![0.5f32; 5000];
        x[4321] = bad;
        let is_refused = |r: Result<SparseVec, CompressError>| {
            matches!(r, Err(CompressError::NonFinite { index: 4321, .. }))
        };
        assert!(is_refused(select::top_k(&x, 0.01)), "top_k {bad}");
        assert!(is_refused(select::top_k_count(&x, 0)), "top_k 0 {bad}");
        assert!(is_refused(select::threshold(&x, 0.1)), "threshold {bad}");
        assert!(
            is_refused(select::threshold(&x, 1e30)),
            "threshold above {bad}"
        );
        assert!(is_refused(select::sampled_top_k(&x, 0.01)), "sampled {bad}");
        assert!(
            is_refused(select::random_k(&x, 0.01, 1, false)),
            "random {bad}"
        );

        let mut memory = ErrorFeedback::new(5000);
        memory
            .compress(&vec![0.25; 5000], &SparseCodec::TopK(0.001))
            .unwrap();
        let before = memory.clone();
        assert!(is_refused(memory.compress(&x, &SparseCodec::TopK(0.01))));
        assert_eq!(memory, before, "a refused gradient changes nothing");
    }
    // Finite values that overflow the accumulator reset it instead of keeping inf.
    let mut memory = ErrorFeedback::new(2);
    memory
        .compress(
            &[f32::MAX, 0.0],
            &SparseCodec::Threshold(f32::MAX * 2.0 / 4.0 * 2.0),
        )
        .ok();
    let result = memory.compress(&[f32::MAX, 0.0], &SparseCodec::TopK(0.5));
    assert!(
        matches!(result, Err(CompressError::NonFinite { .. })),
        "{result:?}"
    );
    assert!(memory.residual().iter().all(|r| *r == 0.0));
}

#[test]
fn bad_parameters_are_errors() {
    let x = [1.0f32, 2.0];
    for r in [0.0, -0.1, 1.5, f64::NAN] {
        assert!(
            matches!(select::top_k(&x, r), Err(CompressError::InvalidArgument(_))),
            "{r}"
        );
        assert!(matches!(
            select::sampled_top_k(&x, r),
            Err(CompressError::InvalidArgument(_))
        ));
        assert!(matches!(
            select::random_k(&x, r, 0, true),
            Err(CompressError::InvalidArgument(_))
        ));
    }
    assert!(matches!(
        select::threshold(&x, -1.0),
        Err(CompressError::InvalidArgument(_))
    ));
    assert!(matches!(
        select::threshold(&x, f32::NAN),
        Err(CompressError::InvalidArgument(_))
    ));
    let mut out = [f16::ZERO; 2];
    let bad_clip = CastOptions {
        clip: Some(-1.0),
        scale: 1.0,
    };
    assert!(matches!(
        cast::encode(&x, &mut out, &bad_clip),
        Err(CompressError::InvalidArgument(_))
    ));
    let bad_scale = CastOptions {
        clip: None,
        scale: 0.0,
    };
    assert!(matches!(
        cast::encode(&x, &mut out, &bad_scale),
        Err(CompressError::InvalidArgument(_))
    ));
    assert!(matches!(
        cast::encode(&x, &mut out[..1], &CastOptions::default()),
        Err(CompressError::LengthMismatch { .. })
    ));
    assert!(matches!(
        ErrorFeedback::with_momentum(2, 1.0),
        Err(CompressError::InvalidArgument(_))
    ));
    assert!(matches!(
        ErrorFeedback::new(3).compress(&x, &SparseCodec::TopK(0.5)),
        Err(CompressError::LengthMismatch { .. })
    ));
    assert!(matches!(
        SparseVec::new(3, vec![2, 1], vec![0.0, 0.0]),
        Err(CompressError::InvalidArgument(_))
    ));
    assert!(matches!(
        SparseVec::new(3, vec![3], vec![0.0]),
        Err(CompressError::InvalidArgument(_))
    ));
}

#[test]
fn the_clip_clamps_before_rounding_and_keeps_nan() {
    let x = [70000.0f32, -70000.0, 3.0, f32::NAN];
    let mut out = [f16::ZERO; 4];
    cast::encode(
        &x,
        &mut out,
        &CastOptions {
            clip: Some(100.0),
            scale: 1.0,
        },
    )
    .unwrap();
    assert_eq!(out[0].to_f32(), 100.0);
    assert_eq!(out[1].to_f32(), -100.0);
    assert_eq!(out[2].to_f32(), 3.0);
    assert!(out[3].is_nan());
    // Without a clip, beyond f16's range is infinite (the documented overflow).
    cast::encode(&x, &mut out, &CastOptions::default()).unwrap();
    assert!(out[0].is_infinite());
}

/// Large inputs take the one-pass path (a sample brackets the k-th
/// magnitude); these check it against the sort, on smooth data, on data
/// with massive ties, and on data built so that the strided sample misleads
/// it (the exact radix path must then take over).
#[test]
fn top_k_is_exact_on_large_inputs_whatever_the_sample_says() {
    let n = 131_072; // the sample stride is 2
    let mut s = 0x1234_5678_9abc_def1u64;
    let mut noise = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let smooth: Vec<f32> = (0..n).map(|_| noise() * 10.0).collect();
    let ties: Vec<f32> = (0..n).map(|i| [0.0f32, 1.0, -1.0, 2.0][i % 4]).collect();
    // Every sampled (even) index is tiny, every odd index large.
    let misleading: Vec<f32> = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                noise() * 1e-6
            } else {
                1.0 + noise()
            }
        })
        .collect();
    let sorted: Vec<f32> = (0..n).map(|i| i as f32).collect();
    for (name, x) in [
        ("smooth", &smooth),
        ("ties", &ties),
        ("misleading", &misleading),
        ("sorted", &sorted),
    ] {
        for ratio in [0.0001, 0.001, 0.01, 0.1, 0.3, 0.5, 1.0] {
            let k = count_for_ratio(ratio, n).unwrap();
            let got = select::top_k(x, ratio).unwrap();
            assert_eq!(
                got.indices(),
                &reference_top_k(x, k)[..],
                "{name} at {ratio}"
            );
        }
    }
}

/// Buffers of millions of elements take the streaming-store path (x86-64
/// with F16C): the same bits as half's conversions, from aligned and
/// misaligned starts, with every class of value (NaN, infinities,
/// subnormals, overflow, rounding ties).
#[test]
fn large_f16_casts_give_the_same_bits_as_small_ones() {
    let n = (4 << 20) + 13;
    let mut s = 0x0123_4567_89ab_cdefu64;
    let x: Vec<f32> = (0..n)
        .map(|i| match i % 7 {
            0 => f32::from_bits(0x3f80_1000 + (i as u32 % 3) * 0x1000), // ties at f16's precision
            1 => [f32::NAN, f32::INFINITY, -70000.0, 1e-7, -0.0][i % 5],
            _ => {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                f32::from_bits((s >> 32) as u32)
            }
        })
        .collect();
    for offset in [0usize, 1, 3] {
        let src = &x[offset..];
        let mut h = vec![f16::ZERO; src.len() + 1];
        let dst = &mut h[1..]; // a destination that starts off its alignment
        cast::encode(src, dst, &CastOptions::default()).unwrap();
        for (i, (&v, hv)) in src.iter().zip(dst.iter()).enumerate() {
            let want = f16::from_f32(v);
            assert!(
                if v.is_nan() {
                    hv.is_nan()
                } else {
                    hv.to_bits() == want.to_bits()
                },
                "narrow {i}: {v:e} -> {hv:?}, want {want:?}"
            );
        }
        let mut back = vec![0f32; dst.len() + 1];
        cast::decode(dst, &mut back[1..]).unwrap();
        for (i, (hv, w)) in dst.iter().zip(&back[1..]).enumerate() {
            assert!(
                if hv.is_nan() {
                    w.is_nan()
                } else {
                    w.to_bits() == hv.to_f32().to_bits()
                },
                "widen {i}"
            );
        }
    }
}

/// Gradients long enough for the sampled paths (bracketing from 32 768
/// entries, sampled top-k from 4 096), mixed with short ones.
fn long_gradient() -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![
        gradient(),
        (
            prop::sample::select(vec![4096usize, 9001, 40_009]),
            any::<u64>()
        )
            .prop_map(|(n, seed)| {
                // A cheap deterministic spread of magnitudes, with ties.
                let mut s = seed | 1;
                (0..n)
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        ((s % 2001) as f32 - 1000.0) * 1e-3
                    })
                    .collect()
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Selecting into reused buffers (holding whatever earlier selections of
    /// other lengths left there) gives exactly what a fresh selection gives.
    #[test]
    fn select_into_reused_buffers_equals_a_fresh_selection(
        xs in prop::collection::vec(long_gradient(), 1..5),
        r in ratio(),
    ) {
        let codecs = [
            SparseCodec::TopK(r),
            SparseCodec::Threshold(0.5),
            SparseCodec::SampledTopK(r),
            SparseCodec::RandomK { ratio: r, seed: 11 },
        ];
        let mut scratch = SelectScratch::default();
        let mut out = SparseVec::default();
        for x in &xs {
            for codec in &codecs {
                codec.select_into(x, &mut out, &mut scratch).unwrap();
                prop_assert_eq!(&out, &codec.select(x).unwrap(), "{:?}, n = {}", codec, x.len());
            }
        }
        // Error feedback through reused buffers, against a fresh memory.
        let n = xs[0].len();
        let mut reused = ErrorFeedback::new(n);
        let mut fresh = ErrorFeedback::new(n);
        for x in xs.iter().filter(|x| x.len() == n) {
            reused.compress_into(x, &SparseCodec::TopK(r), &mut out, &mut scratch).unwrap();
            prop_assert_eq!(&out, &fresh.compress(x, &SparseCodec::TopK(r)).unwrap());
            prop_assert_eq!(reused.residual(), fresh.residual());
        }
    }
}

/// Random-k draws every index with probability k / n: over 4 000 seeds,
/// each of 64 indices' count stays within five standard deviations of
/// 4 000 k / n.
#[test]
fn random_k_draws_every_index_alike() {
    let (n, k, draws) = (64usize, 8usize, 4000u64);
    let x = vec![1.0f32; n];
    let ratio = k as f64 / n as f64;
    let mut counts = vec![0u64; n];
    for seed in 0..draws {
        let s = select::random_k(&x, ratio, seed, false).unwrap();
        assert_eq!(s.nnz(), k);
        for &i in s.indices() {
            counts[i as usize] += 1;
        }
    }
    let p = k as f64 / n as f64;
    let mean = draws as f64 * p;
    let sd = (draws as f64 * p * (1.0 - p)).sqrt();
    for (i, &c) in counts.iter().enumerate() {
        assert!(
            (c as f64 - mean).abs() <= 5.0 * sd,
            "index {i} drawn {c} times, expected {mean:.0} +- {:.0}",
            5.0 * sd
        );
    }
}
