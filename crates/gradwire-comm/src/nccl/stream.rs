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

use super::NcclComm;
use super::transport::{Native, NcclTransport};
use crate::error::{CommError, Result};

impl<T: NcclTransport> NcclComm<T> {
    /// Queues NCCL work on the owner thread: `issue` gets the communicator
    /// and this communicator's stream, and queues work there. Returns once
    /// queued (not done); the caller keeps every buffer the work touches
    /// alive until the stream has passed it (its wait, or the outbox).
    pub(super) fn queue<F>(&self, op: &'static str, issue: F) -> Result<()>
    where
        F: FnOnce(&T::Comm, &T::Queue) -> Result<()> + Send + 'static,
    {
        let queue = T::queue_of(&self.stream);
        self.owner
            .call(op, self.config.timeout, move |comm| issue(comm, &queue))
    }

    /// Queues NCCL's `ncclAllReduce` in place on the first `len` elements
    /// at device address `at`, where `capacity` bytes are available,
    /// refusing a length beyond them. The caller keeps the buffer alive,
    /// and reads it only after the stream has passed the call (its wait,
    /// inside [`NcclComm::watched`]); every rank must queue the same call
    /// (the header exchange has checked it).
    pub(super) fn queue_all_reduce_at(
        &self,
        what: &'static str,
        at: u64,
        capacity: usize,
        len: usize,
        native: Native,
    ) -> Result<()> {
        let size = native.elem.size_in_bytes();
        if len.checked_mul(size).is_none_or(|b| b > capacity) {
            return Err(beyond(what, 0, len.saturating_mul(size), capacity));
        }
        self.queue(what, move |comm, queue| {
            #[allow(unsafe_code)]
            // SAFETY: `len` elements at `at`, checked within the buffer,
            // which the caller keeps alive until its wait on the stream.
            unsafe {
                T::all_reduce(comm, at, at, len, native, queue)
            }
        })
    }

    /// [`NcclComm::queue_all_reduce_at`] on a scratch buffer.
    pub(super) fn queue_all_reduce_in_place(
        &self,
        what: &'static str,
        buf: &mut T::Buffer,
        len: usize,
        native: Native,
    ) -> Result<()> {
        let capacity = T::len(buf);
        T::with_address(buf, &self.stream, |at| {
            self.queue_all_reduce_at(what, at, capacity, len, native)
        })
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
    /// [`NcclComm::watched`]: the synchronisation has no deadline of its
    /// own (the watchdog's abort ends it).
    pub(super) fn sync(&self) -> Result<()> {
        T::sync(&self.stream)
    }

    /// Copies host bytes into `dst` at byte offset `at`, on the stream.
    /// Returns once the host bytes are consumed (CUDA stages pageable
    /// memory before returning), which may wait for earlier work on the
    /// stream: call inside [`NcclComm::watched`].
    pub(super) fn upload(&self, src: &[u8], dst: &mut T::Buffer, at: usize) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        T::upload(&self.stream, src, dst, at)
    }

    /// Copies `dst.len()` bytes of `src` from byte offset `at` to the host,
    /// on the stream, after the work queued before it. Call inside
    /// [`NcclComm::watched`], and [`NcclComm::sync`] before reading `dst`
    /// (a copy to page-locked memory returns before it is done).
    pub(super) fn download(&self, src: &T::Buffer, at: usize, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        T::download(&self.stream, src, at, dst)
    }

    /// `ncclAllGather` in place in `buf`: rank r's block of `block` bytes
    /// at offset `at + r * block` goes to every rank's same place. Queued
    /// only; the range is checked here against the buffer, which the
    /// caller holds until its wait ends.
    pub(super) fn all_gather_in_place(
        &self,
        op: &'static str,
        buf: &mut T::Buffer,
        at: usize,
        block: usize,
    ) -> Result<()> {
        let len = T::len(buf);
        block
            .checked_mul(self.size)
            .and_then(|bytes| bytes.checked_add(at))
            .filter(|&end| end <= len)
            .ok_or_else(|| beyond(op, at, block.saturating_mul(self.size), len))?;
        if block == 0 {
            return Ok(());
        }
        let rank = self.rank;
        T::with_address(buf, &self.stream, |base| {
            let recv = base + at as u64;
            let send = recv + (rank * block) as u64;
            self.queue(op, move |comm, queue| {
                #[allow(unsafe_code)]
                // SAFETY: W blocks of `block` bytes from `recv` lie inside
                // the buffer (checked above), which the caller holds until
                // the stream has passed the call; `send` is this rank's
                // block of it, NCCL's in-place all-gather.
                unsafe {
                    T::all_gather(comm, send, recv, block, queue)
                }
            })
        })
    }

    /// `ncclBroadcast` of `bytes` bytes in place from `root` at device
    /// address `at`, where `capacity` bytes are available. Queued only; the
    /// caller holds the buffer (a scratch or a tensor's bytes) until its
    /// wait ends.
    pub(super) fn broadcast_at(
        &self,
        at: u64,
        capacity: usize,
        bytes: usize,
        root: usize,
    ) -> Result<()> {
        if capacity < bytes {
            return Err(beyond("broadcast", 0, bytes, capacity));
        }
        if bytes == 0 {
            return Ok(());
        }
        self.queue("broadcast", move |comm, queue| {
            #[allow(unsafe_code)]
            // SAFETY: `bytes` bytes at `at` lie inside the buffer (checked
            // above), which the caller holds until the stream has passed
            // the call.
            unsafe {
                T::broadcast(comm, at, bytes, root, queue)
            }
        })
    }

    /// [`NcclComm::broadcast_at`] on a scratch buffer.
    pub(super) fn broadcast_in_place(
        &self,
        buf: &mut T::Buffer,
        bytes: usize,
        root: usize,
    ) -> Result<()> {
        let capacity = T::len(buf);
        T::with_address(buf, &self.stream, |at| {
            self.broadcast_at(at, capacity, bytes, root)
        })
    }
}

/// A range outside a device buffer: a bug in this module's arithmetic,
/// refused rather than handed to NCCL.
pub(super) fn beyond(op: &str, at: usize, bytes: usize, len: usize) -> CommError {
    CommError::InvalidArgument(format!(
        "{op}: {bytes} bytes at offset {at} of a device buffer of {len}"
    ))
}
