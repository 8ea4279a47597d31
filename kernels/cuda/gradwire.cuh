// gradwire.cuh: helpers shared by every gradwire kernel module.
//
// Compiled by NVRTC (`cargo xtask ptx`) with --fmad=false, so a * x + y is a
// multiply and an add, each rounded, exactly as gradwire's CPU code computes it
// (Rust never contracts into a fused multiply-add). Division and square root
// are IEEE round-to-nearest (--prec-div=true --prec-sqrt=true) and denormals
// are kept (--ftz=false), again as on the CPU.
//
// No system or toolkit header is included (NVRTC from PyPI ships none): the
// integer types are declared here and the half-precision conversions are
// written out on the bits, reproducing the `half` crate's results bit for bit,
// NaN payloads included.

#ifndef GRADWIRE_CUH
#define GRADWIRE_CUH

typedef unsigned char gw_u8;
typedef unsigned short gw_u16;
typedef unsigned int gw_u32;
typedef unsigned long long gw_u64;
typedef long long gw_i64;

// Storage types of the three dtypes: f32 is float, f16 and bf16 are their bits.
struct gw_f16 { gw_u16 bits; };
struct gw_bf16 { gw_u16 bits; };

// Magnitude keys: for finite floats `bits & 0x7fffffff` orders like |x|;
// keys at or above GW_NON_FINITE_KEY are infinities and NaNs.
#define GW_KEY_MASK 0x7fffffffu
#define GW_NON_FINITE_KEY 0x7f800000u
// "No index" for the atomicMin-based first-index searches.
#define GW_NO_INDEX 0xffffffffffffffffull

// Threads per block the launchers use for the block-level algorithms
// (compaction, histograms, block reductions). Every kernel that depends on it
// starts with GW_REQUIRE_BLOCK: any other block size is a launcher bug, and the
// kernel traps (the launch fails with an error) rather than index shared
// memory out of bounds.
#define GW_BLOCK 256
#define GW_WARPS (GW_BLOCK / 32)
#define GW_REQUIRE_BLOCK()                                     \
    do {                                                       \
        if (blockDim.x != GW_BLOCK || blockDim.y != 1 || blockDim.z != 1) { \
            __trap();                                          \
        }                                                      \
    } while (0)

__device__ __forceinline__ gw_u32 gw_key(float x) {
    return __float_as_uint(x) & GW_KEY_MASK;
}

__device__ __forceinline__ bool gw_is_finite(float x) {
    return gw_key(x) < GW_NON_FINITE_KEY;
}

// f32 -> f16, round to nearest, ties to even. Overflow gives an infinity; a
// NaN stays a quiet NaN keeping the top 10 bits of its payload.
__device__ __forceinline__ gw_u16 gw_f32_to_f16_bits(float value) {
    const gw_u32 x = __float_as_uint(value);
    const gw_u32 sign = (x >> 16) & 0x8000u;
    const gw_u32 exp = (x >> 23) & 0xffu;
    const gw_u32 man = x & 0x007fffffu;
    if (exp == 0xffu) {
        const gw_u32 quiet = man != 0u ? 0x0200u : 0u;
        return (gw_u16)(sign | 0x7c00u | quiet | (man >> 13));
    }
    const int e = (int)exp - 127 + 15;  // biased f16 exponent
    if (e >= 0x1f) {
        return (gw_u16)(sign | 0x7c00u);
    }
    if (e <= 0) {
        // Subnormal (or zero) in f16: shift the full significand right.
        const int shift = 14 - e;  // 14..; beyond 24 everything rounds to 0
        if (shift > 24) {
            return (gw_u16)sign;
        }
        const gw_u32 full = man | 0x00800000u;
        gw_u32 h = full >> shift;
        const gw_u32 half_ulp = 1u << (shift - 1);
        const gw_u32 rest = full & ((half_ulp << 1) - 1u);
        if (rest > half_ulp || (rest == half_ulp && (h & 1u))) {
            h += 1u;
        }
        return (gw_u16)(sign | h);
    }
    gw_u32 h = ((gw_u32)e << 10) | (man >> 13);
    const gw_u32 rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) {
        h += 1u;  // a carry into the exponent is correct, up to infinity
    }
    return (gw_u16)(sign | h);
}

// f16 -> f32, exact. A NaN becomes a quiet NaN with the payload shifted up.
__device__ __forceinline__ float gw_f16_bits_to_f32(gw_u16 h) {
    const gw_u32 sign = ((gw_u32)h & 0x8000u) << 16;
    const gw_u32 exp = ((gw_u32)h >> 10) & 0x1fu;
    gw_u32 man = (gw_u32)h & 0x3ffu;
    if (exp == 0x1fu) {
        if (man == 0u) {
            return __uint_as_float(sign | 0x7f800000u);
        }
        return __uint_as_float(sign | 0x7fc00000u | (man << 13));
    }
    if (exp == 0u) {
        if (man == 0u) {
            return __uint_as_float(sign);
        }
        // Subnormal: normalise.
        int e = -1;
        do {
            man <<= 1;
            e += 1;
        } while ((man & 0x400u) == 0u);
        const gw_u32 exp32 = (gw_u32)(127 - 15 - e);
        return __uint_as_float(sign | (exp32 << 23) | ((man & 0x3ffu) << 13));
    }
    return __uint_as_float(sign | ((exp + 127u - 15u) << 23) | (man << 13));
}

// f32 -> bf16, round to nearest, ties to even; a NaN stays a quiet NaN.
__device__ __forceinline__ gw_u16 gw_f32_to_bf16_bits(float value) {
    const gw_u32 x = __float_as_uint(value);
    if ((x & GW_KEY_MASK) > 0x7f800000u) {
        return (gw_u16)((x >> 16) | 0x0040u);
    }
    const gw_u32 rest = x & 0xffffu;
    gw_u32 h = x >> 16;
    if (rest > 0x8000u || (rest == 0x8000u && (h & 1u))) {
        h += 1u;
    }
    return (gw_u16)h;
}

// bf16 -> f32, exact.
__device__ __forceinline__ float gw_bf16_bits_to_f32(gw_u16 h) {
    return __uint_as_float((gw_u32)h << 16);
}

// Loads and stores of any storage type as f32 (one rounding on the store).
__device__ __forceinline__ float gw_load(const float* p, gw_u64 i) { return p[i]; }
__device__ __forceinline__ float gw_load(const gw_f16* p, gw_u64 i) {
    return gw_f16_bits_to_f32(p[i].bits);
}
__device__ __forceinline__ float gw_load(const gw_bf16* p, gw_u64 i) {
    return gw_bf16_bits_to_f32(p[i].bits);
}
__device__ __forceinline__ void gw_store(float* p, gw_u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void gw_store(gw_f16* p, gw_u64 i, float v) {
    p[i].bits = gw_f32_to_f16_bits(v);
}
__device__ __forceinline__ void gw_store(gw_bf16* p, gw_u64 i, float v) {
    p[i].bits = gw_f32_to_bf16_bits(v);
}

// Four elements per access. A memory-bound kernel that moves one 2- or
// 4-byte element per thread and iteration keeps too few bytes in flight to
// reach the memory's bandwidth; one 16-byte (f32) or 8-byte (f16, bf16)
// access per four elements does. The arithmetic per element is unchanged, so
// are the results.
struct __attribute__((aligned(16))) gw_f32x4 { float v[4]; };
struct __attribute__((aligned(8))) gw_u16x4 { gw_u16 v[4]; };

// Whether `p` may be accessed four elements at a time (a view at an offset
// that is not a multiple of four elements may not).
template <typename T>
__device__ __forceinline__ bool gw_aligned4(const T* p) {
    return ((gw_u64)p % (4u * sizeof(T))) == 0u;
}

// A half-precision storage type's bits of `v` (one rounding), and back.
__device__ __forceinline__ gw_u16 gw_narrow(const gw_f16*, float v) {
    return gw_f32_to_f16_bits(v);
}
__device__ __forceinline__ gw_u16 gw_narrow(const gw_bf16*, float v) {
    return gw_f32_to_bf16_bits(v);
}
__device__ __forceinline__ float gw_widen(const gw_f16*, gw_u16 h) {
    return gw_f16_bits_to_f32(h);
}
__device__ __forceinline__ float gw_widen(const gw_bf16*, gw_u16 h) {
    return gw_bf16_bits_to_f32(h);
}

// Elements 4q .. 4q + 3 of an aligned buffer, as f32 (exact when widening).
__device__ __forceinline__ void gw_load4(const float* p, gw_u64 q, float out[4]) {
    const gw_f32x4 x = reinterpret_cast<const gw_f32x4*>(p)[q];
    for (int k = 0; k < 4; ++k) {
        out[k] = x.v[k];
    }
}
template <typename H>
__device__ __forceinline__ void gw_load4_half(const H* p, gw_u64 q, float out[4]) {
    const gw_u16x4 x = reinterpret_cast<const gw_u16x4*>(p)[q];
    for (int k = 0; k < 4; ++k) {
        out[k] = gw_widen(p, x.v[k]);
    }
}
__device__ __forceinline__ void gw_load4(const gw_f16* p, gw_u64 q, float out[4]) {
    gw_load4_half(p, q, out);
}
__device__ __forceinline__ void gw_load4(const gw_bf16* p, gw_u64 q, float out[4]) {
    gw_load4_half(p, q, out);
}

// Stores elements 4q .. 4q + 3 of an aligned buffer (one rounding each when
// narrowing).
__device__ __forceinline__ void gw_store4(float* p, gw_u64 q, const float v[4]) {
    gw_f32x4 x;
    for (int k = 0; k < 4; ++k) {
        x.v[k] = v[k];
    }
    reinterpret_cast<gw_f32x4*>(p)[q] = x;
}
template <typename H>
__device__ __forceinline__ void gw_store4_half(H* p, gw_u64 q, const float v[4]) {
    gw_u16x4 x;
    for (int k = 0; k < 4; ++k) {
        x.v[k] = gw_narrow(p, v[k]);
    }
    reinterpret_cast<gw_u16x4*>(p)[q] = x;
}
__device__ __forceinline__ void gw_store4(gw_f16* p, gw_u64 q, const float v[4]) {
    gw_store4_half(p, q, v);
}
__device__ __forceinline__ void gw_store4(gw_bf16* p, gw_u64 q, const float v[4]) {
    gw_store4_half(p, q, v);
}

// Clamp to [-c, c] with two comparisons: a NaN passes through (fminf/fmaxf
// would drop it), as Rust's f32::clamp does.
__device__ __forceinline__ float gw_clamp(float v, float c) {
    const float lo = -c;
    v = v < lo ? lo : v;
    return v > c ? c : v;
}

// Grid-stride loop over [0, n) with 64-bit indices.
#define GW_FOR_EACH(i, n)                                                   \
    for (gw_u64 i = (gw_u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (gw_u64)gridDim.x * blockDim.x)

// Records `index` as a candidate for the smallest index with some property.
__device__ __forceinline__ void gw_first_index(gw_u64* first, gw_u64 index) {
    atomicMin(first, index);
}

// Sum of one f64 per thread over the block, in a fixed tree order (the result
// depends only on the values and the block size, never on timing). Every
// thread of the block must call it; thread 0 gets the total.
__device__ __forceinline__ double gw_block_sum_f64(double v, double* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            shared[threadIdx.x] = shared[threadIdx.x] + shared[threadIdx.x + s];
        }
        __syncthreads();
    }
    const double total = shared[0];
    __syncthreads();
    return total;
}

#endif  // GRADWIRE_CUH
