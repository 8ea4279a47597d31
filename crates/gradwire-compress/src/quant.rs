//! Quantizers: every entry sent in a fixed, small number of bits.
//!
//! - [`Quantizer::Sign`]: one bit per entry (its sign) and a scale, the
//!   mean magnitude, per chunk of [`QUANT_CHUNK`] entries (scaled sign
//!   compression, EF-SignSGD: Karimireddy et al., ICML 2019; DeepSpeed's
//!   1-bit Adam sends the same with one scale per call: a scale per chunk
//!   follows each layer's magnitude, for 1/16 of a bit more per entry);
//!   biased, so meant for use with error feedback.
//! - [`Quantizer::Qsgd`]: QSGD (Alistarh et al., NeurIPS 2017) with
//!   max-norm scaling: each chunk of [`QUANT_CHUNK`] entries has a scale (its
//!   largest magnitude) and each entry an `i8` level in `-s..=s`, rounded
//!   stochastically (seeded), so the decoded value is unbiased.
//! - [`Quantizer::MinMaxU8`]: Bagua's ByteGrad: each chunk has its minimum and
//!   maximum, each entry a `u8` step between them, rounded to nearest
//!   (deterministic).
//!
//! Payloads are little-endian byte strings of a length fixed by the number
//! of entries ([`Quantizer::encoded_len`]), so a receiver knows every
//! size in advance. Encoding refuses NaN and infinities; decoding checks the
//! length, every scale and every level, and never yields a non-finite value.

use crate::error::{CompressError, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Entries per scale (QSGD's "bucket size": 512 in the paper's
/// experiments): a scale costs 4 or 8 bytes per 512 entries.
pub const QUANT_CHUNK: usize = 512;

/// How entries are quantized (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantizer {
    /// One bit per entry and the mean magnitude as the scale.
    Sign,
    /// QSGD with `levels` levels per sign (1 to 127: 127 is 8 bits), max-norm
    /// scaled per chunk, stochastic rounding from `seed`.
    Qsgd {
        /// Levels per sign.
        levels: u8,
        /// The seed of the rounding (mixed with the caller's stream).
        seed: u64,
    },
    /// A `u8` between each chunk's minimum and maximum.
    MinMaxU8,
}

impl Quantizer {
    /// The settings' check: QSGD's levels in `1..=127`.
    pub fn validate(&self) -> Result<()> {
        match *self {
            Quantizer::Qsgd { levels, .. } if !(1..=127).contains(&levels) => {
                Err(CompressError::InvalidArgument(format!(
                    "QSGD's levels must be 1 to 127, got {levels}"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Bits per entry on the wire, scales included, for large inputs.
    pub fn bits_per_entry(&self) -> f64 {
        match self {
            Quantizer::Sign => 1.0 + 32.0 / QUANT_CHUNK as f64,
            Quantizer::Qsgd { .. } => 8.0 + 32.0 / QUANT_CHUNK as f64,
            Quantizer::MinMaxU8 => 8.0 + 64.0 / QUANT_CHUNK as f64,
        }
    }

    /// The bytes `n` entries encode to.
    pub fn encoded_len(&self, n: usize) -> usize {
        let chunks = n.div_ceil(QUANT_CHUNK);
        match self {
            // Chunks of 512 hold whole bytes of signs.
            Quantizer::Sign => 4 * chunks + n.div_ceil(8),
            Quantizer::Qsgd { .. } => 4 * chunks + n,
            Quantizer::MinMaxU8 => 8 * chunks + n,
        }
    }

    /// Encodes `x` into `out` (exactly [`Quantizer::encoded_len`] bytes).
    /// `stream` picks QSGD's random stream (callers mix in the step, the
    /// rank and the chunk, so no two encodings share their draws); the
    /// others ignore it.
    pub fn encode(&self, x: &[f32], stream: u64, out: &mut [u8]) -> Result<()> {
        self.validate()?;
        let expected = self.encoded_len(x.len());
        if out.len() != expected {
            return Err(CompressError::LengthMismatch {
                op: "quantize",
                expected,
                got: out.len(),
            });
        }
        if let Some((index, &value)) = x.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(CompressError::NonFinite { index, value });
        }
        match *self {
            Quantizer::Sign => {
                for (x, out) in x
                    .chunks(QUANT_CHUNK)
                    .zip(out.chunks_mut(4 + QUANT_CHUNK / 8))
                {
                    encode_sign(x, out);
                }
            }
            Quantizer::Qsgd { levels, seed } => {
                let mut rng =
                    ChaCha8Rng::seed_from_u64(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                for (x, out) in x.chunks(QUANT_CHUNK).zip(out.chunks_mut(4 + QUANT_CHUNK)) {
                    encode_qsgd(x, levels, &mut rng, out);
                }
            }
            Quantizer::MinMaxU8 => {
                for (x, out) in x.chunks(QUANT_CHUNK).zip(out.chunks_mut(8 + QUANT_CHUNK)) {
                    encode_min_max(x, out);
                }
            }
        }
        Ok(())
    }

    /// Decodes `payload` (of `out.len()` entries) into `out`.
    pub fn decode(&self, payload: &[u8], out: &mut [f32]) -> Result<()> {
        self.decode_with(payload, out, |o, v| *o = v)
    }

    /// Decodes `payload` (of `acc.len()` entries) and adds it to `acc`.
    pub fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        self.decode_with(payload, acc, |o, v| *o += v)
    }

    fn decode_with(
        &self,
        payload: &[u8],
        out: &mut [f32],
        put: impl Fn(&mut f32, f32),
    ) -> Result<()> {
        let expected = self.encoded_len(out.len());
        if payload.len() != expected {
            return Err(CompressError::Corrupt(format!(
                "a quantized payload of {} bytes for {} entries (expected {expected})",
                payload.len(),
                out.len()
            )));
        }
        match *self {
            Quantizer::Sign => {
                for (out, chunk) in out
                    .chunks_mut(QUANT_CHUNK)
                    .zip(payload.chunks(4 + QUANT_CHUNK / 8))
                {
                    let scale = read_scale(chunk, 0)?;
                    let bits = &chunk[4..];
                    for (i, o) in out.iter_mut().enumerate() {
                        let positive = bits[i / 8] >> (i % 8) & 1 == 1;
                        put(o, if positive { scale } else { -scale });
                    }
                }
            }
            Quantizer::Qsgd { levels, .. } => {
                let step_of = 1.0 / f32::from(levels);
                for (out, chunk) in out
                    .chunks_mut(QUANT_CHUNK)
                    .zip(payload.chunks(4 + QUANT_CHUNK))
                {
                    let scale = read_scale(chunk, 0)?;
                    for (o, &q) in out.iter_mut().zip(&chunk[4..]) {
                        let level = q as i8;
                        if level.unsigned_abs() > levels {
                            return Err(CompressError::Corrupt(format!(
                                "QSGD level {level} beyond {levels}"
                            )));
                        }
                        put(o, f32::from(level) * step_of * scale);
                    }
                }
            }
            Quantizer::MinMaxU8 => {
                for (out, chunk) in out
                    .chunks_mut(QUANT_CHUNK)
                    .zip(payload.chunks(8 + QUANT_CHUNK))
                {
                    let (min, max) = (read_scale(chunk, 0)?, read_scale(chunk, 4)?);
                    if min > max {
                        return Err(CompressError::Corrupt(format!(
                            "a chunk's minimum {min} above its maximum {max}"
                        )));
                    }
                    // In f64: max - min may overflow f32.
                    let step = (f64::from(max) - f64::from(min)) / 255.0;
                    for (o, &q) in out.iter_mut().zip(&chunk[8..]) {
                        // Clamped: rounding may not carry a value past max.
                        let v = f64::from(min) + f64::from(q) * step;
                        put(o, (v as f32).clamp(min, max));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A finite f32 at `at`.
fn read_scale(payload: &[u8], at: usize) -> Result<f32> {
    let bytes: [u8; 4] = payload
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| CompressError::Corrupt("a truncated scale".into()))?;
    let scale = f32::from_le_bytes(bytes);
    if scale.is_finite() {
        Ok(scale)
    } else {
        Err(CompressError::Corrupt(format!(
            "a non-finite scale {scale}"
        )))
    }
}

/// One chunk: its mean magnitude, then the signs, eight to a byte (1 for
/// `>= 0`).
fn encode_sign(x: &[f32], out: &mut [u8]) {
    let sum: f64 = x.iter().map(|v| f64::from(v.abs())).sum();
    let scale = if x.is_empty() {
        0.0
    } else {
        (sum / x.len() as f64) as f32
    };
    out[..4].copy_from_slice(&scale.to_le_bytes());
    let bits = &mut out[4..];
    let mut chunks = x.chunks_exact(8);
    for (byte, eight) in bits.iter_mut().zip(chunks.by_ref()) {
        let mut b = 0u8;
        for (i, v) in eight.iter().enumerate() {
            b |= u8::from(v.is_sign_positive()) << i;
        }
        *byte = b;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut b = 0u8;
        for (i, v) in rest.iter().enumerate() {
            b |= u8::from(v.is_sign_positive()) << i;
        }
        bits[bits.len() - 1] = b;
    }
}

/// One chunk: its largest magnitude, then each entry's level, rounded up
/// with probability equal to the fraction (unbiased).
fn encode_qsgd(x: &[f32], levels: u8, rng: &mut ChaCha8Rng, out: &mut [u8]) {
    let scale = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    out[..4].copy_from_slice(&scale.to_le_bytes());
    let s = f32::from(levels);
    for (o, &v) in out[4..].iter_mut().zip(x) {
        // |v| / scale first: at most 1, even when scale is subnormal.
        let exact = if scale > 0.0 {
            v.abs() / scale * s
        } else {
            0.0
        };
        let floor = exact.floor();
        let up = rng.random::<f32>() < exact - floor;
        let level = (floor + f32::from(u8::from(up))).min(s) as i8;
        *o = (if v < 0.0 { -level } else { level }) as u8;
    }
}

/// One chunk: its minimum and maximum, then each entry's nearest of 256
/// steps between them.
fn encode_min_max(x: &[f32], out: &mut [u8]) {
    let (min, max) = x
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    let (min, max) = if x.is_empty() { (0.0, 0.0) } else { (min, max) };
    out[..4].copy_from_slice(&min.to_le_bytes());
    out[4..8].copy_from_slice(&max.to_le_bytes());
    // In f64: max - min may overflow f32.
    let range = f64::from(max) - f64::from(min);
    let to_step = if range > 0.0 { 255.0 / range } else { 0.0 };
    for (o, &v) in out[8..].iter_mut().zip(x) {
        *o = ((f64::from(v) - f64::from(min)) * to_step)
            .round()
            .clamp(0.0, 255.0) as u8;
    }
}
