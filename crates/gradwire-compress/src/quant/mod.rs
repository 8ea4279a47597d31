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
//!   odd chunk's last high half zero), else 8 (an `i8`). The 2-norm is
//!   summed in f64 in a fixed order (eight lanes, then the rest), so the
//!   device forms give the same bits; a chunk whose 2-norm overflows f32
//!   is scaled by its largest magnitude instead (still unbiased).
//! - [`Quantizer::E3m0`]: a 4-bit float without mantissa, Streaming
//!   DiLoCo's pseudo-gradient format (Douillard et al., 2025): each chunk
//!   has its largest magnitude as the scale, each entry a sign and a power
//!   of two of it, `scale * 2^-6 ..= scale`, or zero, rounded
//!   stochastically between the two neighbours (the same draws as QSGD's),
//!   so unbiased too. Its levels are logarithmic where QSGD's are even, so
//!   its error relative to an entry is about the same at every magnitude
//!   down to `2^-6` of the chunk's largest, whatever the distribution
//!   (a round trip's relative 2-norm error about 0.28; QSGD's with 7
//!   levels and the max norm 0.19 on normal entries, 0.27-0.29 on
//!   heavier tails). Nibbles as QSGD's, sign and magnitude (bit 3 the
//!   sign, bits 0-2 the power: 0 for zero, `e` for `scale * 2^(e - 7)`).
//! - [`Quantizer::MinMaxU8`]: Bagua's ByteGrad: each chunk has its minimum and
//!   maximum, each entry a `u8` step between them, rounded to nearest
//!   (deterministic).
//!
//! Payloads are little-endian byte strings of a length fixed by the number
//! of entries ([`Quantizer::encoded_len`]), so a receiver knows every
//! size in advance. Encoding refuses NaN and infinities; decoding checks the
//! length, every scale and every level before it writes anything, and never
//! yields a non-finite value. Every payload has one spelling: a 4-bit
//! codec's padding nibble is zero and E3M0 has no negative zero.
//! The bytes depend on the entries only (every scale is computed in a fixed
//! order), so the device forms (`cuda::quant_encode` and friends, feature
//! `cuda`) give the same payloads.

mod draws;
mod e3m0;
mod min_max;
mod nibbles;
mod qsgd;
mod sign;

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
    /// A sign and a power of two of the chunk's largest magnitude in 4
    /// bits (E3M0), stochastic rounding from `seed`.
    E3m0 {
        /// The seed of the rounding (mixed with the caller's stream).
        seed: u64,
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
            Quantizer::Qsgd { levels, .. } => 4 + QUANT_CHUNK / qsgd::entries_per_byte(*levels),
            Quantizer::E3m0 { .. } => 4 + QUANT_CHUNK / 2,
            Quantizer::MinMaxU8 => 8 + QUANT_CHUNK,
        }
    }

    /// The key of the rounding draws for the caller's `stream`: the seed
    /// (QSGD's, E3M0's) mixed with the stream, 0 for the deterministic
    /// quantizers. The CPU encoder's, and the argument of the device
    /// encoders (`quant_qsgd_encode_f32`, `quant_e3m0_encode_f32`), which
    /// derive their draws from it alone.
    pub fn stream_key(&self, stream: u64) -> u64 {
        match *self {
            Quantizer::Qsgd { seed, .. } | Quantizer::E3m0 { seed } => draws::key(seed, stream),
            Quantizer::Sign | Quantizer::MinMaxU8 => 0,
        }
    }

    /// The same quantizer drawing from `seed` (QSGD's and E3M0's rounding;
    /// the deterministic quantizers as they are).
    pub fn with_seed(self, seed: u64) -> Quantizer {
        match self {
            Quantizer::Qsgd { levels, norm, .. } => Quantizer::Qsgd { levels, seed, norm },
            Quantizer::E3m0 { .. } => Quantizer::E3m0 { seed },
            Quantizer::Sign | Quantizer::MinMaxU8 => self,
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
                4 * chunks + n.div_ceil(qsgd::entries_per_byte(*levels))
            }
            Quantizer::E3m0 { .. } => 4 * chunks + n.div_ceil(2),
            Quantizer::MinMaxU8 => 8 * chunks + n,
        }
    }

    /// Encodes `x` into `out` (exactly [`Quantizer::encoded_len`] bytes).
    /// `stream` picks the random stream of QSGD and E3M0 (callers mix in
    /// the step, the rank and the chunk, so no two encodings share their
    /// draws); the others ignore it.
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
        for (out, chunk) in out
            .chunks_mut(QUANT_CHUNK)
            .zip(payload.chunks(self.chunk_bytes()))
        {
            match *self {
                Quantizer::Sign => sign::decode(chunk, out, &put)?,
                Quantizer::Qsgd { levels, .. } => qsgd::decode(chunk, levels, out, &put)?,
                Quantizer::E3m0 { .. } => e3m0::decode(chunk, out, &put)?,
                Quantizer::MinMaxU8 => min_max::decode(chunk, out, &put)?,
            }
        }
        Ok(())
    }

    /// Refuses a payload of the encoded length for `n` entries that
    /// decoding would refuse: a non-finite scale, a negative E3M0 scale, a
    /// minimum above its maximum, a QSGD level beyond the setting, E3M0's
    /// negative zero, a set padding nibble.
    fn check_chunks(&self, payload: &[u8], n: usize) -> Result<()> {
        for (c, chunk) in payload.chunks(self.chunk_bytes()).enumerate() {
            let entries = (n - c * QUANT_CHUNK).min(QUANT_CHUNK);
            match *self {
                Quantizer::Sign => read_scale(chunk, 0).map(drop)?,
                Quantizer::Qsgd { levels, .. } => qsgd::check(chunk, entries, levels)?,
                Quantizer::E3m0 { .. } => e3m0::check(chunk, entries)?,
                Quantizer::MinMaxU8 => min_max::check(chunk)?,
            }
        }
        Ok(())
    }
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
/// own target features, as are the quantizers' chunk encoders. `out` has
/// the encoded length (checked by the caller).
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
        let first = (c * QUANT_CHUNK) as u64;
        match q {
            Quantizer::Sign => sign::encode(x, out),
            Quantizer::Qsgd { levels, norm, .. } => {
                qsgd::encode(x, qsgd::scale(x, norm, largest), levels, key, first, out)
            }
            Quantizer::E3m0 { .. } => e3m0::encode(x, f32::from_bits(largest), key, first, out),
            Quantizer::MinMaxU8 => min_max::encode(x, out),
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
