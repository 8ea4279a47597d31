//! The data phases of the in-process collectives: the only code that touches
//! another rank's buffer.
//!
//! Every function here runs after a round resolved with the same element type
//! and (validated) lengths on every rank, and before the completion barrier,
//! so every buffer address in the posts is live. Each rank writes only to its
//! own chunk of the shared buffers (all-reduce), or only to its own buffers
//! (the rest), so no two ranks write the same element and nobody reads an
//! element while another writes it.

use super::group::Post;
use crate::communicator::chunk_range;
use crate::element::{BLOCK, Element};
use crate::op::ReduceOp;
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
/// block, handing each reduced block to `store` with its offset.
///
/// # Safety
/// Every `sources[k]` is a live buffer of `T` covering `range` that no one
/// writes while this runs, except through `store` for the block just reduced.
unsafe fn reduce_blocks<T: Element>(
    sources: &[*const u8],
    range: std::ops::Range<usize>,
    op: ReduceOp,
    mut store: impl FnMut(usize, &[T::Acc]),
) {
    let world = sources.len();
    let Some((&first, rest)) = sources.split_first() else {
        return;
    };
    let mut acc = [T::Acc::default(); BLOCK];
    let mut start = range.start;
    while start < range.end {
        let n = BLOCK.min(range.end - start);
        let acc = &mut acc[..n];
        // SAFETY: within `range`, which the caller guarantees.
        T::load(unsafe { view(first, start, n) }, acc);
        for &src in rest {
            // SAFETY: as above.
            T::combine(unsafe { view(src, start, n) }, acc, op);
        }
        if op == ReduceOp::Avg {
            T::average(acc, world);
        }
        store(start, acc);
        start += n;
    }
}

/// All-reduce: this rank reduces its chunk of every rank's buffer and writes
/// the result back into all of them, so each byte is read once and written
/// once across the group.
///
/// # Safety
/// A resolved all-reduce round: every post's `recv` is a live `[T; len]`.
pub(crate) unsafe fn all_reduce<T: Element>(posts: &[Post], rank: usize, op: ReduceOp) {
    let world = posts.len();
    if world == 1 {
        return; // the identity for every op, Avg included (x / 1 == x)
    }
    let range = chunk_range(posts[0].len, world, rank);
    let buffers: Vec<*const u8> = posts.iter().map(|p| p.recv.0.cast_const()).collect();
    // SAFETY: each rank reads and writes only its own chunk `range`.
    unsafe {
        reduce_blocks::<T>(&buffers, range, op, |offset, acc| {
            for p in posts {
                T::store(acc, view_mut(p.recv.0, offset, acc.len()));
            }
        });
    }
}

/// Reduce-scatter: this rank reduces its chunk of every rank's send buffer
/// into its own receive buffer.
///
/// # Safety
/// A resolved reduce-scatter round: every post's `send` is a live `[T; len]`.
pub(crate) unsafe fn reduce_scatter<T: Element>(
    posts: &[Post],
    rank: usize,
    op: ReduceOp,
    recv: &mut [T],
) {
    let range = chunk_range(posts[0].len, posts.len(), rank);
    let base = range.start;
    let sources: Vec<*const u8> = posts.iter().map(|p| p.send.0.cast_const()).collect();
    // SAFETY: send buffers are only read during the round.
    unsafe {
        reduce_blocks::<T>(&sources, range, op, |offset, acc| {
            T::store(acc, &mut recv[offset - base..offset - base + acc.len()]);
        });
    }
}

/// Broadcast: a non-root rank copies the root's buffer into its own.
///
/// # Safety
/// A resolved broadcast round: the root's `recv` is a live `[T; len]`.
pub(crate) unsafe fn broadcast<T: Element>(posts: &[Post], root: usize, buf: &mut [T]) {
    // SAFETY: the root's buffer is only read during the round.
    buf.copy_from_slice(unsafe { view(posts[root].recv.0, 0, buf.len()) });
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

/// All-gather of varied lengths: concatenates every rank's send buffer.
///
/// # Safety
/// A resolved all-gather-varied round: every post's `send` is a live
/// `[T; post.len]`.
pub(crate) unsafe fn all_gather_varied<T: Element>(posts: &[Post]) -> Vec<T> {
    let total = posts.iter().map(|p| p.len).sum();
    let mut out = Vec::with_capacity(total);
    for p in posts {
        // SAFETY: send buffers are only read during the round.
        out.extend_from_slice(unsafe { view::<T>(p.send.0, 0, p.len) });
    }
    out
}
