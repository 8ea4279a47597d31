//! The device scratch of one NCCL communicator: one buffer, kept between
//! calls and grown (never shrunk) to the largest a call has needed, which
//! every collective lays its regions out in. A training loop that repeats
//! the same collectives allocates nothing once warm, and nothing is
//! cleared: every byte a collective reads from scratch it has written in
//! the same call (padding NCCL reduces along is never read back).
//!
//! The buffer is used on the communicator's stream only, so a call may
//! reuse it as soon as it has queued its own work: the stream orders the
//! next call's writes after this call's reads. A grown buffer replaces the
//! old one, whose free is queued on the same stream (cudarc frees
//! asynchronously on the buffer's stream), after the work that used it.

use std::cell::{Cell, RefCell};
use std::ops::Range;

use super::transport::NcclTransport;
use crate::error::{CommError, Result};

/// Region offsets are multiples of this: every element type and every NCCL
/// buffer is aligned (cuMemAlloc's own alignment is 256 bytes too).
pub(super) const ALIGN: usize = 256;

/// Capacities are multiples of this (2 MiB, CUDA's allocation granularity),
/// so a size that creeps up by a few bytes does not allocate every call.
pub(super) const GRANULE: usize = 2 << 20;

/// The capacity to hold `needed` bytes given `current` (0: no buffer yet):
/// `current` when it suffices, else `needed` rounded up to [`GRANULE`] (a
/// whole granule at least: the driver cannot allocate nothing). `None` on
/// overflow.
pub(super) fn grown_capacity(current: usize, needed: usize) -> Option<usize> {
    if current > 0 && needed <= current {
        return Some(current);
    }
    needed.max(1).checked_next_multiple_of(GRANULE)
}

/// Byte ranges for regions of `sizes` bytes laid out in order, each
/// starting at a multiple of [`ALIGN`], and the bytes they span. `None` on
/// overflow.
pub(super) fn layout<const N: usize>(sizes: [usize; N]) -> Option<([Range<usize>; N], usize)> {
    let mut end = 0usize;
    let mut ranges = [const { 0..0 }; N];
    for (range, size) in ranges.iter_mut().zip(sizes) {
        let start = end.checked_next_multiple_of(ALIGN)?;
        end = start.checked_add(size)?;
        *range = start..end;
    }
    Some((ranges, end))
}

/// The cached buffer of one communicator.
pub(super) struct Scratch<T: NcclTransport> {
    buffer: RefCell<Option<T::Buffer>>,
    /// A lease is out.
    lent: Cell<bool>,
}

impl<T: NcclTransport> Default for Scratch<T> {
    fn default() -> Self {
        Scratch {
            buffer: RefCell::new(None),
            lent: Cell::new(false),
        }
    }
}

/// The scratch buffer, lent to one call and given back when dropped.
pub(super) struct Lease<'a, T: NcclTransport> {
    home: &'a Scratch<T>,
    buffer: Option<T::Buffer>,
}

impl<T: NcclTransport> Scratch<T> {
    /// The buffer, at least `bytes` long, for one call. Calls do not nest
    /// (one rank's calls happen in order, and each returns its lease
    /// before the next); a nested lease is refused rather than aliased.
    pub(super) fn lease(&self, bytes: usize, stream: &T::Stream) -> Result<Lease<'_, T>> {
        if self.lent.get() {
            return Err(nested());
        }
        let mut home = self.buffer.try_borrow_mut().map_err(|_| nested())?;
        let current = home.as_ref().map_or(0, T::len);
        let capacity = grown_capacity(current, bytes).ok_or_else(|| {
            CommError::InvalidArgument(format!("{bytes} bytes of scratch overflow"))
        })?;
        let buffer = match home.take() {
            Some(buffer) if capacity == current => buffer,
            old => {
                // Queued after the work that used the old buffer, on the
                // same stream.
                drop(old);
                // Zeroed once, when allocated: never read before written,
                // but a fresh buffer's bytes are then defined.
                T::alloc_zeros(stream, capacity)?
            }
        };
        self.lent.set(true);
        Ok(Lease {
            home: self,
            buffer: Some(buffer),
        })
    }

    /// The bytes held now (for tests and reports).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.buffer.borrow().as_ref().map_or(0, T::len)
    }
}

fn nested() -> CommError {
    CommError::InvalidArgument("NcclComm's scratch is already in use (a nested call)".into())
}

impl<T: NcclTransport> Lease<'_, T> {
    /// The buffer.
    pub(super) fn buffer(&mut self) -> Result<&mut T::Buffer> {
        self.buffer.as_mut().ok_or_else(nested)
    }
}

impl<T: NcclTransport> Drop for Lease<'_, T> {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take()
            && let Ok(mut home) = self.home.buffer.try_borrow_mut()
        {
            *home = Some(buffer);
        }
        self.home.lent.set(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_grows_to_granules_and_never_shrinks() {
        assert_eq!(grown_capacity(0, 0), Some(GRANULE));
        assert_eq!(grown_capacity(0, 1), Some(GRANULE));
        assert_eq!(grown_capacity(0, GRANULE), Some(GRANULE));
        assert_eq!(grown_capacity(0, GRANULE + 1), Some(2 * GRANULE));
        assert_eq!(grown_capacity(GRANULE, 10), Some(GRANULE));
        assert_eq!(grown_capacity(3 * GRANULE, GRANULE + 1), Some(3 * GRANULE));
        assert_eq!(
            grown_capacity(3 * GRANULE, 3 * GRANULE + 1),
            Some(4 * GRANULE)
        );
        assert_eq!(grown_capacity(0, usize::MAX), None);
    }

    #[test]
    fn regions_are_aligned_disjoint_and_in_order() {
        let (ranges, total) = layout([5, 0, 600, 64]).expect("fits");
        assert_eq!(ranges[0], 0..5);
        assert_eq!(ranges[1], 256..256);
        assert_eq!(ranges[2], 256..856);
        assert_eq!(ranges[3], 1024..1088);
        assert_eq!(total, 1088);
        let (ranges, total) = layout([0]).expect("fits");
        assert_eq!((ranges[0].clone(), total), (0..0, 0));
        assert!(layout([usize::MAX, 1]).is_none());
    }

    #[test]
    fn an_unused_scratch_holds_nothing() {
        let scratch = Scratch::<crate::nccl::HostTransport>::default();
        assert_eq!(scratch.capacity(), 0);
        assert!(!scratch.lent.get());
    }
}
