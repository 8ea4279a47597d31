// cast.cu: dtype conversions. gradwire-tensor's `cast` (one rounding, to
// nearest even, when narrowing; exact when widening) and gradwire-compress's
// cast codec `encode` (clamp to [-clip, clip], then scale, then round) and
// `decode`. Bitwise equal to the `half` crate's conversions, NaN payloads
// included.
//
// Entries: cast_<src>_<dst> for every pair of f32, f16, bf16 (no identity),
// encode_f32_<f16|bf16> with the codec's options.

#include "gradwire.cuh"

// Four elements per access where both buffers allow it (gw_load4), the rest
// one by one.
template <typename S, typename D>
__device__ void cast_impl(const S* src, D* dst, gw_u64 n) {
    const gw_u64 quads = gw_aligned4(src) && gw_aligned4(dst) ? n / 4 : 0;
    GW_FOR_EACH(q, quads) {
        float v[4];
        gw_load4(src, q, v);
        gw_store4(dst, q, v);
    }
    GW_FOR_EACH(j, n - 4 * quads) {
        const gw_u64 i = 4 * quads + j;
        gw_store(dst, i, gw_load(src, i));
    }
}

// `has_clip` != 0: clamp to [-clip, clip] first (the launcher validated clip
// finite and >= 0, scale finite and > 0). The clamp is Rust's f32::clamp
// (NaN passes), the scale a plain f32 multiply.
template <typename D>
__device__ void encode_impl(const float* src, D* dst, gw_u64 n, int has_clip, float clip,
                            float scale) {
    const gw_u64 quads = gw_aligned4(src) && gw_aligned4(dst) ? n / 4 : 0;
    GW_FOR_EACH(q, quads) {
        float v[4];
        gw_load4(src, q, v);
        for (int k = 0; k < 4; ++k) {
            v[k] = (has_clip ? gw_clamp(v[k], clip) : v[k]) * scale;
        }
        gw_store4(dst, q, v);
    }
    GW_FOR_EACH(j, n - 4 * quads) {
        const gw_u64 i = 4 * quads + j;
        float v = src[i];
        if (has_clip) {
            v = gw_clamp(v, clip);
        }
        gw_store(dst, i, v * scale);
    }
}

#define GW_CAST(NAME, S, D)                                                  \
    extern "C" __global__ void NAME(const S* src, D* dst, gw_u64 n) {        \
        cast_impl<S, D>(src, dst, n);                                        \
    }

GW_CAST(cast_f32_f16, float, gw_f16)
GW_CAST(cast_f32_bf16, float, gw_bf16)
GW_CAST(cast_f16_f32, gw_f16, float)
GW_CAST(cast_bf16_f32, gw_bf16, float)
GW_CAST(cast_f16_bf16, gw_f16, gw_bf16)
GW_CAST(cast_bf16_f16, gw_bf16, gw_f16)

extern "C" __global__ void encode_f32_f16(const float* src, gw_f16* dst, gw_u64 n, int has_clip,
                                          float clip, float scale) {
    encode_impl<gw_f16>(src, dst, n, has_clip, clip, scale);
}

extern "C" __global__ void encode_f32_bf16(const float* src, gw_bf16* dst, gw_u64 n,
                                           int has_clip, float clip, float scale) {
    encode_impl<gw_bf16>(src, dst, n, has_clip, clip, scale);
}
