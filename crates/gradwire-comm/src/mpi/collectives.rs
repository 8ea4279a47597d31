//! `impl Communicator for MpiComm`: the collectives and point-to-point calls,
//! their header exchange, and the rank-ordered reduction they share.

use super::MpiComm;
use super::deadline::NOTICE_TAG;
use super::sys::{self, HalfKind, Layout, NativeOp, Wire};
use crate::communicator::{Communicator, Gathered, chunk_range};
use crate::element::{ElemType, Element};
use crate::error::{CommError, Result};
use crate::header::{self, Call, Kind};
use crate::job_slot::{AsyncJob, JobSlot};
use crate::op::ReduceOp;
use crate::pending::Pending;
use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl MpiComm {
    /// Open MPI's own `MPI_Allreduce` (its algorithm, its reduction order),
    /// for f32, f64 and the integer types, with `Sum`, `Max` or `Min`, and
    /// the sum of f16 and bf16:
    /// what Horovod and plain MPI programs call, so that a training loop
    /// can be measured against them. The call is agreed first like every
    /// collective here (mismatched lengths or types are a typed error on
    /// every rank, not undefined behaviour), but the sum is MPI's: it is
    /// the same on every rank in Open MPI's algorithms, yet not guaranteed
    /// bitwise equal to gradwire's rank-ordered [`Communicator::all_reduce`].
    ///
    /// f16 and bf16 are summed by a user-defined MPI operation (MPI cannot
    /// add them), each pair added in f32 and rounded once, as Horovod's
    /// float16 sum does (gradwire's own all-reduce accumulates in f32).
    ///
    /// # Errors
    /// [`CommError::Unsupported`] for `Avg` (MPI has no mean: sum and
    /// divide) and for `Max` or `Min` of f16 and bf16; the errors of any
    /// collective.
    pub fn library_all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let half = match T::TYPE {
            ElemType::F16 => Some(HalfKind::F16),
            ElemType::BF16 => Some(HalfKind::BF16),
            _ => None,
        };
        // Refused alike on every rank (the same op and type everywhere, or
        // the agreement below would have failed first) before any round.
        let supported = match (op, half) {
            (ReduceOp::Sum, Some(kind)) => Some(NativeOp::HalfSum(kind)),
            (_, Some(_)) | (ReduceOp::Avg, None) => None,
            (ReduceOp::Sum, None) => Some(NativeOp::Sum),
            (ReduceOp::Max, None) => Some(NativeOp::Max),
            (ReduceOp::Min, None) => Some(NativeOp::Min),
        };
        let _busy = self.busy();
        self.agree(Call {
            elem: Some(T::TYPE),
            op: Some(op),
            len: buf.len(),
            ..Call::new(Kind::LibraryAllReduce)
        })?;
        let native = supported.ok_or_else(|| {
            CommError::Unsupported(format!(
                "MPI_Allreduce of {:?} with {op:?} (it takes Sum, Max or Min of f32, f64 and \
                 integers, and Sum of f16 and bf16)",
                T::TYPE
            ))
        })?;
        if self.size == 1 || buf.is_empty() {
            return Ok(());
        }
        // MPI_IN_PLACE is not among rsmpi's handles: the input is staged.
        self.with_scratch::<T, _>(buf.len(), |send| {
            send.copy_from_slice(buf);
            sys::all_reduce(self.comm, wire::<T>(), send, buf, native)
        })
    }

    /// The agreement on `call` ([`crate::protocol::agree`]) over this
    /// communicator's header exchange.
    pub(super) fn agree(&self, call: Call) -> Result<Vec<Call>> {
        crate::protocol::agree(self, call)
    }

    /// Borrows the reusable staging area as `n` elements of `T`.
    fn with_scratch<T: Element, R>(&self, n: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
        let mut scratch = self.scratch.borrow_mut();
        let words = (n * std::mem::size_of::<T>()).div_ceil(8);
        if scratch.len() < words {
            scratch.resize(words, 0);
        }
        let all: &mut [T] = bytemuck::cast_slice_mut(&mut scratch[..words]);
        f(&mut all[..n])
    }

    /// The reduction both `all_reduce` and `reduce_scatter` are made of: this
    /// rank's chunk of every rank's `send` arrives (`MPI_Alltoallv`) and is
    /// reduced in rank order into `out` (this rank's chunk of the result).
    fn reduce_chunk<T: Element>(
        &self,
        send: &[T],
        op: ReduceOp,
        stage: &mut [T],
        out: &mut [T],
    ) -> Result<()> {
        let (w, me, len) = (self.size, self.rank, send.len());
        let mine = chunk_range(len, w, me);
        let n = mine.len();
        let mut send_counts = vec![0 as c_int; w];
        let mut send_displs = vec![0 as c_int; w];
        let mut recv_counts = vec![0 as c_int; w];
        let mut recv_displs = vec![0 as c_int; w];
        for q in 0..w {
            let theirs = chunk_range(len, w, q);
            send_displs[q] = sys::int("offset", theirs.start)?;
            recv_displs[q] = sys::int("offset", q * n)?;
            // This rank's own chunk is read in place, never sent to itself.
            if q != me {
                send_counts[q] = sys::int("chunk", theirs.len())?;
                recv_counts[q] = sys::int("chunk", n)?;
            }
        }
        sys::all_to_all_varied(
            self.comm,
            wire::<T>(),
            send,
            Layout {
                counts: &send_counts,
                displs: &send_displs,
            },
            stage,
            Layout {
                counts: &recv_counts,
                displs: &recv_displs,
            },
        )?;
        let own = send.get(mine).unwrap_or(&[]);
        let sources: Vec<&[T]> = (0..w)
            .map(|q| {
                if q == me {
                    own
                } else {
                    stage.get(q * n..(q + 1) * n).unwrap_or(&[])
                }
            })
            .collect();
        crate::rank_order::in_rank_order(&sources, op, w, out)
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank < self.size {
            Ok(())
        } else {
            Err(CommError::InvalidRank {
                rank,
                world_size: self.size,
            })
        }
    }
}

/// How elements of `T` travel: as themselves, the half types as 16-bit
/// words (MPI only moves them; gradwire reduces them).
fn wire<T: Element>() -> Wire {
    match T::TYPE {
        ElemType::F16 | ElemType::BF16 => Wire::U16,
        ElemType::F32 => Wire::F32,
        ElemType::F64 => Wire::F64,
        ElemType::U8 => Wire::U8,
        ElemType::U32 => Wire::U32,
        ElemType::U64 => Wire::U64,
        ElemType::I32 => Wire::I32,
        ElemType::I64 => Wire::I64,
    }
}

/// The tag a point-to-point message of `elem` travels with.
fn tag_of(elem: ElemType) -> c_int {
    ElemType::ALL
        .iter()
        .position(|&e| e == elem)
        .map_or(0, |i| i as c_int + 1)
}

fn elem_of(tag: c_int) -> Option<ElemType> {
    usize::try_from(tag)
        .ok()
        .and_then(|t| t.checked_sub(1))
        .and_then(|i| ElemType::ALL.get(i).copied())
}

impl Communicator for MpiComm {
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

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let _busy = self.busy();
        self.agree(Call {
            elem: Some(T::TYPE),
            op: Some(op),
            len: buf.len(),
            ..Call::new(Kind::AllReduce)
        })?;
        let (w, len) = (self.size, buf.len());
        // One rank: the result is the input, for every op (Avg: x / 1 == x).
        if w == 1 || len == 0 {
            return Ok(());
        }
        sys::int("all_reduce length", len)?;
        // Cut into segments that stay in cache from their arrival through
        // the reduction to their departure: an element's result does not
        // depend on the segment it is in (its rank-order reduction is the
        // same), so segmenting changes no bit, only the memory traffic.
        let seg_len = (self.segment_bytes / std::mem::size_of::<T>()).max(w);
        let most = chunk_range(seg_len.min(len), w, 0).len();
        self.with_scratch::<T, _>(w * most + most, |scratch| {
            let (stage, out) = scratch.split_at_mut(w * most);
            for start in (0..len).step_by(seg_len) {
                let seg = start..(start + seg_len).min(len);
                let Some(part) = buf.get_mut(seg) else {
                    break;
                };
                let seg_len = part.len();
                let n = chunk_range(seg_len, w, self.rank).len();
                // Same on every rank (validated length): everyone fails alike.
                let counts = (0..w)
                    .map(|q| sys::int("chunk", chunk_range(seg_len, w, q).len()))
                    .collect::<Result<Vec<_>>>()?;
                let displs = (0..w)
                    .map(|q| sys::int("offset", chunk_range(seg_len, w, q).start))
                    .collect::<Result<Vec<_>>>()?;
                let (stage, out) = (&mut stage[..w * n], &mut out[..n]);
                self.reduce_chunk(part, op, stage, out)?;
                sys::all_gather_varied(self.comm, wire::<T>(), out, part, &counts, &displs)?;
            }
            Ok(())
        })
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let _busy = self.busy();
        self.agree(Call {
            elem: Some(T::TYPE),
            len: buf.len(),
            root,
            ..Call::new(Kind::Broadcast)
        })?;
        sys::broadcast(self.comm, wire::<T>(), buf, root)
    }

    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let _busy = self.busy();
        self.agree(Call {
            elem: Some(T::TYPE),
            len: send.len(),
            recv_len: recv.len(),
            ..Call::new(Kind::AllGather)
        })?;
        sys::all_gather(self.comm, wire::<T>(), send, recv)
    }

    fn all_gather_varied<T: Element>(&self, send: &[T]) -> Result<Gathered<T>> {
        let _busy = self.busy();
        // The header exchange carries every rank's count: counts first.
        let calls = self.agree(Call {
            elem: Some(T::TYPE),
            len: send.len(),
            ..Call::new(Kind::AllGatherVaried)
        })?;
        let lens: Vec<usize> = calls.iter().map(|c| c.len).collect();
        let mut counts = Vec::with_capacity(lens.len());
        let mut displs = Vec::with_capacity(lens.len());
        let mut total = 0usize;
        for &l in &lens {
            displs.push(sys::int("all_gather_varied offset", total)?);
            counts.push(sys::int("all_gather_varied count", l)?);
            total += l;
        }
        sys::int("all_gather_varied total", total)?;
        let mut data = vec![T::zeroed(); total];
        sys::all_gather_varied(self.comm, wire::<T>(), send, &mut data, &counts, &displs)?;
        Gathered::new(data, &lens)
    }

    fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let _busy = self.busy();
        self.agree(Call {
            elem: Some(T::TYPE),
            op: Some(op),
            len: send.len(),
            recv_len: recv.len(),
            ..Call::new(Kind::ReduceScatter)
        })?;
        let n = recv.len();
        self.with_scratch::<T, _>(self.size * n, |stage| {
            self.reduce_chunk(send, op, stage, recv)
        })
    }

    fn send<T: Element>(&self, buf: &[T], dest: usize) -> Result<()> {
        let _busy = self.busy();
        self.check_rank(dest)?;
        self.enter("send")?;
        self.check_notice(None)?;
        let bytes = bytemuck::cast_slice::<T, u8>(buf).to_vec();
        let outgoing = sys::isend(self.comm, bytes, dest, tag_of(T::TYPE))?;
        self.outbox.borrow_mut().push(outgoing);
        Ok(())
    }

    fn recv<T: Element>(&self, buf: &mut [T], src: usize) -> Result<()> {
        let _busy = self.busy();
        self.check_rank(src)?;
        self.enter("recv")?;
        // What the sender sent before it left (or gave up) is still
        // received: a first look before the notices.
        let mut found = sys::improbe(self.comm, Some(src), None)?;
        if found.is_none()
            && let Err(err) = self.heed_notices(None)
        {
            // One last look, as `poll` takes: the message may have come
            // after the notice.
            found = sys::improbe(self.comm, Some(src), None)?;
            if found.is_none() {
                return Err(err);
            }
        }
        self.poll("recv", &[src], None, || {
            if found.is_none() {
                found = sys::improbe(self.comm, Some(src), None)?;
            }
            Ok(found.is_some())
        })?;
        let Some(probed) = found else {
            return Err(CommError::Mpi {
                op: "MPI_Improbe",
                code: -1,
                message: "a receive ended without a message".into(),
            });
        };
        if probed.tag == NOTICE_TAG {
            // The sender gave up or left before it sent what this rank
            // waits for; or the notice was for an earlier communicator of
            // this context, ignored: the message is still to come.
            self.take_notice(probed)?;
            self.heed_notices(None)?;
            return self.recv(buf, src);
        }
        let want = std::mem::size_of_val(buf);
        match elem_of(probed.tag) {
            Some(elem) if elem == T::TYPE && probed.bytes == want => {
                probed.receive(bytemuck::cast_slice_mut::<T, u8>(buf))
            }
            elem => {
                // Consume the message, as LocalComm does: the next recv must
                // not find it again.
                let bytes = probed.bytes;
                probed.receive(&mut vec![0u8; bytes])?;
                let (len, name) = match elem {
                    Some(e) => (bytes / e.size_in_bytes(), e.as_str()),
                    None => (bytes, "unknown elements"),
                };
                Err(CommError::Mismatch {
                    detail: format!(
                        "rank {src} sent {len} elements of {name} to rank {}, which receives {} of {}",
                        self.rank,
                        buf.len(),
                        T::TYPE
                    ),
                })
            }
        }
    }

    fn sendrecv<T: Element>(
        &self,
        send: &[T],
        dest: usize,
        recv: &mut [T],
        src: usize,
    ) -> Result<()> {
        // Sends are eager, so a ring of sendrecvs cannot deadlock.
        self.check_rank(src)?;
        self.send(send, dest)?;
        self.recv(recv, src)
    }

    fn barrier(&self) -> Result<()> {
        let _busy = self.busy();
        crate::protocol::barrier(self)
    }

    fn post_fault(&self, kind: crate::FaultKind) -> CommError {
        crate::protocol::post_fault(self, kind)
    }

    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Self>> {
        let number = self.timeline().map(crate::TimelineTrack::next_split);
        let plan = crate::protocol::split_plan(self, color, key)?;
        let (mpi_color, mpi_key) = plan.get(self.rank).copied().unwrap_or((None, 0));
        match sys::comm_split(self.comm, mpi_color, mpi_key)? {
            None => Ok(None),
            Some(comm) => self.adopt_sub(comm, number.map(|n| (n, color))).map(Some),
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
}

/// MpiComm's header exchange: a non-blocking all-gather (`MPI_Iallgather`,
/// polled with the deadline), so a rank that never arrives is a `Timeout`,
/// not a hang. Once it completed every rank is present, and the data phase
/// that follows uses MPI's blocking collectives; a peer that gave up on this
/// very round (its deadline passed just before a late rank arrived) has told
/// everyone in a notice, which is checked here before any data moves.
impl crate::protocol::HeaderTransport for MpiComm {
    fn gather_headers<R>(
        &self,
        op: &'static str,
        mine: [i64; header::WORDS],
        then: impl FnOnce(&[i64]) -> Result<R>,
    ) -> Result<R> {
        self.enter(op)?;
        let round = self.rounds.get();
        // A peer already said it will not come.
        self.check_notice(Some(round))?;
        self.rounds.set(round + 1);
        let mut gathering = sys::iallgather(self.comm, mine.to_vec(), self.size)?;
        self.poll(op, &[], Some(round), || gathering.test())?;
        self.heed_notices(Some(round))?;
        let all = gathering.received().ok_or_else(|| CommError::Mpi {
            op: "MPI_Iallgather",
            code: -1,
            message: "the header exchange completed without its data".into(),
        })?;
        then(all)
    }

    fn poison(&self, err: CommError) -> CommError {
        MpiComm::poison(self, err)
    }

    fn flight(&self) -> &crate::flight::FlightRecorder {
        &self.flight
    }

    fn away(&self) -> Option<Duration> {
        Some(self.call_ended.get()?.elapsed())
    }

    fn waited(&self, wait: Duration) {
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.waiting.fetch_add(nanos, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_name_element_types() {
        for e in ElemType::ALL {
            assert_eq!(elem_of(tag_of(e)), Some(e));
        }
        assert_eq!(elem_of(0), None);
        assert_eq!(elem_of(99), None);
        assert_eq!(elem_of(NOTICE_TAG), None);
    }
}
