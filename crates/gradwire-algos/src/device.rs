//! The device forms of the fused and sparse strategies (feature `cuda`), for CUDA
//! tensors on a communicator that reduces them in device memory
//! ([`Communicator::takes_device_tensors`]: NcclComm): the bucket is packed,
//! encoded, reduced, decoded and unpacked without leaving the GPU.
//!
//! The sparse exchange ([`sparse_exchange_on_device`]) selects on the
//! device (with a [`CudaErrorFeedback`] memory or without), and only the
//! selection crosses to the host, to travel in the wire format; the
//! payloads gathered are added into the device buffer in rank order. The
//! selection's working memory and the room the payloads are added from are
//! kept too, so a steady sparse step allocates only the selection itself.
//!
//! The fused all-reduce packs the bucket into a device buffer of its dtype
//! and all-reduces it. The half-precision all-reduce packs into an f32 buffer on the device,
//! encodes it with gradwire-compress's device cast codec (bitwise the CPU's
//! `cast::encode`: clamp, round to f16 or bf16), all-reduces the wire
//! buffer, and widens it back (exact). Its buffers are kept from call to
//! call ([`DeviceFusion`]), so a steady state allocates no device memory.

use crate::error::{AlgoError, Result};
use crate::fault::prepare;
use crate::fusion::{FusionBuffers, check_capacity};
use crate::half::{HalfOptions, HalfPrecision};
use crate::handle::Traffic;
use crate::sparse::sparse_costs_more;
use gradwire_comm::{Communicator, Gathered, ReduceOp};
use gradwire_compress::cast::CastOptions;
use gradwire_compress::cuda::{
    self as codecs, CudaErrorFeedback, DeviceSelectScratch, SparseStaging,
};
use gradwire_compress::{SparseCodec, SparseVec, wire};
use gradwire_tensor::{DType, Device, Tensor, flat};

/// The device buffers of [`fused_all_reduce`], [`half_all_reduce`] and
/// [`sparse_exchange_on_device`] (and the latter's host payloads), kept from
/// call to call (a bucket's size is the same every step).
#[derive(Debug, Default)]
pub(crate) struct DeviceFusion {
    /// The packed bucket of [`fused_all_reduce`], in the bucket's dtype.
    dense: Option<Tensor>,
    /// The packed f32 bucket (and, after the reduction, its average).
    flat: Option<Tensor>,
    /// The f16 or bf16 wire buffer.
    wire: Option<Tensor>,
    /// The sparse exchange's encoded selection and every rank's.
    payload: Vec<u8>,
    gathered: Gathered<u8>,
    /// The selection's working memory on the device.
    select: DeviceSelectScratch,
    /// The device room the gathered selections are added from.
    staging: SparseStaging,
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
        return Err(gradwire_tensor::Error::DeviceMismatch {
            op: "a device bucket",
            expected: device,
            got: other.device(),
        }
        .into());
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

/// [`crate::sparse_exchange_with`] for CUDA tensors (all on one device):
/// the codec selects on the device, from the error-feedback memory
/// `feedback` (on the tensors' device) when given, and the sum of the
/// ranks' selections comes back into the tensors. The same decisions and,
/// bit for bit, the same result as the host form on the same values: one
/// Max all-reduce of the largest selection decides between the all-gather
/// of the payloads (added in rank order) and a dense all-reduce of the
/// whole accumulator (the memory flushed). The payloads travel through
/// host memory (the wire format and the variable-length all-gather are the
/// host's); the dense all-reduce stays on the device when the communicator
/// takes device tensors. Random-k has no device form (its draw is the
/// CPU's): refused, on every rank, before the first collective. The result
/// is the sum; on a failure on any rank `feedback` may have changed (the
/// caller keeps a copy to put back, as DistOpt does).
pub fn sparse_exchange_on_device<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    codec: &SparseCodec,
    mut feedback: Option<&mut CudaErrorFeedback>,
    buffers: &mut FusionBuffers,
) -> Result<Traffic> {
    let fusion = &mut buffers.device;
    let (n, layout, selected) = prepare(comm, || {
        let (n, device) = check_bucket(tensors, usize::MAX)?;
        if !matches!(device, Device::Cuda(_)) {
            return Err(AlgoError::InvalidArgument(
                "sparse_exchange_on_device takes CUDA tensors".into(),
            ));
        }
        let packed = reuse(&mut fusion.flat, n, DType::F32, device)?;
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let layout = flat::pack(&refs, packed)?;
        let values = packed.cuda_storage()?;
        // Random-k is refused here, on every rank, before the first
        // collective (its draw is the CPU's).
        let selected = match feedback.as_deref_mut() {
            Some(memory) => memory.compress_with(&values, codec, &mut fusion.select)?,
            None => codecs::select_with(&values, codec, &mut fusion.select)?,
        };
        Ok((n, layout, selected))
    })?;
    let world = comm.world_size();
    let mut vote = [selected.nnz() as u64];
    comm.all_reduce(&mut vote, ReduceOp::Max)?;
    let vote_traffic = Traffic::all_reduce(8, world);
    let largest = usize::try_from(vote[0]).unwrap_or(usize::MAX);
    let Some(packed) = fusion.flat.as_mut() else {
        return Err(AlgoError::InvalidArgument(
            "a device buffer went missing".into(),
        ));
    };
    let traffic = if sparse_costs_more(largest, n, world) {
        // Dense: what was selected plus what the memory still holds is the
        // whole accumulator (without feedback: the gradient, still packed).
        // Local work between collectives: a failure is posted in place of
        // the all-reduce, so every rank fails there.
        let staged = prepare(comm, || {
            if let Some(memory) = feedback {
                let dense = packed.cuda_storage_mut()?;
                dense.zero_fill()?;
                codecs::scatter_add(&selected, dense)?;
                memory.flush_into(dense)?;
            }
            Ok(if comm.takes_device_tensors() {
                None
            } else {
                Some(packed.to_device(Device::Cpu)?)
            })
        })?;
        match staged {
            None => comm.all_reduce_tensor(packed, ReduceOp::Sum)?,
            Some(mut host) => {
                comm.all_reduce_tensor(&mut host, ReduceOp::Sum)?;
                flat::pack(&[&host], packed)?;
            }
        }
        vote_traffic + Traffic::all_reduce(n * 4, world)
    } else {
        let payload = &mut fusion.payload;
        prepare(comm, || {
            let (indices, values) = selected.to_host()?;
            let local = SparseVec::new(n, indices, values)?;
            wire::encode_into(&local, codec.wire_id(), DType::F32, payload);
            Ok(())
        })?;
        comm.all_gather_varied_into(&fusion.payload, &mut fusion.gathered)?;
        let dense = packed.cuda_storage_mut()?;
        dense.zero_fill()?;
        for rank in 0..world {
            let part = wire::decode(fusion.gathered.part(rank))?;
            if part.dense_len() != n {
                return Err(gradwire_compress::CompressError::LengthMismatch {
                    op: "sparse_exchange_on_device",
                    expected: n,
                    got: part.dense_len(),
                }
                .into());
            }
            fusion.staging.scatter_add_payload(&part, dense)?;
        }
        vote_traffic
            + Traffic::all_gather(fusion.payload.len(), fusion.gathered.data().len(), world)
    };
    let mut outs: Vec<&mut Tensor> = tensors.iter_mut().collect();
    flat::unpack(packed, &layout, &mut outs)?;
    Ok(traffic)
}
