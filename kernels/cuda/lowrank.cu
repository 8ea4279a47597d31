// lowrank.cu: PowerSGD's low-rank products (gradwire-compress lowrank.rs) on
// device buffers of f32, each matrix at an element offset of its buffer.
//
// Matrices are row-major; `M` is rows x cols, `P` rows x rank, and `Q` is
// kept transposed (`Qt`, rank x cols), as on the CPU. The three products
// compute the CPU's bits: every sum runs in the CPU's order with each
// multiply and add rounded separately (--fmad=false):
//
// - lowrank_project_f32, P = M Q: the CPU's `dot` sums a row in spans of
//   GW_LOWRANK_SPAN columns. A span keeps eight partial sums (entry e goes
//   to lane e % 8, over the span's whole multiples of 8), adds the lanes in
//   order 0..7, then its tail (its last len % 8 products, summed in order
//   from -0.0, as Rust's `Sum` does); the spans' sums are added in order
//   from -0.0. Here a group of eight threads holds the eight lanes of one
//   span, `slots` groups take the spans of one output side by side (span
//   `first + slot` in each round), and the output's first group adds their
//   sums in order.
// - lowrank_project_back_f32, Qt = (Mt P)t: the CPU sums over the rows in
//   spans of GW_LOWRANK_SPAN rows (each in row order from 0.0), the spans'
//   sums in order from -0.0. Here one thread sums one span of one output,
//   `slots` threads take the spans of one output side by side, and the
//   first adds their sums in order.
// - lowrank_reconstruct_f32, out = P Qt: one thread per output, summing
//   over the rank in order from 0.0.
//
// So the order of every sum is the spans', whatever the `slots` a launch
// takes (the launch plan's `lowrank_project` and `lowrank_project_back` pick
// them to fill the GPU: a long row or a tall matrix is split across
// threads instead of summed by one).
//
// lowrank_orthonormalize_f32 is the CPU's modified Gram-Schmidt (each
// projection done twice, the norms and dot products in f64, a column with no
// direction left zeroed), one block per matrix. Its f64 sums are block
// reductions in a fixed order, not the CPU's sequential one: the result is
// deterministic (the same bits on every run and every GPU) and equals the
// CPU's to within a rounding of those f64 sums (entries of an orthonormal
// column differ by a few f32 ulps at most).
//
// Launched with GW_BLOCK threads per block; the two projections and
// orthonormalize require it (GW_REQUIRE_BLOCK), and the projections trap on
// a `slots` outside 1..=GW_LOWRANK_MAX_SLOTS.

#include "gradwire.cuh"

// Terms of one partial sum: gradwire-compress's lowrank::SPAN.
#define GW_LOWRANK_SPAN 1024ull
// Lanes of one span's dot product in lowrank_project_f32.
#define GW_LOWRANK_LANES 8
// Groups of eight lanes in a block of lowrank_project_f32.
#define GW_LOWRANK_GROUPS (GW_BLOCK / GW_LOWRANK_LANES)
// The most spans of one output a launch sums side by side.
#define GW_LOWRANK_MAX_SLOTS 32

#define GW_LOWRANK_REQUIRE_SLOTS(slots)                          \
    do {                                                         \
        if ((slots) == 0 || (slots) > GW_LOWRANK_MAX_SLOTS) {    \
            __trap();                                            \
        }                                                        \
    } while (0)

// The spans of a sum of n terms.
__device__ __forceinline__ gw_u64 lowrank_spans(gw_u64 n) {
    return (n + GW_LOWRANK_SPAN - 1) / GW_LOWRANK_SPAN;
}

// p[p_at + i * rank + j] = dot(row i of M, row j of Qt) for every i < rows,
// j < rank. A block holds GW_LOWRANK_GROUPS / slots outputs, `slots` groups
// of eight lanes each (the groups past them idle); grid-stride over such
// sets of outputs. The loops run the same number of times in every thread
// of a block, so the barriers are reached by all.
extern "C" __global__ void lowrank_project_f32(const float* m, gw_u64 m_at, const float* qt,
                                               gw_u64 qt_at, float* p, gw_u64 p_at,
                                               gw_u64 rows, gw_u64 cols, gw_u64 rank,
                                               gw_u64 slots) {
    __shared__ float lanes[GW_BLOCK];
    __shared__ float sums[GW_LOWRANK_GROUPS];
    GW_REQUIRE_BLOCK();
    GW_LOWRANK_REQUIRE_SLOTS(slots);
    const gw_u64 outputs = rows * rank;
    const gw_u64 spans = lowrank_spans(cols);
    const gw_u64 group = threadIdx.x / GW_LOWRANK_LANES;
    const gw_u64 lane = threadIdx.x % GW_LOWRANK_LANES;
    const gw_u64 per_block = GW_LOWRANK_GROUPS / slots;
    const gw_u64 slot = group % slots;
    // Whether this thread's group is the first of its output's.
    const bool leader = slot == 0 && lane == 0;
    for (gw_u64 base = (gw_u64)blockIdx.x * per_block; base < outputs;
         base += (gw_u64)gridDim.x * per_block) {
        const gw_u64 output = base + group / slots;
        const bool live = group < per_block * slots && output < outputs;
        float total = -0.0f;
        for (gw_u64 first = 0; first < spans; first += slots) {
            const gw_u64 span = first + slot;
            const bool summing = live && span < spans;
            const float* row = m + m_at;
            const float* q = qt + qt_at;
            gw_u64 whole = 0;
            gw_u64 end = 0;
            float acc = 0.0f;
            if (summing) {
                row += (output / rank) * cols;
                q += (output % rank) * cols;
                const gw_u64 start = span * GW_LOWRANK_SPAN;
                end = start + GW_LOWRANK_SPAN < cols ? start + GW_LOWRANK_SPAN : cols;
                whole = end - (end - start) % GW_LOWRANK_LANES;
                for (gw_u64 e = start + lane; e < whole; e += GW_LOWRANK_LANES) {
                    acc = acc + row[e] * q[e];
                }
            }
            lanes[threadIdx.x] = acc;
            __syncthreads();
            if (summing && lane == 0) {
                float sum = lanes[threadIdx.x];
                for (int l = 1; l < GW_LOWRANK_LANES; ++l) {
                    sum = sum + lanes[threadIdx.x + l];
                }
                float tail = -0.0f;
                for (gw_u64 e = whole; e < end; ++e) {
                    tail = tail + row[e] * q[e];
                }
                sums[group] = sum + tail;
            }
            __syncthreads();
            // Read before the next round's first barrier, which every
            // thread reaches only after this.
            if (live && leader) {
                for (gw_u64 s = 0; s < slots && first + s < spans; ++s) {
                    total = total + sums[group + s];
                }
            }
        }
        if (live && leader) {
            p[p_at + output] = total;
        }
    }
}

// qt[qt_at + j * cols + c] = sum over i in order of p[i * rank + j] *
// m[i * cols + c], span by span. A block holds GW_BLOCK / slots outputs,
// `slots` threads each (the threads past them idle): consecutive threads on
// consecutive columns (coalesced reads of M's rows), the k-th set of them
// on the output's k-th span of each round; grid-stride over such sets.
extern "C" __global__ void lowrank_project_back_f32(const float* m, gw_u64 m_at, const float* p,
                                                    gw_u64 p_at, float* qt, gw_u64 qt_at,
                                                    gw_u64 rows, gw_u64 cols, gw_u64 rank,
                                                    gw_u64 slots) {
    __shared__ float sums[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    GW_LOWRANK_REQUIRE_SLOTS(slots);
    const gw_u64 outputs = rank * cols;
    const gw_u64 spans = lowrank_spans(rows);
    const gw_u64 per_block = GW_BLOCK / slots;
    const gw_u64 column = threadIdx.x % per_block;
    const gw_u64 slot = threadIdx.x / per_block;
    for (gw_u64 base = (gw_u64)blockIdx.x * per_block; base < outputs;
         base += (gw_u64)gridDim.x * per_block) {
        const gw_u64 o = base + column;
        const bool live = slot < slots && o < outputs;
        float total = -0.0f;
        for (gw_u64 first = 0; first < spans; first += slots) {
            const gw_u64 span = first + slot;
            float acc = 0.0f;
            if (live && span < spans) {
                const gw_u64 j = o / cols;
                const gw_u64 c = o % cols;
                const gw_u64 start = span * GW_LOWRANK_SPAN;
                const gw_u64 end =
                    start + GW_LOWRANK_SPAN < rows ? start + GW_LOWRANK_SPAN : rows;
                for (gw_u64 i = start; i < end; ++i) {
                    acc = acc + p[p_at + i * rank + j] * m[m_at + i * cols + c];
                }
            }
            sums[threadIdx.x] = acc;
            __syncthreads();
            if (live && slot == 0) {
                for (gw_u64 s = 0; s < slots && first + s < spans; ++s) {
                    total = total + sums[s * per_block + column];
                }
            }
            // The sums are written anew in the next round.
            __syncthreads();
        }
        if (live && slot == 0) {
            qt[qt_at + o] = total;
        }
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
