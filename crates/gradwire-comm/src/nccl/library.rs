//! NCCL's own all-reduce called the way a program using NCCL directly calls
//! it, timed: the baseline `gradwire bench allreduce --backend nccl` puts
//! beside NcclComm's checked calls, so the cost of gradwire's agreement,
//! watchdog and stream ordering is a measured ratio.
//!
//! The ranks agree once (two checked header exchanges: the length, then
//! the number of runs) and then issue the same raw `ncclAllReduce` calls,
//! back to back on the communicator's stream, over buffers that rotate so
//! no call finds its data in L2; one wait at the end, under the watchdog's
//! deadline. A rank that cannot allocate its buffers describes another
//! length, so the agreement fails on every rank before any data moves.

use std::time::Instant;

use gradwire_tensor::{CudaStorage, DType};

use gradwire_tensor::cudarc::driver::DevicePtrMut;

use super::{CudaTransport, NcclComm, NcclReduction, cuda, driver, native_reduction};
use crate::element::ElemType;
use crate::error::{CommError, Result};
use crate::header::{Call, Kind};
use crate::op::ReduceOp;

/// Buffers the timed calls rotate over.
const ROTATION: usize = 4;

impl NcclComm<CudaTransport> {
    /// Seconds per call of NCCL's own `ncclAllReduce` (f32 sum, in place,
    /// `len` elements per rank), over `runs` calls issued back to back
    /// after one warm-up call, on every rank (each rank measures its own
    /// wall time; they agree within a call). Every rank must pass the same
    /// `len` and `runs`: the agreement refuses a mismatch
    /// ([`CommError::Mismatch`]) on every rank. `Ok(0.0)` for `len` or
    /// `runs` of zero.
    pub fn time_library_all_reduce(&self, len: usize, runs: usize) -> Result<f64> {
        let ordinal = self.device.ordinal();
        let allocated: Result<Vec<CudaStorage>> = (0..ROTATION)
            .map(|_| CudaStorage::alloc_zeros(len, DType::F32, ordinal).map_err(cuda))
            .collect();
        let described = if allocated.is_ok() {
            len
        } else {
            len.wrapping_add(1)
        };
        let call = |len| Call {
            elem: Some(ElemType::F32),
            op: Some(ReduceOp::Sum),
            len,
            ..Call::new(Kind::LibraryAllReduce)
        };
        self.agree(call(described))?;
        self.agree(call(runs))?;
        let mut buffers = allocated?;
        if len == 0 || runs == 0 {
            return Ok(0.0);
        }
        let native = native_reduction(NcclReduction::Native, ElemType::F32, ReduceOp::Sum)
            .ok_or_else(|| CommError::Unsupported("NCCL's f32 sum".into()))?;
        // The buffers' zeros were written on the device's stream.
        self.stream
            .join(self.device.stream())
            .map_err(|e| driver("cuStreamWaitEvent", e))?;
        let issue = |count: usize, buffers: &mut [CudaStorage]| -> Result<()> {
            for i in 0..count {
                // Kept alive until the wait that follows the loop; every rank
                // agreed on `len` and issues the same calls.
                let mut view = buffers[i % ROTATION].bytes_mut().map_err(cuda)?;
                let capacity = view.len();
                let (at, guard) = view.device_ptr_mut(&self.stream);
                let queued =
                    self.queue_all_reduce_at("library all_reduce", at, capacity, len, native);
                // Records the view's use on the stream after the call.
                drop(guard);
                queued?;
            }
            self.sync()
        };
        self.watched("library all_reduce (warm-up)", || issue(1, &mut buffers))?;
        let start = Instant::now();
        self.watched("library all_reduce", || issue(runs, &mut buffers))?;
        Ok(start.elapsed().as_secs_f64() / runs as f64)
    }
}
