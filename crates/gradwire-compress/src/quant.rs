//! Quantizers: every entry sent in a fixed, small number of bits.
//!
//! - [`Quantizer::Sign`]: one bit per entry (its sign) and a scale, the
//!   mean magnitude, per chunk of [`QUANT_CHUNK`] entries (scaled sign
//!   compression, EF-SignSGD: Karimireddy et al., ICML 2019; DeepSpeed's
//!   1-bit Adam sends the same with one scale per call: a scale per chunk
//!   follows each layer's magnitude, for 1/16 of a bit more per entry);
//!   biased, so meant for use with error feedback.
//! - [`Quantizer::Qsgd`]: QSGD (Alistarh et al., NeurIPS 2017): each chunk
//!   of [`QUANT_CHUNK`] entries (the paper's bucket) has a scale, by default
//!   the paper's bucket 2-norm ([`QsgdNorm::L2`]; its largest magnitude
//!   with [`QsgdNorm::Max`], the variant most implementations ship), and
//!   each entry a level in `-s..=s` of `|v| / scale`, rounded
//!   stochastically (seeded, counter-based: entry `i` of a stream draws
//!   from a hash of `i`), so the decoded value is unbiased. The levels
//!   take 4 bits an entry when `s` is at most 7 ([`QSGD_NIBBLE_LEVELS`]:
//!   two's-complement nibbles, entry `2j` in the low half of byte `j`, an
//!   odd chunk's last high half zero), else 8 (an `i8`): 4-bit
//!   pseudo-gradients, as Streaming DiLoCo's. The 2-norm is
//!   summed in f64 in a fixed order (eight lanes, then the rest), so the
//!   device forms give the same bits; a chunk whose 2-norm overflows f32
//!   is scaled by its largest magnitude instead (still unbiased).
//! - [`Quantizer::MinMaxU8`]: Bagua's ByteGrad: each chunk has its minimum and
//!   maximum, each entry a `u8` step between them, rounded to nearest
//!   (deterministic).
//!
//! Payloads are little-endian byte strings of a length fixed by the number
//! of entries ([`Quantizer::encoded_len`]), so a receiver knows every
//! size in advance. Encoding refuses NaN and infinities; decoding checks the
//! length, every scale and every level before it writes anything, and never
//! yields a non-finite value.
//! The bytes depend on the entries only (every scale is computed in a fixed
//! order), so the device forms (`cuda::quant_encode` and friends, feature
//! `cuda`) give the same payloads.

use crate::error::{CompressError, Result};

/// Entries per scale (QSGD's "bucket size": 512 in the paper's
/// experiments): a scale costs 4 or 8 bytes per 512 entries.
pub const QUANT_CHUNK: usize = 512;

/// The most QSGD levels per sign that 4 bits an entry hold (a nibble's
/// `-7..=7`; its -8 is never written and refused on decoding).
pub const QSGD_NIBBLE_LEVELS: u8 = 7;

/// How entries are quantized (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantizer {
    /// One bit per entry and the mean magnitude as the scale.
    Sign,
    /// QSGD with `levels` levels per sign (1 to 127: up to 7 take 4 bits
    /// an entry, more take 8), each chunk scaled by its `norm`, stochastic
    /// rounding from `seed`.
    Qsgd {
        /// Levels per sign.
        levels: u8,
        /// The seed of the rounding (mixed with the caller's stream).
        seed: u64,
        /// The norm each chunk is scaled by.
        norm: QsgdNorm,
    },
    /// A `u8` between each chunk's minimum and maximum.
    MinMaxU8,
}

/// The norm QSGD scales a chunk by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QsgdNorm {
    /// The chunk's 2-norm, as the paper (its variance bound assumes it).
    #[default]
    L2,
    /// The chunk's largest magnitude: finer levels for the same bits (every
    /// level can be reached), the variant most implementations ship.
    Max,
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

    /// The bytes of a whole chunk of [`QUANT_CHUNK`] entries, its header
    /// (the scales) and its codes: chunk `c` of a payload starts at `c`
    /// times this.
    pub fn chunk_bytes(&self) -> usize {
        match self {
            Quantizer::Sign => 4 + QUANT_CHUNK / 8,
            Quantizer::Qsgd { levels, .. } => 4 + QUANT_CHUNK / qsgd_entries_per_byte(*levels),
            Quantizer::MinMaxU8 => 8 + QUANT_CHUNK,
        }
    }

    /// The key of the rounding draws for the caller's `stream`: QSGD's
    /// seed mixed with the stream, 0 for the deterministic quantizers. The
    /// CPU encoder's, and the argument of the device encoder
    /// (`quant_qsgd_encode_f32`), which derives its draws from it alone.
    pub fn stream_key(&self, stream: u64) -> u64 {
        match *self {
            Quantizer::Qsgd { seed, .. } => qsgd_key(seed, stream),
            Quantizer::Sign | Quantizer::MinMaxU8 => 0,
        }
    }

    /// The bytes `n` entries encode to.
    pub fn encoded_len(&self, n: usize) -> usize {
        let chunks = n.div_ceil(QUANT_CHUNK);
        match self {
            // Chunks of 512 hold whole bytes of signs.
            Quantizer::Sign => 4 * chunks + n.div_ceil(8),
            // Chunks of 512 hold whole bytes of nibbles: only the last
            // may end with half a byte.
            Quantizer::Qsgd { levels, .. } => {
                4 * chunks + n.div_ceil(qsgd_entries_per_byte(*levels))
            }
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
        let key = self.stream_key(stream);
        // The loops vectorise several times wider with AVX2 (x86-64's
        // baseline has no 32-bit multiply or packed narrowing): the same
        // code, the same results, compiled twice.
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above), which is
            // all the target-feature function requires beyond its safe
            // signature.
            return unsafe { encode_chunks_avx2(*self, x, key, out) };
        }
        encode_chunks(*self, x, key, out)
    }

    /// Decodes `payload` (of `out.len()` entries) into `out`. Settings that
    /// [`Quantizer::validate`] refuses are refused here too (with 0 QSGD
    /// levels a zero code would decode to a NaN), and so is a corrupt
    /// payload, every chunk checked first: on any error `out` is untouched.
    pub fn decode(&self, payload: &[u8], out: &mut [f32]) -> Result<()> {
        self.decode_with(payload, out, |o, v| *o = v)
    }

    /// Decodes `payload` (of `acc.len()` entries) and adds it to `acc`;
    /// on any error `acc` is untouched (as [`Quantizer::decode`]).
    pub fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<()> {
        self.decode_with(payload, acc, |o, v| *o += v)
    }

    fn decode_with(
        &self,
        payload: &[u8],
        out: &mut [f32],
        put: impl Fn(&mut f32, f32),
    ) -> Result<()> {
        self.validate()?;
        let expected = self.encoded_len(out.len());
        if payload.len() != expected {
            return Err(CompressError::Corrupt(format!(
                "a quantized payload of {} bytes for {} entries (expected {expected})",
                payload.len(),
                out.len()
            )));
        }
        // Every chunk checked before any entry is written: a corrupt
        // payload leaves `out` as it was (as the device decoders, whose
        // check kernel runs first).
        self.check_chunks(payload, out.len())?;
        match *self {
            Quantizer::Sign => {
                for (out, chunk) in out
                    .chunks_mut(QUANT_CHUNK)
                    .zip(payload.chunks(self.chunk_bytes()))
                {
                    let scale = read_scale(chunk, 0)?;
                    for (eight, &byte) in out.chunks_mut(8).zip(&chunk[4..]) {
                        for (i, o) in eight.iter_mut().enumerate() {
                            put(o, if byte >> i & 1 == 1 { scale } else { -scale });
                        }
                    }
                }
            }
            Quantizer::Qsgd { levels, .. } => {
                let nibbles = qsgd_entries_per_byte(levels) == 2;
                for (out, chunk) in out
                    .chunks_mut(QUANT_CHUNK)
                    .zip(payload.chunks(self.chunk_bytes()))
                {
                    let scale = read_scale(chunk, 0)?;
                    let codes = &chunk[4..];
                    let unit = scale / f32::from(levels);
                    if nibbles {
                        for (pair, &b) in out.chunks_mut(2).zip(codes) {
                            let (low, high) = nibble_levels(b);
                            put(&mut pair[0], f32::from(low) * unit);
                            if let Some(o) = pair.get_mut(1) {
                                put(o, f32::from(high) * unit);
                            }
                        }
                    } else {
                        for (o, &q) in out.iter_mut().zip(codes) {
                            put(o, f32::from(q as i8) * unit);
                        }
                    }
                }
            }
            Quantizer::MinMaxU8 => {
                for (out, chunk) in out
                    .chunks_mut(QUANT_CHUNK)
                    .zip(payload.chunks(self.chunk_bytes()))
                {
                    let (min, max) = (read_scale(chunk, 0)?, read_scale(chunk, 4)?);
                    let codes = &chunk[8..];
                    let step = (max - min) / 255.0;
                    if step.is_finite() {
                        for (o, &q) in out.iter_mut().zip(codes) {
                            // Clamped: rounding may not carry a value past
                            // max (a comparison, not f32::min, whose choice
                            // between +0.0 and -0.0 is the compiler's).
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
                }
            }
        }
        Ok(())
    }

    /// Refuses a payload of the encoded length for `n` entries that
    /// decoding would refuse: a non-finite scale, a minimum above its
    /// maximum, a QSGD level beyond the setting, a set padding nibble.
    fn check_chunks(&self, payload: &[u8], n: usize) -> Result<()> {
        for (c, chunk) in payload.chunks(self.chunk_bytes()).enumerate() {
            let entries = (n - c * QUANT_CHUNK).min(QUANT_CHUNK);
            match *self {
                Quantizer::Sign => {
                    read_scale(chunk, 0)?;
                }
                Quantizer::Qsgd { levels, .. } => {
                    read_scale(chunk, 0)?;
                    check_qsgd_codes(&chunk[4..], entries, levels)?;
                }
                Quantizer::MinMaxU8 => {
                    let (min, max) = (read_scale(chunk, 0)?, read_scale(chunk, 4)?);
                    if min > max {
                        return Err(CompressError::Corrupt(format!(
                            "a chunk's minimum {min} above its maximum {max}"
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The codes of a QSGD chunk of `entries` entries: every level within
/// `levels`, and in nibbles an odd chunk's padding half zero.
fn check_qsgd_codes(codes: &[u8], entries: usize, levels: u8) -> Result<()> {
    let nibbles = qsgd_entries_per_byte(levels) == 2;
    // The largest magnitude first (a pass that vectorises), the offending
    // level looked for only when it is bad.
    let largest = if nibbles {
        codes.iter().fold(0u8, |m, &b| {
            let (low, high) = nibble_levels(b);
            m.max(low.unsigned_abs()).max(high.unsigned_abs())
        })
    } else {
        codes
            .iter()
            .fold(0u8, |m, &b| m.max((b as i8).unsigned_abs()))
    };
    if largest > levels {
        let level = |i: usize| match nibbles {
            true if i.is_multiple_of(2) => nibble_levels(codes[i / 2]).0,
            true => nibble_levels(codes[i / 2]).1,
            false => codes[i] as i8,
        };
        return Err(
            match (0..entries).map(level).find(|q| q.unsigned_abs() > levels) {
                Some(bad) => CompressError::Corrupt(format!("QSGD level {bad} beyond {levels}")),
                // No entry's: the padding nibble's, the one nibble that is
                // no entry.
                None => padding_not_zero(),
            },
        );
    }
    // An odd chunk's last byte holds one entry: its other half is zero, so
    // a payload has one spelling.
    if nibbles && entries % 2 == 1 && codes[entries / 2] >> 4 != 0 {
        return Err(padding_not_zero());
    }
    Ok(())
}

/// [`encode_chunks`] compiled with AVX2 enabled.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn encode_chunks_avx2(q: Quantizer, x: &[f32], key: u64, out: &mut [u8]) -> Result<()> {
    encode_chunks(q, x, key, out)
}

/// Chunk by chunk: each is checked, then quantized while it is in the L1
/// cache (a separate pass over the input for the check would cost as much
/// as the quantization). Always inlined, so each caller compiles it for its
/// own target features. `out` has the encoded length (checked by the
/// caller).
#[inline(always)]
fn encode_chunks(q: Quantizer, x: &[f32], key: u64, out: &mut [u8]) -> Result<()> {
    let stride = q.chunk_bytes();
    for (c, (x, out)) in x
        .chunks(QUANT_CHUNK)
        .zip(out.chunks_mut(stride))
        .enumerate()
    {
        let largest = max_abs_bits(x);
        if largest >= f32::INFINITY.to_bits() {
            let i = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
            return Err(CompressError::NonFinite {
                index: c * QUANT_CHUNK + i,
                value: x[i],
            });
        }
        match q {
            Quantizer::Sign => encode_sign(x, out),
            Quantizer::Qsgd { levels, norm, .. } => encode_qsgd(
                x,
                qsgd_scale(x, norm, largest),
                levels,
                key,
                (c * QUANT_CHUNK) as u64,
                out,
            ),
            Quantizer::MinMaxU8 => encode_min_max(x, out),
        }
    }
    Ok(())
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
#[inline(always)]
fn encode_sign(x: &[f32], out: &mut [u8]) {
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

/// The key of QSGD's rounding draws for `seed` and the caller's `stream`.
fn qsgd_key(seed: u64, stream: u64) -> u64 {
    mix(seed ^ mix(stream))
}

/// SplitMix64's finaliser: a strong 64-bit mix (of a seed and a stream into
/// a key).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The counter-based source of QSGD's rounding: entry `i` of the stream
/// `key` draws a 32-bit hash of both (two rounds of the murmur3 finaliser),
/// so chunks need no generator state and the loop vectorises (32-bit
/// multiplies only).
#[inline(always)]
fn hash32(key: u64, i: u32) -> u32 {
    let fmix = |mut h: u32| {
        h ^= h >> 16;
        h = h.wrapping_mul(0x85EB_CA6B);
        h ^= h >> 13;
        h = h.wrapping_mul(0xC2B2_AE35);
        h ^ (h >> 16)
    };
    fmix(fmix(i ^ key as u32) ^ (key >> 32) as u32)
}

/// The bits of the largest magnitude in `x` (magnitudes order as their
/// bits do): at least those of infinity when `x` holds a NaN or an
/// infinity. One pass of integer maxima, which vectorises.
#[inline(always)]
fn max_abs_bits(x: &[f32]) -> u32 {
    let mut lanes = [0u32; 8];
    let mut eights = x.chunks_exact(8);
    for c in eights.by_ref() {
        for l in 0..8 {
            lanes[l] = lanes[l].max(c[l].to_bits() & 0x7fff_ffff);
        }
    }
    lanes
        .into_iter()
        .chain(eights.remainder().iter().map(|v| v.to_bits() & 0x7fff_ffff))
        .fold(0, u32::max)
}

/// QSGD's scale of a chunk of finite entries whose largest magnitude has
/// the bits `largest`: its 2-norm (the squares summed in f64 in eight lanes
/// of every eighth entry, the lanes in order, then the remainder in order,
/// so the device gives the same bits; rounded once to f32), or its largest
/// magnitude, for [`QsgdNorm::Max`] or when the 2-norm overflows f32.
fn qsgd_scale(x: &[f32], norm: QsgdNorm, largest: u32) -> f32 {
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
fn encode_qsgd(x: &[f32], scale: f32, levels: u8, key: u64, first: u64, out: &mut [u8]) {
    out[..4].copy_from_slice(&scale.to_le_bytes());
    let s = f32::from(levels);
    // |v| / scale first: at most 1, even when scale is subnormal.
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let level = |i: usize, v: f32| {
        let exact = (v.abs() * inverse).min(1.0) * s;
        // 24 random bits: a uniform in [0, 1).
        let u = (hash32(key, first as u32 ^ i as u32) >> 8) as f32 * (1.0 / (1u32 << 24) as f32);
        // floor(exact + u): up with probability frac(exact); through i32,
        // whose conversion vectorises.
        let level = ((exact + u) as i32).min(i32::from(levels)) as i8;
        if v < 0.0 { -level } else { level }
    };
    let codes = &mut out[4..];
    if qsgd_entries_per_byte(levels) == 1 {
        for (i, (o, &v)) in codes.iter_mut().zip(x).enumerate() {
            *o = level(i, v) as u8;
        }
        return;
    }
    // The levels of the whole chunk first (the loop above, which
    // vectorises), then packed two to a byte.
    let mut levels_of = [0i8; QUANT_CHUNK];
    for (i, (l, &v)) in levels_of.iter_mut().zip(x).enumerate() {
        *l = level(i, v);
    }
    // Past x's end the levels are 0: an odd chunk's padding half.
    for (o, pair) in codes.iter_mut().zip(levels_of.chunks_exact(2)) {
        *o = (pair[0] as u8 & 0x0f) | ((pair[1] as u8) << 4);
    }
}

/// Entries a byte of QSGD codes holds with `levels` levels per sign: two
/// 4-bit levels for at most [`QSGD_NIBBLE_LEVELS`], else one `i8`.
fn qsgd_entries_per_byte(levels: u8) -> usize {
    if levels <= QSGD_NIBBLE_LEVELS { 2 } else { 1 }
}

/// The levels in the low and high halves of a byte of nibbles, sign-extended
/// (each nibble moved to the top, then an arithmetic shift back down).
#[inline(always)]
fn nibble_levels(byte: u8) -> (i8, i8) {
    (((byte << 4) as i8) >> 4, (byte as i8) >> 4)
}

/// A payload whose odd chunk's padding nibble is set.
fn padding_not_zero() -> CompressError {
    CompressError::Corrupt("a QSGD payload's padding nibble is not zero".into())
}

/// One chunk: its minimum and maximum, then each entry's nearest of 256
/// steps between them.
#[inline(always)]
fn encode_min_max(x: &[f32], out: &mut [u8]) {
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
