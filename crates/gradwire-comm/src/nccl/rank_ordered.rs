//! The deterministic reduction on NCCL (`NcclReduction::RankOrdered`, and
//! the operators NCCL cannot do as gradwire promises): NCCL only moves
//! bytes; each rank receives its [`chunk_range`] of every rank's buffer
//! (grouped `ncclSend`/`ncclRecv`), reduces the W chunks in rank order, and
//! the reduced chunks are all-gathered, so results are bitwise LocalComm's
//! and MpiComm's. Host slices reduce on the CPU with LocalComm's kernels
//! (`rank_order.rs`), CUDA tensors on the GPU with `kernels/cuda/comm.cu`
//! (the same bits). Every device buffer is a region of the communicator's
//! scratch.

use gradwire_tensor::Tensor;
use gradwire_tensor::cuda_backend::collective::{self, ChunkOp};
use gradwire_tensor::cudarc::driver::DevicePtrMut;

use super::collectives::{bytes_of, bytes_of_mut};
use super::scratch::{Lease, layout};
use super::stream::beyond;
use super::transport::{NcclTransport, Transfer};
use super::{CudaTransport, NcclComm, cuda, driver};
use crate::communicator::chunk_range;
use crate::element::Element;
use crate::error::{CommError, Result};
use crate::op::ReduceOp;

fn overflow() -> CommError {
    CommError::InvalidArgument("a reduction larger than memory".into())
}

impl<T: NcclTransport> NcclComm<T> {
    /// Queues the exchange both reductions are made of: this rank receives
    /// its chunk of every peer's buffer at `send` (`len` elements of
    /// `elem_bytes` each) into its slot of `stage` (W slots of this rank's
    /// chunk length, back to back). Its own slot is left to the caller.
    ///
    /// # Safety
    ///
    /// `send` is the address of `len * elem_bytes` device bytes and `stage`
    /// of `W * n * elem_bytes` (n this rank's chunk length), both on this
    /// communicator's device, and both stay allocated, and ordered for this
    /// communicator's stream (their guards dropped after this returns),
    /// until the stream has passed the exchange.
    #[allow(unsafe_code)]
    unsafe fn queue_chunk_exchange(
        &self,
        send: u64,
        stage: u64,
        len: usize,
        elem_bytes: usize,
    ) -> Result<()> {
        let (w, me) = (self.size, self.rank);
        let n = chunk_range(len, w, me).len();
        let mut sends = Vec::with_capacity(w);
        let mut recvs = Vec::with_capacity(w);
        for q in (0..w).filter(|&q| q != me) {
            let theirs = chunk_range(len, w, q);
            sends.push(Transfer {
                peer: q,
                ptr: send + (theirs.start * elem_bytes) as u64,
                bytes: theirs.len() * elem_bytes,
            });
            recvs.push(Transfer {
                peer: q,
                ptr: stage + (q * n * elem_bytes) as u64,
                bytes: n * elem_bytes,
            });
        }
        self.queue("chunk exchange", move |comm, queue| {
            // SAFETY: every transfer lies inside `send` (a chunk_range of
            // its length) or `stage` (W * n elements), which the caller
            // keeps until the stream has passed the group (this function's
            // contract).
            unsafe { T::exchange(comm, &sends, &recvs, queue) }
        })
    }

    /// The first half of both host reductions: uploads `send`, exchanges
    /// the chunks in the scratch, and returns every rank's chunk of this
    /// rank's range (the own slot left as it was: the caller reads its own
    /// chunk from `send`).
    fn gather_my_chunks<E: Element>(
        &self,
        op: &'static str,
        send: &[E],
        lease: &mut Lease<'_, T>,
        send_at: usize,
        stage_at: usize,
    ) -> Result<Vec<E>> {
        let (w, len) = (self.size, send.len());
        let size = std::mem::size_of::<E>();
        let n = chunk_range(len, w, self.rank).len();
        let mut stage = vec![E::zeroed(); w * n];
        self.watched(op, || {
            let dev = lease.buffer()?;
            let end = stage_at + stage.len() * size;
            let capacity = T::len(dev);
            if send_at + len * size > capacity || end > capacity {
                return Err(beyond(op, stage_at, stage.len() * size, capacity));
            }
            self.upload(bytes_of(send), dev, send_at)?;
            T::with_address(dev, &self.stream, |base| {
                #[allow(unsafe_code)]
                // SAFETY: the send region (`len` elements) and the stage
                // (W * n) lie in the scratch (checked above), leased until
                // this function returns, after the wait below.
                unsafe {
                    self.queue_chunk_exchange(
                        base + send_at as u64,
                        base + stage_at as u64,
                        len,
                        size,
                    )
                }
            })?;
            self.download(dev, stage_at, bytes_of_mut(&mut stage))?;
            self.sync()
        })?;
        Ok(stage)
    }

    /// Reduces this rank's chunk in rank order on the CPU into `out`: the
    /// own chunk from `own`, the others from `stage`.
    fn reduce_on_host<E: Element>(
        &self,
        stage: &[E],
        own: &[E],
        op: ReduceOp,
        out: &mut [E],
    ) -> Result<()> {
        let n = out.len();
        let sources: Vec<&[E]> = (0..self.size)
            .map(|q| {
                if q == self.rank {
                    own
                } else {
                    stage.get(q * n..(q + 1) * n).unwrap_or(&[])
                }
            })
            .collect();
        crate::rank_order::in_rank_order(&sources, op, self.size, out)
    }

    /// `all_reduce` on a host slice in rank order: chunk exchange, the
    /// CPU's reduction of this rank's chunk, in-place all-gather of the
    /// reduced chunks (in blocks as long as the largest chunk).
    pub(super) fn all_reduce_in_rank_order<E: Element>(
        &self,
        buf: &mut [E],
        op: ReduceOp,
    ) -> Result<()> {
        let (w, me, len) = (self.size, self.rank, buf.len());
        let size = std::mem::size_of::<E>();
        let mine = chunk_range(len, w, me);
        let block = chunk_range(len, w, 0).len() * size;
        let stage_bytes = w.checked_mul(mine.len() * size).ok_or_else(overflow)?;
        let ([send_r, stage_r, gather_r], total) = layout([
            len * size,
            stage_bytes,
            w.checked_mul(block).ok_or_else(overflow)?,
        ])
        .ok_or_else(overflow)?;
        let mut lease = self.scratch.lease(total, &self.stream)?;
        let stage =
            self.gather_my_chunks("all_reduce", buf, &mut lease, send_r.start, stage_r.start)?;
        let mut out = vec![E::zeroed(); mine.len()];
        self.reduce_on_host(&stage, buf.get(mine).unwrap_or(&[]), op, &mut out)?;
        self.watched("all_reduce", || {
            let dev = lease.buffer()?;
            self.upload(bytes_of(&out), dev, gather_r.start + me * block)?;
            self.all_gather_in_place("all-gather of chunks", dev, gather_r.start, block)?;
            for q in 0..w {
                let range = chunk_range(len, w, q);
                let part = buf.get_mut(range).unwrap_or(&mut []);
                self.download(dev, gather_r.start + q * block, bytes_of_mut(part))?;
            }
            self.sync()
        })
    }

    /// `reduce_scatter` on host slices in rank order: chunk exchange and
    /// the CPU's reduction of this rank's chunk into `recv`.
    pub(super) fn reduce_scatter_in_rank_order<E: Element>(
        &self,
        send: &[E],
        recv: &mut [E],
        op: ReduceOp,
    ) -> Result<()> {
        let (w, len) = (self.size, send.len());
        let size = std::mem::size_of::<E>();
        let mine = chunk_range(len, w, self.rank);
        let stage_bytes = w.checked_mul(mine.len() * size).ok_or_else(overflow)?;
        let ([send_r, stage_r], total) = layout([len * size, stage_bytes]).ok_or_else(overflow)?;
        let mut lease = self.scratch.lease(total, &self.stream)?;
        let stage = self.gather_my_chunks(
            "reduce_scatter",
            send,
            &mut lease,
            send_r.start,
            stage_r.start,
        )?;
        self.reduce_on_host(&stage, send.get(mine).unwrap_or(&[]), op, recv)
    }
}

impl NcclComm<CudaTransport> {
    /// `all_reduce_tensor` on a CUDA tensor in rank order, all on its
    /// device: the chunk exchange from the tensor into the scratch, the own
    /// chunk copied beside it, `comm.cu`'s reduction into this rank's block
    /// of the gather region, the in-place all-gather, and the blocks copied
    /// back into the tensor.
    pub(super) fn all_reduce_device_in_rank_order(
        &self,
        tensor: &mut Tensor,
        op: ReduceOp,
    ) -> Result<()> {
        let chunk_op = match op {
            ReduceOp::Sum => ChunkOp::Sum,
            ReduceOp::Avg => ChunkOp::Avg,
            ReduceOp::Max => ChunkOp::Max,
            ReduceOp::Min => ChunkOp::Min,
        };
        let dtype = tensor.dtype();
        let (w, me, len) = (self.size, self.rank, tensor.len());
        let size = dtype.size_in_bytes();
        let mine = chunk_range(len, w, me);
        let n = mine.len();
        let block = chunk_range(len, w, 0).len() * size;
        let stage_bytes = w.checked_mul(n * size).ok_or_else(overflow)?;
        let gather_bytes = w.checked_mul(block).ok_or_else(overflow)?;
        let ([stage_r, gather_r], total) =
            layout([stage_bytes, gather_bytes]).ok_or_else(overflow)?;
        let mut lease = self.scratch.lease(total, &self.stream)?;
        let storage = self.device_storage(tensor)?;
        self.watched("all_reduce", || {
            let dev = lease.buffer()?;
            if dev.len() < total {
                return Err(beyond("all_reduce", 0, total, dev.len()));
            }
            let mut view = storage.bytes_mut().map_err(cuda)?;
            if view.len() != len * size {
                return Err(beyond("all_reduce", 0, len * size, view.len()));
            }
            {
                let (t, tensor_guard) = view.device_ptr_mut(&self.stream);
                let (s, scratch_guard) = dev.device_ptr_mut(&self.stream);
                #[allow(unsafe_code)]
                // SAFETY: the tensor's view is `len` elements (checked
                // above) and the stage region W * n of the scratch (laid
                // out above, the scratch checked to hold it); the tensor is
                // borrowed and the scratch leased until the wait below.
                let queued =
                    unsafe { self.queue_chunk_exchange(t, s + stage_r.start as u64, len, size) };
                drop(tensor_guard);
                drop(scratch_guard);
                queued?;
            }
            let missing = || CommError::InvalidArgument("a chunk beyond its buffer".into());
            if n > 0 {
                // The own chunk: a device-to-device copy, never sent to
                // itself.
                let src = view
                    .try_slice(mine.start * size..mine.end * size)
                    .ok_or_else(missing)?;
                let slot = stage_r.start + me * n * size;
                let mut dst = dev
                    .try_slice_mut(slot..slot + n * size)
                    .ok_or_else(missing)?;
                self.stream
                    .memcpy_dtod(&src, &mut dst)
                    .map_err(|e| driver("cuMemcpyDtoD", e))?;
            }
            {
                // The reduced chunk goes straight into this rank's block
                // of the gather region (a block as long as the largest
                // chunk: the tail is never read back).
                let (front, mut back) = dev.try_split_at_mut(gather_r.start).ok_or_else(missing)?;
                let stage = front.try_slice(stage_r.clone()).ok_or_else(missing)?;
                let mut out = back
                    .try_slice_mut(me * block..me * block + n * size)
                    .ok_or_else(missing)?;
                collective::reduce_chunks_bytes(
                    &self.device,
                    dtype,
                    &mut out,
                    &stage,
                    w,
                    chunk_op,
                    &self.stream,
                )
                .map_err(cuda)?;
            }
            self.all_gather_in_place("all-gather of chunks", dev, gather_r.start, block)?;
            for q in 0..w {
                let range = chunk_range(len, w, q);
                if range.is_empty() {
                    continue;
                }
                let bytes = range.len() * size;
                let at = gather_r.start + q * block;
                let src = dev.try_slice(at..at + bytes).ok_or_else(missing)?;
                let mut dst = view
                    .try_slice_mut(range.start * size..range.end * size)
                    .ok_or_else(missing)?;
                self.stream
                    .memcpy_dtod(&src, &mut dst)
                    .map_err(|e| driver("cuMemcpyDtoD", e))?;
            }
            self.sync()
        })
    }
}
