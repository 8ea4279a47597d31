//! The random draws of the stochastic quantizers (QSGD, E3M0): counter
//! based, so a chunk needs no generator state and the loops vectorise, and
//! the device kernels (`quant.cu`'s `quant_hash32`) draw the same bits.

/// The key of the draws for `seed` and the caller's `stream`.
pub(super) fn key(seed: u64, stream: u64) -> u64 {
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

/// Entry `i`'s draw in the stream `key`: a 32-bit hash of both (two rounds
/// of the murmur3 finaliser; 32-bit multiplies only).
#[inline(always)]
pub(super) fn hash32(key: u64, i: u32) -> u32 {
    let fmix = |mut h: u32| {
        h ^= h >> 16;
        h = h.wrapping_mul(0x85EB_CA6B);
        h ^= h >> 13;
        h = h.wrapping_mul(0xC2B2_AE35);
        h ^ (h >> 16)
    };
    fmix(fmix(i ^ key as u32) ^ (key >> 32) as u32)
}

/// A draw's top 24 bits as a uniform in `[0, 1)` (exact in f32).
#[inline(always)]
pub(super) fn uniform(draw: u32) -> f32 {
    (draw >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}
