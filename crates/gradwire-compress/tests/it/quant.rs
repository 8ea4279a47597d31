//! The quantizers against their definitions, for lengths 0, 1, primes and
//! chunk boundaries: the sign keeps every sign and each chunk's mean
//! magnitude;
//! min-max uint8 is within half a step of every entry; QSGD is within one
//! level of every entry and unbiased (measured over seeds), its levels in
//! nibbles (two an entry byte, the layout checked by hand) up to 7 levels;
//! payloads have the advertised length; corrupt payloads are refused and
//! nothing decodes to a non-finite value (E3M0's own properties in
//! `e3m0.rs`).

use gradwire_compress::quant::{QSGD_NIBBLE_LEVELS, QUANT_CHUNK};
use gradwire_compress::{CompressError, QsgdNorm, Quantizer};
use proptest::prelude::*;

/// `n` entries over several orders of magnitude, some exact zeros.
pub(crate) fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Magnitudes over several orders, some exact zeros.
            let u = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            if i % 17 == 0 {
                0.0
            } else {
                u * 10f32.powi((i % 5) as i32 - 2)
            }
        })
        .collect()
}

/// The sums of `x`'s round trips over streams `0..trials`, entry by entry
/// (in f64): a stochastic quantizer's mean is this over `trials`.
pub(crate) fn sum_over_streams(q: Quantizer, x: &[f32], trials: u64) -> Vec<f64> {
    let mut sum = vec![0f64; x.len()];
    for stream in 0..trials {
        for (s, o) in sum.iter_mut().zip(round_trip(q, x, stream)) {
            *s += f64::from(o);
        }
    }
    sum
}

/// `x` encoded with `stream` and decoded.
pub(crate) fn round_trip(q: Quantizer, x: &[f32], stream: u64) -> Vec<f32> {
    let mut payload = vec![0u8; q.encoded_len(x.len())];
    q.encode(x, stream, &mut payload).unwrap();
    let mut out = vec![f32::NAN; x.len()];
    q.decode(&payload, &mut out).unwrap();
    out
}

/// Lengths 0, 1, primes, and around the eights and the chunks.
pub(crate) const LENGTHS: &[usize] = &[0, 1, 2, 7, 8, 9, 31, 511, 512, 513, 1031, 4099];

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn sign_keeps_every_sign_and_the_mean_magnitude(
        n in prop::sample::select(LENGTHS.to_vec()), seed: u64,
    ) {
        let x = values(seed, n);
        let out = round_trip(Quantizer::Sign, &x, 0);
        for (xs, os) in x.chunks(QUANT_CHUNK).zip(out.chunks(QUANT_CHUNK)) {
            let scale = xs.iter().map(|v| f64::from(v.abs())).sum::<f64>() / xs.len() as f64;
            let decoded = os.first().map_or(0.0, |o| f64::from(o.abs()));
            // f32 partial sums of up to 512 terms.
            prop_assert!((decoded - scale).abs() <= 64.0 * f64::from(f32::EPSILON) * scale,
                "scale {} decoded {}", scale, decoded);
            for (v, o) in xs.iter().zip(os) {
                prop_assert_eq!(f64::from(o.abs()), decoded);
                prop_assert_eq!(o.is_sign_positive(), v.is_sign_positive());
            }
        }
        prop_assert_eq!(Quantizer::Sign.encoded_len(n), 4 * n.div_ceil(QUANT_CHUNK) + n.div_ceil(8));
    }

    #[test]
    fn min_max_is_within_half_a_step(
        n in prop::sample::select(LENGTHS.to_vec()), seed: u64,
    ) {
        let x = values(seed, n);
        let out = round_trip(Quantizer::MinMaxU8, &x, 0);
        for (c, (xs, os)) in x.chunks(QUANT_CHUNK).zip(out.chunks(QUANT_CHUNK)).enumerate() {
            let lo = xs.iter().fold(f32::INFINITY, |a, &b| a.min(b));
            let hi = xs.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let half_step = (f64::from(hi) - f64::from(lo)) / 510.0;
            for (v, o) in xs.iter().zip(os) {
                let err = (f64::from(*v) - f64::from(*o)).abs();
                // Half a step, and the f32 rounding of the decoded value.
                prop_assert!(err <= half_step * (1.0 + 1e-5) + f64::from(hi.abs().max(lo.abs())) * 1e-7,
                    "chunk {}: {} decoded {} (half step {})", c, v, o, half_step);
            }
        }
        prop_assert_eq!(Quantizer::MinMaxU8.encoded_len(n), 8 * n.div_ceil(QUANT_CHUNK) + n);
    }

    #[test]
    fn qsgd_is_within_one_level(
        n in prop::sample::select(LENGTHS.to_vec()), levels in 1u8..=127, seed: u64,
        max_norm: bool,
    ) {
        let norm = if max_norm { QsgdNorm::Max } else { QsgdNorm::L2 };
        let q = Quantizer::Qsgd { levels, seed, norm };
        let x = values(seed, n);
        let out = round_trip(q, &x, 5);
        for (xs, os) in x.chunks(QUANT_CHUNK).zip(out.chunks(QUANT_CHUNK)) {
            let level = chunk_scale(xs, norm) / f64::from(levels);
            for (v, o) in xs.iter().zip(os) {
                prop_assert!((f64::from(*v) - f64::from(*o)).abs() <= level * (1.0 + 1e-5),
                    "{} decoded {} (a level is {})", v, o, level);
                prop_assert!(*o == 0.0 || o.signum() == v.signum());
            }
        }
        let per_entry = if levels <= 7 { n.div_ceil(2) } else { n };
        prop_assert_eq!(q.encoded_len(n), 4 * n.div_ceil(QUANT_CHUNK) + per_entry);
    }

    /// Up to 7 levels, a chunk's codes are nibbles: entry 2j in the low half
    /// of byte j, two's complement, an odd chunk's last high half zero;
    /// unpacked here by hand, they are the decoded values over a level.
    #[test]
    fn qsgd_up_to_7_levels_packs_two_levels_a_byte(
        n in prop::sample::select(LENGTHS.to_vec()), levels in 1u8..=QSGD_NIBBLE_LEVELS,
        seed: u64,
    ) {
        let q = Quantizer::Qsgd { levels, seed, norm: QsgdNorm::L2 };
        let x = values(seed, n);
        let mut payload = vec![0u8; q.encoded_len(n)];
        q.encode(&x, 3, &mut payload).unwrap();
        let mut out = vec![0f32; n];
        q.decode(&payload, &mut out).unwrap();
        prop_assert_eq!(q.chunk_bytes(), 4 + QUANT_CHUNK / 2);
        for (chunk, os) in payload.chunks(q.chunk_bytes()).zip(out.chunks(QUANT_CHUNK)) {
            let unit = f32::from_le_bytes(chunk[..4].try_into().unwrap()) / f32::from(levels);
            let codes = &chunk[4..];
            prop_assert_eq!(codes.len(), os.len().div_ceil(2));
            for (i, o) in os.iter().enumerate() {
                let nibble = (codes[i / 2] >> (4 * (i % 2))) & 0x0f;
                let level = if nibble < 8 { i32::from(nibble) } else { i32::from(nibble) - 16 };
                prop_assert!(level.unsigned_abs() <= u32::from(levels));
                prop_assert_eq!(*o, level as f32 * unit);
            }
            if os.len() % 2 == 1 {
                prop_assert_eq!(codes[os.len() / 2] >> 4, 0);
            }
        }
    }
}

/// A chunk's scale under `norm`, in f64: its 2-norm or largest magnitude.
fn chunk_scale(xs: &[f32], norm: QsgdNorm) -> f64 {
    match norm {
        QsgdNorm::L2 => xs
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            .sqrt(),
        QsgdNorm::Max => f64::from(xs.iter().fold(0f32, |a, &b| a.max(b.abs()))),
    }
}

/// The scale an encoded chunk carries: its first four bytes.
fn carried_scales(q: Quantizer, x: &[f32]) -> Vec<f32> {
    let mut payload = vec![0u8; q.encoded_len(x.len())];
    q.encode(x, 0, &mut payload).unwrap();
    payload
        .chunks(q.chunk_bytes())
        .map(|c| f32::from_le_bytes(c[..4].try_into().unwrap()))
        .collect()
}

#[test]
fn qsgd_scales_by_the_bucket_2_norm_by_default() {
    // The paper's norm, to the f32 rounding of its f64 value; the max-norm
    // variant by the largest magnitude, exactly.
    for n in [1, 7, 8, 512, 513, 1031] {
        let x = values(5, n);
        let l2 = Quantizer::Qsgd {
            levels: 5,
            seed: 1,
            norm: QsgdNorm::default(),
        };
        let max = Quantizer::Qsgd {
            levels: 5,
            seed: 1,
            norm: QsgdNorm::Max,
        };
        for ((xs, a), b) in x
            .chunks(QUANT_CHUNK)
            .zip(carried_scales(l2, &x))
            .zip(carried_scales(max, &x))
        {
            let want = chunk_scale(xs, QsgdNorm::L2);
            assert!(
                (f64::from(a) - want).abs() <= want * 1e-7,
                "n = {n}: scale {a}, 2-norm {want}"
            );
            assert_eq!(f64::from(b), chunk_scale(xs, QsgdNorm::Max), "n = {n}");
        }
    }
    // A chunk whose 2-norm overflows f32 is scaled by its largest
    // magnitude: still finite, still unbiased.
    let huge = vec![f32::MAX / 2.0; 16];
    let q = Quantizer::Qsgd {
        levels: 5,
        seed: 1,
        norm: QsgdNorm::L2,
    };
    assert_eq!(carried_scales(q, &huge), vec![f32::MAX / 2.0]);
    assert_eq!(round_trip(q, &huge, 3), huge);
}

#[test]
fn qsgd_is_unbiased_over_seeds() {
    for norm in [QsgdNorm::L2, QsgdNorm::Max] {
        qsgd_is_unbiased_with(norm);
    }
}

fn qsgd_is_unbiased_with(norm: QsgdNorm) {
    // 3000 independent encodings of the same vector: the mean of each entry
    // is within 5 standard errors of the entry (the rounding's variance is
    // at most a quarter of a level squared).
    let n = 700;
    let x = values(11, n);
    let q = Quantizer::Qsgd {
        levels: 3,
        seed: 99,
        norm,
    };
    let trials = 3000;
    let sum = sum_over_streams(q, &x, trials);
    for (c, (xs, ss)) in x
        .chunks(QUANT_CHUNK)
        .zip(sum.chunks(QUANT_CHUNK))
        .enumerate()
    {
        let level = chunk_scale(xs, norm) / 3.0;
        let bound = 5.0 * (level / 2.0) / (trials as f64).sqrt();
        for (i, (v, s)) in xs.iter().zip(ss).enumerate() {
            let mean = s / trials as f64;
            assert!(
                (mean - f64::from(*v)).abs() <= bound + 1e-7,
                "{norm:?}: chunk {c} entry {i}: mean {mean}, value {v}, bound {bound}"
            );
        }
    }
    // And a given stream is reproducible.
    assert_eq!(round_trip(q, &x, 7), round_trip(q, &x, 7));
}

#[test]
fn non_finite_inputs_and_bad_settings_are_refused() {
    for q in [
        Quantizer::Sign,
        Quantizer::MinMaxU8,
        Quantizer::Qsgd {
            levels: 127,
            seed: 0,
            norm: gradwire_compress::QsgdNorm::L2,
        },
        Quantizer::E3m0 { seed: 0 },
    ] {
        let mut x = values(3, 40);
        x[13] = f32::INFINITY;
        let mut payload = vec![0u8; q.encoded_len(40)];
        assert!(matches!(
            q.encode(&x, 0, &mut payload),
            Err(CompressError::NonFinite { index: 13, .. })
        ));
        let expected = q.encoded_len(40);
        let mut short = vec![0u8; expected - 1];
        let result = q.encode(&values(3, 40), 0, &mut short);
        assert_eq!(
            result,
            Err(CompressError::LengthMismatch {
                op: "quantize",
                expected,
                got: expected - 1
            }),
            "{q:?}"
        );
    }
    for levels in [0u8, 128, 255] {
        let q = Quantizer::Qsgd {
            levels,
            seed: 0,
            norm: QsgdNorm::L2,
        };
        let result = q.validate();
        assert!(
            matches!(&result, Err(CompressError::InvalidArgument(m)) if m.contains("levels")),
            "{levels}: {result:?}"
        );
        let result = q.encode(&[1.0], 0, &mut [0u8; 5]);
        assert!(
            matches!(&result, Err(CompressError::InvalidArgument(m)) if m.contains("levels")),
            "{levels}: {result:?}"
        );
        // Decoding with the setting is refused too: with 0 levels a zero
        // code would decode to 0 x (scale / 0), a NaN.
        let mut out = [7.0f32];
        let result = q.decode(&[0u8; 5], &mut out);
        assert!(
            matches!(&result, Err(CompressError::InvalidArgument(m)) if m.contains("levels")),
            "{levels}: {result:?} (decoded {out:?})"
        );
        assert_eq!(out, [7.0], "{levels}");
        let result = q.decode_add(&[0u8; 5], &mut out);
        assert!(
            matches!(&result, Err(CompressError::InvalidArgument(m)) if m.contains("levels")),
            "{levels}: {result:?} (decoded {out:?})"
        );
        assert_eq!(out, [7.0], "{levels}");
    }
}

/// A payload corrupt only in its last chunk is refused before any entry
/// is written: `decode` and `decode_add` leave their output as it was.
#[test]
fn a_payload_corrupt_in_a_later_chunk_changes_nothing() {
    let n = 1031;
    let q7 = |levels| Quantizer::Qsgd {
        levels,
        seed: 2,
        norm: QsgdNorm::L2,
    };
    for q in [
        Quantizer::Sign,
        Quantizer::MinMaxU8,
        q7(100),
        q7(7),
        Quantizer::E3m0 { seed: 2 },
    ] {
        let mut payload = vec![0u8; q.encoded_len(n)];
        q.encode(&values(9, n), 0, &mut payload).unwrap();
        let last = 2 * q.chunk_bytes();
        let mut corrupt = payload.clone();
        match q {
            // A NaN scale; min above max; a level beyond the setting (127
            // in a byte, -8 in a nibble); E3M0's negative zero.
            Quantizer::Sign => corrupt[last..last + 4].copy_from_slice(&f32::NAN.to_le_bytes()),
            Quantizer::MinMaxU8 => {
                corrupt[last..last + 4].copy_from_slice(&2.0f32.to_le_bytes());
                corrupt[last + 4..last + 8].copy_from_slice(&1.0f32.to_le_bytes());
            }
            Quantizer::Qsgd { levels, .. } => {
                corrupt[last + 4 + 3] = if levels > QSGD_NIBBLE_LEVELS {
                    0x7f
                } else {
                    0x88
                }
            }
            // Two negative zeros.
            Quantizer::E3m0 { .. } => corrupt[last + 4 + 3] = 0x88,
        }
        let before = values(4, n);
        let mut out = before.clone();
        type Decode = fn(&Quantizer, &[u8], &mut [f32]) -> Result<(), CompressError>;
        let decoders: [(&str, Decode); 2] = [
            ("decode", Quantizer::decode),
            ("decode_add", Quantizer::decode_add),
        ];
        for (op, decode) in decoders {
            let result = decode(&q, &corrupt, &mut out);
            assert!(
                matches!(result, Err(CompressError::Corrupt(_))),
                "{q:?} {op}: {result:?}"
            );
            assert_eq!(
                out, before,
                "{q:?}: {op} wrote entries of a refused payload"
            );
        }
        // The intact payload decodes.
        q.decode(&payload, &mut out).unwrap();
    }
}

#[test]
fn corrupt_payloads_are_refused_and_nothing_decodes_to_non_finite() {
    let n = 600;
    for q in [
        Quantizer::Sign,
        Quantizer::MinMaxU8,
        Quantizer::Qsgd {
            levels: 100,
            seed: 1,
            norm: gradwire_compress::QsgdNorm::L2,
        },
        Quantizer::Qsgd {
            levels: 7,
            seed: 1,
            norm: gradwire_compress::QsgdNorm::L2,
        },
        Quantizer::E3m0 { seed: 1 },
    ] {
        let mut payload = vec![0u8; q.encoded_len(n)];
        q.encode(&values(5, n), 0, &mut payload).unwrap();
        let mut out = vec![0f32; n];
        // A wrong length.
        assert!(matches!(
            q.decode(&payload[1..], &mut out),
            Err(CompressError::Corrupt(_))
        ));
        // A NaN scale.
        let mut bad = payload.clone();
        bad[..4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(matches!(
            q.decode(&bad, &mut out),
            Err(CompressError::Corrupt(_))
        ));
        // Every single-byte change decodes to finite values or is refused.
        for at in (0..payload.len()).step_by(7) {
            for byte in [0u8, 0x7f, 0x80, 0xff] {
                let mut flipped = payload.clone();
                flipped[at] = byte;
                if q.decode(&flipped, &mut out).is_ok() {
                    assert!(
                        out.iter().all(|v| v.is_finite()),
                        "{q:?} byte {at} = {byte}"
                    );
                }
            }
        }
    }
    // QSGD levels beyond the setting, and min above max.
    let q = Quantizer::Qsgd {
        levels: 3,
        seed: 0,
        norm: QsgdNorm::L2,
    };
    let mut payload = vec![0u8; q.encoded_len(4)];
    q.encode(&[1.0, -1.0, 0.5, 0.0], 0, &mut payload).unwrap();
    // Entries 2 and 3 share byte 5 (3 levels: nibbles): 4 in the low half.
    payload[5] = 4;
    let result = q.decode(&payload, &mut [0.0; 4]);
    assert!(
        matches!(&result, Err(CompressError::Corrupt(m)) if m.contains("level 4 beyond 3")),
        "{result:?}"
    );
    // A nibble's -8, beyond any setting that nibbles hold, in the high half.
    let q = Quantizer::Qsgd {
        levels: QSGD_NIBBLE_LEVELS,
        seed: 0,
        norm: QsgdNorm::L2,
    };
    let mut payload = vec![0u8; q.encoded_len(3)];
    q.encode(&[1.0, -1.0, 0.5], 0, &mut payload).unwrap();
    payload[4] = (payload[4] & 0x0f) | 0x80;
    let result = q.decode(&payload, &mut [0.0; 3]);
    assert!(
        matches!(&result, Err(CompressError::Corrupt(m)) if m.contains("level -8 beyond 7")),
        "{result:?}"
    );
    // An odd chunk's padding nibble set: one payload, one spelling.
    q.encode(&[1.0, -1.0, 0.5], 0, &mut payload).unwrap();
    payload[5] |= 0x10;
    let mut out = [9.0f32; 3];
    let result = q.decode_add(&payload, &mut out);
    assert!(
        matches!(&result, Err(CompressError::Corrupt(m)) if m.contains("padding nibble")),
        "{result:?}"
    );
    assert_eq!(out, [9.0; 3], "nothing added from a refused payload");
    let q = Quantizer::MinMaxU8;
    let mut payload = vec![0u8; q.encoded_len(2)];
    q.encode(&[1.0, 2.0], 0, &mut payload).unwrap();
    payload[..4].copy_from_slice(&3.0f32.to_le_bytes());
    let result = q.decode(&payload, &mut [0.0; 2]);
    assert!(
        matches!(&result, Err(CompressError::Corrupt(m)) if m.contains("minimum 3 above its maximum 2")),
        "{result:?}"
    );
}

#[test]
fn extreme_ranges_stay_finite() {
    let x = [-3.0e38f32, 3.0e38, 1.0, -1.0, 1e-45];
    for q in [
        Quantizer::MinMaxU8,
        Quantizer::Qsgd {
            levels: 127,
            seed: 2,
            norm: gradwire_compress::QsgdNorm::L2,
        },
        Quantizer::Sign,
        Quantizer::E3m0 { seed: 2 },
    ] {
        let out = round_trip(q, &x, 1);
        assert!(out.iter().all(|v| v.is_finite()), "{q:?}: {out:?}");
    }
    // A subnormal scale.
    for q in [
        Quantizer::Qsgd {
            levels: 127,
            seed: 2,
            norm: gradwire_compress::QsgdNorm::L2,
        },
        Quantizer::E3m0 { seed: 2 },
    ] {
        let out = round_trip(q, &[1e-45, -1e-45, 0.0], 3);
        assert!(out.iter().all(|v| v.is_finite()), "{q:?}: {out:?}");
    }
}

/// Min-max's minimum and maximum are the first of equal zeros met (the
/// lanes of whole eights, then the remainder): the payload's bytes do not
/// depend on the compiler's choice between +0.0 and -0.0, which f32::min
/// and f32::max leave open (the device encoder gives the same bytes).
#[test]
fn min_max_keeps_the_first_of_equal_zeros() {
    let q = Quantizer::MinMaxU8;
    let header = |x: &[f32]| {
        let mut payload = vec![0u8; q.encoded_len(x.len())];
        q.encode(x, 0, &mut payload).unwrap();
        let scale = |at: usize| f32::from_le_bytes(payload[at..at + 4].try_into().unwrap());
        (scale(0).to_bits(), scale(4).to_bits())
    };
    let (pos, neg) = (0.0f32.to_bits(), (-0.0f32).to_bits());
    // The remainder only.
    assert_eq!(header(&[-0.0, 0.0, -0.0]), (neg, neg));
    assert_eq!(header(&[0.0, -0.0, 0.0]), (pos, pos));
    assert_eq!(header(&[1.0, -0.0, 0.0, -0.0]).0, neg);
    assert_eq!(header(&[0.5, -0.0, 0.0, -0.0, 0.0, 0.25, -0.0]).0, neg);
    assert_eq!(header(&[-0.5, 0.0, -0.0, 0.0, -0.0, -0.25, 0.0]).1, pos);
    assert_eq!(header(&[-1.0, 0.0, -0.0]).1, pos);
    // Lanes, then the remainder: lane 0 holds +0.0, lane 1 -0.0.
    let mut x = vec![1.0f32; 9];
    x[0] = 0.0;
    x[1] = -0.0;
    x[8] = -0.0;
    assert_eq!(header(&x).0, pos);
    x[0] = -0.0;
    x[1] = 0.0;
    assert_eq!(header(&x).0, neg);
    // Decoding keeps a value equal to the maximum as it comes: an all-zero
    // chunk whose minimum is -0.0 decodes to +0.0 (-0.0 + 0 * 0.0).
    let mut out = [1.0f32; 3];
    let mut payload = vec![0u8; q.encoded_len(3)];
    q.encode(&[-0.0, 0.0, -0.0], 0, &mut payload).unwrap();
    q.decode(&payload, &mut out).unwrap();
    assert!(out.iter().all(|v| v.to_bits() == pos), "{out:?}");
}
