//! Point to point on NCCL: `send`, `recv` and `sendrecv` with a 16-byte
//! message header (element type and length) before each payload, so a
//! receiver checks both and reports `Mismatch` as LocalComm does, the
//! message consumed.
//!
//! An NCCL send completes when the peer receives, so `send` queues its
//! transfer and returns; its device copy waits in the outbox until the
//! stream has passed it (a later call reaps it). Receives and exchanges
//! work in the scratch and wait like collectives.
//!
//! A message to this rank itself never goes through NCCL, which refuses a
//! send to self unless its receive is in the same group (and a failed call
//! aborts the communicator): it waits in a host-side loopback queue, in
//! order, for the receive from self that takes it.

use std::ops::Range;

use super::NcclComm;
use super::collectives::{bytes_of, bytes_of_mut};
use super::scratch::layout;
use super::stream::beyond;
use super::transport::{NcclTransport, Transfer};
use crate::element::{ElemType, Element};
use crate::error::{CommError, Result};

/// Bytes of a message header.
const HEAD: usize = 16;

/// A message this rank sent to itself: its element type and bytes.
pub(super) struct Loopback {
    elem: ElemType,
    len: usize,
    bytes: Vec<u8>,
}

impl<T: NcclTransport> NcclComm<T> {
    pub(super) fn check_rank(&self, rank: usize) -> Result<()> {
        if rank < self.size {
            Ok(())
        } else {
            Err(CommError::InvalidRank {
                rank,
                world_size: self.size,
            })
        }
    }

    /// Sets up NCCL's point-to-point connections to every peer now, in one
    /// group of 1-byte transfers each way (NCCL skips empty ones).
    /// Collective, at construction. NCCL connects a pair lazily, inside the
    /// first group with a transfer between them, and that group's
    /// `ncclGroupEnd` blocks on the host until the peer connects too: a
    /// later `send` would wait there for a peer busy elsewhere (a ring of
    /// sends, each rank blocked in its own). Connected now, a `send` only
    /// queues its transfer. Costs NCCL's buffers for every peer up front.
    pub(super) fn connect_to_every_peer(&self) -> Result<()> {
        let (w, me) = (self.size, self.rank);
        if w < 2 {
            return Ok(());
        }
        let ([out, into], total) =
            layout([w, w]).ok_or_else(|| CommError::InvalidArgument("connection layout".into()))?;
        let mut lease = self.scratch.lease(total, &self.stream)?;
        self.watched("connect", || {
            let dev = lease.buffer()?;
            T::with_address(dev, &self.stream, |base| {
                let one = |start: usize| {
                    move |peer: usize| Transfer {
                        peer,
                        ptr: base + (start + peer) as u64,
                        bytes: 1,
                    }
                };
                let peers = (0..w).filter(|&q| q != me);
                let sends: Vec<Transfer> = peers.clone().map(one(out.start)).collect();
                let recvs: Vec<Transfer> = peers.map(one(into.start)).collect();
                self.queue("connect", move |comm, queue| {
                    #[allow(unsafe_code)]
                    // SAFETY: one byte per peer in each region of the
                    // scratch (laid out above), leased until the wait
                    // below ends.
                    unsafe {
                        T::exchange(comm, &sends, &recvs, queue)
                    }
                })
            })?;
            self.sync()
        })
    }

    /// Frees the device buffers of sends the peers have received.
    pub(super) fn reap(&self) -> Result<()> {
        let mut outbox = self.outbox.borrow_mut();
        let mut kept = Vec::with_capacity(outbox.len());
        for (event, buffers) in outbox.drain(..) {
            match T::event_done(&event) {
                Ok(true) => drop(buffers),
                Ok(false) => kept.push((event, buffers)),
                Err(e) => return Err(e),
            }
        }
        *outbox = kept;
        Ok(())
    }

    /// Queues one NCCL group on the owner thread: the bytes `send.1` of
    /// `buf` to rank `send.0`, and/or the bytes `recv.1` of `buf` from
    /// rank `recv.0` (disjoint ranges). The ranges are checked against the
    /// buffer here; the caller keeps the buffer alive until the stream has
    /// passed the group (it waits, or parks it in the outbox).
    fn queue_p2p(
        &self,
        op: &'static str,
        buf: &mut T::Buffer,
        send: Option<(usize, Range<usize>)>,
        recv: Option<(usize, Range<usize>)>,
    ) -> Result<()> {
        let len = T::len(buf);
        for (_, range) in send.iter().chain(&recv) {
            if range.start > range.end || range.end > len {
                return Err(beyond(op, range.start, range.len(), len));
            }
        }
        T::with_address(buf, &self.stream, |base| {
            let transfer = |(peer, range): (usize, Range<usize>)| Transfer {
                peer,
                ptr: base + range.start as u64,
                bytes: range.len(),
            };
            let sends: Vec<Transfer> = send.into_iter().map(transfer).collect();
            let recvs: Vec<Transfer> = recv.into_iter().map(transfer).collect();
            self.queue(op, move |comm, queue| {
                #[allow(unsafe_code)]
                // SAFETY: every transfer lies in the buffer (checked
                // above), which the caller keeps until the stream has
                // passed the group.
                unsafe {
                    T::exchange(comm, &sends, &recvs, queue)
                }
            })
        })
    }

    /// The send half of `send`: header, then payload, from one device copy
    /// of both, queued (not waited for); the copy stays in the outbox until
    /// the peer received it.
    pub(super) fn queue_send<E: Element>(&self, buf: &[E], dest: usize) -> Result<()> {
        let bytes = std::mem::size_of_val(buf);
        let ([head, payload], total) = layout([HEAD, bytes])
            .ok_or_else(|| CommError::InvalidArgument("a message larger than memory".into()))?;
        self.watched("send", || {
            let mut copy = T::alloc_zeros(&self.stream, total)?;
            self.upload(
                &encode_message_header(E::TYPE, buf.len()),
                &mut copy,
                head.start,
            )?;
            self.upload(bytes_of(buf), &mut copy, payload.start)?;
            self.queue_p2p("send", &mut copy, Some((dest, head)), None)?;
            self.queue_p2p("send", &mut copy, Some((dest, payload)), None)?;
            let event = T::record_event(&self.stream)?;
            self.outbox.borrow_mut().push((event, vec![copy]));
            Ok(())
        })
    }

    /// A send to this rank itself: a copy into the loopback queue.
    pub(super) fn send_to_self<E: Element>(&self, buf: &[E]) {
        self.loopback.borrow_mut().push_back(Loopback {
            elem: E::TYPE,
            len: buf.len(),
            bytes: bytes_of(buf).to_vec(),
        });
    }

    /// A receive from this rank itself: the oldest message of the loopback
    /// queue, checked as a message from a peer is (and consumed even when
    /// it does not fit `buf`). With none queued the receive could never
    /// complete (no other thread sends as this rank), so it is refused.
    pub(super) fn receive_from_self<E: Element>(&self, buf: &mut [E]) -> Result<()> {
        let message = self.loopback.borrow_mut().pop_front().ok_or_else(|| {
            CommError::InvalidArgument(format!(
                "rank {} receives from itself, but sent itself no message: the receive \
                 would wait forever",
                self.rank
            ))
        })?;
        let fits = message.elem == E::TYPE && message.len == buf.len();
        if fits {
            bytes_of_mut(buf).copy_from_slice(&message.bytes);
        }
        self.delivered::<E>(fits, Some(message.elem), message.len, buf.len(), self.rank)
    }

    /// The receive half: the 16-byte header, checked, then the payload as
    /// long as the sender says (consumed even when it does not fit `buf`).
    pub(super) fn receive<E: Element>(&self, buf: &mut [E], src: usize) -> Result<()> {
        let mut head = [0u8; HEAD];
        {
            let mut lease = self.scratch.lease(HEAD, &self.stream)?;
            self.watched("recv", || {
                let dev = lease.buffer()?;
                self.queue_p2p("recv", dev, None, Some((src, 0..HEAD)))?;
                self.download(dev, 0, &mut head)?;
                self.sync()
            })?;
        }
        let (elem, len) = decode_message_header(&head)?;
        let incoming = elem.map_or(0, |e| len.saturating_mul(e.size_in_bytes()));
        let fits = elem == Some(E::TYPE) && len == buf.len();
        let mut lease = self.scratch.lease(incoming, &self.stream)?;
        self.watched("recv", || {
            let dev = lease.buffer()?;
            self.queue_p2p("recv", dev, None, Some((src, 0..incoming)))?;
            if fits {
                self.download(dev, 0, bytes_of_mut(buf))?;
            }
            self.sync()
        })?;
        self.delivered::<E>(fits, elem, len, buf.len(), src)
    }

    /// `sendrecv` in two NCCL groups, so that neither direction waits for
    /// the other: first both 16-byte headers, then both payloads (the
    /// incoming one as long as its header says, consumed even when it does
    /// not fit `recv`).
    pub(super) fn exchange_with<E: Element>(
        &self,
        send: &[E],
        dest: usize,
        recv: &mut [E],
        src: usize,
    ) -> Result<()> {
        let mut head = [0u8; HEAD];
        {
            let ([out, into], total) = layout([HEAD, HEAD])
                .ok_or_else(|| CommError::InvalidArgument("header layout".into()))?;
            let mut lease = self.scratch.lease(total, &self.stream)?;
            self.watched("sendrecv", || {
                let dev = lease.buffer()?;
                let mine = encode_message_header(E::TYPE, send.len());
                self.upload(&mine, dev, out.start)?;
                self.queue_p2p(
                    "sendrecv",
                    dev,
                    Some((dest, out.clone())),
                    Some((src, into.clone())),
                )?;
                self.download(dev, into.start, &mut head)?;
                self.sync()
            })?;
        }
        let (elem, len) = decode_message_header(&head)?;
        let incoming = elem.map_or(0, |e| len.saturating_mul(e.size_in_bytes()));
        let fits = elem == Some(E::TYPE) && len == recv.len();
        let ([out, into], total) = layout([std::mem::size_of_val(send), incoming])
            .ok_or_else(|| CommError::InvalidArgument("a message larger than memory".into()))?;
        let mut lease = self.scratch.lease(total, &self.stream)?;
        self.watched("sendrecv", || {
            let dev = lease.buffer()?;
            self.upload(bytes_of(send), dev, out.start)?;
            self.queue_p2p(
                "sendrecv",
                dev,
                Some((dest, out.clone())),
                Some((src, into.clone())),
            )?;
            if fits {
                self.download(dev, into.start, bytes_of_mut(recv))?;
            }
            self.sync()
        })?;
        self.delivered::<E>(fits, elem, len, recv.len(), src)
    }

    /// `Ok` if the received payload was `T`s as many as `buf` holds (and
    /// was copied there), else the `Mismatch` LocalComm returns.
    fn delivered<E: Element>(
        &self,
        fits: bool,
        elem: Option<ElemType>,
        len: usize,
        want: usize,
        src: usize,
    ) -> Result<()> {
        if fits {
            return Ok(());
        }
        Err(CommError::Mismatch {
            detail: format!(
                "rank {src} sent {len} elements of {} to rank {}, which receives {want} of {}",
                elem.map_or("unknown elements", |e| e.as_str()),
                self.rank,
                E::TYPE,
            ),
        })
    }
}

/// The 16-byte header a point-to-point message starts with: the element
/// type's index in [`ElemType::ALL`] and the length, little-endian.
fn encode_message_header(elem: ElemType, len: usize) -> [u8; HEAD] {
    let index = ElemType::ALL
        .iter()
        .position(|&e| e == elem)
        .unwrap_or(usize::MAX);
    let mut head = [0u8; HEAD];
    head[..8].copy_from_slice(&(index as u64).to_le_bytes());
    head[8..].copy_from_slice(&(len as u64).to_le_bytes());
    head
}

/// The element type and length a message header announces.
fn decode_message_header(head: &[u8; HEAD]) -> Result<(Option<ElemType>, usize)> {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&head[i..i + 8]);
        u64::from_le_bytes(w)
    };
    let elem = usize::try_from(word(0))
        .ok()
        .and_then(|i| ElemType::ALL.get(i).copied());
    let len = usize::try_from(word(8))
        .map_err(|_| CommError::InvalidArgument("a message longer than memory".into()))?;
    Ok((elem, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_headers_round_trip_and_reject_unknown_types() {
        for (i, &elem) in ElemType::ALL.iter().enumerate() {
            let head = encode_message_header(elem, 1000 + i);
            assert_eq!(
                decode_message_header(&head).expect("decodes"),
                (Some(elem), 1000 + i)
            );
        }
        let mut head = [0u8; HEAD];
        head[..8].copy_from_slice(&99u64.to_le_bytes());
        assert_eq!(decode_message_header(&head).expect("decodes").0, None);
    }
}
