// selftest.cpp: kernels that test the execution layer itself (not
// gradwire's kernels): barriers, warp intrinsics, traps, the float atomic,
// and the faults the layer must report. Each is `(gw_u32* out, gw_u64 n)`;
// gradwire-kernels-host's tests run them through `selftest`.

#include "cuda_host.h"

typedef unsigned int gw_u32;
typedef unsigned long long gw_u64;

// out[block] = the sum of the block's thread indices, through shared memory
// and a barrier.
static void block_sum(gw_u32* out, gw_u64 n, bool barrier) {
    // `__shared__ gw_u32 values[1024];` as build.rs rewrites it.
    static thread_local gw_u32 values[1024];
    gw_host::shared_memory(values, sizeof values);
    values[threadIdx.x] = threadIdx.x + 1;
    if (barrier) __syncthreads();
    if (threadIdx.x == 0) {
        gw_u32 sum = 0;
        for (unsigned t = 0; t < blockDim.x; ++t) sum += values[t];
        if (blockIdx.x < n) out[blockIdx.x] = sum;
    }
}

static void selftest_block_sum(gw_u32* out, gw_u64 n) { block_sum(out, n, true); }
static void selftest_missing_barrier(gw_u32* out, gw_u64 n) { block_sum(out, n, false); }

// Threads past the first half exit, the rest wait at a barrier.
static void selftest_divergent_barrier(gw_u32* out, gw_u64 n) {
    if (threadIdx.x >= blockDim.x / 2) return;
    __syncthreads();
    if (threadIdx.x < n) out[threadIdx.x] = 1;
}

// out[t] = (ballot of t % 3 == 0, match_any of t % 5) of thread t's warp.
static void selftest_warp(gw_u32* out, gw_u64 n) {
    const unsigned t = threadIdx.x;
    const unsigned ballot = __ballot_sync(0xffffffffu, t % 3 == 0);
    const unsigned peers = __match_any_sync(0xffffffffu, t % 5);
    if (2 * t + 1 < n) {
        out[2 * t] = ballot;
        out[2 * t + 1] = peers;
    }
}

// Lane 5 of each warp exits before a full-warp ballot.
static void selftest_lane_exits(gw_u32* out, gw_u64 n) {
    if ((threadIdx.x & 31u) == 5u) return;
    const unsigned ballot = __ballot_sync(0xffffffffu, 1);
    if (threadIdx.x < n) out[threadIdx.x] = ballot;
}

// Half of each warp at a barrier, half at a ballot.
static void selftest_deadlock(gw_u32* out, gw_u64 n) {
    if ((threadIdx.x & 31u) < 16u) {
        __syncthreads();
    } else {
        (void)__ballot_sync(0xffffffffu, 1);
        __syncthreads();
    }
    if (threadIdx.x < n) out[threadIdx.x] = 1;
}

static void selftest_trap(gw_u32* out, gw_u64 n) {
    if (blockIdx.x == 1 && threadIdx.x == 7) __trap();
    if (threadIdx.x < n) out[threadIdx.x] = 1;
}

// out[0..2] = the bits of atomicAdd(float) on a subnormal, and of a plain
// add of the same values.
static void selftest_float_atomic(gw_u32* out, gw_u64 n) {
    if (threadIdx.x != 0 || n < 2) return;
    float a = __uint_as_float(0x00000010u);
    atomicAdd(&a, __uint_as_float(0x00000020u));
    out[0] = __float_as_uint(a);
    out[1] = __float_as_uint(__uint_as_float(0x00000010u) + __uint_as_float(0x00000020u));
}

// out[t] = the thread's position: x | y << 8 | blockIdx.x << 16 | blockIdx.y << 24.
static void selftest_positions(gw_u32* out, gw_u64 n) {
    const gw_u64 i = ((gw_u64)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = threadIdx.x | (blockDim.x << 8) | (blockIdx.x << 16) | (blockIdx.y << 24);
    }
}

#define SELFTEST(NAME)                                                                  \
    static void body_##NAME(void* const* a) {                                           \
        NAME(*static_cast<gw_u32* const*>(a[0]), *static_cast<const gw_u64*>(a[1]));   \
    }                                                                                   \
    extern "C" int gw_host_launch_##NAME(gw_host::Launch* l, void* const* a) {          \
        return gw_host::run(l, body_##NAME, a);                                         \
    }

SELFTEST(selftest_block_sum)
SELFTEST(selftest_missing_barrier)
SELFTEST(selftest_divergent_barrier)
SELFTEST(selftest_warp)
SELFTEST(selftest_lane_exits)
SELFTEST(selftest_deadlock)
SELFTEST(selftest_trap)
SELFTEST(selftest_float_atomic)
SELFTEST(selftest_positions)
