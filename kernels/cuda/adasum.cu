// adasum.cu: AdaSum's pairwise rule (gradwire-algos adasum.rs) on device
// buffers of f32, per tensor range of a fused buffer.
//
// adasum_partials_f32 computes, per tensor t and per block column, the f64
// partial sums of a.b, |a|^2 and |b|^2 over the tensor's range (the launcher
// clips the ranges to the piece this rank holds); adasum_finish_f64 adds the
// columns in a fixed order, giving the 3 x tensors partials that AdaSum
// all-reduces across ranks; adasum_combine_f32 then sets, per tensor,
// a = ca a + cb b in f64, rounded once to f32, with the CPU's coefficients
// (1 - a.b / (2 |a|^2), staying 1 below sqrt(f64::MIN_POSITIVE)).
//
// `ranges` holds 2 u64 per tensor: start and end, within the buffers' length
// `n` (the kernels clip them to it, so a range read from device memory never
// reaches past the buffers). Grids: x = block columns per tensor, y = tensors
// (strided when there are more than gridDim.y). `partials` holds
// 3 x tensors x gridDim.x doubles: partials[(t * gridDim.x + column) * 3 + j].
// Launched with GW_BLOCK threads per block.

#include "gradwire.cuh"

// Tensor t's range clipped to [0, n): start <= end <= n.
__device__ __forceinline__ void adasum_range(const gw_u64* ranges, gw_u64 t, gw_u64 n,
                                             gw_u64* start, gw_u64* end) {
    const gw_u64 e = ranges[2 * t + 1] < n ? ranges[2 * t + 1] : n;
    *start = ranges[2 * t] < e ? ranges[2 * t] : e;
    *end = e;
}

extern "C" __global__ void adasum_partials_f32(const float* a, const float* b, gw_u64 n,
                                               const gw_u64* ranges, gw_u64 tensors,
                                               double* partials) {
    __shared__ double shared[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    for (gw_u64 t = blockIdx.y; t < tensors; t += gridDim.y) {
        gw_u64 start;
        gw_u64 end;
        adasum_range(ranges, t, n, &start, &end);
        double dot = 0.0;
        double aa = 0.0;
        double bb = 0.0;
        for (gw_u64 i = start + (gw_u64)blockIdx.x * GW_BLOCK + threadIdx.x; i < end;
             i += (gw_u64)gridDim.x * GW_BLOCK) {
            const double x = (double)a[i];
            const double y = (double)b[i];
            dot = dot + x * y;
            aa = aa + x * x;
            bb = bb + y * y;
        }
        dot = gw_block_sum_f64(dot, shared);
        aa = gw_block_sum_f64(aa, shared);
        bb = gw_block_sum_f64(bb, shared);
        if (threadIdx.x == 0) {
            double* out = partials + (t * gridDim.x + blockIdx.x) * 3;
            out[0] = dot;
            out[1] = aa;
            out[2] = bb;
        }
    }
}

// sums[3 t + j] = sum over columns c of partials[(t * columns + c) * 3 + j],
// one block per tensor (strided), columns in a fixed order.
extern "C" __global__ void adasum_finish_f64(const double* partials, gw_u64 tensors,
                                             gw_u64 columns, double* sums) {
    __shared__ double shared[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    for (gw_u64 t = blockIdx.x; t < tensors; t += gridDim.x) {
        for (int j = 0; j < 3; ++j) {
            double acc = 0.0;
            for (gw_u64 c = threadIdx.x; c < columns; c += GW_BLOCK) {
                acc = acc + partials[(t * columns + c) * 3 + j];
            }
            acc = gw_block_sum_f64(acc, shared);
            if (threadIdx.x == 0) {
                sums[3 * t + j] = acc;
            }
        }
    }
}

// The coefficient of one side of the pairwise rule.
__device__ __forceinline__ double adasum_coefficient(double dot, double norm_sq) {
    // sqrt(f64::MIN_POSITIVE) = 2^-511 exactly.
    const double tiny = __longlong_as_double(0x2000000000000000ll);
    return norm_sq < tiny ? 1.0 : 1.0 - dot / (2.0 * norm_sq);
}

extern "C" __global__ void adasum_combine_f32(float* a, const float* b, gw_u64 n,
                                              const gw_u64* ranges, gw_u64 tensors,
                                              const double* sums) {
    for (gw_u64 t = blockIdx.y; t < tensors; t += gridDim.y) {
        gw_u64 start;
        gw_u64 end;
        adasum_range(ranges, t, n, &start, &end);
        const double ca = adasum_coefficient(sums[3 * t], sums[3 * t + 1]);
        const double cb = adasum_coefficient(sums[3 * t], sums[3 * t + 2]);
        for (gw_u64 i = start + (gw_u64)blockIdx.x * blockDim.x + threadIdx.x; i < end;
             i += (gw_u64)gridDim.x * blockDim.x) {
            a[i] = (float)(ca * (double)a[i] + cb * (double)b[i]);
        }
    }
}
