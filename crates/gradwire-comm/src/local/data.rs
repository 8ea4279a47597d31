//! The data phases of the in-process collectives: the only code that touches
//! another rank's buffer.
//!
//! Every function here runs after a round resolved with the same element type
//! and (validated) lengths on every rank, and before the completion barrier,
//! so every buffer address in the posts is live. Each rank writes only to its
//! own chunk of the shared buffers (all-reduce), or only to its own buffers
//! (the rest), so no two ranks write the same element and nobody reads an
//! element while another writes it.

use super::group::{Post, Progress};
use crate::communicator::{Gathered, chunk_range};
use crate::element::{BLOCK, Element};
use crate::op::ReduceOp;
use std::ops::Range;
use std::slice;

/// Reads `len` elements at `offset` of a posted buffer.
///
/// # Safety
/// `base` must be a live buffer of `T` with at least `offset + len` elements
/// that no one writes during the returned borrow.
unsafe fn view<'a, T>(base: *const u8, offset: usize, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { slice::from_raw_parts(base.cast::<T>().add(offset), len) }
}

/// Writes `len` elements at `offset` of a posted buffer.
///
/// # Safety
/// `base` must be a live buffer of `T` with at least `offset + len` elements
/// that no one else reads or writes during the returned borrow.
unsafe fn view_mut<'a, T>(base: *mut u8, offset: usize, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { slice::from_raw_parts_mut(base.cast::<T>().add(offset), len) }
}

/// Reduces `range` of every rank's source buffer in rank order, block by
/// block, and hands each reduced block (rounded once to `T`) to `store` with
/// its offset.
///
/// # Safety
/// Every `sources[k]` is a live buffer of `T` covering `range` that no one
/// writes while this runs, except through `store` for the block just reduced.
unsafe fn reduce_blocks<T: Element, S>(
    sources: &[S],
    address: impl Fn(&S) -> *const u8,
    range: Range<usize>,
    op: ReduceOp,
    store: impl FnMut(usize, &[T]),
) {
    // The portable build targets x86-64's baseline (SSE2), which has no
    // packed 32-to-16-bit narrowing: the half-precision conversions run 3-6x
    // faster with AVX2. Same code, same results, compiled twice.
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above); the caller's guarantees
        // are passed on unchanged.
        return unsafe { reduce_blocks_avx2(sources, address, range, op, store) };
    }
    // SAFETY: the caller's guarantees are passed on unchanged.
    unsafe { reduce_blocks_portable(sources, address, range, op, store) }
}

/// [`reduce_blocks_portable`] compiled with AVX2 enabled.
///
/// # Safety
/// As [`reduce_blocks`], and the CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn reduce_blocks_avx2<T: Element, S>(
    sources: &[S],
    address: impl Fn(&S) -> *const u8,
    range: Range<usize>,
    op: ReduceOp,
    store: impl FnMut(usize, &[T]),
) {
    // SAFETY: as the caller's.
    unsafe { reduce_blocks_portable(sources, address, range, op, store) }
}

/// The block reduction itself; always inlined, so that each caller compiles
/// it (and the kernels it inlines) for its own target features.
///
/// # Safety
/// As [`reduce_blocks`].
#[inline(always)]
unsafe fn reduce_blocks_portable<T: Element, S>(
    sources: &[S],
    address: impl Fn(&S) -> *const u8,
    range: Range<usize>,
    op: ReduceOp,
    mut store: impl FnMut(usize, &[T]),
) {
    let world = sources.len();
    let Some((first, rest)) = sources.split_first() else {
        return;
    };
    let first = address(first);
    let mut acc = [T::Acc::default(); BLOCK];
    let mut out = [T::zeroed(); BLOCK];
    let mut start = range.start;
    while start < range.end {
        let n = BLOCK.min(range.end - start);
        let acc = &mut acc[..n];
        // SAFETY: within `range`, which the caller guarantees.
        T::load(unsafe { view(first, start, n) }, acc);
        for src in rest {
            // SAFETY: as above.
            T::combine(unsafe { view(address(src), start, n) }, acc, op);
        }
        if op == ReduceOp::Avg {
            T::average(acc, world);
        }
        // Rounded once, copied W times: for f16/bf16 this saves W - 1
        // conversions per block.
        let out = &mut out[..n];
        T::store(acc, out);
        store(start, out);
        start += n;
    }
}

/// Elements per piece of a reduction at most: 8 reduction blocks, 64 KiB of
/// each rank's f32 buffer. Small enough that the running ranks share the
/// work evenly, large enough that claiming a piece (one atomic add) is free.
const PIECE: usize = 8 * BLOCK;

/// How a reduction of `len` elements over `world` ranks is cut into pieces:
/// each rank's chunk ([`chunk_range`]) into pieces of at most [`PIECE`]
/// elements, so that a piece never straddles two ranks' chunks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pieces {
    len: usize,
    world: usize,
    piece: usize,
}

impl Pieces {
    pub(crate) fn new(len: usize, world: usize) -> Pieces {
        let piece = len.div_ceil(world.max(1)).clamp(1, PIECE);
        Pieces { len, world, piece }
    }

    /// Number of pieces.
    pub(crate) fn count(&self) -> usize {
        (0..self.world)
            .map(|r| {
                chunk_range(self.len, self.world, r)
                    .len()
                    .div_ceil(self.piece)
            })
            .sum()
    }

    /// Piece `id`: the rank whose chunk it is in, and its element range.
    pub(crate) fn get(&self, mut id: usize) -> Option<(usize, Range<usize>)> {
        for owner in 0..self.world {
            let chunk = chunk_range(self.len, self.world, owner);
            let in_chunk = chunk.len().div_ceil(self.piece);
            if id < in_chunk {
                let start = chunk.start + id * self.piece;
                return Some((owner, start..(start + self.piece).min(chunk.end)));
            }
            id -= in_chunk;
        }
        None
    }
}

/// All-reduce: the ranks claim pieces of the buffer; for each, the claimant
/// reduces that range of every rank's buffer and writes the result back into
/// all of them, so each byte is read once and written once across the group.
///
/// # Safety
/// A resolved all-reduce round: every post's `recv` is a live `[T; len]`, and
/// `progress` counts `pieces.count()` units.
pub(crate) unsafe fn all_reduce<T: Element>(
    posts: &[Post],
    pieces: &Pieces,
    op: ReduceOp,
    progress: &Progress<'_>,
) {
    while let Some(id) = progress.claim() {
        if let Some((_, range)) = pieces.get(id) {
            // SAFETY: a claimed piece is read and written by its claimant only.
            unsafe {
                reduce_blocks::<T, _>(
                    posts,
                    |p| p.recv.0.cast_const(),
                    range,
                    op,
                    |offset, block| {
                        for p in posts {
                            view_mut(p.recv.0, offset, block.len()).copy_from_slice(block);
                        }
                    },
                );
            }
        }
        progress.finish();
    }
}

/// Reduce-scatter: the ranks claim pieces; for each, the claimant reduces that
/// range of every rank's send buffer into the receive buffer of the rank
/// whose chunk it is in.
///
/// # Safety
/// A resolved reduce-scatter round: every post's `send` is a live `[T; len]`
/// and its `recv` a live buffer of its chunk's length; `progress` counts
/// `pieces.count()` units.
pub(crate) unsafe fn reduce_scatter<T: Element>(
    posts: &[Post],
    pieces: &Pieces,
    op: ReduceOp,
    progress: &Progress<'_>,
) {
    let world = posts.len();
    while let Some(id) = progress.claim() {
        if let Some((owner, range)) = pieces.get(id) {
            let base = chunk_range(posts[0].len, world, owner).start;
            let recv = posts[owner].recv.0;
            // SAFETY: a claimed piece of the owner's chunk is written by its
            // claimant only; send buffers are only read.
            unsafe {
                reduce_blocks::<T, _>(
                    posts,
                    |p| p.send.0.cast_const(),
                    range,
                    op,
                    |offset, block| {
                        view_mut(recv, offset - base, block.len()).copy_from_slice(block);
                    },
                );
            }
        }
        progress.finish();
    }
}

/// Broadcast: rank `rank` (not the root) copies the root's buffer into its
/// own, writing through its own post: the caller's `&mut` is not used while
/// the round runs, so the root's pointer, which its peers read, stays valid
/// (reborrowing the root's `&mut` would invalidate it under Rust's aliasing
/// rules, which Miri checks).
///
/// # Safety
/// A resolved broadcast round: every post's `recv` is a live `[T; len]`, and
/// `rank != root`.
pub(crate) unsafe fn broadcast<T: Element>(posts: &[Post], root: usize, rank: usize) {
    let len = posts[root].len;
    // SAFETY: the root's buffer is only read during the round; this rank's
    // is written by this rank only, and is not the root's.
    unsafe {
        view_mut::<T>(posts[rank].recv.0, 0, len).copy_from_slice(view(posts[root].recv.0, 0, len))
    };
}

/// All-gather: copies every rank's send buffer into this rank's receive
/// buffer, in rank order.
///
/// # Safety
/// A resolved all-gather round: every post's `send` is a live `[T; len]`.
pub(crate) unsafe fn all_gather<T: Element>(posts: &[Post], recv: &mut [T]) {
    let n = posts[0].len;
    for (p, out) in posts.iter().zip(recv.chunks_exact_mut(n.max(1))) {
        // SAFETY: send buffers are only read during the round.
        out.copy_from_slice(unsafe { view(p.send.0, 0, n) });
    }
}

/// All-gather of varied lengths: every rank's send buffer, in rank order,
/// into `out` (refilled, its buffers reused).
///
/// # Safety
/// A resolved all-gather-varied round: every post's `send` is a live
/// `[T; post.len]`.
pub(crate) unsafe fn all_gather_varied_into<T: Element>(posts: &[Post], out: &mut Gathered<T>) {
    out.clear();
    for p in posts {
        // SAFETY: send buffers are only read during the round.
        out.push_part(unsafe { view::<T>(p.send.0, 0, p.len) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// Both compilations of the block reduction give the same bits (on a CPU
    /// with AVX2 this compares the two; elsewhere the dispatch is trivial).
    fn both_paths_agree<T: Element>(from: fn(f32) -> T) {
        let len = 3 * BLOCK + 17;
        let buffers: Vec<Vec<T>> = (0..3)
            .map(|r| {
                (0..len)
                    .map(|i| from(((i * 7 + r * 5) % 23) as f32 * 0.37 - 4.0))
                    .collect()
            })
            .collect();
        let sources: Vec<*const u8> = buffers.iter().map(|b| b.as_ptr().cast()).collect();
        for op in ReduceOp::ALL {
            if !op.supports(T::TYPE) {
                continue;
            }
            let (mut dispatched, mut portable) = (vec![T::zeroed(); len], vec![T::zeroed(); len]);
            // SAFETY: the sources are live, of `len` elements, and only read.
            unsafe {
                reduce_blocks::<T, _>(
                    &sources,
                    |p| *p,
                    0..len,
                    op,
                    |o, b| dispatched[o..o + b.len()].copy_from_slice(b),
                );
                reduce_blocks_portable::<T, _>(
                    &sources,
                    |p| *p,
                    0..len,
                    op,
                    |o, b| portable[o..o + b.len()].copy_from_slice(b),
                );
            }
            assert!(
                bytemuck::cast_slice::<T, u8>(&dispatched)
                    == bytemuck::cast_slice::<T, u8>(&portable),
                "{op} on {}",
                T::TYPE
            );
        }
    }

    #[test]
    fn dispatched_and_portable_reductions_agree() {
        both_paths_agree::<f32>(|x| x);
        both_paths_agree::<f16>(f16::from_f32);
        both_paths_agree::<bf16>(bf16::from_f32);
        both_paths_agree::<i64>(|x| x as i64);
    }

    #[test]
    fn pieces_cover_every_element_once_within_chunks() {
        for world in 1..=8 {
            for len in [0, 1, 2, 7, 31, PIECE - 1, PIECE * 3 + 5, PIECE * 8 + 1] {
                let pieces = Pieces::new(len, world);
                let mut covered = vec![0u8; len];
                for id in 0..pieces.count() {
                    let (owner, range) = pieces.get(id).expect("piece in range");
                    let chunk = chunk_range(len, world, owner);
                    assert!(chunk.start <= range.start && range.end <= chunk.end);
                    assert!(!range.is_empty() && range.len() <= PIECE);
                    covered[range].iter_mut().for_each(|c| *c += 1);
                }
                assert!(covered.iter().all(|&c| c == 1), "world {world}, len {len}");
                assert!(pieces.get(pieces.count()).is_none());
            }
        }
    }
}
