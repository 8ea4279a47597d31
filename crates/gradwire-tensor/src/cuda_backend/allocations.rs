//! A count of the device memory gradwire allocates (feature `cuda`): every
//! allocation site of the workspace ([`CudaStorage`](super::CudaStorage)'s
//! constructors and copy on write, [`DeviceVec`](super::DeviceVec),
//! NcclComm's scratch) notes its allocation here, so that a GPU test can
//! state what a steady training step allocates, as the host's counting
//! allocator does for host memory. A tidy test keeps cudarc's allocating
//! calls at those sites.

use std::sync::atomic::{AtomicU64, Ordering};

static COUNT: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// Device allocations made through gradwire in this process (every
/// device, every thread): how many, and their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceAllocations {
    /// Allocations made.
    pub count: u64,
    /// Their bytes, together.
    pub bytes: u64,
}

impl DeviceAllocations {
    /// The count so far.
    pub fn now() -> DeviceAllocations {
        DeviceAllocations {
            count: COUNT.load(Ordering::Relaxed),
            bytes: BYTES.load(Ordering::Relaxed),
        }
    }

    /// What was allocated after `earlier` (a count taken before this one).
    pub fn since(self, earlier: DeviceAllocations) -> DeviceAllocations {
        DeviceAllocations {
            count: self.count.saturating_sub(earlier.count),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }
}

/// Counts one device allocation of `bytes`: called by every site that
/// allocates device memory, after the allocation succeeded.
pub fn note_device_allocation(bytes: usize) {
    COUNT.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(u64::try_from(bytes).unwrap_or(u64::MAX), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counts only grow; a window's difference is what was noted in
    /// it (other tests may note allocations at the same time: at least).
    #[test]
    fn a_window_counts_what_was_noted_in_it() {
        let before = DeviceAllocations::now();
        note_device_allocation(100);
        note_device_allocation(28);
        let window = DeviceAllocations::now().since(before);
        assert!(window.count >= 2 && window.bytes >= 128, "{window:?}");
        assert_eq!(
            before.since(DeviceAllocations::now()),
            DeviceAllocations::default()
        );
    }
}
