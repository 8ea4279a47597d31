// elementwise.cu: gradwire-tensor's elementwise operations (ops.rs) on f32,
// f16 and bf16 buffers. Arithmetic is f32; a half-precision result is the f32
// result rounded once, and `y + a * x` is a multiply then an add (no FMA), so
// every kernel is bitwise equal to the CPU.
//
// Entries: <op>_<dtype> for op in fill, axpy, scale, add, mul, clamp and
// dtype in f32, f16, bf16.

#include "gradwire.cuh"

template <typename T>
__device__ void fill_impl(T* y, gw_u64 n, float v) {
    GW_FOR_EACH(i, n) { gw_store(y, i, v); }
}

template <typename T>
__device__ void axpy_impl(T* y, float a, const T* x, gw_u64 n) {
    GW_FOR_EACH(i, n) { gw_store(y, i, gw_load(y, i) + a * gw_load(x, i)); }
}

template <typename T>
__device__ void scale_impl(T* y, float a, gw_u64 n) {
    GW_FOR_EACH(i, n) { gw_store(y, i, gw_load(y, i) * a); }
}

template <typename T>
__device__ void add_impl(T* y, const T* x, gw_u64 n) {
    GW_FOR_EACH(i, n) { gw_store(y, i, gw_load(y, i) + gw_load(x, i)); }
}

template <typename T>
__device__ void mul_impl(T* y, const T* x, gw_u64 n) {
    GW_FOR_EACH(i, n) { gw_store(y, i, gw_load(y, i) * gw_load(x, i)); }
}

// The launcher has validated c (>= 0, not NaN) and normalised -0 to +0.
template <typename T>
__device__ void clamp_impl(T* y, float c, gw_u64 n) {
    GW_FOR_EACH(i, n) { gw_store(y, i, gw_clamp(gw_load(y, i), c)); }
}

#define GW_ELEMENTWISE(SUFFIX, T)                                                  \
    extern "C" __global__ void fill_##SUFFIX(T* y, gw_u64 n, float v) {           \
        fill_impl<T>(y, n, v);                                                     \
    }                                                                              \
    extern "C" __global__ void axpy_##SUFFIX(T* y, float a, const T* x, gw_u64 n) { \
        axpy_impl<T>(y, a, x, n);                                                  \
    }                                                                              \
    extern "C" __global__ void scale_##SUFFIX(T* y, float a, gw_u64 n) {          \
        scale_impl<T>(y, a, n);                                                    \
    }                                                                              \
    extern "C" __global__ void add_##SUFFIX(T* y, const T* x, gw_u64 n) {         \
        add_impl<T>(y, x, n);                                                      \
    }                                                                              \
    extern "C" __global__ void mul_##SUFFIX(T* y, const T* x, gw_u64 n) {         \
        mul_impl<T>(y, x, n);                                                      \
    }                                                                              \
    extern "C" __global__ void clamp_##SUFFIX(T* y, float c, gw_u64 n) {          \
        clamp_impl<T>(y, c, n);                                                    \
    }

GW_ELEMENTWISE(f32, float)
GW_ELEMENTWISE(f16, gw_f16)
GW_ELEMENTWISE(bf16, gw_bf16)
