//! 1-bit scaled sign (EF-SignSGD): each chunk's mean magnitude, then the
//! signs, eight to a byte (bit `i` of byte `j` entry `8j + i`, 1 for
//! `>= 0`).

use super::read_scale;
use crate::error::Result;

/// One chunk: its mean magnitude, then the signs.
#[inline(always)]
pub(super) fn encode(x: &[f32], out: &mut [u8]) {
    let scale = match sum_abs(x) {
        _ if x.is_empty() => 0.0,
        sum if sum.is_finite() => sum / x.len() as f32,
        // Huge magnitudes overflow the f32 sum: in f64.
        _ => (x.iter().map(|v| f64::from(v.abs())).sum::<f64>() / x.len() as f64) as f32,
    };
    out[..4].copy_from_slice(&scale.to_le_bytes());
    for (byte, eight) in out[4..].iter_mut().zip(x.chunks(8)) {
        let mut b = 0u8;
        for (i, v) in eight.iter().enumerate() {
            // The sign bit, inverted: 1 for a non-negative entry.
            b |= ((v.to_bits() >> 31) as u8 ^ 1) << i;
        }
        *byte = b;
    }
}

/// The sum of magnitudes of a chunk, eight partial sums at a time (512
/// entries: f32 partial sums lose nothing that matters to a scale).
#[inline(always)]
fn sum_abs(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut eights = x.chunks_exact(8);
    for c in eights.by_ref() {
        for l in 0..8 {
            lanes[l] += c[l].abs();
        }
    }
    lanes.iter().sum::<f32>() + eights.remainder().iter().map(|v| v.abs()).sum::<f32>()
}

/// Puts a checked chunk's values into `out` with `put`.
pub(super) fn decode(chunk: &[u8], out: &mut [f32], put: impl Fn(&mut f32, f32)) -> Result<()> {
    let scale = read_scale(chunk, 0)?;
    for (eight, &byte) in out.chunks_mut(8).zip(&chunk[4..]) {
        for (i, o) in eight.iter_mut().enumerate() {
            put(o, if byte >> i & 1 == 1 { scale } else { -scale });
        }
    }
    Ok(())
}
