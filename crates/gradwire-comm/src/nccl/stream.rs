//! The caller's side of every NCCL call: queue the work on the owner
//! thread, copy between host memory and the communicator's scratch on its
//! stream, and wait for the stream under the watchdog.
//!
//! Everything a communicator does runs on its one stream, in the order it
//! was queued; a call is one [`NcclComm::watched`] wait around its copies,
//! its NCCL work and the synchronisation that ends it, so no step of it
//! can block past the deadline, and a failure inside it aborts the
//! communicator (the collective is half done on some rank: nothing else
//! is safe).

use gradwire_tensor::cudarc::driver::sys::CUstream;
use gradwire_tensor::cudarc::driver::{CudaSlice, DevicePtrMut};

use super::sys::{self, RawComm};
use super::{NcclComm, driver};
use crate::error::{CommError, Result};

impl NcclComm {
    /// Queues NCCL work on the owner thread: `issue` gets the communicator
    /// and this communicator's stream, and queues work there. Returns once
    /// queued (not done); the caller keeps every buffer the work touches
    /// alive until the stream has passed it (its wait, or the outbox).
    pub(super) fn queue<F>(&self, op: &'static str, issue: F) -> Result<()>
    where
        F: FnOnce(&RawComm, CUstream) -> Result<()> + Send + 'static,
    {
        // A raw pointer is not Send: it crosses as an address.
        let stream = self.stream.cu_stream() as usize;
        self.owner.call(op, self.config.timeout, move |comm| {
            issue(comm, stream as CUstream)
        })
    }

    /// Queues NCCL's `ncclAllReduce` in place on the first `len` elements
    /// of `buf` (of NCCL's `dtype`), refusing a buffer shorter than that.
    /// The caller keeps `buf` alive, and reads it only after the stream has
    /// passed the call (its wait, inside [`NcclComm::watched`]); every rank
    /// must queue the same call (the header exchange has checked it).
    pub(super) fn queue_all_reduce_in_place<B: DevicePtrMut<u8>>(
        &self,
        what: &'static str,
        buf: &mut B,
        len: usize,
        (dtype, op): (sys::DataType, sys::RedOp),
    ) -> Result<()> {
        let size = sys::datatype_size(dtype);
        if len.checked_mul(size).is_none_or(|b| b > buf.len()) {
            return Err(beyond(what, 0, len.saturating_mul(size), buf.len()));
        }
        let (p, guard) = buf.device_ptr_mut(&self.stream);
        let queued = self.queue(what, move |comm, stream| {
            #[allow(unsafe_code)]
            // SAFETY: `len` elements of `dtype` at `p`, checked within the
            // buffer, which the caller keeps alive until its wait on the
            // stream.
            unsafe {
                sys::ops::all_reduce(comm, p, p, len, dtype, op, stream)
            }
        });
        drop(guard);
        queued
    }

    /// Runs `body`, which queues work and blocks until the stream has done
    /// it, as one wait the watchdog watches (deadline, asynchronous
    /// errors, poisoning from another thread). Returns the reason the
    /// watchdog aborted the communicator if it did; an error of `body`
    /// aborts it too (the peers' halves of the collective would never
    /// complete otherwise), so every later call fails with it.
    pub(super) fn watched<R>(
        &self,
        op: &'static str,
        body: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        self.owner.watch.begin(op)?;
        let result = body();
        match self.owner.watch.end() {
            Some(reason) => Err(reason),
            None => result.inspect_err(|e| self.owner.watch.abort_with(e.clone())),
        }
    }

    /// Waits until everything queued on the stream is done. Call inside
    /// [`NcclComm::watched`]: CUDA's synchronisation has no deadline of
    /// its own (the watchdog's abort ends it).
    pub(super) fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver("cuStreamSynchronize", e))
    }

    /// Copies host bytes into `dst` at byte offset `at`, on the stream.
    /// Returns once the host bytes are consumed (CUDA stages pageable
    /// memory before returning), which may wait for earlier work on the
    /// stream: call inside [`NcclComm::watched`].
    pub(super) fn upload(&self, src: &[u8], dst: &mut CudaSlice<u8>, at: usize) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let len = dst.len();
        let mut view = at
            .checked_add(src.len())
            .and_then(|end| dst.try_slice_mut(at..end))
            .ok_or_else(|| beyond("upload", at, src.len(), len))?;
        self.stream
            .memcpy_htod(src, &mut view)
            .map_err(|e| driver("cuMemcpyHtoD", e))
    }

    /// Copies `dst.len()` bytes of `src` from byte offset `at` to the host,
    /// on the stream, after the work queued before it. Call inside
    /// [`NcclComm::watched`], and [`NcclComm::sync`] before reading `dst`
    /// (a copy to page-locked memory returns before it is done).
    pub(super) fn download(&self, src: &CudaSlice<u8>, at: usize, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let view = at
            .checked_add(dst.len())
            .and_then(|end| src.try_slice(at..end))
            .ok_or_else(|| beyond("download", at, dst.len(), src.len()))?;
        self.stream
            .memcpy_dtoh(&view, dst)
            .map_err(|e| driver("cuMemcpyDtoH", e))
    }

    /// `ncclAllGather` in place in `buf`: rank r's block of `block` bytes
    /// at offset `at + r * block` goes to every rank's same place. Queued
    /// only; the range is checked here against the buffer, which the
    /// caller holds until its wait ends.
    pub(super) fn all_gather_in_place(
        &self,
        op: &'static str,
        buf: &mut CudaSlice<u8>,
        at: usize,
        block: usize,
    ) -> Result<()> {
        block
            .checked_mul(self.size)
            .and_then(|bytes| bytes.checked_add(at))
            .filter(|&end| end <= buf.len())
            .ok_or_else(|| beyond(op, at, block.saturating_mul(self.size), buf.len()))?;
        if block == 0 {
            return Ok(());
        }
        let rank = self.rank;
        let (base, guard) = buf.device_ptr_mut(&self.stream);
        let recv = base + at as u64;
        let send = recv + (rank * block) as u64;
        let queued = self.queue(op, move |comm, stream| {
            #[allow(unsafe_code)]
            // SAFETY: W blocks of `block` bytes from `recv` lie inside the
            // buffer (checked above), which the caller holds until the
            // stream has passed the call; `send` is this rank's block of
            // it, NCCL's in-place all-gather.
            unsafe {
                sys::ops::all_gather(comm, send, recv, block, stream)
            }
        });
        // Records the buffer's use on the stream after the queued call.
        drop(guard);
        queued
    }
}

impl NcclComm {
    /// `ncclBroadcast` of the first `bytes` bytes of `buf` in place from
    /// `root`. Queued only; the range is checked here against the buffer
    /// (a scratch or a tensor's bytes), which the caller holds until its
    /// wait ends.
    pub(super) fn broadcast_in_place<B: DevicePtrMut<u8>>(
        &self,
        buf: &mut B,
        bytes: usize,
        root: usize,
    ) -> Result<()> {
        if buf.len() < bytes {
            return Err(beyond("broadcast", 0, bytes, buf.len()));
        }
        if bytes == 0 {
            return Ok(());
        }
        let (p, guard) = buf.device_ptr_mut(&self.stream);
        let queued = self.queue("broadcast", move |comm, stream| {
            #[allow(unsafe_code)]
            // SAFETY: `bytes` bytes at `p` lie inside the buffer (checked
            // above), which the caller holds until the stream has passed
            // the call.
            unsafe {
                sys::ops::broadcast(comm, p, bytes, root, stream)
            }
        });
        drop(guard);
        queued
    }
}

/// A range outside a device buffer: a bug in this module's arithmetic,
/// refused rather than handed to NCCL.
pub(super) fn beyond(op: &str, at: usize, bytes: usize, len: usize) -> CommError {
    CommError::InvalidArgument(format!(
        "{op}: {bytes} bytes at offset {at} of a device buffer of {len}"
    ))
}
