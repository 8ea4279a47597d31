//! Device kernels communicators run between their transfers: the
//! rank-ordered reduction of W chunks (`kernels/cuda/comm.cu`), which keeps
//! NcclComm's reductions bitwise equal to LocalComm's and MpiComm's.

use std::sync::Arc;

use cudarc::driver::{CudaStream, PushKernelArg};

use super::driver::{CudaStorage, DeviceBuffer};
use super::launch::{driver_error, grid_stride, len_arg};
use crate::error::{Error, Result};

/// How [`reduce_chunks`] combines the chunks (the codes of `comm.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkOp {
    /// The sum, in rank order.
    Sum,
    /// The sum divided by the number of chunks, in the accumulator's
    /// precision (f32).
    Avg,
    /// The maximum; a NaN wins.
    Max,
    /// The minimum; a NaN wins.
    Min,
}

impl ChunkOp {
    fn code(self) -> u32 {
        match self {
            ChunkOp::Sum => 0,
            ChunkOp::Avg => 1,
            ChunkOp::Max => 2,
            ChunkOp::Min => 3,
        }
    }
}

/// `out[i] = op(stage[i], stage[n + i], ..., stage[(world - 1) * n + i])`
/// with `n = out.len()`, combined in that order in f32 and rounded once into
/// `out`'s dtype, queued on `stream` (a stream of `out`'s device; the caller
/// orders it after the writes to `stage`).
///
/// `stage` must hold exactly `world * out.len()` elements of `out`'s dtype on
/// the same device, and `world` must be at least 1.
pub fn reduce_chunks(
    out: &mut CudaStorage,
    stage: &CudaStorage,
    world: usize,
    op: ChunkOp,
    stream: &Arc<CudaStream>,
) -> Result<()> {
    const OP: &str = "reduce_chunks";
    if out.dtype() != stage.dtype() {
        return Err(Error::DTypeMismatch {
            op: OP,
            expected: out.dtype(),
            got: stage.dtype(),
        });
    }
    if out.ordinal() != stage.ordinal() {
        return Err(Error::DeviceMismatch {
            op: OP,
            expected: crate::Device::Cuda(out.ordinal()),
            got: crate::Device::Cuda(stage.ordinal()),
        });
    }
    let n = out.len();
    let expected = world.checked_mul(n).ok_or(Error::ShapeOverflow)?;
    if world == 0 || stage.len() != expected {
        return Err(Error::LengthMismatch {
            op: OP,
            expected,
            got: stage.len(),
        });
    }
    if n == 0 {
        return Ok(());
    }
    let world_arg =
        u32::try_from(world).map_err(|_| Error::InvalidArgument(format!("{world} chunks")))?;
    let n_arg = len_arg(n)?;
    let op_arg = op.code();
    let cfg = grid_stride(n);
    let device = Arc::clone(out.device());
    let module = gradwire_kernels::comm::NAME;
    let stage_buffer = stage.buffer();
    match (out.buffer_mut()?, stage_buffer) {
        (DeviceBuffer::F32(o), DeviceBuffer::F32(s)) => {
            let f = device.function(module, gradwire_kernels::comm::REDUCE_CHUNKS_F32)?;
            let mut launch = stream.launch_builder(&f);
            launch
                .arg(o)
                .arg(s)
                .arg(&n_arg)
                .arg(&world_arg)
                .arg(&op_arg);
            #[allow(unsafe_code)]
            // SAFETY: `reduce_chunks_f32(float* out, const float* stage,
            // gw_u64 n, gw_u32 world, gw_u32 op)`: five arguments of those
            // types in that order; `out` holds n elements and `stage`
            // world * n (checked above), the kernel reads and writes no
            // index beyond them.
            unsafe { launch.launch(cfg) }.map_err(|e| driver_error(OP, e))?;
        }
        (DeviceBuffer::F16(o), DeviceBuffer::F16(s)) => {
            let f = device.function(module, gradwire_kernels::comm::REDUCE_CHUNKS_F16)?;
            let mut launch = stream.launch_builder(&f);
            launch
                .arg(o)
                .arg(s)
                .arg(&n_arg)
                .arg(&world_arg)
                .arg(&op_arg);
            #[allow(unsafe_code)]
            // SAFETY: as for f32, with `gw_f16` (one u16) elements.
            unsafe { launch.launch(cfg) }.map_err(|e| driver_error(OP, e))?;
        }
        (DeviceBuffer::BF16(o), DeviceBuffer::BF16(s)) => {
            let f = device.function(module, gradwire_kernels::comm::REDUCE_CHUNKS_BF16)?;
            let mut launch = stream.launch_builder(&f);
            launch
                .arg(o)
                .arg(s)
                .arg(&n_arg)
                .arg(&world_arg)
                .arg(&op_arg);
            #[allow(unsafe_code)]
            // SAFETY: as for f32, with `gw_bf16` (one u16) elements.
            unsafe { launch.launch(cfg) }.map_err(|e| driver_error(OP, e))?;
        }
        _ => {
            // Unreachable: the dtypes were compared above.
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: out.dtype(),
                got: stage.dtype(),
            });
        }
    }
    Ok(())
}
