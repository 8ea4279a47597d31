//! [`DeviceVec`]: a vector of plain values in device memory (indices,
//! counts, a selection's state, f64 partial sums, payload bytes), the
//! working memory of the launchers, beside [`CudaStorage`](super::CudaStorage),
//! which holds tensors' float elements.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use gradwire_kernels::CType;

use super::allocations::note_device_allocation;
use super::driver::CudaDevice;
use super::launch::{driver_error, out_of_bounds};
use crate::error::{Error, Result};

mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
    impl Sealed for f64 {}
}

/// A type a [`DeviceVec`] holds: one of the kernels' C types.
pub trait DeviceScalar: bytemuck::Pod + sealed::Sealed {
    /// Its C type in the kernels' signatures.
    const CTYPE: CType;
}

impl DeviceScalar for u8 {
    const CTYPE: CType = CType::U8;
}

impl DeviceScalar for u32 {
    const CTYPE: CType = CType::U32;
}

impl DeviceScalar for u64 {
    const CTYPE: CType = CType::U64;
}

impl DeviceScalar for f64 {
    const CTYPE: CType = CType::F64;
}

/// `len` values of `T` in the memory of one device.
///
/// CUDA cannot allocate zero bytes, so an empty vector holds a one-element
/// allocation; [`DeviceVec::len`] is the vector's length, and kernel
/// arguments and copies cover exactly that.
#[derive(Debug)]
pub struct DeviceVec<T> {
    device: Arc<CudaDevice>,
    len: usize,
    bytes: CudaSlice<u8>,
    values: PhantomData<T>,
}

impl<T: DeviceScalar> DeviceVec<T> {
    fn byte_len(len: usize) -> Result<usize> {
        len.checked_mul(size_of::<T>()).ok_or(Error::ShapeOverflow)
    }

    /// `len` zeros on `device`.
    pub fn zeros(device: &Arc<CudaDevice>, len: usize) -> Result<DeviceVec<T>> {
        let bytes = device
            .stream()
            .alloc_zeros::<u8>(Self::byte_len(len.max(1))?)
            .map_err(|e| driver_error("cuMemAlloc / cuMemsetD8", e))?;
        note_device_allocation(bytes.len());
        Ok(DeviceVec {
            device: Arc::clone(device),
            len,
            bytes,
            values: PhantomData,
        })
    }

    /// A device copy of `host` on `device`.
    pub fn from_host(device: &Arc<CudaDevice>, host: &[T]) -> Result<DeviceVec<T>> {
        if host.is_empty() {
            return Self::zeros(device, 0);
        }
        let bytes = device
            .stream()
            .clone_htod(bytemuck::cast_slice::<T, u8>(host))
            .map_err(|e| driver_error("cuMemcpyHtoD", e))?;
        note_device_allocation(bytes.len());
        Ok(DeviceVec {
            device: Arc::clone(device),
            len: host.len(),
            bytes,
            values: PhantomData,
        })
    }

    /// The vector kept in `slot` when it holds at least `len` values on
    /// `device`, else `len` new zeros put there: working memory kept from
    /// call to call, so that a steady caller allocates nothing. A kept
    /// vector's values are what its last user left (launchers initialise
    /// what they rely on, with [`DeviceVec::write_from_host`]); pass a
    /// window of the `len` values a kernel needs where the length matters.
    pub fn kept<'s>(
        slot: &'s mut Option<DeviceVec<T>>,
        device: &Arc<CudaDevice>,
        len: usize,
    ) -> Result<&'s mut DeviceVec<T>> {
        let fits = slot
            .as_ref()
            .is_some_and(|v| v.len >= len && v.ordinal() == device.ordinal());
        if !fits {
            *slot = Some(DeviceVec::zeros(device, len)?);
        }
        slot.as_mut()
            .ok_or_else(|| Error::Cuda("a kept device vector went missing".into()))
    }

    /// Writes host `values` from value `offset` on, in stream order (a
    /// kernel queued before reads the old values, one queued after the
    /// new); [`Error::InvalidArgument`] for a range outside.
    pub fn write_from_host(&mut self, offset: usize, values: &[T]) -> Result<()> {
        let end = offset
            .checked_add(values.len())
            .ok_or(Error::ShapeOverflow)?;
        if end > self.len {
            return Err(out_of_bounds(
                "DeviceVec::write_from_host",
                &(offset..end),
                self.len,
            ));
        }
        if values.is_empty() {
            return Ok(());
        }
        let bytes = Self::byte_len(offset)?..Self::byte_len(end)?;
        let stream = Arc::clone(self.device.stream());
        let mut view = self
            .bytes
            .try_slice_mut(bytes)
            .ok_or_else(|| Error::Cuda("a device vector shorter than its length".into()))?;
        stream
            .memcpy_htod(bytemuck::cast_slice::<T, u8>(values), &mut view)
            .map_err(|e| driver_error("cuMemcpyHtoD", e))
    }

    /// Values `range`, on the host (waits for the stream);
    /// [`Error::InvalidArgument`] for a range outside.
    pub fn read(&self, range: Range<usize>) -> Result<Vec<T>> {
        if range.start > range.end || range.end > self.len {
            return Err(out_of_bounds("DeviceVec::read", &range, self.len));
        }
        let mut host = vec![T::zeroed(); range.len()];
        if range.is_empty() {
            return Ok(host);
        }
        let view = self
            .bytes
            .try_slice(Self::byte_len(range.start)?..Self::byte_len(range.end)?)
            .ok_or_else(|| Error::Cuda("a device vector shorter than its length".into()))?;
        self.device
            .stream()
            .memcpy_dtoh(&view, bytemuck::cast_slice_mut::<T, u8>(&mut host))
            .map_err(|e| driver_error("cuMemcpyDtoH", e))?;
        Ok(host)
    }

    /// Every value, on the host (waits for the stream).
    pub fn to_host(&self) -> Result<Vec<T>> {
        self.read(0..self.len)
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device holding the memory.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The CUDA ordinal of that device.
    pub fn ordinal(&self) -> usize {
        self.device.ordinal()
    }

    /// The values as bytes, exactly `len * size_of::<T>()` of them.
    pub(crate) fn bytes(&self) -> Result<CudaView<'_, u8>> {
        self.bytes
            .try_slice(..Self::byte_len(self.len)?)
            .ok_or_else(|| Error::Cuda("a device vector shorter than its length".into()))
    }

    /// The values as writable bytes: any bytes written are valid values of
    /// `T` (plain old data).
    pub(crate) fn bytes_mut(&mut self) -> Result<CudaViewMut<'_, u8>> {
        let end = Self::byte_len(self.len)?;
        self.bytes
            .try_slice_mut(..end)
            .ok_or_else(|| Error::Cuda("a device vector shorter than its length".into()))
    }
}

/// "No index" of the kernels' first-index reductions (`GW_NO_INDEX`).
pub const NO_INDEX: u64 = u64::MAX;

/// A one-u64 cell on `device` starting at [`NO_INDEX`], for a kernel that
/// records the smallest index with some property (`gw_first_index`).
pub fn first_index_cell(device: &Arc<CudaDevice>) -> Result<DeviceVec<u64>> {
    DeviceVec::from_host(device, &[NO_INDEX])
}

/// The index a first-index cell holds, `None` if no element had the
/// property (waits for the stream).
pub fn read_first_index(cell: &DeviceVec<u64>) -> Result<Option<usize>> {
    Ok(match cell.read(0..1.min(cell.len()))?.first() {
        Some(&i) if i != NO_INDEX => Some(usize::try_from(i).map_err(|_| Error::ShapeOverflow)?),
        _ => None,
    })
}
