//! Point-to-point messages between in-process ranks.
//!
//! A send copies the data into the destination's queue for that source and
//! returns at once (MPI's eager protocol), so a ring of `sendrecv` calls, or a
//! pairwise exchange, cannot deadlock. Messages from one source to one
//! destination are received in the order they were sent.

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

/// The incoming queues of one rank, one per source.
#[derive(Debug)]
pub(crate) struct Mailbox {
    pub(crate) queues: Mutex<Vec<VecDeque<Message>>>,
    pub(crate) arrived: Condvar,
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
                queues: Mutex::new((0..size).map(|_| VecDeque::new()).collect()),
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
