// reduce.cu: gradwire-tensor's reductions (sum, sum of squares, dot, max-abs)
// on f32, f16 and bf16 buffers, accumulated in f64.
//
// Sums run in two deterministic stages: `<op>_partial_<dtype>` leaves one f64
// per block in `partials` (each thread sums its grid-stride elements in index
// order, then the block adds the threads' sums in a fixed tree), and
// `finish_sum_f64` adds the partials in a fixed order with one block. The
// result depends only on the data and the launch shape, never on timing. The
// order of the f64 additions differs from the CPU's eight lanes, so the GPU
// result equals the CPU's within the rounding of f64 additions (every f32 and
// every product of two f32 is exact in f64), not bitwise.
//
// max-abs is exact in any order: the magnitude key (bits & 0x7fffffff) of
// every element goes into one atomicMax; a key above 0x7f800000 is a NaN
// (the CPU returns NaN when any element is NaN), 0x7f800000 an infinity.
//
// Entries: sum_partial_<dt>, sum_sq_partial_<dt>, dot_partial_<dt>,
// max_abs_key_<dt> for dt in f32, f16, bf16, and finish_sum_f64.
// Launch the partial and finish kernels with GW_BLOCK threads per block.

#include "gradwire.cuh"

template <typename T>
__device__ void sum_partial_impl(const T* x, gw_u64 n, double* partials) {
    __shared__ double shared[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    double acc = 0.0;
    GW_FOR_EACH(i, n) { acc = acc + (double)gw_load(x, i); }
    const double total = gw_block_sum_f64(acc, shared);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = total;
    }
}

template <typename T>
__device__ void sum_sq_partial_impl(const T* x, gw_u64 n, double* partials) {
    __shared__ double shared[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    double acc = 0.0;
    GW_FOR_EACH(i, n) {
        const double v = (double)gw_load(x, i);
        acc = acc + v * v;
    }
    const double total = gw_block_sum_f64(acc, shared);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = total;
    }
}

template <typename T>
__device__ void dot_partial_impl(const T* a, const T* b, gw_u64 n, double* partials) {
    __shared__ double shared[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    double acc = 0.0;
    GW_FOR_EACH(i, n) { acc = acc + (double)gw_load(a, i) * (double)gw_load(b, i); }
    const double total = gw_block_sum_f64(acc, shared);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = total;
    }
}

// `out_key` starts at 0 (the launcher zeroes it): the key of an empty input.
// The block's largest key first (a maximum is exact in any order), then one
// atomic per block: one per thread would queue up to MAX_GRID x GW_BLOCK
// atomics on one address.
template <typename T>
__device__ void max_abs_key_impl(const T* x, gw_u64 n, gw_u32* out_key) {
    __shared__ gw_u32 shared[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    gw_u32 best = 0u;
    GW_FOR_EACH(i, n) {
        const gw_u32 k = gw_key(gw_load(x, i));
        best = k > best ? k : best;
    }
    shared[threadIdx.x] = best;
    __syncthreads();
    for (unsigned s = GW_BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const gw_u32 other = shared[threadIdx.x + s];
            shared[threadIdx.x] = other > shared[threadIdx.x] ? other : shared[threadIdx.x];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && shared[0] != 0u) {
        atomicMax(out_key, shared[0]);
    }
}

#define GW_REDUCE(SUFFIX, T)                                                           \
    extern "C" __global__ void sum_partial_##SUFFIX(const T* x, gw_u64 n,              \
                                                    double* partials) {                \
        sum_partial_impl<T>(x, n, partials);                                           \
    }                                                                                  \
    extern "C" __global__ void sum_sq_partial_##SUFFIX(const T* x, gw_u64 n,           \
                                                       double* partials) {             \
        sum_sq_partial_impl<T>(x, n, partials);                                        \
    }                                                                                  \
    extern "C" __global__ void dot_partial_##SUFFIX(const T* a, const T* b, gw_u64 n,  \
                                                    double* partials) {                \
        dot_partial_impl<T>(a, b, n, partials);                                        \
    }                                                                                  \
    extern "C" __global__ void max_abs_key_##SUFFIX(const T* x, gw_u64 n,              \
                                                    gw_u32* out_key) {                 \
        max_abs_key_impl<T>(x, n, out_key);                                            \
    }

GW_REDUCE(f32, float)
GW_REDUCE(f16, gw_f16)
GW_REDUCE(bf16, gw_bf16)

// Adds `count` f64 partials into out[0] with one block: thread t sums the
// partials t, t + GW_BLOCK, ... in order, then the block tree. Used after the
// partial kernels above and by adasum.cu's per-tensor partials (one launch
// per group, `partials` offset by the launcher).
extern "C" __global__ void finish_sum_f64(const double* partials, gw_u64 count, double* out) {
    __shared__ double shared[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    if (blockIdx.x != 0) {
        return;
    }
    double acc = 0.0;
    for (gw_u64 i = threadIdx.x; i < count; i += GW_BLOCK) {
        acc = acc + partials[i];
    }
    const double total = gw_block_sum_f64(acc, shared);
    if (threadIdx.x == 0) {
        out[0] = total;
    }
}
