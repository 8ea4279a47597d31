//! E3M0: a sign and a 3-bit power of two in a nibble, each chunk scaled by
//! its largest magnitude (Streaming DiLoCo's 4-bit pseudo-gradients). Code
//! `e` in `1..=7` is `scale * 2^(e - 7)`, 0 is zero, bit 3 the sign (never
//! set on a zero: the code 8 is refused). An entry rounds stochastically
//! between the two codes around it, up with the probability that makes the
//! mean exact: with `|v| / scale = 2^E (1 + m)` (`E` in `-6..=0`), up from
//! `2^E` with probability `m`, its mantissa; below `2^-6`, to `2^-6` with
//! probability `64 |v| / scale`, else to zero.

use super::{QUANT_CHUNK, draws, nibbles, read_scale};
use crate::error::{CompressError, Result};

/// Code `e`'s magnitude as a fraction of the scale.
const MAGNITUDES: [f32; 8] = [
    0.0,
    1.0 / 64.0,
    1.0 / 32.0,
    1.0 / 16.0,
    1.0 / 8.0,
    1.0 / 4.0,
    1.0 / 2.0,
    1.0,
];

/// The sign bit of a code.
const NEGATIVE: u8 = 8;

/// The bits of `2^-6`, the smallest magnitude but zero (an exponent field
/// of 127 - 6).
const SMALLEST_BITS: u32 = 121 << 23;

/// One chunk of largest magnitude `scale` (its entries from `first` on in
/// the stream `key`): the scale, then each entry's code, two to a byte.
#[inline(always)]
pub(super) fn encode(x: &[f32], scale: f32, key: u64, first: u64, out: &mut [u8]) {
    out[..4].copy_from_slice(&scale.to_le_bytes());
    let mut codes = [0u8; QUANT_CHUNK];
    // A zero scale: every entry zero, every code 0.
    if scale > 0.0 {
        for (i, (c, &v)) in codes.iter_mut().zip(x).enumerate() {
            *c = code(v, scale, draws::hash32(key, first as u32 ^ i as u32));
        }
    }
    nibbles::pack(&codes, &mut out[4..]);
}

/// The code of `v` in a chunk of largest magnitude `scale` (> 0) with the
/// draw `draw`.
#[inline(always)]
fn code(v: f32, scale: f32, draw: u32) -> u8 {
    // Correctly rounded, so at most 1 (|v| is at most the scale), even for
    // a subnormal scale.
    let bits = (v.abs() / scale).to_bits();
    let magnitude = if bits >= SMALLEST_BITS {
        // Exponent field 121 ..= 127 (2^-6 ..= 1): codes 1 ..= 7, one up
        // when the draw's top 23 bits fall below the mantissa's (1 has
        // none: 7 is the most).
        (bits >> 23) - 120 + u32::from(draw >> 9 < (bits & 0x7f_ffff))
    } else {
        // 2^-6 with probability 64 r (an exact product), else zero.
        u32::from(draws::uniform(draw) < f32::from_bits(bits) * 64.0)
    };
    let sign = if v < 0.0 && magnitude != 0 {
        NEGATIVE
    } else {
        0
    };
    magnitude as u8 | sign
}

/// Refuses a chunk of `entries` entries whose scale is not finite or is
/// negative (its sign bit set: the encoder writes a magnitude), with a
/// negative zero code or a set padding nibble.
pub(super) fn check(chunk: &[u8], entries: usize) -> Result<()> {
    let scale = read_scale(chunk, 0)?;
    if scale.is_sign_negative() {
        return Err(CompressError::Corrupt(format!(
            "a negative E3M0 scale {scale}"
        )));
    }
    let codes = &chunk[4..];
    // One pass that vectorises: a nibble of 8 anywhere.
    let negative_zero = codes.iter().fold(false, |found, &b| {
        found | (b & 0x0f == NEGATIVE) | (b >> 4 == NEGATIVE)
    });
    if negative_zero {
        return Err(CompressError::Corrupt(
            "an E3M0 code 8 (a negative zero), which no encoder writes".into(),
        ));
    }
    nibbles::check_padding(codes, entries, "E3M0")
}

/// Puts a checked chunk's values into `out` with `put`.
pub(super) fn decode(chunk: &[u8], out: &mut [f32], put: impl Fn(&mut f32, f32)) -> Result<()> {
    let scale = read_scale(chunk, 0)?;
    // The sixteen values of the chunk's nibbles (8, refused, stays 0).
    let mut values = [0f32; 16];
    for (e, m) in MAGNITUDES.iter().enumerate().skip(1) {
        values[e] = scale * m;
        values[e | usize::from(NEGATIVE)] = -(scale * m);
    }
    nibbles::decode(&chunk[4..], out, |n| values[usize::from(n)], put);
    Ok(())
}
