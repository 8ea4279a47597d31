//! CUDA tensors on NcclComm: `broadcast_tensor` and `all_reduce_tensor`
//! call NCCL on the tensor's own buffer, with no host round trip and no
//! copy (`ncclBroadcast` and, by default, `ncclAllReduce` in place; the
//! rank-ordered reduction is in `rank_ordered.rs`).
//!
//! Ordering: the communicator's stream waits for the work queued on the
//! tensor's stream before NCCL touches the buffer (a CUDA event, no host
//! wait). The call then waits on the host for the collective, under the
//! watchdog, like every other, so whatever is queued on the tensor's stream
//! after it returns runs after the collective with no event back: an event
//! would make the tensor's stream (the device's default stream, which every
//! kernel of gradwire uses) wait on NCCL's, the asynchronous lane's
//! included, for nothing.

use std::sync::Arc;

use gradwire_tensor::cudarc::driver::{CudaStream, DevicePtrMut};
use gradwire_tensor::{CudaStorage, Tensor};

use super::transport::Native;
use super::{CudaTransport, NcclComm, cuda, driver};
use crate::element::ElemType;
use crate::error::{CommError, Result};
use crate::header::{Call, Kind};
use crate::op::ReduceOp;

impl NcclComm<CudaTransport> {
    /// A CUDA tensor's storage, prepared for a collective that writes it:
    /// checked to be on this rank's device, its zeroed flag materialised (a
    /// zeroed tensor takes part with zeros), copied if shared with a clone
    /// (copy on write, done now, before the streams are ordered), and
    /// NCCL's stream ordered after the work queued on the tensor's stream.
    /// The caller waits for its collective on the host before it returns
    /// (see the module docs).
    pub(super) fn device_storage<'t>(&self, tensor: &'t mut Tensor) -> Result<&'t mut CudaStorage> {
        let ordinal = self.device.ordinal();
        let storage = tensor.cuda_storage_mut().map_err(cuda)?;
        if storage.ordinal() != ordinal {
            return Err(CommError::InvalidArgument(format!(
                "tensor on CUDA device {}, communicator on device {ordinal}",
                storage.ordinal()
            )));
        }
        storage.buffer_mut().map_err(cuda)?;
        self.wait_for(storage.device().stream())?;
        Ok(storage)
    }

    /// Orders this communicator's stream after the work queued on `other`
    /// so far, through one event kept from call to call (recorded anew
    /// each time; a wait takes the event's state when it is queued).
    fn wait_for(&self, other: &Arc<CudaStream>) -> Result<()> {
        let mut joined = self.joined.borrow_mut();
        let event = match joined.take() {
            Some(event) => event,
            None => other
                .context()
                .new_event(None)
                .map_err(|e| driver("cuEventCreate", e))?,
        };
        event
            .record(other)
            .map_err(|e| driver("cuEventRecord", e))?;
        self.stream
            .wait(&event)
            .map_err(|e| driver("cuStreamWaitEvent", e))?;
        *joined = Some(event);
        Ok(())
    }

    /// `broadcast_tensor` on a CUDA tensor: `ncclBroadcast` in place.
    pub(super) fn broadcast_device(&self, tensor: &mut Tensor, root: usize) -> Result<()> {
        let _call = self.flight.call();
        let elem = ElemType::from(tensor.dtype());
        let len = tensor.len();
        self.agree(Call {
            elem: Some(elem),
            len,
            root,
            ..Call::new(Kind::Broadcast)
        })?;
        if len == 0 {
            return Ok(());
        }
        let storage = self.device_storage(tensor)?;
        self.watched("broadcast", || {
            let mut view = storage.bytes_mut().map_err(cuda)?;
            let capacity = view.len();
            let (at, guard) = view.device_ptr_mut(&self.stream);
            let queued = self.broadcast_at(at, capacity, len * elem.size_in_bytes(), root);
            // Records the view's use on the stream after the broadcast.
            drop(guard);
            queued?;
            self.sync()
        })
    }

    /// `all_reduce_tensor` on a CUDA tensor, all on its device: NCCL's
    /// `ncclAllReduce` in place where the reduction is native, else the
    /// rank-ordered chunk exchange, `comm.cu`'s reduction and all-gather.
    pub(super) fn all_reduce_device(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<()> {
        let _call = self.flight.call();
        let elem = ElemType::from(tensor.dtype());
        let len = tensor.len();
        self.agree(Call {
            elem: Some(elem),
            op: Some(op),
            len,
            ..Call::new(Kind::AllReduce)
        })?;
        if self.size == 1 || len == 0 {
            return Ok(());
        }
        match self.native(elem, op) {
            Some(native) => self.all_reduce_device_native(tensor, native),
            None => self.all_reduce_device_in_rank_order(tensor, op),
        }
    }

    /// `ncclAllReduce` in place on the tensor's buffer.
    fn all_reduce_device_native(&self, tensor: &mut Tensor, native: Native) -> Result<()> {
        let len = tensor.len();
        let storage = self.device_storage(tensor)?;
        self.watched("all_reduce", || {
            // The view is the storage's `len` elements, and the tensor is
            // borrowed until the wait below ends.
            let mut view = storage.bytes_mut().map_err(cuda)?;
            let capacity = view.len();
            let (at, guard) = view.device_ptr_mut(&self.stream);
            let queued = self.queue_all_reduce_at("all_reduce", at, capacity, len, native);
            // Records the view's use on the stream after the reduction.
            drop(guard);
            queued?;
            self.sync()
        })
    }
}
