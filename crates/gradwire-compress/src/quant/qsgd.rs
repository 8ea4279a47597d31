//! QSGD (Alistarh et al., NeurIPS 2017): each chunk's scale (its 2-norm or
//! largest magnitude), then each entry's level in `-s..=s` of
//! `|v| / scale`, rounded stochastically; an `i8` a level, or with at most
//! [`QSGD_NIBBLE_LEVELS`] levels a two's-complement nibble.

use super::{QSGD_NIBBLE_LEVELS, QUANT_CHUNK, QsgdNorm, draws, nibbles, read_scale};
use crate::error::{CompressError, Result};

/// Entries a byte of QSGD codes holds with `levels` levels per sign: two
/// 4-bit levels for at most [`QSGD_NIBBLE_LEVELS`], else one `i8`.
pub(super) fn entries_per_byte(levels: u8) -> usize {
    if levels <= QSGD_NIBBLE_LEVELS { 2 } else { 1 }
}

/// QSGD's scale of a chunk of finite entries whose largest magnitude has
/// the bits `largest`: its 2-norm (the squares summed in f64 in eight lanes
/// of every eighth entry, the lanes in order, then the remainder in order,
/// so the device gives the same bits; rounded once to f32), or its largest
/// magnitude, for [`QsgdNorm::Max`] or when the 2-norm overflows f32.
pub(super) fn scale(x: &[f32], norm: QsgdNorm, largest: u32) -> f32 {
    let max = f32::from_bits(largest);
    if norm == QsgdNorm::Max {
        return max;
    }
    let mut lanes = [0f64; 8];
    let mut eights = x.chunks_exact(8);
    for c in eights.by_ref() {
        for l in 0..8 {
            let v = f64::from(c[l]);
            lanes[l] += v * v;
        }
    }
    let total = lanes
        .into_iter()
        .chain(
            eights
                .remainder()
                .iter()
                .map(|&v| f64::from(v) * f64::from(v)),
        )
        .fold(0.0, |acc, v| acc + v);
    let l2 = total.sqrt() as f32;
    if l2.is_finite() { l2 } else { max }
}

/// One chunk of scale `scale` (its entries from `first` on in
/// the stream `key`): the scale, then each entry's level, rounded up with
/// probability equal to the fraction (unbiased), in a byte or, for at
/// most [`QSGD_NIBBLE_LEVELS`] levels, in half of one.
#[inline(always)]
pub(super) fn encode(x: &[f32], scale: f32, levels: u8, key: u64, first: u64, out: &mut [u8]) {
    out[..4].copy_from_slice(&scale.to_le_bytes());
    let s = f32::from(levels);
    // |v| / scale first: at most 1, even when scale is subnormal.
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let level = |i: usize, v: f32| {
        let exact = (v.abs() * inverse).min(1.0) * s;
        let u = draws::uniform(draws::hash32(key, first as u32 ^ i as u32));
        // floor(exact + u): up with probability frac(exact); through i32,
        // whose conversion vectorises.
        let level = ((exact + u) as i32).min(i32::from(levels)) as i8;
        if v < 0.0 { -level } else { level }
    };
    let codes = &mut out[4..];
    if entries_per_byte(levels) == 1 {
        for (i, (o, &v)) in codes.iter_mut().zip(x).enumerate() {
            *o = level(i, v) as u8;
        }
        return;
    }
    // The levels of the whole chunk first (the loop above, which
    // vectorises), then packed two to a byte; past x's end they are 0.
    let mut levels_of = [0u8; QUANT_CHUNK];
    for (i, (l, &v)) in levels_of.iter_mut().zip(x).enumerate() {
        *l = level(i, v) as u8;
    }
    nibbles::pack(&levels_of, codes);
}

/// A nibble's level, sign-extended (moved to the top, then an arithmetic
/// shift back down).
#[inline(always)]
fn nibble_level(nibble: u8) -> i8 {
    ((nibble << 4) as i8) >> 4
}

/// Refuses a chunk of `entries` entries whose scale is not finite, whose
/// level is beyond `levels` or (in nibbles) whose padding is set.
pub(super) fn check(chunk: &[u8], entries: usize, levels: u8) -> Result<()> {
    read_scale(chunk, 0)?;
    let codes = &chunk[4..];
    let nibbles = entries_per_byte(levels) == 2;
    // The largest magnitude first (a pass that vectorises), the offending
    // level looked for only when it is bad.
    let largest = if nibbles {
        codes.iter().fold(0u8, |m, &b| {
            m.max(nibble_level(b & 0x0f).unsigned_abs())
                .max(nibble_level(b >> 4).unsigned_abs())
        })
    } else {
        codes
            .iter()
            .fold(0u8, |m, &b| m.max((b as i8).unsigned_abs()))
    };
    if largest > levels {
        let level = |i: usize| match nibbles {
            true => nibble_level(codes[i / 2] >> (4 * (i % 2))),
            false => codes[i] as i8,
        };
        return Err(
            match (0..entries).map(level).find(|q| q.unsigned_abs() > levels) {
                Some(bad) => CompressError::Corrupt(format!("QSGD level {bad} beyond {levels}")),
                // No entry's: the padding nibble's, the one nibble that is
                // no entry.
                None => nibbles::padding_not_zero("QSGD"),
            },
        );
    }
    if nibbles {
        nibbles::check_padding(codes, entries, "QSGD")?;
    }
    Ok(())
}

/// Puts a checked chunk's values into `out` with `put`: level times
/// `scale / levels`.
pub(super) fn decode(
    chunk: &[u8],
    levels: u8,
    out: &mut [f32],
    put: impl Fn(&mut f32, f32),
) -> Result<()> {
    let unit = read_scale(chunk, 0)? / f32::from(levels);
    let codes = &chunk[4..];
    if entries_per_byte(levels) == 2 {
        nibbles::decode(codes, out, |n| f32::from(nibble_level(n)) * unit, put);
    } else {
        for (o, &q) in out.iter_mut().zip(codes) {
            put(o, f32::from(q as i8) * unit);
        }
    }
    Ok(())
}
