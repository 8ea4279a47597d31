// feedback.cu: gradwire-compress's error feedback (feedback.rs) and the
// scatter-add of a sparse payload (wire.rs), on device buffers of f32.
//
// A step with a sparse codec: first_non_finite_f32 (select.cu) refuses a
// gradient holding a NaN or an infinity before anything changes, then
// ef_accumulate_f32 (or ef_accumulate_momentum_f32 with DGC's momentum
// correction) adds it into the residual and reports the first entry that
// overflowed (the launcher then resets the memory, as the CPU does), the
// selection runs on the residual (select.cu), and ef_zero_selected zeroes
// what was sent. A step with a cast: ef_cast_f32_<f16|bf16> rounds the
// accumulator and keeps `acc - widen(sent) * (1 / scale)`, exactly as the
// CPU's compress_cast.
//
// Entries: ef_accumulate_f32, ef_accumulate_momentum_f32, ef_zero_selected,
// ef_cast_f32_f16, ef_cast_f32_bf16, scatter_add_<f32|f16|bf16>.

#include "gradwire.cuh"

// residual += grad; first_bad[0] (GW_NO_INDEX from the launcher) gets the
// smallest index whose sum is not finite.
extern "C" __global__ void ef_accumulate_f32(float* residual, const float* grad, gw_u64 n,
                                             gw_u64* first_bad) {
    GW_FOR_EACH(i, n) {
        const float r = residual[i] + grad[i];
        residual[i] = r;
        if (!gw_is_finite(r)) {
            gw_first_index(first_bad, i);
        }
    }
}

// DGC momentum correction: u = mu u + g; residual += u (then as above).
extern "C" __global__ void ef_accumulate_momentum_f32(float* residual, float* velocity,
                                                      const float* grad, gw_u64 n, float mu,
                                                      gw_u64* first_bad) {
    GW_FOR_EACH(i, n) {
        const float u = mu * velocity[i] + grad[i];
        velocity[i] = u;
        const float r = residual[i] + u;
        residual[i] = r;
        if (!gw_is_finite(r)) {
            gw_first_index(first_bad, i);
        }
    }
}

// Zeroes the residual (and the velocity, when not null) at the `count` sent
// indices; an index at or beyond n is ignored.
extern "C" __global__ void ef_zero_selected(float* residual, float* velocity, gw_u64 n,
                                            const gw_u32* index, gw_u64 count) {
    GW_FOR_EACH(j, count) {
        const gw_u64 i = index[j];
        if (i < n) {
            residual[i] = 0.0f;
            if (velocity != 0) {
                velocity[i] = 0.0f;
            }
        }
    }
}

// The cast codec with error feedback on the accumulator `residual`: sent =
// round(clamp(acc) * scale) into dst, residual = acc - widen(sent) * inverse
// (inverse = 1 / scale in f32, computed by the launcher as the CPU does).
// Four elements per access where both buffers allow it (gw_load4).
template <typename D>
__device__ void ef_cast_impl(float* residual, D* dst, gw_u64 n, int has_clip, float clip,
                             float scale, float inverse) {
    const gw_u64 quads = gw_aligned4(residual) && gw_aligned4(dst) ? n / 4 : 0;
    GW_FOR_EACH(q, quads) {
        float acc[4];
        gw_load4(residual, q, acc);
        gw_u16x4 sent;
        float rest[4];
        for (int k = 0; k < 4; ++k) {
            const float v = has_clip ? gw_clamp(acc[k], clip) : acc[k];
            sent.v[k] = gw_narrow(dst, v * scale);
            rest[k] = acc[k] - gw_widen(dst, sent.v[k]) * inverse;
        }
        reinterpret_cast<gw_u16x4*>(dst)[q] = sent;
        gw_store4(residual, q, rest);
    }
    GW_FOR_EACH(j, n - 4 * quads) {
        const gw_u64 i = 4 * quads + j;
        const float acc = residual[i];
        float v = has_clip ? gw_clamp(acc, clip) : acc;
        gw_store(dst, i, v * scale);
        const float wide = gw_load(dst, i);
        residual[i] = acc - wide * inverse;
    }
}

extern "C" __global__ void ef_cast_f32_f16(float* residual, gw_f16* dst, gw_u64 n, int has_clip,
                                           float clip, float scale, float inverse) {
    ef_cast_impl<gw_f16>(residual, dst, n, has_clip, clip, scale, inverse);
}

extern "C" __global__ void ef_cast_f32_bf16(float* residual, gw_bf16* dst, gw_u64 n,
                                            int has_clip, float clip, float scale,
                                            float inverse) {
    ef_cast_impl<gw_bf16>(residual, dst, n, has_clip, clip, scale, inverse);
}

// dense[index[j]] += widen(value[j]). The launcher has validated the payload
// (indices strictly increasing, below n), so no two threads meet on an
// element: a plain add is race-free and rounds as the CPU's does, subnormals
// included (a float atomic, red.global.add.f32, flushes them to zero). An
// index at or beyond n is ignored.
template <typename V>
__device__ void scatter_add_impl(float* dense, gw_u64 n, const gw_u32* index, const V* value,
                                 gw_u64 count) {
    GW_FOR_EACH(j, count) {
        const gw_u64 i = index[j];
        if (i < n) {
            dense[i] = __fadd_rn(dense[i], gw_load(value, j));
        }
    }
}

#define GW_SCATTER(SUFFIX, V)                                                        \
    extern "C" __global__ void scatter_add_##SUFFIX(float* dense, gw_u64 n,           \
                                                    const gw_u32* index, const V* value, \
                                                    gw_u64 count) {                  \
        scatter_add_impl<V>(dense, n, index, value, count);                          \
    }

GW_SCATTER(f32, float)
GW_SCATTER(f16, gw_f16)
GW_SCATTER(bf16, gw_bf16)
