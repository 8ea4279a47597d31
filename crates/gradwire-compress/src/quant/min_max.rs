//! Min-max uint8 (Bagua's ByteGrad): each chunk's minimum and maximum,
//! then each entry's nearest of 256 steps between them (deterministic).

use super::read_scale;
use crate::error::{CompressError, Result};

/// One chunk: its minimum and maximum, then each entry's step.
#[inline(always)]
pub(super) fn encode(x: &[f32], out: &mut [u8]) {
    let (mut lo, mut hi) = ([f32::INFINITY; 8], [f32::NEG_INFINITY; 8]);
    let mut eights = x.chunks_exact(8);
    for c in eights.by_ref() {
        for l in 0..8 {
            lo[l] = if c[l] < lo[l] { c[l] } else { lo[l] };
            hi[l] = if c[l] > hi[l] { c[l] } else { hi[l] };
        }
    }
    // The lanes, then the remainder, in order, a value replacing the running
    // one only when strictly smaller (larger), as in the lanes: f32::min and
    // f32::max may return either zero of +0.0 and -0.0, and which one the
    // compiler picks varies, while the payload's bytes must not (the device
    // encoder gives the same).
    let fold = |init: f32, lanes: [f32; 8], replaces: fn(f32, f32) -> bool| {
        lanes
            .into_iter()
            .chain(eights.remainder().iter().copied())
            .fold(init, |acc, v| if replaces(v, acc) { v } else { acc })
    };
    let (min, max) = if x.is_empty() {
        (0.0, 0.0)
    } else {
        (
            fold(f32::INFINITY, lo, |v, acc| v < acc),
            fold(f32::NEG_INFINITY, hi, |v, acc| v > acc),
        )
    };
    out[..4].copy_from_slice(&min.to_le_bytes());
    out[4..8].copy_from_slice(&max.to_le_bytes());
    let range = max - min;
    let codes = &mut out[8..];
    if range.is_finite() {
        let to_step = if range > 0.0 { 255.0 / range } else { 0.0 };
        for (o, &v) in codes.iter_mut().zip(x) {
            // Non-negative and below 256: + 0.5 and the cast round to
            // nearest (through i32, whose conversion vectorises).
            *o = ((v - min) * to_step + 0.5) as i32 as u8;
        }
    } else {
        // max - min overflows f32: in f64.
        let to_step = 255.0 / (f64::from(max) - f64::from(min));
        for (o, &v) in codes.iter_mut().zip(x) {
            *o = ((f64::from(v) - f64::from(min)) * to_step + 0.5) as u8;
        }
    }
}

/// Refuses a chunk whose minimum or maximum is not finite or whose
/// minimum is above its maximum.
pub(super) fn check(chunk: &[u8]) -> Result<()> {
    let (min, max) = (read_scale(chunk, 0)?, read_scale(chunk, 4)?);
    if min > max {
        return Err(CompressError::Corrupt(format!(
            "a chunk's minimum {min} above its maximum {max}"
        )));
    }
    Ok(())
}

/// Puts a checked chunk's values into `out` with `put`: the minimum plus
/// the step times the code, at most the maximum.
pub(super) fn decode(chunk: &[u8], out: &mut [f32], put: impl Fn(&mut f32, f32)) -> Result<()> {
    let (min, max) = (read_scale(chunk, 0)?, read_scale(chunk, 4)?);
    let codes = &chunk[8..];
    let step = (max - min) / 255.0;
    if step.is_finite() {
        for (o, &q) in out.iter_mut().zip(codes) {
            // Clamped: rounding may not carry a value past max (a
            // comparison, not f32::min, whose choice between +0.0 and -0.0
            // is the compiler's).
            let v = min + f32::from(q) * step;
            put(o, if v > max { max } else { v });
        }
    } else {
        // max - min overflows f32: in f64.
        let step = (f64::from(max) - f64::from(min)) / 255.0;
        for (o, &q) in out.iter_mut().zip(codes) {
            let v = f64::from(min) + f64::from(q) * step;
            put(o, (v as f32).clamp(min, max));
        }
    }
    Ok(())
}
