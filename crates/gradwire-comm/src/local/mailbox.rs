//! Point-to-point messages between in-process ranks.
//!
//! A send copies the data into the destination's queue for that source and
//! returns at once (MPI's eager protocol), so a ring of `sendrecv` calls, or a
//! pairwise exchange, cannot deadlock. Messages from one source to one
//! destination are received in the order they were sent.
//!
//! The copies' byte buffers are recycled per pair of ranks: a receiver
//! hands a message's buffer back to the spares of its source, and that
//! source's next send to it refills the smallest spare that is large
//! enough. A repeated exchange pattern (AdaSum's halving, a ring, the
//! quantized all-reduce's paired exchanges) allocates nothing once warm,
//! whatever the timing: a pair's spares serve that pair only, so another
//! rank's messages in flight can never leave it without one.

use crate::element::ElemType;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;

/// A message in flight.
#[derive(Debug)]
pub(crate) struct Message {
    pub(crate) elem: ElemType,
    pub(crate) len: usize,
    pub(crate) bytes: Vec<u8>,
}

/// The incoming queues of one rank, one per source, with the byte
/// buffers of received messages kept for the next sends.
#[derive(Debug)]
pub(crate) struct Mailbox {
    pub(crate) queues: Mutex<Queues>,
    pub(crate) arrived: Condvar,
}

/// What a mailbox's lock guards.
#[derive(Debug)]
pub(crate) struct Queues {
    /// The messages in flight, one queue per source.
    pub(crate) from: Vec<VecDeque<Message>>,
    /// Byte buffers of received messages, per source, for its next sends
    /// (at most [`MAX_SPARES`] each).
    spares: Vec<Vec<Vec<u8>>>,
}

/// The most spare buffers a mailbox keeps per source: more than any
/// exchange pattern has in flight from one rank to another at once, few
/// enough to bound the memory.
const MAX_SPARES: usize = 8;

impl Queues {
    /// A copy of `bytes` from `src` in one of its recycled buffers when one
    /// is large enough (the smallest such), else in its largest spare grown,
    /// else a new one.
    pub(crate) fn copy_of(&mut self, src: usize, bytes: &[u8]) -> Vec<u8> {
        let Some(spares) = self.spares.get_mut(src) else {
            return bytes.to_vec();
        };
        let fitting = spares
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= bytes.len())
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let largest = spares
            .iter()
            .enumerate()
            .max_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let mut buffer = match fitting.or(largest) {
            Some(i) => spares.swap_remove(i),
            None => Vec::new(),
        };
        buffer.clear();
        buffer.extend_from_slice(bytes);
        buffer
    }

    /// Keeps a received message's buffer for `src`'s later sends.
    pub(crate) fn recycle(&mut self, src: usize, buffer: Vec<u8>) {
        if let Some(spares) = self.spares.get_mut(src)
            && spares.len() < MAX_SPARES
        {
            spares.push(buffer);
        }
    }
}

/// Every rank's mailbox.
#[derive(Debug)]
pub(crate) struct Mailboxes {
    boxes: Box<[Mailbox]>,
}

impl Mailboxes {
    pub(crate) fn new(size: usize) -> Mailboxes {
        let boxes = (0..size)
            .map(|_| Mailbox {
                queues: Mutex::new(Queues {
                    from: (0..size).map(|_| VecDeque::new()).collect(),
                    spares: (0..size).map(|_| Vec::new()).collect(),
                }),
                arrived: Condvar::new(),
            })
            .collect();
        Mailboxes { boxes }
    }

    /// The mailbox of rank `dest` (the caller checked the range).
    pub(crate) fn of(&self, dest: usize) -> Option<&Mailbox> {
        self.boxes.get(dest)
    }

    /// Wakes every receiver so that it can see a departure or a poisoning.
    pub(crate) fn wake_all(&self) {
        for b in self.boxes.iter() {
            let _guard = b.queues.lock();
            b.arrived.notify_all();
        }
    }
}
