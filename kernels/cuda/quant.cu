// quant.cu: gradwire-compress's quantizers (quant.rs) on device buffers:
// 1-bit scaled sign, QSGD, E3M0 and min-max uint8, encode, decode and
// decode-add, with the CPU's payload layout, byte for byte.
//
// Payload: chunks of GW_QUANT_CHUNK (512) entries, each a header (sign,
// QSGD and E3M0: one f32 scale; min-max: the f32 minimum then the f32
// maximum, all little-endian) followed by the codes (sign: one bit per
// entry, eight to a byte, 1 for a non-negative entry; QSGD: one i8 level per
// entry, or with at most 7 levels two's-complement nibbles, entry 2j in the
// low half of byte j and an odd chunk's last high half zero; E3M0: nibbles
// in the same places, bit 3 the sign and bits 0-2 the power e, scale *
// 2^(e - 7), 0 for zero; min-max: one u8 step per entry). Chunk c starts at
// c * stride (68, 516 or 260, 260, 520 bytes); only the last chunk may be
// shorter.
//
// QSGD's scale is the chunk's 2-norm (the paper's), its squares summed in
// f64 in the CPU's lanes and order, or with max_norm its largest magnitude;
// E3M0's is always the largest magnitude.
//
// Encoding runs one block per chunk (grid-stride over the chunks, GW_BLOCK
// threads per block): the chunk is staged in shared memory, then the scale
// is computed in the CPU's order, not just to the CPU's value: eight threads
// each run one of the CPU's eight lanes (entry l, l + 8, ... of the whole
// eights, in index order), and one thread folds the lanes in order and then
// the remainder, exactly as quant.rs's `sum_abs`, `max_abs_bits` and
// `encode_min_max` do, with the same f64 fallbacks when an f32 sum or range
// overflows. The codes are then one thread per entry (per byte for sign),
// with the CPU's operations in the CPU's order (compiled with --fmad=false
// and IEEE division, denormals kept). Min-max's fold and clamp are the
// CPU's comparisons (a value replaces the running one only when strictly
// smaller or larger), so even +0.0 and -0.0 come out as on the CPU. The
// input is finite: the launcher's caller refuses NaN and infinities first
// (first_non_finite_f32 of select.cu), as the CPU does.
//
// QSGD's and E3M0's stochastic rounding is the CPU's counter-based hash:
// entry i draws hash32(key, i) (two rounds of the murmur3 finaliser), its
// top 24 bits as a uniform in [0, 1) (E3M0 compares its top 23 with the
// mantissa); `key` is mix(seed ^ mix(stream)), computed by the host.
//
// Decoding is validated first: quant_<q>_check records the first chunk whose
// header (a non-finite scale, a negative E3M0 scale, a minimum above the
// maximum), level (beyond `levels`, E3M0's negative zero 8) or padding
// nibble (not zero) is bad, and the host refuses the payload before
// anything is written; quant_<q>_decode_f32 then writes (add = 0) or adds (add != 0) one
// entry per thread, grid-stride.
//
// Entries: quant_sign_encode_f32, quant_qsgd_encode_f32,
// quant_e3m0_encode_f32, quant_minmax_encode_f32 (GW_BLOCK threads per
// block), quant_sign_check, quant_qsgd_check, quant_e3m0_check,
// quant_minmax_check, quant_sign_decode_f32, quant_qsgd_decode_f32,
// quant_e3m0_decode_f32, quant_minmax_decode_f32 (any launch shape).

#include "gradwire.cuh"

#define GW_QUANT_CHUNK 512u
#define GW_QUANT_LANES 8u

#define GW_QUANT_SIGN 0
#define GW_QUANT_QSGD 1
#define GW_QUANT_MINMAX 2
#define GW_QUANT_E3M0 3

// Header bytes of a chunk.
__device__ constexpr gw_u64 quant_header(int q) { return q == GW_QUANT_MINMAX ? 8u : 4u; }

// The most QSGD levels that 4 bits an entry hold (quant.rs's
// QSGD_NIBBLE_LEVELS).
#define GW_QSGD_NIBBLE_LEVELS 7u

// Bytes of a whole chunk: the header and 512 codes (64 bytes of signs, 256
// of E3M0's nibbles and of QSGD's when its `levels` are at most
// GW_QSGD_NIBBLE_LEVELS; the others pass 0, which they ignore).
__device__ constexpr gw_u64 quant_stride(int q, gw_u32 levels) {
    return quant_header(q) +
           (q == GW_QUANT_SIGN ? GW_QUANT_CHUNK / 8u
            : q == GW_QUANT_E3M0 ||
                    (q == GW_QUANT_QSGD && levels <= GW_QSGD_NIBBLE_LEVELS)
                ? GW_QUANT_CHUNK / 2u
                : GW_QUANT_CHUNK);
}

// E3M0's sign bit, and the bits of 2^-6, its smallest magnitude but zero.
#define GW_E3M0_NEGATIVE 8u
#define GW_E3M0_SMALLEST_BITS (121u << 23)

// Entry j's nibble in a chunk's 4-bit codes: the low (even j) or high (odd
// j) half of byte j / 2.
__device__ __forceinline__ gw_u32 quant_nibble(const gw_u8* codes, gw_u32 j) {
    const gw_u32 byte = codes[j / 2u];
    return (j % 2u == 0u ? byte : byte >> 4) & 0xfu;
}

// Entry j's QSGD level in a chunk's codes: an i8, or with nibbles its
// nibble sign-extended.
__device__ __forceinline__ int quant_qsgd_code(const gw_u8* codes, gw_u32 j, gw_u32 levels) {
    if (levels <= GW_QSGD_NIBBLE_LEVELS) {
        const int nibble = (int)quant_nibble(codes, j);
        return nibble < 8 ? nibble : nibble - 16;
    }
    return (int)(signed char)codes[j];
}

__device__ __forceinline__ float gw_abs(float x) { return __uint_as_float(gw_key(x)); }

__device__ __forceinline__ float gw_infinity() { return __uint_as_float(0x7f800000u); }

// Little-endian f32 at p (payloads have no alignment to rely on).
__device__ __forceinline__ float gw_read_f32_le(const gw_u8* p) {
    return __uint_as_float((gw_u32)p[0] | ((gw_u32)p[1] << 8) | ((gw_u32)p[2] << 16) |
                           ((gw_u32)p[3] << 24));
}

__device__ __forceinline__ void gw_write_f32_le(gw_u8* p, float v) {
    const gw_u32 bits = __float_as_uint(v);
    p[0] = (gw_u8)bits;
    p[1] = (gw_u8)(bits >> 8);
    p[2] = (gw_u8)(bits >> 16);
    p[3] = (gw_u8)(bits >> 24);
}

// The murmur3 finaliser.
__device__ __forceinline__ gw_u32 quant_fmix(gw_u32 h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    return h ^ (h >> 16);
}

// quant.rs's hash32: entry i of the stream `key`.
__device__ __forceinline__ gw_u32 quant_hash32(gw_u64 key, gw_u32 i) {
    return quant_fmix(quant_fmix(i ^ (gw_u32)key) ^ (gw_u32)(key >> 32));
}

// quant.rs's QSGD level of entry j (of the chunk starting at `first`) of
// value v: (|v| * inverse).min(1.0) * levels plus a uniform draw, floored,
// at most `levels`, with v's sign.
__device__ __forceinline__ int quant_qsgd_level(float v, float inverse, gw_u32 levels, gw_u64 key,
                                                gw_u64 first, gw_u32 j) {
    // (|v| * inverse).min(1.0) * s: a NaN (0 * inf, when the scale is a
    // tiny subnormal) becomes 1, as in Rust.
    const float ratio = gw_abs(v) * inverse;
    const float exact = (ratio < 1.0f ? ratio : 1.0f) * (float)levels;
    // 24 random bits: a uniform in [0, 1) (times 2^-24, exact).
    const gw_u32 h = quant_hash32(key, (gw_u32)first ^ j);
    const float u = (float)(h >> 8) * 5.9604644775390625e-8f;
    // floor(exact + u) through a saturating conversion to i32, as Rust's
    // `as i32`, then at most `levels`.
    int level = __float2int_rz(exact + u);
    level = level < (int)levels ? level : (int)levels;
    return v < 0.0f ? -level : level;
}

// e3m0.rs's code of entry j (of the chunk starting at `first`) of value v
// in a chunk of largest magnitude scale > 0: r = |v| / scale (IEEE
// division, at most 1); from 2^-6 on its exponent's code, one up when the
// draw's top 23 bits fall below r's mantissa; below, 2^-6 (code 1) when
// the uniform falls below 64 r, else zero; the sign bit on a non-zero code
// of a negative v.
__device__ __forceinline__ gw_u32 quant_e3m0_code(float v, float scale, gw_u64 key,
                                                  gw_u64 first, gw_u32 j) {
    const gw_u32 bits = __float_as_uint(gw_abs(v) / scale);
    const gw_u32 h = quant_hash32(key, (gw_u32)first ^ j);
    gw_u32 magnitude;
    if (bits >= GW_E3M0_SMALLEST_BITS) {
        magnitude = (bits >> 23) - 120u + ((h >> 9) < (bits & 0x7fffffu) ? 1u : 0u);
    } else {
        const float u = (float)(h >> 8) * 5.9604644775390625e-8f;
        magnitude = u < __uint_as_float(bits) * 64.0f ? 1u : 0u;
    }
    return magnitude | (v < 0.0f && magnitude != 0u ? GW_E3M0_NEGATIVE : 0u);
}

// Encodes the chunks of x (n finite f32) into `payload`, which holds the
// encoded length. `levels` (1..=127), `max_norm` (QSGD's scale: 0 the
// chunk's 2-norm, else its largest magnitude) are QSGD's, `key` QSGD's and
// E3M0's.
template <int Q>
__device__ void quant_encode_impl(const float* x, gw_u64 n, gw_u32 levels, gw_u32 max_norm,
                                  gw_u64 key, gw_u8* payload) {
    __shared__ float xs[GW_QUANT_CHUNK];
    // Per lane: sign's sums or min-max's minima and maxima; QSGD's largest
    // magnitude keys.
    __shared__ float lane_a[GW_QUANT_LANES];
    __shared__ float lane_b[GW_QUANT_LANES];
    __shared__ gw_u32 lane_key[GW_QUANT_LANES];
    // QSGD's 2-norm: per lane, the f64 sum of its squares.
    __shared__ double lane_sq[GW_QUANT_LANES];
    // What the codes need, from thread 0: QSGD's inverse scale; min-max's
    // minimum and step, in f32 (wide == 0) or f64 (wide != 0).
    __shared__ float param_f32[2];
    __shared__ double param_f64[2];
    __shared__ int wide;
    GW_REQUIRE_BLOCK();
    const gw_u64 chunks = (n + GW_QUANT_CHUNK - 1u) / GW_QUANT_CHUNK;
    for (gw_u64 c = blockIdx.x; c < chunks; c += gridDim.x) {
        const gw_u64 first = c * GW_QUANT_CHUNK;
        const gw_u32 len = (gw_u32)(n - first < GW_QUANT_CHUNK ? n - first : GW_QUANT_CHUNK);
        // Entries [0, whole) are the whole eights, [whole, len) the remainder.
        const gw_u32 whole = len / GW_QUANT_LANES * GW_QUANT_LANES;
        gw_u8* out = payload + c * quant_stride(Q, levels);
        for (gw_u32 j = threadIdx.x; j < len; j += GW_BLOCK) {
            xs[j] = x[first + j];
        }
        __syncthreads();
        if (threadIdx.x < GW_QUANT_LANES) {
            const gw_u32 l = threadIdx.x;
            if (Q == GW_QUANT_SIGN) {
                float sum = 0.0f;
                for (gw_u32 j = l; j < whole; j += GW_QUANT_LANES) {
                    sum = sum + gw_abs(xs[j]);
                }
                lane_a[l] = sum;
            } else if (Q == GW_QUANT_QSGD || Q == GW_QUANT_E3M0) {
                gw_u32 largest = 0u;
                double sq = 0.0;
                for (gw_u32 j = l; j < whole; j += GW_QUANT_LANES) {
                    const gw_u32 k = gw_key(xs[j]);
                    largest = k > largest ? k : largest;
                    if (Q == GW_QUANT_QSGD) {
                        const double v = (double)xs[j];
                        sq = sq + v * v;
                    }
                }
                lane_key[l] = largest;
                lane_sq[l] = sq;
            } else {
                float lo = gw_infinity();
                float hi = -gw_infinity();
                for (gw_u32 j = l; j < whole; j += GW_QUANT_LANES) {
                    const float v = xs[j];
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
                lane_a[l] = lo;
                lane_b[l] = hi;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            if (Q == GW_QUANT_SIGN) {
                // The lanes in order, plus the remainder's own sum.
                float lanes = 0.0f;
                for (gw_u32 l = 0; l < GW_QUANT_LANES; ++l) {
                    lanes = lanes + lane_a[l];
                }
                float rest = 0.0f;
                for (gw_u32 j = whole; j < len; ++j) {
                    rest = rest + gw_abs(xs[j]);
                }
                const float sum = lanes + rest;
                float scale;
                if (gw_is_finite(sum)) {
                    scale = sum / (float)len;
                } else {
                    // Huge magnitudes overflow the f32 sum: in f64, in order.
                    double wide_sum = 0.0;
                    for (gw_u32 j = 0; j < len; ++j) {
                        wide_sum = wide_sum + (double)gw_abs(xs[j]);
                    }
                    scale = (float)(wide_sum / (double)len);
                }
                gw_write_f32_le(out, scale);
            } else if (Q == GW_QUANT_QSGD || Q == GW_QUANT_E3M0) {
                gw_u32 largest = 0u;
                for (gw_u32 l = 0; l < GW_QUANT_LANES; ++l) {
                    const gw_u32 k = lane_key[l];
                    largest = k > largest ? k : largest;
                }
                for (gw_u32 j = whole; j < len; ++j) {
                    const gw_u32 k = gw_key(xs[j]);
                    largest = k > largest ? k : largest;
                }
                float scale = __uint_as_float(largest);
                if (Q == GW_QUANT_QSGD && max_norm == 0u) {
                    // quant.rs's qsgd_scale: the lanes in order, then the
                    // remainder, in f64; a 2-norm past f32 keeps the max.
                    double total = 0.0;
                    for (gw_u32 l = 0; l < GW_QUANT_LANES; ++l) {
                        total = total + lane_sq[l];
                    }
                    for (gw_u32 j = whole; j < len; ++j) {
                        const double v = (double)xs[j];
                        total = total + v * v;
                    }
                    const float l2 = (float)sqrt(total);
                    if (gw_is_finite(l2)) {
                        scale = l2;
                    }
                }
                gw_write_f32_le(out, scale);
                // QSGD's inverse scale; E3M0's scale.
                param_f32[0] = Q == GW_QUANT_E3M0 ? scale : scale > 0.0f ? 1.0f / scale : 0.0f;
            } else {
                // The CPU's fold: the running value is kept unless the
                // next one is strictly smaller / larger.
                float lo = gw_infinity();
                float hi = -gw_infinity();
                for (gw_u32 l = 0; l < GW_QUANT_LANES; ++l) {
                    lo = lane_a[l] < lo ? lane_a[l] : lo;
                    hi = lane_b[l] > hi ? lane_b[l] : hi;
                }
                for (gw_u32 j = whole; j < len; ++j) {
                    const float v = xs[j];
                    lo = v < lo ? v : lo;
                    hi = v > hi ? v : hi;
                }
                gw_write_f32_le(out, lo);
                gw_write_f32_le(out + 4, hi);
                const float range = hi - lo;
                if (gw_is_finite(range)) {
                    wide = 0;
                    param_f32[0] = lo;
                    param_f32[1] = range > 0.0f ? 255.0f / range : 0.0f;
                } else {
                    // max - min overflows f32: in f64.
                    wide = 1;
                    param_f64[0] = (double)lo;
                    param_f64[1] = 255.0 / ((double)hi - (double)lo);
                }
            }
        }
        __syncthreads();
        gw_u8* codes = out + quant_header(Q);
        if (Q == GW_QUANT_SIGN) {
            const gw_u32 bytes = (len + 7u) / 8u;
            for (gw_u32 b = threadIdx.x; b < bytes; b += GW_BLOCK) {
                const gw_u32 end = len - 8u * b < 8u ? len - 8u * b : 8u;
                gw_u32 byte = 0u;
                for (gw_u32 i = 0; i < end; ++i) {
                    // The sign bit, inverted: 1 for a non-negative entry.
                    byte |= ((__float_as_uint(xs[8u * b + i]) >> 31) ^ 1u) << i;
                }
                codes[b] = (gw_u8)byte;
            }
        } else if (Q == GW_QUANT_QSGD) {
            const float inverse = param_f32[0];
            if (levels <= GW_QSGD_NIBBLE_LEVELS) {
                // One thread per byte: entries 2b and 2b + 1 (or zero past
                // the chunk's end) in its low and high halves.
                const gw_u32 bytes = (len + 1u) / 2u;
                for (gw_u32 b = threadIdx.x; b < bytes; b += GW_BLOCK) {
                    const gw_u32 j = 2u * b;
                    const int low = quant_qsgd_level(xs[j], inverse, levels, key, first, j);
                    const int high =
                        j + 1u < len ? quant_qsgd_level(xs[j + 1u], inverse, levels, key, first,
                                                        j + 1u)
                                     : 0;
                    codes[b] = (gw_u8)((low & 0xf) | ((high & 0xf) << 4));
                }
            } else {
                for (gw_u32 j = threadIdx.x; j < len; j += GW_BLOCK) {
                    codes[j] = (gw_u8)quant_qsgd_level(xs[j], inverse, levels, key, first, j);
                }
            }
        } else if (Q == GW_QUANT_E3M0) {
            // One thread per byte, as QSGD's nibbles; a zero scale (every
            // entry zero) writes zero codes.
            const float scale = param_f32[0];
            const gw_u32 bytes = (len + 1u) / 2u;
            for (gw_u32 b = threadIdx.x; b < bytes; b += GW_BLOCK) {
                const gw_u32 j = 2u * b;
                gw_u32 byte = 0u;
                if (scale > 0.0f) {
                    byte = quant_e3m0_code(xs[j], scale, key, first, j);
                    if (j + 1u < len) {
                        byte |= quant_e3m0_code(xs[j + 1u], scale, key, first, j + 1u) << 4;
                    }
                }
                codes[b] = (gw_u8)byte;
            }
        } else {
            if (wide == 0) {
                const float lo = param_f32[0];
                const float to_step = param_f32[1];
                for (gw_u32 j = threadIdx.x; j < len; j += GW_BLOCK) {
                    // `as i32 as u8`: saturating to i32, then the low byte.
                    codes[j] = (gw_u8)__float2int_rz((xs[j] - lo) * to_step + 0.5f);
                }
            } else {
                const double lo = param_f64[0];
                const double to_step = param_f64[1];
                for (gw_u32 j = threadIdx.x; j < len; j += GW_BLOCK) {
                    // `as u8` from f64: saturating to 0..=255.
                    const unsigned int step =
                        __double2uint_rz(((double)xs[j] - lo) * to_step + 0.5);
                    codes[j] = (gw_u8)(step < 255u ? step : 255u);
                }
            }
        }
        // The next chunk reuses the shared memory.
        __syncthreads();
    }
}

extern "C" __global__ void quant_sign_encode_f32(const float* x, gw_u64 n, gw_u8* payload) {
    quant_encode_impl<GW_QUANT_SIGN>(x, n, 0u, 0u, 0ull, payload);
}

extern "C" __global__ void quant_qsgd_encode_f32(const float* x, gw_u64 n, gw_u32 levels,
                                                 gw_u32 max_norm, gw_u64 key, gw_u8* payload) {
    quant_encode_impl<GW_QUANT_QSGD>(x, n, levels, max_norm, key, payload);
}

extern "C" __global__ void quant_e3m0_encode_f32(const float* x, gw_u64 n, gw_u64 key,
                                                 gw_u8* payload) {
    quant_encode_impl<GW_QUANT_E3M0>(x, n, 0u, 0u, key, payload);
}

extern "C" __global__ void quant_minmax_encode_f32(const float* x, gw_u64 n, gw_u8* payload) {
    quant_encode_impl<GW_QUANT_MINMAX>(x, n, 0u, 0u, 0ull, payload);
}

// The checks of a payload for n entries (of the encoded length, checked by
// the launcher): first_bad[0] (GW_NO_INDEX from the launcher) gets the
// smallest chunk the CPU's decode would refuse.
extern "C" __global__ void quant_sign_check(const gw_u8* payload, gw_u64 n, gw_u64* first_bad) {
    const gw_u64 chunks = (n + GW_QUANT_CHUNK - 1u) / GW_QUANT_CHUNK;
    GW_FOR_EACH(c, chunks) {
        if (!gw_is_finite(gw_read_f32_le(payload + c * quant_stride(GW_QUANT_SIGN, 0u)))) {
            gw_first_index(first_bad, c);
        }
    }
}

extern "C" __global__ void quant_qsgd_check(const gw_u8* payload, gw_u64 n, gw_u32 levels,
                                            gw_u64* first_bad) {
    GW_FOR_EACH(i, n) {
        const gw_u64 c = i / GW_QUANT_CHUNK;
        const gw_u32 j = (gw_u32)(i % GW_QUANT_CHUNK);
        const gw_u8* chunk = payload + c * quant_stride(GW_QUANT_QSGD, levels);
        const int q = quant_qsgd_code(chunk + 4, j, levels);
        const int magnitude = q < 0 ? -q : q;
        const bool bad_scale = j == 0u && !gw_is_finite(gw_read_f32_le(chunk));
        // The last entry of an odd chunk (only the last chunk can be odd)
        // shares its byte with a padding nibble, which must be zero.
        const bool bad_padding = levels <= GW_QSGD_NIBBLE_LEVELS && i + 1u == n && j % 2u == 0u &&
                                 (chunk[4 + j / 2u] >> 4) != 0u;
        if (bad_scale || magnitude > (int)levels || bad_padding) {
            gw_first_index(first_bad, c);
        }
    }
}

extern "C" __global__ void quant_e3m0_check(const gw_u8* payload, gw_u64 n, gw_u64* first_bad) {
    GW_FOR_EACH(i, n) {
        const gw_u64 c = i / GW_QUANT_CHUNK;
        const gw_u32 j = (gw_u32)(i % GW_QUANT_CHUNK);
        const gw_u8* chunk = payload + c * quant_stride(GW_QUANT_E3M0, 0u);
        const gw_u32 nibble = quant_nibble(chunk + 4, j);
        // The scale: finite, its sign bit clear (-0.0 included).
        const bool bad_scale =
            j == 0u && (!gw_is_finite(gw_read_f32_le(chunk)) || (chunk[3] & 0x80u) != 0u);
        // An odd chunk's padding nibble, as QSGD's.
        const bool bad_padding = i + 1u == n && j % 2u == 0u && (chunk[4 + j / 2u] >> 4) != 0u;
        if (bad_scale || nibble == GW_E3M0_NEGATIVE || bad_padding) {
            gw_first_index(first_bad, c);
        }
    }
}

extern "C" __global__ void quant_minmax_check(const gw_u8* payload, gw_u64 n,
                                              gw_u64* first_bad) {
    const gw_u64 chunks = (n + GW_QUANT_CHUNK - 1u) / GW_QUANT_CHUNK;
    GW_FOR_EACH(c, chunks) {
        const gw_u8* chunk = payload + c * quant_stride(GW_QUANT_MINMAX, 0u);
        const float lo = gw_read_f32_le(chunk);
        const float hi = gw_read_f32_le(chunk + 4);
        if (!gw_is_finite(lo) || !gw_is_finite(hi) || lo > hi) {
            gw_first_index(first_bad, c);
        }
    }
}

// out[i] = v (add == 0) or out[i] = out[i] + v (add != 0).
__device__ __forceinline__ void quant_put(float* out, gw_u64 i, float v, int add) {
    out[i] = add ? out[i] + v : v;
}

// Decoding of a checked payload for n entries into out (n f32).
extern "C" __global__ void quant_sign_decode_f32(const gw_u8* payload, gw_u64 n, float* out,
                                                 int add) {
    GW_FOR_EACH(i, n) {
        const gw_u64 c = i / GW_QUANT_CHUNK;
        const gw_u32 j = (gw_u32)(i % GW_QUANT_CHUNK);
        const gw_u8* chunk = payload + c * quant_stride(GW_QUANT_SIGN, 0u);
        const float scale = gw_read_f32_le(chunk);
        const gw_u32 byte = chunk[4 + j / 8u];
        quant_put(out, i, (byte >> (j % 8u)) & 1u ? scale : -scale, add);
    }
}

extern "C" __global__ void quant_qsgd_decode_f32(const gw_u8* payload, gw_u64 n, gw_u32 levels,
                                                 float* out, int add) {
    GW_FOR_EACH(i, n) {
        const gw_u64 c = i / GW_QUANT_CHUNK;
        const gw_u32 j = (gw_u32)(i % GW_QUANT_CHUNK);
        const gw_u8* chunk = payload + c * quant_stride(GW_QUANT_QSGD, levels);
        const float unit = gw_read_f32_le(chunk) / (float)levels;
        const int q = quant_qsgd_code(chunk + 4, j, levels);
        quant_put(out, i, (float)q * unit, add);
    }
}

extern "C" __global__ void quant_e3m0_decode_f32(const gw_u8* payload, gw_u64 n, float* out,
                                                 int add) {
    GW_FOR_EACH(i, n) {
        const gw_u64 c = i / GW_QUANT_CHUNK;
        const gw_u32 j = (gw_u32)(i % GW_QUANT_CHUNK);
        const gw_u8* chunk = payload + c * quant_stride(GW_QUANT_E3M0, 0u);
        const gw_u32 nibble = quant_nibble(chunk + 4, j);
        const gw_u32 e = nibble & 7u;
        // scale * 2^(e - 7) (the power's bits built exactly), +0.0 for code
        // 0; negated with the sign bit, as e3m0.rs's table.
        float v = e == 0u ? 0.0f : gw_read_f32_le(chunk) * __uint_as_float((120u + e) << 23);
        v = (nibble & GW_E3M0_NEGATIVE) != 0u ? -v : v;
        quant_put(out, i, v, add);
    }
}

extern "C" __global__ void quant_minmax_decode_f32(const gw_u8* payload, gw_u64 n, float* out,
                                                   int add) {
    GW_FOR_EACH(i, n) {
        const gw_u64 c = i / GW_QUANT_CHUNK;
        const gw_u32 j = (gw_u32)(i % GW_QUANT_CHUNK);
        const gw_u8* chunk = payload + c * quant_stride(GW_QUANT_MINMAX, 0u);
        const float lo = gw_read_f32_le(chunk);
        const float hi = gw_read_f32_le(chunk + 4);
        const gw_u32 q = chunk[8 + j];
        const float step = (hi - lo) / 255.0f;
        float v;
        if (gw_is_finite(step)) {
            // min + q step, clamped to max as the CPU does: rounding may
            // not carry past max (a value equal to max is kept as it is).
            v = lo + (float)q * step;
            v = hi < v ? hi : v;
        } else {
            // max - min overflows f32: in f64, then Rust's clamp.
            const double wide_step = ((double)hi - (double)lo) / 255.0;
            v = (float)((double)lo + (double)q * wide_step);
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
        }
        quant_put(out, i, v, add);
    }
}
