//! The dense strategy: the all-reduce of one tensor, or of a list fused
//! through one buffer (SINGA's `fused_all_reduce`, checked instead of
//! overflowing), each blocking or on the communication thread
//! (`_async`), and [`DenseSum`], the f32 sum of a bucket as a [`Strategy`].
//!
//! Each keeps the failure model ([`crate::fault`]): whatever can fail on
//! one rank is checked before the first collective, and a rank that fails
//! posts the fault in place of that collective.

use crate::error::Result;
use crate::fault::prepare;
use crate::fusion::{FusionBuffers, all_on_cpu, check_capacity, common_dtype, pack, unpack};
use crate::handle::{Handle, Reduced, Traffic};
use crate::strategy::{BucketView, Combined, Strategy};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_tensor::{DType, Tensor, WithDType, flat};

/// All-reduces one tensor in place, in its own dtype (f16 and bf16 are
/// accumulated in f32 by the backend).
pub fn all_reduce<C: Communicator>(comm: &C, tensor: &mut Tensor, op: ReduceOp) -> Result<Traffic> {
    comm.all_reduce_tensor(tensor, op)?;
    let bytes = tensor.len() * tensor.dtype().size_in_bytes();
    Ok(Traffic::all_reduce(bytes, comm.world_size()))
}

/// All-reduces a list of tensors through one fusion buffer of at most
/// `capacity` elements (SINGA's `fused_all_reduce`, checked instead of
/// overflowing): one collective instead of one per tensor. The buffer has the
/// list's dtype (f32 if the list mixes dtypes).
pub fn fused_all_reduce<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    op: ReduceOp,
    capacity: usize,
) -> Result<Traffic> {
    fused_all_reduce_with(comm, tensors, op, capacity, &mut FusionBuffers::default())
}

/// [`fused_all_reduce`] through `buffers`, reused from call to call: CPU
/// tensors through host buffers; CUDA tensors on a communicator that takes
/// device tensors (with the `cuda` feature) through a device buffer (on
/// another communicator, a buffer of their own each call). The same result,
/// bit for bit.
pub fn fused_all_reduce_with<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    op: ReduceOp,
    capacity: usize,
    buffers: &mut FusionBuffers,
) -> Result<Traffic> {
    if tensors.len() > 1 && all_on_cpu(tensors) {
        let dtype = common_dtype(tensors);
        if comm.world_size() == 1 {
            // Alone, every reduction is the identity: nothing to pack,
            // reduce or unpack (the same checks, the same traffic: none).
            let n = prepare(comm, || {
                check_capacity(tensors, capacity)?;
                Ok(tensors.iter().map(Tensor::len).sum::<usize>())
            })?;
            return Ok(Traffic::all_reduce(n * dtype.size_in_bytes(), 1));
        }
        let n = prepare(comm, || {
            check_capacity(tensors, capacity)?;
            Ok(match dtype {
                DType::F32 => flat::pack_into(tensors, &mut buffers.f32)?,
                DType::F16 => flat::pack_into(tensors, &mut buffers.f16)?,
                DType::BF16 => flat::pack_into(tensors, &mut buffers.bf16)?,
            })
        })?;
        match dtype {
            DType::F32 => reduce_packed(comm, &mut buffers.f32[..n], op, tensors)?,
            DType::F16 => reduce_packed(comm, &mut buffers.f16[..n], op, tensors)?,
            DType::BF16 => reduce_packed(comm, &mut buffers.bf16[..n], op, tensors)?,
        }
        return Ok(Traffic::all_reduce(
            n * dtype.size_in_bytes(),
            comm.world_size(),
        ));
    }
    #[cfg(feature = "cuda")]
    if tensors.len() > 1 && comm.takes_device_tensors() {
        let dtype = common_dtype(tensors);
        return crate::device::fused_all_reduce(
            comm,
            tensors,
            op,
            dtype,
            capacity,
            &mut buffers.device,
        );
    }
    let packed = prepare(comm, || {
        check_capacity(tensors, capacity)?;
        match tensors {
            [_] => Ok(None),
            _ => pack(tensors, common_dtype(tensors)).map(Some),
        }
    })?;
    let Some((mut buffer, layout)) = packed else {
        return all_reduce(comm, &mut tensors[0], op);
    };
    let traffic = all_reduce(comm, &mut buffer, op)?;
    unpack(&buffer, &layout, tensors)?;
    Ok(traffic)
}

/// The all-reduce of a packed buffer, unpacked into `tensors`.
fn reduce_packed<C: Communicator, D: WithDType + gradwire_comm::Element>(
    comm: &C,
    packed: &mut [D],
    op: ReduceOp,
    tensors: &mut [Tensor],
) -> Result<()> {
    comm.all_reduce(packed, op)?;
    Ok(flat::unpack_from(packed, tensors)?)
}

/// [`all_reduce`] on the communication thread.
pub fn all_reduce_async<C: Communicator>(
    comm: &C,
    mut tensor: Tensor,
    op: ReduceOp,
) -> Result<Handle<Tensor>> {
    let pending = comm.run_async(move |comm| {
        Ok(all_reduce(comm, &mut tensor, op).map(|traffic| Reduced {
            value: tensor,
            traffic,
        }))
    })?;
    Ok(Handle::from_pending(pending))
}

/// [`fused_all_reduce`] on the communication thread.
pub fn fused_all_reduce_async<C: Communicator>(
    comm: &C,
    mut tensors: Vec<Tensor>,
    op: ReduceOp,
    capacity: usize,
) -> Result<Handle<Vec<Tensor>>> {
    let pending = comm.run_async(move |comm| {
        Ok(
            fused_all_reduce(comm, &mut tensors, op, capacity).map(|traffic| Reduced {
                value: tensors,
                traffic,
            }),
        )
    })?;
    Ok(Handle::from_pending(pending))
}

/// The plain sum of a bucket, through a fusion buffer reused from step to
/// step; the caller divides it by the world size.
#[derive(Debug, Default)]
pub struct DenseSum {
    fusion: FusionBuffers,
}

impl<C: Communicator + 'static> Strategy<C> for DenseSum {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> Result<Combined> {
        let traffic = fused_all_reduce_with(
            comm,
            tensors,
            ReduceOp::Sum,
            bucket.capacity,
            &mut self.fusion,
        )?;
        Ok(Combined {
            traffic,
            averaged: false,
        })
    }

    fn carries_non_finite(&self) -> bool {
        true
    }
}
