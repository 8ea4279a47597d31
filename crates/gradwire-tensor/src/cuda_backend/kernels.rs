//! Safe launchers of the kernels the upper crates run on device buffers:
//! the optimizer updates ([`optim`]), sparse selection ([`select`]), error
//! feedback, the cast codec and scatter-add ([`feedback`]) and AdaSum's
//! pairwise rule ([`adasum`]).
//!
//! Every launcher validates its operands (device, dtype, lengths, ranges)
//! before it queues anything and then launches with the geometry its kernel
//! requires, so the only `unsafe` of the GPU path above the driver lives in
//! this module and in gradwire-comm's NCCL bindings: gradwire-optim,
//! gradwire-compress and gradwire-algos compose these launchers into their
//! device forms without `unsafe` of their own. Each launcher documents the
//! CPU function it matches and how (bitwise, or within a stated bound).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DeviceRepr, DriverError, ValidAsZeroBits};

use super::driver::{CudaDevice, CudaStorage};
use super::launch::driver_error;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};

pub mod adasum;
pub mod feedback;
pub mod optim;
pub mod select;

/// `storage` must hold f32 (the optimizer buffers, the residuals and the
/// selection inputs are f32 whatever the parameters' dtype).
fn require_f32(op: &'static str, storage: &CudaStorage) -> Result<()> {
    if storage.dtype() == DType::F32 {
        Ok(())
    } else {
        Err(Error::DTypeMismatch {
            op,
            expected: DType::F32,
            got: storage.dtype(),
        })
    }
}

/// `other` must live on `storage`'s device.
fn require_same_device(op: &'static str, storage: &CudaStorage, other: &CudaStorage) -> Result<()> {
    if storage.ordinal() == other.ordinal() {
        Ok(())
    } else {
        Err(Error::DeviceMismatch {
            op,
            expected: Device::Cuda(storage.ordinal()),
            got: Device::Cuda(other.ordinal()),
        })
    }
}

fn require_len(op: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::LengthMismatch { op, expected, got })
    }
}

/// A launch's outcome as this crate's error, naming the kernel.
fn launched<T>(kernel: &str, result: std::result::Result<T, DriverError>) -> Result<()> {
    result
        .map(|_| ())
        .map_err(|e| driver_error(&format!("launching `{kernel}`"), e))
}

/// `len` zeroed elements on `device` (at least one: cuMemAlloc refuses zero
/// bytes; kernels are told the real length).
fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    device: &Arc<CudaDevice>,
    len: usize,
) -> Result<CudaSlice<T>> {
    device
        .stream()
        .alloc_zeros::<T>(len.max(1))
        .map_err(|e| driver_error("cuMemAlloc / cuMemsetD8", e))
}

/// A device copy of `host` (at least one element, see [`zeros`]).
fn upload<T: DeviceRepr + ValidAsZeroBits>(
    device: &Arc<CudaDevice>,
    host: &[T],
) -> Result<CudaSlice<T>> {
    if host.is_empty() {
        return zeros(device, 0);
    }
    device
        .stream()
        .clone_htod(host)
        .map_err(|e| driver_error("cuMemcpyHtoD", e))
}

/// The first `len` elements of `slice`, on the host (waits for the stream).
fn download<T: DeviceRepr>(
    device: &Arc<CudaDevice>,
    slice: &CudaSlice<T>,
    len: usize,
) -> Result<Vec<T>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let view = slice
        .try_slice(..len)
        .ok_or_else(|| Error::Cuda(format!("download of {len} elements from a shorter buffer")))?;
    device
        .stream()
        .clone_dtoh(&view)
        .map_err(|e| driver_error("cuMemcpyDtoH", e))
}

/// `n` as a 32-bit kernel argument (tensor counts, shifts).
fn u32_arg(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::InvalidArgument(format!("{what} {n} exceeds u32")))
}
