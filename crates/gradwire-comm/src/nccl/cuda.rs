//! The CUDA transport: NCCL's calls (`sys.rs`) on a CUDA stream of the
//! rank's device, cudarc's device buffers and events.

use std::sync::Arc;

use gradwire_tensor::cudarc::driver::sys::CUstream;
use gradwire_tensor::cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtrMut};
use gradwire_tensor::{CudaDevice, Tensor};

use super::sys::{self, RawComm, UniqueId};
use super::transport::{Imp, Native, NcclTransport, Transfer};
use super::{NcclComm, driver};
use crate::error::Result;
use crate::op::ReduceOp;

/// NCCL on NVIDIA GPUs, loaded at run time: [`NcclComm`]'s default
/// transport.
#[derive(Debug, Clone, Copy)]
pub struct CudaTransport;

impl NcclTransport for CudaTransport {}

impl Imp for CudaTransport {
    type Device = Arc<CudaDevice>;
    type Comm = RawComm;
    type Abort = sys::AbortHandle;
    type Split = sys::PendingSplit;
    type Stream = Arc<CudaStream>;
    /// A raw stream is not `Send`: it crosses as an address.
    type Queue = usize;
    type Buffer = CudaSlice<u8>;
    type Event = CudaEvent;
    type Id = UniqueId;

    fn load() -> Result<i32> {
        sys::load()
    }

    fn ordinal(device: &Self::Device) -> usize {
        device.ordinal()
    }

    fn bind(device: &Self::Device) -> Result<()> {
        device
            .stream()
            .context()
            .bind_to_thread()
            .map_err(|e| driver("cuCtxSetCurrent", e))
    }

    fn new_stream(device: &Self::Device) -> Result<Self::Stream> {
        device
            .stream()
            .context()
            .new_stream()
            .map_err(|e| driver("cuStreamCreate", e))
    }

    fn queue_of(stream: &Self::Stream) -> usize {
        stream.cu_stream() as usize
    }

    fn init_rank(id: &UniqueId, world: usize, rank: usize) -> Result<RawComm> {
        sys::init_rank(id, world, rank)
    }

    fn split(comm: &RawComm, color: Option<i32>, key: i32) -> Result<sys::PendingSplit> {
        sys::split(comm, color, key)
    }

    fn split_result(split: sys::PendingSplit) -> Result<Option<RawComm>> {
        Ok(split.result())
    }

    fn destroy(comm: RawComm) -> Result<()> {
        sys::destroy(comm)
    }

    fn abort_handle(comm: &RawComm) -> sys::AbortHandle {
        comm.abort_handle()
    }

    #[allow(unsafe_code)]
    unsafe fn abort(handle: sys::AbortHandle) -> Result<()> {
        // SAFETY: the caller's contract is `AbortHandle::abort`'s.
        unsafe { handle.abort() }
    }

    fn async_error(handle: &sys::AbortHandle) -> Result<()> {
        handle.async_error()
    }

    fn progress(handle: &sys::AbortHandle) -> Result<bool> {
        handle.progress()
    }

    #[allow(unsafe_code)]
    unsafe fn all_gather(
        comm: &RawComm,
        send: u64,
        recv: u64,
        bytes: usize,
        queue: &usize,
    ) -> Result<()> {
        // SAFETY: the trait's contract is `sys::ops`'.
        unsafe { sys::ops::all_gather(comm, send, recv, bytes, *queue as CUstream) }
    }

    #[allow(unsafe_code)]
    unsafe fn all_reduce(
        comm: &RawComm,
        send: u64,
        recv: u64,
        count: usize,
        native: Native,
        queue: &usize,
    ) -> Result<()> {
        let (dtype, op) = (sys::datatype(native.elem), sys::red_op(native.op));
        // SAFETY: the trait's contract is `sys::ops`'.
        unsafe { sys::ops::all_reduce(comm, send, recv, count, dtype, op, *queue as CUstream) }
    }

    #[allow(unsafe_code)]
    unsafe fn reduce_scatter(
        comm: &RawComm,
        send: u64,
        recv: u64,
        recv_count: usize,
        native: Native,
        queue: &usize,
    ) -> Result<()> {
        let (dtype, op) = (sys::datatype(native.elem), sys::red_op(native.op));
        // SAFETY: the trait's contract is `sys::ops`'.
        unsafe {
            sys::ops::reduce_scatter(comm, send, recv, recv_count, dtype, op, *queue as CUstream)
        }
    }

    #[allow(unsafe_code)]
    unsafe fn broadcast(
        comm: &RawComm,
        buf: u64,
        bytes: usize,
        root: usize,
        queue: &usize,
    ) -> Result<()> {
        // SAFETY: the trait's contract is `sys::ops`'.
        unsafe { sys::ops::broadcast(comm, buf, bytes, root, *queue as CUstream) }
    }

    #[allow(unsafe_code)]
    unsafe fn exchange(
        comm: &RawComm,
        sends: &[Transfer],
        recvs: &[Transfer],
        queue: &usize,
    ) -> Result<()> {
        // SAFETY: the trait's contract is `sys::ops`'.
        unsafe { sys::ops::exchange(comm, sends, recvs, *queue as CUstream) }
    }

    fn alloc_zeros(stream: &Self::Stream, bytes: usize) -> Result<CudaSlice<u8>> {
        let buffer = stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| driver("cuMemAlloc", e))?;
        gradwire_tensor::note_device_allocation(bytes);
        Ok(buffer)
    }

    fn len(buffer: &CudaSlice<u8>) -> usize {
        buffer.len()
    }

    fn with_address<R>(
        buffer: &mut CudaSlice<u8>,
        stream: &Self::Stream,
        use_at: impl FnOnce(u64) -> R,
    ) -> R {
        let (address, guard) = buffer.device_ptr_mut(stream);
        let result = use_at(address);
        // Records the buffer's use on the stream after the queued work.
        drop(guard);
        result
    }

    fn upload(stream: &Self::Stream, src: &[u8], dst: &mut CudaSlice<u8>, at: usize) -> Result<()> {
        let len = dst.len();
        let mut view = at
            .checked_add(src.len())
            .and_then(|end| dst.try_slice_mut(at..end))
            .ok_or_else(|| super::stream::beyond("upload", at, src.len(), len))?;
        stream
            .memcpy_htod(src, &mut view)
            .map_err(|e| driver("cuMemcpyHtoD", e))
    }

    fn download(
        stream: &Self::Stream,
        src: &CudaSlice<u8>,
        at: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        let view = at
            .checked_add(dst.len())
            .and_then(|end| src.try_slice(at..end))
            .ok_or_else(|| super::stream::beyond("download", at, dst.len(), src.len()))?;
        stream
            .memcpy_dtoh(&view, dst)
            .map_err(|e| driver("cuMemcpyDtoH", e))
    }

    fn sync(stream: &Self::Stream) -> Result<()> {
        stream
            .synchronize()
            .map_err(|e| driver("cuStreamSynchronize", e))
    }

    fn record_event(stream: &Self::Stream) -> Result<CudaEvent> {
        stream
            .record_event(None)
            .map_err(|e| driver("cuEventRecord", e))
    }

    fn event_done(event: &CudaEvent) -> Result<bool> {
        event
            .try_is_complete()
            .map_err(|e| driver("cuEventQuery", e))
    }

    fn broadcast_device(comm: &NcclComm<Self>, tensor: &mut Tensor, root: usize) -> Result<()> {
        comm.broadcast_device(tensor, root)
    }

    fn all_reduce_device(comm: &NcclComm<Self>, tensor: &mut Tensor, op: ReduceOp) -> Result<()> {
        comm.all_reduce_device(tensor, op)
    }
}
