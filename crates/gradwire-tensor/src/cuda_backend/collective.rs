//! Device kernels communicators run between their transfers: the
//! rank-ordered reduction of W chunks (`kernels/cuda/comm.cu`), which keeps
//! NcclComm's reductions bitwise equal to LocalComm's and MpiComm's.

use std::sync::Arc;

use cudarc::driver::{CudaStream, CudaView, CudaViewMut};
use gradwire_kernels::comm;

use super::driver::CudaDevice;
use super::launch::{Blocks, Launch, Operand, by_dtype, ctype};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// How [`reduce_chunks_bytes`] combines the chunks (the codes of `comm.cu`).
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
            ChunkOp::Sum => comm::OP_SUM,
            ChunkOp::Avg => comm::OP_AVG,
            ChunkOp::Max => comm::OP_MAX,
            ChunkOp::Min => comm::OP_MIN,
        }
    }
}

/// `out[i] = op(stage[i], stage[n + i], ..., stage[(world - 1) * n + i])`,
/// combined in that order in f32 and rounded once into `dtype`, on byte
/// views of memory the caller manages (a communicator's cached scratch, a
/// range of a tensor's buffer): `out` receives `n = out.len() / size`
/// elements of `dtype`, combined from `stage`'s `world` blocks of `n`
/// elements, in block order, queued on
/// `stream` (a stream of `device`, which both views are on; the caller
/// orders it after the writes to `stage`). Both views must be aligned to
/// the element size (allocations and element offsets are).
///
/// `out` must be a whole number of elements and `stage` exactly `world`
/// times as long, and `world` at least 1.
pub fn reduce_chunks_bytes(
    device: &CudaDevice,
    dtype: DType,
    out: &mut CudaViewMut<'_, u8>,
    stage: &CudaView<'_, u8>,
    world: usize,
    op: ChunkOp,
    stream: &Arc<CudaStream>,
) -> Result<()> {
    const OP: &str = "reduce_chunks_bytes";
    let size = dtype.size_in_bytes();
    if !out.len().is_multiple_of(size) {
        return Err(Error::InvalidArgument(format!(
            "{OP}: {} bytes are not whole {dtype:?} elements",
            out.len()
        )));
    }
    let n = out.len() / size;
    let expected = world.checked_mul(out.len()).ok_or(Error::ShapeOverflow)?;
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
    let world =
        u32::try_from(world).map_err(|_| Error::InvalidArgument(format!("{world} chunks")))?;
    let kernel = by_dtype(
        dtype,
        [
            &comm::REDUCE_CHUNKS_F32,
            &comm::REDUCE_CHUNKS_F16,
            &comm::REDUCE_CHUNKS_BF16,
        ],
    );
    let (elem, ordinal) = (ctype(dtype), device.ordinal());
    let stage_len = stage.len() / size;
    Launch::new(device, kernel)
        .on_stream(stream)
        .write(Operand::write(out.slice_mut(..), elem, n, ordinal))
        .read(Operand::read(stage.slice(..), elem, stage_len, ordinal))
        .len(n)
        .value(world)
        .value(op.code())
        .run(Blocks::Over(n))
}
