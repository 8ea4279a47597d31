//! Launch geometry and helpers shared by every kernel launcher.
//!
//! The kernels of gradwire-kernels come in two shapes: grid-stride loops
//! (`GW_FOR_EACH`, any grid works, 64-bit indices) and block algorithms
//! (block reductions, histograms, compaction) that require exactly
//! [`BLOCK`] threads per block and trap otherwise. Launchers build their
//! [`LaunchConfig`] here so those two rules live in one place, and share the
//! operand checks, the small device allocations and copies, and the error
//! mapping of every launch (crate-internal helpers).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DeviceRepr, DriverError, LaunchConfig, ValidAsZeroBits};

use super::driver::{CudaDevice, CudaStorage};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Threads per block: `GW_BLOCK` in `kernels/cuda/gradwire.cuh`, which the
/// block algorithms check (`GW_REQUIRE_BLOCK`).
pub const BLOCK: u32 = 256;

/// The most blocks a grid-stride launch uses: enough to fill any current GPU
/// (a few thousand resident blocks), few enough that per-block partial
/// results stay small.
pub const MAX_GRID: u32 = 4096;

/// A grid-stride launch over `n` elements: [`BLOCK`] threads per block and
/// enough blocks to give each thread about one element, capped at
/// [`MAX_GRID`]. At least one block, so `n = 0` launches are well formed
/// (launchers skip them anyway).
pub fn grid_stride(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks_for(n), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The number of blocks [`grid_stride`] uses for `n` elements.
pub fn blocks_for(n: usize) -> u32 {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_GRID as usize);
    // In range by the clamp.
    u32::try_from(blocks).unwrap_or(MAX_GRID)
}

/// A launch of exactly `blocks` blocks of [`BLOCK`] threads (block
/// algorithms that index per-block outputs).
pub fn blocks(blocks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.max(1), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A driver error as gradwire-tensor's [`Error::Cuda`], naming the call.
pub fn driver_error(call: &str, e: DriverError) -> Error {
    Error::Cuda(format!("{call}: {e:?}"))
}

/// The error of a range of elements outside a buffer of `len`.
pub(crate) fn out_of_bounds(op: &str, range: &std::ops::Range<usize>, len: usize) -> Error {
    Error::InvalidArgument(format!(
        "{op}: range {}..{} out of bounds for {len} elements",
        range.start, range.end
    ))
}

/// `n` as the `gw_u64` length argument every kernel takes.
pub fn len_arg(n: usize) -> Result<u64> {
    u64::try_from(n).map_err(|_| Error::ShapeOverflow)
}

/// `n` as a 32-bit kernel argument (tensor counts, grid sizes).
pub(crate) fn u32_arg(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::InvalidArgument(format!("{what} {n} exceeds u32")))
}

/// The kernel of `names` (its f32, f16 and bf16 forms, in that order) for
/// `dtype`.
pub(crate) fn by_dtype(dtype: DType, names: [&'static str; 3]) -> &'static str {
    let [f32, f16, bf16] = names;
    match dtype {
        DType::F32 => f32,
        DType::F16 => f16,
        DType::BF16 => bf16,
    }
}

/// A launch's outcome as this crate's error, naming the kernel.
pub(crate) fn launched<T>(kernel: &str, result: std::result::Result<T, DriverError>) -> Result<()> {
    result
        .map(|_| ())
        .map_err(|e| driver_error(&format!("launching `{kernel}`"), e))
}

/// `storage` must hold f32 (optimizer buffers, residuals and selection
/// inputs are f32 whatever the parameters' dtype).
pub(crate) fn require_f32(op: &'static str, storage: &CudaStorage) -> Result<()> {
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
pub(crate) fn require_same_device(
    op: &'static str,
    storage: &CudaStorage,
    other: &CudaStorage,
) -> Result<()> {
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

pub(crate) fn require_len(op: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::LengthMismatch { op, expected, got })
    }
}

/// `other` must be like `storage` (same device, dtype and length): the
/// operands of an elementwise kernel.
pub(crate) fn require_like(
    op: &'static str,
    storage: &CudaStorage,
    other: &CudaStorage,
) -> Result<()> {
    require_same_device(op, storage, other)?;
    if other.dtype() != storage.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            expected: storage.dtype(),
            got: other.dtype(),
        });
    }
    require_len(op, storage.len(), other.len())
}

/// `len` zeroed elements on `device` (at least one: cuMemAlloc refuses zero
/// bytes; kernels are told the real length).
pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    device: &Arc<CudaDevice>,
    len: usize,
) -> Result<CudaSlice<T>> {
    device
        .stream()
        .alloc_zeros::<T>(len.max(1))
        .map_err(|e| driver_error("cuMemAlloc / cuMemsetD8", e))
}

/// A device copy of `host` (at least one element, see [`zeros`]).
pub(crate) fn upload<T: DeviceRepr + ValidAsZeroBits>(
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
pub(crate) fn download<T: DeviceRepr>(
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

/// "No index" of the kernels' first-index reductions (`GW_NO_INDEX`).
pub(crate) const NO_INDEX: u64 = u64::MAX;

/// A one-u64 device cell starting at [`NO_INDEX`], for a kernel that
/// records the smallest index with some property (`gw_first_index`).
pub(crate) fn first_index_cell(device: &Arc<CudaDevice>) -> Result<CudaSlice<u64>> {
    upload(device, &[NO_INDEX])
}

/// The index a first-index cell holds, `None` if no element had the
/// property (waits for the stream).
pub(crate) fn read_first_index(
    device: &Arc<CudaDevice>,
    cell: &CudaSlice<u64>,
) -> Result<Option<usize>> {
    Ok(match download(device, cell, 1)?.first() {
        Some(&i) if i != NO_INDEX => Some(usize::try_from(i).map_err(|_| Error::ShapeOverflow)?),
        _ => None,
    })
}
