//! NcclComm's [`Communicator`] implementation: the header exchange that
//! precedes every collective, and the collectives on host slices.
//!
//! Each host collective is one upload of the slice into the communicator's
//! scratch, one NCCL call in place there, one download: `ncclAllReduce` /
//! `ncclReduceScatter` where NCCL's arithmetic keeps gradwire's promises
//! (`NcclReduction::Native`, see `sys::red_op`), `ncclBroadcast`, an
//! in-place `ncclAllGather`. The rank-ordered reductions are in
//! `rank_ordered.rs`, the CUDA-tensor paths in `device.rs`, point to point
//! in `p2p.rs`.

use gradwire_tensor::{Storage, Tensor};

use super::NcclComm;
use super::scratch::layout;
use super::stream::beyond;
use super::transport::{Native, NcclTransport};
use crate::communicator::{Communicator, Gathered, chunk_range};
use crate::element::Element;
use crate::error::{CommError, Result};
use crate::header::{self, Call, Kind, WORDS};
use crate::job_slot::{AsyncJob, JobSlot};
use crate::op::ReduceOp;
use crate::pending::Pending;

/// Bytes of one encoded call.
const HEADER_BYTES: usize = WORDS * 8;

/// Bytes of a host slice.
pub(super) fn bytes_of<E: Element>(s: &[E]) -> &[u8] {
    bytemuck::cast_slice(s)
}

/// Bytes of a mutable host slice.
pub(super) fn bytes_of_mut<E: Element>(s: &mut [E]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// NcclComm's header exchange: an all-gather in place in the scratch, on
/// the device, under the watchdog.
impl<T: NcclTransport> crate::protocol::HeaderTransport for NcclComm<T> {
    fn gather_headers<R>(
        &self,
        _op: &'static str,
        mine: [i64; header::WORDS],
        then: impl FnOnce(&[i64]) -> Result<R>,
    ) -> Result<R> {
        if let Some(reason) = self.owner.aborted() {
            return Err(reason);
        }
        self.reap()?;
        let mut bytes = [0u8; HEADER_BYTES];
        for (out, word) in bytes.chunks_exact_mut(8).zip(mine) {
            out.copy_from_slice(&word.to_le_bytes());
        }
        let mut all = vec![0u8; HEADER_BYTES * self.size];
        {
            let mut lease = self.scratch.lease(all.len(), &self.stream)?;
            self.watched("header exchange", || {
                let buf = lease.buffer()?;
                self.upload(&bytes, buf, self.rank * HEADER_BYTES)?;
                self.all_gather_in_place("header exchange", buf, 0, HEADER_BYTES)?;
                self.download(buf, 0, &mut all)?;
                self.sync()
            })?;
        }
        let words: Vec<i64> = all
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        debug_assert_eq!(words.len(), WORDS * self.size);
        then(&words)
    }

    fn poison(&self, err: CommError) -> CommError {
        self.owner.poison(err.clone());
        err
    }

    fn flight(&self) -> &crate::flight::FlightRecorder {
        &self.flight
    }
}

impl<T: NcclTransport> NcclComm<T> {
    /// The agreement on `call` ([`crate::protocol::agree`]) over this
    /// communicator's header exchange.
    pub(super) fn agree(&self, call: Call) -> Result<Vec<Call>> {
        crate::protocol::agree(self, call)
    }

    /// `all_reduce` with NCCL's `ncclAllReduce`, in place in the scratch.
    fn all_reduce_native<E: Element>(&self, buf: &mut [E], native: Native) -> Result<()> {
        let len = buf.len();
        let bytes = std::mem::size_of_val(buf);
        let mut lease = self.scratch.lease(bytes, &self.stream)?;
        self.watched("all_reduce", || {
            let dev = lease.buffer()?;
            self.upload(bytes_of(buf), dev, 0)?;
            // The scratch is leased at least `bytes` long, held until the
            // wait below ends.
            self.queue_all_reduce_in_place("all_reduce", dev, len, native)?;
            self.download(dev, 0, bytes_of_mut(buf))?;
            self.sync()
        })
    }

    /// `reduce_scatter` with NCCL's `ncclReduceScatter`. NCCL's blocks are
    /// equal; gradwire's chunks differ by at most one element, so each
    /// chunk is uploaded to a block as long as the largest chunk (the
    /// padding is reduced along and never read back).
    fn reduce_scatter_native<E: Element>(
        &self,
        send: &[E],
        recv: &mut [E],
        native: Native,
    ) -> Result<()> {
        let (w, len) = (self.size, send.len());
        let size = std::mem::size_of::<E>();
        let most = chunk_range(len, w, 0).len();
        if most == 0 {
            return Ok(());
        }
        let block = most * size;
        let total = block.checked_mul(w).ok_or(CommError::InvalidArgument(
            "reduce_scatter larger than memory".into(),
        ))?;
        let ([from, into], bytes) = layout([total, block])
            .ok_or_else(|| CommError::InvalidArgument("reduce_scatter scratch overflows".into()))?;
        let mut lease = self.scratch.lease(bytes, &self.stream)?;
        self.watched("reduce_scatter", || {
            let dev = lease.buffer()?;
            if len % w == 0 {
                // Blocks and chunks coincide.
                self.upload(bytes_of(send), dev, from.start)?;
            } else {
                for q in 0..w {
                    let chunk = send.get(chunk_range(len, w, q)).unwrap_or(&[]);
                    self.upload(bytes_of(chunk), dev, from.start + q * block)?;
                }
            }
            if T::len(dev) < into.end {
                return Err(beyond("reduce_scatter", into.start, block, T::len(dev)));
            }
            T::with_address(dev, &self.stream, |base| {
                let (s, r) = (base + from.start as u64, base + into.start as u64);
                self.queue("reduce_scatter", move |comm, queue| {
                    #[allow(unsafe_code)]
                    // SAFETY: W blocks of `most` elements at `s` and one at
                    // `r`, disjoint ranges of the scratch (laid out above,
                    // leased at least `bytes` long), held until the wait
                    // below ends.
                    unsafe {
                        T::reduce_scatter(comm, s, r, most, native, queue)
                    }
                })
            })?;
            // This rank's chunk: the first `recv.len()` elements of its block.
            self.download(dev, into.start, bytes_of_mut(recv))?;
            self.sync()
        })
    }
}

impl<T: NcclTransport> Communicator for NcclComm<T> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn flight_records(&self) -> Vec<crate::FlightRecord> {
        self.flight.records()
    }

    fn timeline(&self) -> Option<&crate::TimelineTrack> {
        self.flight.timeline()
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce<E: Element>(&self, buf: &mut [E], op: ReduceOp) -> Result<()> {
        let _call = self.flight.call();
        self.agree(Call {
            elem: Some(E::TYPE),
            op: Some(op),
            len: buf.len(),
            ..Call::new(Kind::AllReduce)
        })?;
        if self.size == 1 || buf.is_empty() {
            return Ok(());
        }
        match self.native(E::TYPE, op) {
            Some(native) => self.all_reduce_native(buf, native),
            None => self.all_reduce_in_rank_order(buf, op),
        }
    }

    fn broadcast<E: Element>(&self, buf: &mut [E], root: usize) -> Result<()> {
        let _call = self.flight.call();
        self.agree(Call {
            elem: Some(E::TYPE),
            len: buf.len(),
            root,
            ..Call::new(Kind::Broadcast)
        })?;
        if buf.is_empty() {
            return Ok(());
        }
        let bytes = std::mem::size_of_val(buf);
        let mut lease = self.scratch.lease(bytes, &self.stream)?;
        self.watched("broadcast", || {
            let dev = lease.buffer()?;
            // Only the root's bytes matter; the others' are overwritten.
            if self.rank == root {
                self.upload(bytes_of(buf), dev, 0)?;
            }
            self.broadcast_in_place(dev, bytes, root)?;
            self.download(dev, 0, bytes_of_mut(buf))?;
            self.sync()
        })
    }

    fn all_gather<E: Element>(&self, send: &[E], recv: &mut [E]) -> Result<()> {
        let _call = self.flight.call();
        self.agree(Call {
            elem: Some(E::TYPE),
            len: send.len(),
            recv_len: recv.len(),
            ..Call::new(Kind::AllGather)
        })?;
        if recv.is_empty() {
            return Ok(());
        }
        // Validated: recv holds W blocks of send's length.
        let block = std::mem::size_of_val(send);
        let mut lease = self
            .scratch
            .lease(std::mem::size_of_val(recv), &self.stream)?;
        self.watched("all_gather", || {
            let dev = lease.buffer()?;
            self.upload(bytes_of(send), dev, self.rank * block)?;
            self.all_gather_in_place("all_gather", dev, 0, block)?;
            self.download(dev, 0, bytes_of_mut(recv))?;
            self.sync()
        })
    }

    fn all_gather_varied<E: Element>(&self, send: &[E]) -> Result<Gathered<E>> {
        let _call = self.flight.call();
        // The header exchange carries every rank's count.
        let calls = self.agree(Call {
            elem: Some(E::TYPE),
            len: send.len(),
            ..Call::new(Kind::AllGatherVaried)
        })?;
        let lens: Vec<usize> = calls.iter().map(|c| c.len).collect();
        let most = lens.iter().copied().max().unwrap_or(0);
        let size = std::mem::size_of::<E>();
        let block = most * size;
        let mut data = vec![E::zeroed(); lens.iter().sum()];
        if block > 0 {
            // Every rank sends a block as long as the longest part; the
            // padding is never read back.
            let mut lease = self.scratch.lease(block * self.size, &self.stream)?;
            self.watched("all_gather_varied", || {
                let dev = lease.buffer()?;
                self.upload(bytes_of(send), dev, self.rank * block)?;
                self.all_gather_in_place("all_gather_varied", dev, 0, block)?;
                let mut rest = &mut data[..];
                for (q, &l) in lens.iter().enumerate() {
                    let (part, tail) = rest.split_at_mut(l);
                    self.download(dev, q * block, bytes_of_mut(part))?;
                    rest = tail;
                }
                self.sync()
            })?;
        }
        Gathered::new(data, &lens)
    }

    fn reduce_scatter<E: Element>(&self, send: &[E], recv: &mut [E], op: ReduceOp) -> Result<()> {
        let _call = self.flight.call();
        self.agree(Call {
            elem: Some(E::TYPE),
            op: Some(op),
            len: send.len(),
            recv_len: recv.len(),
            ..Call::new(Kind::ReduceScatter)
        })?;
        if self.size == 1 {
            recv.copy_from_slice(send);
            return Ok(());
        }
        match self.native(E::TYPE, op) {
            Some(native) => self.reduce_scatter_native(send, recv, native),
            None => self.reduce_scatter_in_rank_order(send, recv, op),
        }
    }

    fn send<E: Element>(&self, buf: &[E], dest: usize) -> Result<()> {
        self.check_rank(dest)?;
        self.reap()?;
        if dest == self.rank {
            self.send_to_self(buf);
            return Ok(());
        }
        self.queue_send(buf, dest)
    }

    fn recv<E: Element>(&self, buf: &mut [E], src: usize) -> Result<()> {
        self.check_rank(src)?;
        self.reap()?;
        if src == self.rank {
            return self.receive_from_self(buf);
        }
        self.receive(buf, src)
    }

    fn sendrecv<E: Element>(
        &self,
        send: &[E],
        dest: usize,
        recv: &mut [E],
        src: usize,
    ) -> Result<()> {
        self.check_rank(dest)?;
        self.check_rank(src)?;
        self.reap()?;
        // Through the loopback queue for the half that involves this rank
        // itself (NCCL would pair a send to self only with a receive from
        // self in the same group); the other half goes through NCCL.
        match (dest == self.rank, src == self.rank) {
            (false, false) => self.exchange_with(send, dest, recv, src),
            (true, _) => {
                self.send_to_self(send);
                self.recv(recv, src)
            }
            (false, true) => {
                self.queue_send(send, dest)?;
                self.receive_from_self(recv)
            }
        }
    }

    fn barrier(&self) -> Result<()> {
        crate::protocol::barrier(self)
    }

    fn post_fault(&self, kind: crate::FaultKind) -> CommError {
        crate::protocol::post_fault(self, kind)
    }

    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Self>> {
        let number = self.timeline().map(crate::TimelineTrack::next_split);
        let plan = crate::protocol::split_plan(self, color, key)?;
        let (nccl_color, nccl_key) = plan.get(self.rank).copied().unwrap_or((None, 0));
        let size = color.map_or(0, |_| {
            plan.iter()
                .filter(|(c, _)| c.is_some() && *c == nccl_color)
                .count()
        });
        match self.split_raw(nccl_color, nccl_key)? {
            None => Ok(None),
            Some(owner) => NcclComm::adopt(
                owner,
                usize::try_from(nccl_key).unwrap_or(0),
                size,
                self.device.clone(),
                self.config.clone(),
                true,
                self.timeline().zip(number).map(|(t, n)| t.split(n, color)),
            )
            .map(Some),
        }
    }

    fn run_async<R, F>(&self, job: F) -> Result<Pending<R>>
    where
        R: Send + 'static,
        F: FnOnce(&Self) -> Result<R> + Send + 'static,
    {
        self.lane_worker()?.submit(job)
    }

    fn run_job<J: AsyncJob<Self>>(
        &self,
        slot: &mut JobSlot<J, J::Output>,
        job: J,
    ) -> Result<Pending<J::Output>> {
        self.lane_worker()?.submit_slot(slot, job)
    }

    /// NCCL's transfers need both sides (see [`Communicator::send`]).
    fn eager_messages(&self) -> bool {
        false
    }

    /// CUDA tensors are reduced and broadcast in their own device memory
    /// (`device.rs`).
    fn takes_device_tensors(&self) -> bool {
        true
    }

    fn broadcast_tensor(&self, tensor: &mut Tensor, root: usize) -> Result<()> {
        match tensor.storage() {
            Storage::Cuda(_) => T::broadcast_device(self, tensor, root),
            Storage::Cpu(_) => crate::communicator::broadcast_host_tensor(self, tensor, root),
        }
    }

    fn all_reduce_tensor(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<()> {
        match tensor.storage() {
            Storage::Cuda(_) => T::all_reduce_device(self, tensor, op),
            Storage::Cpu(_) => crate::communicator::all_reduce_host_tensor(self, tensor, op),
        }
    }
}
