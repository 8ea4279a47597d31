// select.cu: gradwire-compress's sparse selection (select.rs) on a device
// buffer of f32: threshold, exact top-k and sampled top-k, each giving the
// same (index, value) list as the CPU: strictly increasing indices, values
// exactly as in the input, ties at the k-th magnitude to the lower indices.
//
// Magnitudes are the 31-bit keys `bits & 0x7fffffff`. A selection is a pair
// of u64 in device memory, `sel = {key t, ties}`: it keeps every entry whose
// key is above t, and the first `ties` entries (in index order) whose key
// equals t. Threshold is {key(threshold), UINT64_MAX}; exact top-k is the
// k-th largest key and how many of its equals to take, found by a radix
// select; sampled top-k is {k-th key of a strided sample, UINT64_MAX}.
// Selections are found and applied without leaving the device.
//
// Pipeline (the launcher refuses non-finite input first, with
// first_non_finite_f32, as the CPU does):
//   exact top-k:  radix_init(state, hist, k); for shift in 24, 16, 8, 0:
//                 radix_histogram_f32(x, n, state, hist, shift),
//                 radix_select_digit(state, hist, shift)
//                 -> state[0..2] is the selection (state = sel)
//   sampled:      sample_strided_f32(x, n, stride, sample) then the radix
//                 select above on the sample with k = take, then
//                 selection_all_ties(state)
//   apply:        select_count_f32(x, n, tile, sel, counts_gt, counts_eq,
//                 totals), exclusive_scan_u64 of counts_gt and of counts_eq,
//                 select_compact_f32(x, n, tile, sel, offsets_gt, offsets_eq,
//                 src_index, out_index, out_value)
// `tile` (a multiple of GW_BLOCK) is the same for count and compact: block b
// handles [b tile, (b + 1) tile). `totals` is the global counter: two u64,
// zeroed by the launcher, that end as the number of keys above t and equal to
// t, so the launcher can size the output before compacting (the selection
// holds totals[0] + min(totals[1], ties) entries). With `src_index` not null,
// out_index[j] = src_index[i] instead of i (top-k among a compacted list).
// Every kernel here is launched with GW_BLOCK threads per block.

#include "gradwire.cuh"

// Layout of the radix select state (also a selection, see above).
#define GW_SEL_KEY 0
#define GW_SEL_TIES 1
#define GW_SEL_ABOVE 2
#define GW_SEL_MASK 3
#define GW_RADIX_BINS 256

// Smallest index of a NaN or infinity into first[0] (zeroed to GW_NO_INDEX by
// the launcher; it stays so when every entry is finite). Four elements per
// access when `x` is aligned (the rest, or all of an unaligned view, one at a
// time), so that the check runs at the memory's bandwidth.
extern "C" __global__ void first_non_finite_f32(const float* x, gw_u64 n, gw_u64* first) {
    const gw_u64 quads = gw_aligned4(x) ? n / 4u : 0u;
    GW_FOR_EACH(q, quads) {
        float v[4];
        gw_load4(x, q, v);
        for (int j = 0; j < 4; ++j) {
            if (!gw_is_finite(v[j])) {
                gw_first_index(first, 4u * q + (gw_u64)j);
                break;
            }
        }
    }
    GW_FOR_EACH(r, n - 4u * quads) {
        const gw_u64 i = 4u * quads + r;
        if (!gw_is_finite(x[i])) {
            gw_first_index(first, i);
        }
    }
}

// Starts a radix select of the k-th largest key (1 <= k <= n; the launcher
// handles k = 0). One block.
extern "C" __global__ void radix_init(gw_u64* state, gw_u64* hist, gw_u64 k) {
    GW_REQUIRE_BLOCK();
    if (blockIdx.x != 0) {
        return;
    }
    if (threadIdx.x == 0) {
        state[GW_SEL_KEY] = 0;
        state[GW_SEL_TIES] = k;
        state[GW_SEL_ABOVE] = 0;
        state[GW_SEL_MASK] = 0;
    }
    for (unsigned b = threadIdx.x; b < GW_RADIX_BINS; b += GW_BLOCK) {
        hist[b] = 0;
    }
}

// Counts key `k` (when `valid` and it shares the prefix found so far) in the
// block's histogram. Every lane of the warp must call it: the lanes that count
// the same digit are grouped (__match_any_sync) and their leader adds the
// group's size, one shared atomic per distinct digit instead of one per lane.
// The first pass sees every key, and a gradient's magnitudes crowd into a few
// exponent digits, where one atomic per lane would serialise the warp.
__device__ __forceinline__ void gw_radix_count(gw_u32* local, gw_u32 k, bool valid,
                                               gw_u32 prefix, gw_u32 mask, gw_u32 shift) {
    const bool counted = valid && (k & mask) == prefix;
    if (__ballot_sync(0xffffffffu, counted) == 0u) {
        return;
    }
    const gw_u32 bin = counted ? (k >> shift) & 0xffu : GW_RADIX_BINS;
    const unsigned peers = __match_any_sync(0xffffffffu, bin);
    if (counted && (threadIdx.x & 31u) == (unsigned)(__ffs(peers) - 1)) {
        atomicAdd(&local[bin], (gw_u32)__popc(peers));
    }
}

// Histogram of the 8-bit digit at `shift` of the keys that share the prefix
// found so far. The rounds depend only on the block, so every lane of a warp
// takes part in each (gw_radix_count needs them all). A block's counts fit in
// u32: with at most 2^32 keys (the launcher's bound) and a grid of
// blocks_for(n) blocks, no block sees more than about 2^20 of them.
extern "C" __global__ void radix_histogram_f32(const float* x, gw_u64 n, const gw_u64* state,
                                               gw_u64* hist, gw_u32 shift) {
    __shared__ gw_u32 local[GW_RADIX_BINS];
    GW_REQUIRE_BLOCK();
    for (unsigned b = threadIdx.x; b < GW_RADIX_BINS; b += GW_BLOCK) {
        local[b] = 0;
    }
    __syncthreads();
    const gw_u32 prefix = (gw_u32)state[GW_SEL_KEY];
    const gw_u32 mask = (gw_u32)state[GW_SEL_MASK];
    const gw_u64 stride = (gw_u64)gridDim.x * GW_BLOCK;
    const gw_u64 quads = gw_aligned4(x) ? n / 4u : 0u;
    for (gw_u64 base = (gw_u64)blockIdx.x * GW_BLOCK; base < quads; base += stride) {
        const gw_u64 q = base + threadIdx.x;
        const bool inside = q < quads;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (inside) {
            gw_load4(x, q, v);
        }
        for (int j = 0; j < 4; ++j) {
            gw_radix_count(local, gw_key(v[j]), inside, prefix, mask, shift);
        }
    }
    // The rest one at a time (all of x when it is not aligned).
    for (gw_u64 base = 4u * quads + (gw_u64)blockIdx.x * GW_BLOCK; base < n; base += stride) {
        const gw_u64 i = base + threadIdx.x;
        const bool inside = i < n;
        gw_radix_count(local, inside ? gw_key(x[i]) : 0u, inside, prefix, mask, shift);
    }
    __syncthreads();
    for (unsigned b = threadIdx.x; b < GW_RADIX_BINS; b += GW_BLOCK) {
        if (local[b] != 0u) {
            atomicAdd(&hist[b], (gw_u64)local[b]);
        }
    }
}

// Picks the digit at `shift` of the k-th largest key from the histogram,
// narrows the state to it and clears the histogram for the next pass. One
// block; thread 0 scans (256 bins).
extern "C" __global__ void radix_select_digit(gw_u64* state, gw_u64* hist, gw_u32 shift) {
    GW_REQUIRE_BLOCK();
    if (blockIdx.x != 0) {
        return;
    }
    if (threadIdx.x == 0) {
        const gw_u64 want = state[GW_SEL_TIES];
        gw_u64 above = 0;
        gw_u32 digit = 0;
        for (int b = GW_RADIX_BINS - 1; b >= 0; --b) {
            if (above + hist[b] >= want) {
                digit = (gw_u32)b;
                break;
            }
            above += hist[b];
        }
        state[GW_SEL_TIES] = want - above;
        state[GW_SEL_ABOVE] = state[GW_SEL_ABOVE] + above;
        state[GW_SEL_KEY] = state[GW_SEL_KEY] | ((gw_u64)digit << shift);
        state[GW_SEL_MASK] = state[GW_SEL_MASK] | ((gw_u64)0xffu << shift);
    }
    __syncthreads();
    for (unsigned b = threadIdx.x; b < GW_RADIX_BINS; b += GW_BLOCK) {
        hist[b] = 0;
    }
}

// Turns a radix select's result into "every key >= t" (sampled top-k's
// threshold from the sample's order statistic).
extern "C" __global__ void selection_all_ties(gw_u64* sel) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        sel[GW_SEL_TIES] = GW_NO_INDEX;
    }
}

// out[j] = x[j * stride] for j < ceil(n / stride) (the strided sample of
// sampled top-k; the CPU samples with stride 100).
extern "C" __global__ void sample_strided_f32(const float* x, gw_u64 n, gw_u64 stride,
                                              float* out) {
    if (stride == 0) {
        return;
    }
    const gw_u64 m = (n + stride - 1) / stride;
    GW_FOR_EACH(j, m) { out[j] = x[j * stride]; }
}

__device__ __forceinline__ gw_u64 gw_block_sum_u64(gw_u64 v, gw_u64* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = GW_BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            shared[threadIdx.x] += shared[threadIdx.x + s];
        }
        __syncthreads();
    }
    const gw_u64 total = shared[0];
    __syncthreads();
    return total;
}

// Per tile: how many keys lie above t and how many equal it.
extern "C" __global__ void select_count_f32(const float* x, gw_u64 n, gw_u64 tile,
                                            const gw_u64* sel, gw_u64* counts_gt,
                                            gw_u64* counts_eq, gw_u64* totals) {
    __shared__ gw_u64 shared[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    const gw_u32 t = (gw_u32)sel[GW_SEL_KEY];
    const gw_u64 start = (gw_u64)blockIdx.x * tile;
    const gw_u64 end = start + tile < n ? start + tile : n;
    gw_u64 gt = 0;
    gw_u64 eq = 0;
    // Four keys per access when aligned (tiles start at multiples of
    // GW_BLOCK, so a tile's quads are whole); the order of counting is free.
    const gw_u64 quad_end =
        gw_aligned4(x) && end > start ? start + (end - start) / 4u * 4u : start;
    for (gw_u64 q = start / 4u + threadIdx.x; q < quad_end / 4u; q += GW_BLOCK) {
        float v[4];
        gw_load4(x, q, v);
        for (int j = 0; j < 4; ++j) {
            const gw_u32 k = gw_key(v[j]);
            gt += k > t ? 1u : 0u;
            eq += k == t ? 1u : 0u;
        }
    }
    for (gw_u64 i = quad_end + threadIdx.x; i < end; i += GW_BLOCK) {
        const gw_u32 k = gw_key(x[i]);
        gt += k > t ? 1u : 0u;
        eq += k == t ? 1u : 0u;
    }
    gt = gw_block_sum_u64(gt, shared);
    eq = gw_block_sum_u64(eq, shared);
    if (threadIdx.x == 0) {
        counts_gt[blockIdx.x] = gt;
        counts_eq[blockIdx.x] = eq;
        if (gt != 0) {
            atomicAdd(&totals[0], gt);
        }
        if (eq != 0) {
            atomicAdd(&totals[1], eq);
        }
    }
}

// out[i] = sum of in[0..i) for i <= m (so out has m + 1 entries and out[m] is
// the total). One block, GW_BLOCK elements at a time with a carry.
extern "C" __global__ void exclusive_scan_u64(const gw_u64* in, gw_u64 m, gw_u64* out) {
    __shared__ gw_u64 shared[GW_BLOCK];
    GW_REQUIRE_BLOCK();
    if (blockIdx.x != 0) {
        return;
    }
    gw_u64 carry = 0;
    for (gw_u64 base = 0; base < m; base += GW_BLOCK) {
        const gw_u64 i = base + threadIdx.x;
        const gw_u64 v = i < m ? in[i] : 0;
        shared[threadIdx.x] = v;
        __syncthreads();
        // Hillis-Steele inclusive scan of the chunk.
        for (unsigned d = 1; d < GW_BLOCK; d <<= 1) {
            const gw_u64 add = threadIdx.x >= d ? shared[threadIdx.x - d] : 0;
            __syncthreads();
            shared[threadIdx.x] += add;
            __syncthreads();
        }
        if (i < m) {
            out[i] = carry + shared[threadIdx.x] - v;
        }
        carry += shared[GW_BLOCK - 1];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[m] = carry;
    }
}

// Exclusive prefix of `flag` over the block's threads (in thread order), and
// the block's total, through warp ballots. Every thread must call it.
__device__ __forceinline__ gw_u32 gw_block_prefix(bool flag, gw_u32* warp_totals,
                                                  gw_u32* total) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned warp = threadIdx.x >> 5;
    const unsigned ballot = __ballot_sync(0xffffffffu, flag);
    const gw_u32 in_warp = (gw_u32)__popc(ballot & ((1u << lane) - 1u));
    if (lane == 0) {
        warp_totals[warp] = (gw_u32)__popc(ballot);
    }
    __syncthreads();
    gw_u32 before = 0;
    gw_u32 sum = 0;
    for (unsigned w = 0; w < GW_WARPS; ++w) {
        const gw_u32 c = warp_totals[w];
        before += w < warp ? c : 0u;
        sum += c;
    }
    __syncthreads();
    *total = sum;
    return before + in_warp;
}

// Writes the selected entries of each tile, in index order, at the offsets
// the scans gave: entry i goes to (keys above t before i) + min(keys equal to
// t before i, ties). The outputs hold `cap` entries (the launcher sizes them
// from the counts); a position at or past it is not written, so offsets read
// from device memory never reach past them.
extern "C" __global__ void select_compact_f32(const float* x, gw_u64 n, gw_u64 tile,
                                              const gw_u64* sel, const gw_u64* offsets_gt,
                                              const gw_u64* offsets_eq, const gw_u32* src_index,
                                              gw_u32* out_index, float* out_value, gw_u64 cap) {
    __shared__ gw_u32 warp_gt[GW_WARPS];
    __shared__ gw_u32 warp_eq[GW_WARPS];
    GW_REQUIRE_BLOCK();
    const gw_u32 t = (gw_u32)sel[GW_SEL_KEY];
    const gw_u64 ties = sel[GW_SEL_TIES];
    const gw_u64 start = (gw_u64)blockIdx.x * tile;
    const gw_u64 end = start + tile < n ? start + tile : n;
    gw_u64 gt_base = offsets_gt[blockIdx.x];
    gw_u64 eq_base = offsets_eq[blockIdx.x];
    // Every thread runs the same number of rounds (the ballots need them all).
    for (gw_u64 round = start; round < end; round += GW_BLOCK) {
        const gw_u64 i = round + threadIdx.x;
        const bool inside = i < end;
        const float v = inside ? x[i] : 0.0f;
        const gw_u32 k = gw_key(v);
        const bool gt = inside && k > t;
        const bool eq = inside && k == t;
        gw_u32 round_gt = 0;
        gw_u32 round_eq = 0;
        const gw_u64 gt_before = gt_base + gw_block_prefix(gt, warp_gt, &round_gt);
        const gw_u64 eq_before = eq_base + gw_block_prefix(eq, warp_eq, &round_eq);
        if (gt || (eq && eq_before < ties)) {
            const gw_u64 pos = gt_before + (eq_before < ties ? eq_before : ties);
            if (pos < cap) {
                out_index[pos] = src_index != 0 ? src_index[i] : (gw_u32)i;
                out_value[pos] = v;
            }
        }
        gt_base += round_gt;
        eq_base += round_eq;
    }
}
