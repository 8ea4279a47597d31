//! The device forms of the fused strategies (feature `cuda`), for CUDA
//! tensors on a communicator that reduces them in device memory
//! ([`Communicator::takes_device_tensors`]: NcclComm): the bucket is packed,
//! encoded, reduced, decoded and unpacked without leaving the GPU.
//!
//! The fused all-reduce packs the bucket into a device buffer of its dtype
//! and all-reduces it. The half-precision all-reduce packs into an f32 buffer on the device,
//! encodes it with gradwire-compress's device cast codec (bitwise the CPU's
//! `cast::encode`: clamp, round to f16 or bf16), all-reduces the wire
//! buffer, and widens it back (exact). Its buffers are kept from call to
//! call ([`DeviceFusion`]), so a steady state allocates no device memory.

use crate::error::{AlgoError, Result};
use crate::fault::prepare;
use crate::handle::Traffic;
use crate::reduce::{HalfOptions, HalfPrecision, check_capacity};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_compress::cast::CastOptions;
use gradwire_tensor::{DType, Device, Tensor, flat};

/// The device buffers of [`fused_all_reduce`] and [`half_all_reduce`],
/// kept from call to call (a bucket's size is the same every step).
#[derive(Debug, Default)]
pub(crate) struct DeviceFusion {
    /// The packed bucket of [`fused_all_reduce`], in the bucket's dtype.
    dense: Option<Tensor>,
    /// The packed f32 bucket (and, after the reduction, its average).
    flat: Option<Tensor>,
    /// The f16 or bf16 wire buffer.
    wire: Option<Tensor>,
}

/// `slot` holding a tensor of `len` elements of `dtype` on `device`: the
/// kept one when it matches, else a new one.
fn reuse(
    slot: &mut Option<Tensor>,
    len: usize,
    dtype: DType,
    device: Device,
) -> Result<&mut Tensor> {
    let fits = slot
        .as_ref()
        .is_some_and(|t| t.len() == len && t.dtype() == dtype && t.device() == device);
    if !fits {
        *slot = Some(Tensor::zeros(len, dtype, device)?);
    }
    slot.as_mut()
        .ok_or_else(|| AlgoError::InvalidArgument("a device buffer went missing".into()))
}

/// The checks of a device bucket: within `capacity`, all on one device.
/// Returns the element count and the device.
fn check_bucket(tensors: &[Tensor], capacity: usize) -> Result<(usize, Device)> {
    let n = check_capacity(tensors, capacity)?;
    let device = tensors
        .first()
        .map(Tensor::device)
        .ok_or_else(|| AlgoError::InvalidArgument("an empty bucket".into()))?;
    if let Some(other) = tensors.iter().find(|t| t.device() != device) {
        return Err(AlgoError::InvalidArgument(format!(
            "a bucket on {device:?} and {:?}",
            other.device()
        )));
    }
    Ok((n, device))
}

/// The fused all-reduce of `tensors` (of `dtype`, the list's common one),
/// all on one CUDA device, through the kept device buffer.
pub(crate) fn fused_all_reduce<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    op: ReduceOp,
    dtype: DType,
    capacity: usize,
    buffers: &mut DeviceFusion,
) -> Result<Traffic> {
    let layout = prepare(comm, || {
        let (n, device) = check_bucket(tensors, capacity)?;
        let packed = reuse(&mut buffers.dense, n, dtype, device)?;
        let refs: Vec<&Tensor> = tensors.iter().collect();
        Ok(flat::pack(&refs, packed)?)
    })?;
    let Some(packed) = buffers.dense.as_mut() else {
        return Err(AlgoError::InvalidArgument(
            "a device buffer went missing".into(),
        ));
    };
    comm.all_reduce_tensor(packed, op)?;
    let mut outs: Vec<&mut Tensor> = tensors.iter_mut().collect();
    flat::unpack(packed, &layout, &mut outs)?;
    Ok(Traffic::all_reduce(
        packed.len() * dtype.size_in_bytes(),
        comm.world_size(),
    ))
}

/// The half-precision all-reduce of `tensors`, all on one CUDA device, on a
/// communicator that takes device tensors.
pub(crate) fn half_all_reduce<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    options: &HalfOptions,
    capacity: usize,
    buffers: &mut DeviceFusion,
) -> Result<Traffic> {
    let wire_dtype = match options.precision {
        HalfPrecision::F16 => DType::F16,
        HalfPrecision::BF16 => DType::BF16,
    };
    let cast_options = CastOptions {
        clip: options.clip,
        scale: 1.0,
    };
    let DeviceFusion {
        flat: flat_buf,
        wire,
        ..
    } = buffers;
    let (n, layout) = prepare(comm, || {
        let (n, device) = check_bucket(tensors, capacity)?;
        let flat_buf = reuse(flat_buf, n, DType::F32, device)?;
        let layout = {
            let refs: Vec<&Tensor> = tensors.iter().collect();
            flat::pack(&refs, flat_buf)?
        };
        let wire = reuse(wire, n, wire_dtype, device)?;
        let src = flat_buf.cuda_storage()?;
        gradwire_compress::cuda::encode(&src, wire.cuda_storage_mut()?, &cast_options)?;
        Ok((n, layout))
    })?;
    let (Some(flat_buf), Some(wire)) = (flat_buf.as_mut(), wire.as_mut()) else {
        return Err(AlgoError::InvalidArgument(
            "a device buffer went missing".into(),
        ));
    };
    comm.all_reduce_tensor(wire, options.op)?;
    // The wire's values widened into the f32 buffer (exact), then unpacked.
    flat::pack(&[&*wire], flat_buf)?;
    let mut outs: Vec<&mut Tensor> = tensors.iter_mut().collect();
    flat::unpack(flat_buf, &layout, &mut outs)?;
    Ok(Traffic::all_reduce(
        n * wire_dtype.size_in_bytes(),
        comm.world_size(),
    ))
}
