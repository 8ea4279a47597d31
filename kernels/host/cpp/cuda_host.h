// cuda_host.h: the execution layer that runs gradwire's CUDA kernels on the
// CPU, for tests. Every `kernels/cuda/*.cu` is compiled by the host C++
// compiler with this header included first (`-include`), so the kernel
// bodies are the very text NVRTC compiles to PTX.
//
// A block's threads are cooperative fibers on one OS thread (scheduler.cpp):
// each runs until it reaches `__syncthreads` or a warp intrinsic, where it
// yields; the scheduler releases a barrier once every thread of the block has
// arrived and a warp intrinsic once every lane its mask names has, and reports
// a barrier some threads have exited before, a lane missing from a warp
// intrinsic and a deadlock as launch errors. Blocks run one after another,
// so `__shared__` is a thread-local static, filled with 0xff bytes (NaN,
// all-ones integers) before each block: a read before the block's own
// write sees poison, not a previous block's values. Atomics are plain
// read-modify-writes (nothing runs concurrently); `atomicAdd` on a float
// flushes subnormals to zero as `red.global.add.f32` does. The intrinsics are
// written by their PTX definitions (rounding, saturation, NaN); the float
// arithmetic is IEEE single and double with no contraction
// (`-ffp-contract=off`), as NVRTC's `--fmad=false --ftz=false --prec-div=true
// --prec-sqrt=true`.
//
// This tests kernel bodies and launch geometry, not a driver, a memory model
// or timing: a race between threads that the fiber order hides is not found.

#ifndef GRADWIRE_CUDA_HOST_H
#define GRADWIRE_CUDA_HOST_H

#include <cmath>
#include <cstdint>
#include <cstring>

#define __device__ static
#define __global__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
// build.rs rewrites each `__shared__ T name[N];` of the kernel sources as a
// thread-local static registered with gw_host::shared_memory (so each OS
// thread runs launches of its own, and the scheduler poisons every
// registered variable before each block); one it missed fails to compile.
#define __shared__ __shared___must_be_rewritten_by_build_rs

namespace gw_host {

struct Dim3 {
    unsigned x, y, z;
};

// The block being run on this OS thread and the fiber running now.
struct Current {
    Dim3 thread_idx;
    Dim3 block_idx;
    Dim3 block_dim;
    Dim3 grid_dim;
};
extern thread_local Current* current;

// Kinds of warp intrinsics (they must match across a warp's lanes).
enum WarpOp { WARP_BALLOT = 1, WARP_MATCH_ANY = 2 };

// Yields at a block barrier until every thread of the block has arrived.
void sync_threads();
// Yields at a warp intrinsic until every lane of `mask` has arrived with
// the same `op` and `mask`; returns the lane's result. `value` is the
// lane's operand (a predicate, a value to match).
unsigned warp_op(int op, unsigned mask, unsigned long long value);
// Registers a `__shared__` variable of `bytes` bytes at `p` (its
// declaration, as build.rs rewrites it): poisoned now if new, and before
// every later block.
void shared_memory(void* p, unsigned long bytes);
// Ends the launch with an error (`__trap`).
[[noreturn]] void trap(const char* why);

template <typename T>
inline T bits_as(const void* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline float flush_subnormal(float x) {
    return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}

}  // namespace gw_host

#define threadIdx (gw_host::current->thread_idx)
#define blockIdx (gw_host::current->block_idx)
#define blockDim (gw_host::current->block_dim)
#define gridDim (gw_host::current->grid_dim)

inline void __syncthreads() { gw_host::sync_threads(); }
[[noreturn]] inline void __trap() { gw_host::trap("__trap"); }

inline unsigned __ballot_sync(unsigned mask, int predicate) {
    return gw_host::warp_op(gw_host::WARP_BALLOT, mask, predicate != 0 ? 1u : 0u);
}
inline unsigned __match_any_sync(unsigned mask, unsigned value) {
    return gw_host::warp_op(gw_host::WARP_MATCH_ANY, mask, value);
}
inline unsigned __match_any_sync(unsigned mask, int value) {
    return __match_any_sync(mask, (unsigned)value);
}
inline unsigned __match_any_sync(unsigned mask, unsigned long long value) {
    // Matched on all 64 bits, as `match.any.sync.b64`.
    return gw_host::warp_op(gw_host::WARP_MATCH_ANY + 16, mask, value);
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }

inline unsigned __float_as_uint(float x) { return gw_host::bits_as<unsigned>(&x); }
inline float __uint_as_float(unsigned x) { return gw_host::bits_as<float>(&x); }
inline int __float_as_int(float x) { return gw_host::bits_as<int>(&x); }
inline float __int_as_float(int x) { return gw_host::bits_as<float>(&x); }
inline double __longlong_as_double(long long x) { return gw_host::bits_as<double>(&x); }
inline long long __double_as_longlong(double x) { return gw_host::bits_as<long long>(&x); }

// `cvt.rzi.s32.f32`: toward zero, saturating, NaN to 0.
inline int __float2int_rz(float x) {
    if (std::isnan(x)) return 0;
    if (x >= 2147483648.0f) return 2147483647;
    if (x <= -2147483648.0f) return (-2147483647 - 1);
    return (int)x;
}
// `cvt.rzi.u32.f64`: toward zero, saturating, NaN to 0.
inline unsigned __double2uint_rz(double x) {
    if (std::isnan(x) || x <= 0.0) return 0u;
    if (x >= 4294967296.0) return 4294967295u;
    return (unsigned)x;
}
// `cvt.rzi.s64.f64`: toward zero, saturating, NaN to 0.
inline long long __double2ll_rz(double x) {
    if (std::isnan(x)) return 0;
    if (x >= 9223372036854775808.0) return 9223372036854775807ll;
    if (x <= -9223372036854775808.0) return (-9223372036854775807ll - 1);
    return (long long)x;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }


// Atomics: nothing runs concurrently, so each is a plain read-modify-write
// that returns the old value.
template <typename T>
inline T gw_host_atomic_add(T* a, T v) {
    const T old = *a;
    *a = old + v;
    return old;
}
inline unsigned atomicAdd(unsigned* a, unsigned v) { return gw_host_atomic_add(a, v); }
inline int atomicAdd(int* a, int v) { return gw_host_atomic_add(a, v); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
    return gw_host_atomic_add(a, v);
}
inline double atomicAdd(double* a, double v) { return gw_host_atomic_add(a, v); }
// `red.global.add.f32` flushes subnormal inputs and results to zero.
inline float atomicAdd(float* a, float v) {
    const float old = *a;
    *a = gw_host::flush_subnormal(gw_host::flush_subnormal(old) + gw_host::flush_subnormal(v));
    return old;
}
template <typename T>
inline T gw_host_atomic_min(T* a, T v) {
    const T old = *a;
    *a = v < old ? v : old;
    return old;
}
template <typename T>
inline T gw_host_atomic_max(T* a, T v) {
    const T old = *a;
    *a = v > old ? v : old;
    return old;
}
inline unsigned atomicMin(unsigned* a, unsigned v) { return gw_host_atomic_min(a, v); }
inline int atomicMin(int* a, int v) { return gw_host_atomic_min(a, v); }
inline unsigned long long atomicMin(unsigned long long* a, unsigned long long v) {
    return gw_host_atomic_min(a, v);
}
inline unsigned atomicMax(unsigned* a, unsigned v) { return gw_host_atomic_max(a, v); }
inline int atomicMax(int* a, int v) { return gw_host_atomic_max(a, v); }
inline unsigned long long atomicMax(unsigned long long* a, unsigned long long v) {
    return gw_host_atomic_max(a, v);
}

namespace gw_host {

// The launch a generated launcher passes in (`gw_host_launch` in Rust).
struct Launch {
    unsigned grid_x, grid_y, block_x;
    // 0: threads in index order between yields, 1: in reverse.
    int reverse;
    // Out: the error of a failed launch, NUL-terminated.
    char* error;
    unsigned long error_len;
};

// Runs `body` (one thread's kernel call) on every thread of every block.
// Returns 0, or 1 with `launch->error` set.
int run(Launch* launch, void (*body)(void* const* args), void* const* args);

}  // namespace gw_host

#endif  // GRADWIRE_CUDA_HOST_H
