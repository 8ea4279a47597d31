// lowrank.cu: PowerSGD's low-rank products (gradwire-compress lowrank.rs) on
// device buffers of f32, each matrix at an element offset of its buffer.
//
// Matrices are row-major; `M` is rows x cols, `P` rows x rank, and `Q` is
// kept transposed (`Qt`, rank x cols), as on the CPU. The three products
// compute the CPU's bits: every sum runs in the CPU's order with each
// multiply and add rounded separately (--fmad=false):
//
// - lowrank_project_f32, P = M Q: the CPU's `dot` keeps eight partial sums
//   (entry e goes to lane e % 8, over the whole multiples of 8), adds the
//   lanes in order 0..7, then the tail (the last cols % 8 products, summed
//   in order from -0.0, as Rust's `Sum` does) last. Here eight threads hold
//   the eight lanes of one output and the first of them finishes the sum.
// - lowrank_project_back_f32, Qt = (Mt P)t: one thread per output, summing
//   over the rows in order from 0.0 (the CPU's row-by-row axpys).
// - lowrank_reconstruct_f32, out = P Qt: one thread per output, summing
//   over the rank in order from 0.0.
//
// lowrank_orthonormalize_f32 is the CPU's modified Gram-Schmidt (each
// projection done twice, the norms and dot products in f64, a column with no
// direction left zeroed), one block per matrix. Its f64 sums are block
// reductions in a fixed order, not the CPU's sequential one: the result is
// deterministic (the same bits on every run and every GPU) and equals the
// CPU's to within a rounding of those f64 sums (entries of an orthonormal
// column differ by a few f32 ulps at most).
//
// Launched with GW_BLOCK threads per block; the project and orthonormalize
// kernels require it (GW_REQUIRE_BLOCK).

#include "gradwire.cuh"

// Outputs per block of lowrank_project_f32: eight threads (lanes) each.
#define GW_LOWRANK_LANES 8
#define GW_LOWRANK_OUTPUTS (GW_BLOCK / GW_LOWRANK_LANES)

// p[p_at + i * rank + j] = dot(row i of M, row j of Qt) for every i < rows,
// j < rank. Grid-stride over groups of GW_LOWRANK_OUTPUTS outputs (the loop
// runs the same number of times in every thread of a block, so the barriers
// are reached by all).
extern "C" __global__ void lowrank_project_f32(const float* m, gw_u64 m_at, const float* qt,
                                               gw_u64 qt_at, float* p, gw_u64 p_at,
                                               gw_u64 rows, gw_u64 cols, gw_u64 rank) {
    __shared__ float lanes[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    const gw_u64 outputs = rows * rank;
    const gw_u64 lane = threadIdx.x % GW_LOWRANK_LANES;
    const gw_u64 whole = cols - cols % GW_LOWRANK_LANES;
    for (gw_u64 base = (gw_u64)blockIdx.x * GW_LOWRANK_OUTPUTS; base < outputs;
         base += (gw_u64)gridDim.x * GW_LOWRANK_OUTPUTS) {
        const gw_u64 output = base + threadIdx.x / GW_LOWRANK_LANES;
        float acc = 0.0f;
        if (output < outputs) {
            const float* row = m + m_at + (output / rank) * cols;
            const float* q = qt + qt_at + (output % rank) * cols;
            for (gw_u64 e = lane; e < whole; e += GW_LOWRANK_LANES) {
                acc = acc + row[e] * q[e];
            }
        }
        lanes[threadIdx.x] = acc;
        __syncthreads();
        if (lane == 0 && output < outputs) {
            float sum = lanes[threadIdx.x];
            for (int l = 1; l < GW_LOWRANK_LANES; ++l) {
                sum = sum + lanes[threadIdx.x + l];
            }
            const float* row = m + m_at + (output / rank) * cols;
            const float* q = qt + qt_at + (output % rank) * cols;
            float tail = -0.0f;
            for (gw_u64 e = whole; e < cols; ++e) {
                tail = tail + row[e] * q[e];
            }
            p[p_at + output] = sum + tail;
        }
        __syncthreads();
    }
}

// qt[qt_at + j * cols + c] = sum over i in order of p[i * rank + j] *
// m[i * cols + c]: one thread per output, consecutive threads on consecutive
// columns (coalesced reads of M's rows).
extern "C" __global__ void lowrank_project_back_f32(const float* m, gw_u64 m_at, const float* p,
                                                    gw_u64 p_at, float* qt, gw_u64 qt_at,
                                                    gw_u64 rows, gw_u64 cols, gw_u64 rank) {
    GW_FOR_EACH(o, rank * cols) {
        const gw_u64 j = o / cols;
        const gw_u64 c = o % cols;
        float acc = 0.0f;
        for (gw_u64 i = 0; i < rows; ++i) {
            acc = acc + p[p_at + i * rank + j] * m[m_at + i * cols + c];
        }
        qt[qt_at + o] = acc;
    }
}

// out[out_at + i * cols + c] = sum over j in order of p[i * rank + j] *
// qt[j * cols + c].
extern "C" __global__ void lowrank_reconstruct_f32(const float* p, gw_u64 p_at, const float* qt,
                                                   gw_u64 qt_at, float* out, gw_u64 out_at,
                                                   gw_u64 rows, gw_u64 cols, gw_u64 rank) {
    GW_FOR_EACH(o, rows * cols) {
        const gw_u64 i = o / cols;
        const gw_u64 c = o % cols;
        float acc = 0.0f;
        for (gw_u64 j = 0; j < rank; ++j) {
            acc = acc + p[p_at + i * rank + j] * qt[qt_at + j * cols + c];
        }
        out[out_at + o] = acc;
    }
}

// The f64 sum of squares of column j (every thread gets it).
__device__ double lowrank_column_norm_sq(const float* p, gw_u64 rows, gw_u64 rank, gw_u64 j,
                                         double* shared) {
    double acc = 0.0;
    for (gw_u64 i = threadIdx.x; i < rows; i += GW_BLOCK) {
        const double x = (double)p[i * rank + j];
        acc = acc + x * x;
    }
    return gw_block_sum_f64(acc, shared);
}

// The columns of the rows x rank matrix at p + p_at made orthonormal in
// place: one block, launched as a single block per matrix.
extern "C" __global__ void lowrank_orthonormalize_f32(float* p_base, gw_u64 p_at, gw_u64 rows,
                                                      gw_u64 rank) {
    __shared__ double shared[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    if (blockIdx.x != 0) {
        return;
    }
    float* p = p_base + p_at;
    for (gw_u64 j = 0; j < rank; ++j) {
        const double norm_before = sqrt(lowrank_column_norm_sq(p, rows, rank, j, shared));
        // Twice, as on the CPU ("twice is enough").
        for (int pass = 0; pass < 2; ++pass) {
            for (gw_u64 k = 0; k < j; ++k) {
                double acc = 0.0;
                for (gw_u64 i = threadIdx.x; i < rows; i += GW_BLOCK) {
                    acc = acc + (double)p[i * rank + j] * (double)p[i * rank + k];
                }
                const double dot = gw_block_sum_f64(acc, shared);
                for (gw_u64 i = threadIdx.x; i < rows; i += GW_BLOCK) {
                    p[i * rank + j] = p[i * rank + j] - (float)(dot * (double)p[i * rank + k]);
                }
                __syncthreads();
            }
        }
        const double norm = sqrt(lowrank_column_norm_sq(p, rows, rank, j, shared));
        // f32::MIN_POSITIVE, the smallest normal f32: 2^-126 exactly.
        const double min_positive = __longlong_as_double(0x3810000000000000ll);
        const double scale =
            (norm > 1e-6 * norm_before && norm > min_positive) ? 1.0 / norm : 0.0;
        for (gw_u64 i = threadIdx.x; i < rows; i += GW_BLOCK) {
            p[i * rank + j] = (float)((double)p[i * rank + j] * scale);
        }
        __syncthreads();
    }
}
