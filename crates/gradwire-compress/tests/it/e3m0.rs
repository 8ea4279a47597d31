//! E3M0 against its definition, written here from the format (a sign and
//! a power of two of each chunk's largest magnitude, `2^-6 ..= 1` or zero,
//! rounded stochastically between the two neighbours), not from the
//! encoder: the nibbles unpacked by hand on lengths 0, 1, primes and chunk
//! edges; every decoded value one of the two neighbours of its entry in
//! f64; the mean over seeds the entry; exact powers of two kept exactly;
//! each corrupt spelling refused by name with nothing written.

use gradwire_compress::quant::QUANT_CHUNK;
use gradwire_compress::{CompressError, Quantizer};
use proptest::prelude::*;

use crate::quant::{LENGTHS, round_trip, sum_over_streams, values};

/// The magnitudes E3M0 has, as fractions of the scale, in f64: 0 and
/// `2^-6 ..= 1`.
fn grid() -> Vec<f64> {
    std::iter::once(0.0)
        .chain((0..=6).rev().map(|k| 2f64.powi(-k)))
        .collect()
}

/// The neighbours in [`grid`] of the ratio `r` (in `[0, 1]`): the largest
/// at most `r` and the smallest at least `r`.
fn neighbours(r: f64) -> (f64, f64) {
    let grid = grid();
    let below = grid.iter().copied().filter(|&g| g <= r).fold(0.0, f64::max);
    let above = grid.iter().copied().filter(|&g| g >= r).fold(1.0, f64::min);
    (below, above)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The payload read by hand: per chunk the largest magnitude, then
    /// nibbles (entry 2j in the low half of byte j) of a sign bit and a
    /// power, never a negative zero, an odd chunk's padding zero; each
    /// decoded value is its nibble's and lies next to its entry.
    #[test]
    fn e3m0_is_a_neighbouring_power_of_the_largest(
        n in prop::sample::select(LENGTHS.to_vec()), seed: u64, stream: u64,
    ) {
        let q = Quantizer::E3m0 { seed };
        let x = values(seed, n);
        let mut payload = vec![0u8; q.encoded_len(n)];
        q.encode(&x, stream, &mut payload).unwrap();
        prop_assert_eq!(q.encoded_len(n), 4 * n.div_ceil(QUANT_CHUNK) + n.div_ceil(2));
        prop_assert_eq!(q.chunk_bytes(), 4 + QUANT_CHUNK / 2);
        let mut out = vec![f32::NAN; n];
        q.decode(&payload, &mut out).unwrap();
        for ((xs, os), chunk) in x
            .chunks(QUANT_CHUNK)
            .zip(out.chunks(QUANT_CHUNK))
            .zip(payload.chunks(q.chunk_bytes()))
        {
            let scale = f32::from_le_bytes(chunk[..4].try_into().unwrap());
            let largest = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            prop_assert_eq!(scale.to_bits(), largest.to_bits());
            let codes = &chunk[4..];
            prop_assert_eq!(codes.len(), xs.len().div_ceil(2));
            if xs.len() % 2 == 1 {
                prop_assert_eq!(codes[xs.len() / 2] >> 4, 0, "the padding nibble");
            }
            for (i, (&v, &o)) in xs.iter().zip(os).enumerate() {
                let nibble = (codes[i / 2] >> (4 * (i % 2))) & 0x0f;
                let power = nibble & 7;
                prop_assert!(nibble != 8, "entry {}: a negative zero", i);
                let magnitude = if power == 0 {
                    0.0
                } else {
                    f64::from(scale) * 2f64.powi(i32::from(power) - 7)
                };
                let sign = if nibble & 8 != 0 { -1.0 } else { 1.0 };
                prop_assert_eq!(f64::from(o), sign * magnitude, "entry {} nibble {}", i, nibble);
                prop_assert!(o == 0.0 || (o < 0.0) == (v < 0.0), "{} decoded {}", v, o);
                if scale > 0.0 {
                    // The format's ratio is the f32 quotient (IEEE division,
                    // correctly rounded): an entry an ulp below a power of
                    // two of the scale may have the power itself as its
                    // ratio, and then decodes to it exactly.
                    let r = f64::from(v.abs() / scale);
                    let (below, above) = neighbours(r);
                    let m = magnitude / f64::from(scale);
                    prop_assert!(
                        m == below || m == above,
                        "{} (ratio {}) decoded {} (ratio {}): not {} or {}",
                        v, r, o, m, below, above
                    );
                } else {
                    prop_assert_eq!(o, 0.0);
                }
            }
        }
    }
}

#[test]
fn e3m0_is_unbiased_over_seeds() {
    // 3000 independent encodings of the same vector: the mean of each entry
    // is within 5 standard errors of the entry. Rounding between
    // neighbours a gap g apart has a variance of at most g^2 / 4, and the
    // gap is at most the entry's magnitude (above 2^-6 of the scale) or
    // 2^-6 of the scale (below).
    let n = 700;
    let x = values(13, n);
    let q = Quantizer::E3m0 { seed: 99 };
    let trials = 3000;
    let sum = sum_over_streams(q, &x, trials);
    for (c, (xs, ss)) in x
        .chunks(QUANT_CHUNK)
        .zip(sum.chunks(QUANT_CHUNK))
        .enumerate()
    {
        let scale = xs.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
        for (i, (v, s)) in xs.iter().zip(ss).enumerate() {
            let gap = f64::from(v.abs()).max(scale / 64.0);
            let bound = 5.0 * (gap / 2.0) / (trials as f64).sqrt();
            let mean = s / trials as f64;
            assert!(
                (mean - f64::from(*v)).abs() <= bound + 1e-7,
                "chunk {c} entry {i}: mean {mean}, value {v}, bound {bound}"
            );
        }
    }
    // A given stream is reproducible, another stream draws otherwise.
    assert_eq!(round_trip(q, &x, 7), round_trip(q, &x, 7));
    assert_ne!(round_trip(q, &x, 7), round_trip(q, &x, 8));
}

#[test]
fn e3m0_keeps_its_powers_of_two_exactly() {
    // Ratios 1 down to 2^-6 are codes: the same for every stream. Below
    // 2^-6 each entry is 0 or 2^-6 of the scale, with its sign.
    let scale = 3.0f32;
    let mut x: Vec<f32> = (0..=6)
        .map(|k| scale * 2f32.powi(-k) * if k % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    x.extend([scale / 128.0, -scale / 1000.0, 0.0, -0.0]);
    for stream in 0..50 {
        let out = round_trip(Quantizer::E3m0 { seed: 4 }, &x, stream);
        assert_eq!(out[..7], x[..7], "stream {stream}");
        for (&v, &o) in x[7..9].iter().zip(&out[7..9]) {
            assert!(
                o == 0.0 || o == (scale / 64.0).copysign(v),
                "stream {stream}: {v} decoded {o}"
            );
        }
        // Zeros decode to +0.0: no negative zero code.
        assert_eq!(out[9].to_bits(), 0);
        assert_eq!(out[10].to_bits(), 0);
    }
    // An all-zero chunk: a zero scale, zero codes.
    let q = Quantizer::E3m0 { seed: 4 };
    let mut payload = vec![0xffu8; q.encoded_len(5)];
    q.encode(&[0.0, -0.0, 0.0, 0.0, -0.0], 1, &mut payload)
        .unwrap();
    assert_eq!(payload, vec![0u8; 7]);
}

#[test]
fn e3m0_refuses_each_corrupt_spelling_by_name() {
    let q = Quantizer::E3m0 { seed: 0 };
    let x = [1.0f32, -0.5, 0.25];
    let mut good = vec![0u8; q.encoded_len(3)];
    q.encode(&x, 0, &mut good).unwrap();
    // What the case is, how it corrupts a good payload, what the error names.
    type Case = (&'static str, fn(&mut Vec<u8>), &'static str);
    let cases: [Case; 5] = [
        (
            "a negative zero in a low half",
            |p| p[5] = (p[5] & 0xf0) | 0x08,
            "negative zero",
        ),
        (
            "a negative zero in a high half",
            |p| p[4] = (p[4] & 0x0f) | 0x80,
            "negative zero",
        ),
        (
            "a negative scale",
            |p| p[..4].copy_from_slice(&(-1.0f32).to_le_bytes()),
            "negative E3M0 scale",
        ),
        (
            "a negative zero scale",
            |p| p[..4].copy_from_slice(&(-0.0f32).to_le_bytes()),
            "negative E3M0 scale",
        ),
        ("the padding nibble set", |p| p[5] |= 0x10, "padding nibble"),
    ];
    for (what, corrupt, names) in cases {
        let mut payload = good.clone();
        corrupt(&mut payload);
        let mut out = [9.0f32; 3];
        let result = q.decode_add(&payload, &mut out);
        assert!(
            matches!(&result, Err(CompressError::Corrupt(m)) if m.contains(names)),
            "{what}: {result:?}"
        );
        assert_eq!(out, [9.0; 3], "{what}: nothing added");
    }
    let mut out = [0f32; 3];
    q.decode(&good, &mut out).unwrap();
    assert_eq!(out, x);
}
