// comm.cu: the arithmetic of NcclComm's reductions on device buffers.
//
// NCCL only moves the bytes (gradwire-comm's NcclComm exchanges chunks with
// grouped ncclSend/ncclRecv); each rank then reduces its chunk of all W
// buffers here, in rank order 0, 1, ..., W-1, exactly as LocalComm and
// MpiComm do on the CPU (gradwire-comm's element.rs): the first rank's value
// is loaded into an f32 accumulator (f16 and bf16 widened exactly), the
// others are combined into it in order, Avg divides by W in f32, and the
// result is rounded once. Max and Min propagate NaN the way the CPU does: a
// NaN already in the accumulator stays, a NaN in the next value replaces it.
// Compiled with --fmad=false and IEEE division, so every result is bitwise
// the CPU's.
//
// `stage` holds the W chunks back to back (chunk q at q * n). `op`: 0 sum,
// 1 avg, 2 max, 3 min (gradwire_tensor::cuda_backend::collective::ChunkOp).
//
// Entries: reduce_chunks_<dt> for dt in f32, f16, bf16. Grid-stride: any
// launch shape works.

#include "gradwire.cuh"

#define GW_OP_SUM 0u
#define GW_OP_AVG 1u
#define GW_OP_MAX 2u
#define GW_OP_MIN 3u

__device__ __forceinline__ bool gw_is_nan(float x) { return x != x; }

template <typename T>
__device__ void reduce_chunks_impl(T* out, const T* stage, gw_u64 n, gw_u32 world, gw_u32 op) {
    GW_FOR_EACH(i, n) {
        float acc = gw_load(stage, i);
        for (gw_u32 q = 1; q < world; ++q) {
            const float x = gw_load(stage, (gw_u64)q * n + i);
            if (op == GW_OP_MAX) {
                if (x > acc || gw_is_nan(x)) {
                    acc = x;
                }
            } else if (op == GW_OP_MIN) {
                if (x < acc || gw_is_nan(x)) {
                    acc = x;
                }
            } else {
                acc = acc + x;
            }
        }
        if (op == GW_OP_AVG) {
            acc = acc / (float)world;
        }
        gw_store(out, i, acc);
    }
}

#define GW_REDUCE_CHUNKS(SUFFIX, T)                                                       \
    extern "C" __global__ void reduce_chunks_##SUFFIX(T* out, const T* stage, gw_u64 n,   \
                                                      gw_u32 world, gw_u32 op) {          \
        reduce_chunks_impl<T>(out, stage, n, world, op);                                  \
    }

GW_REDUCE_CHUNKS(f32, float)
GW_REDUCE_CHUNKS(f16, gw_f16)
GW_REDUCE_CHUNKS(bf16, gw_bf16)
