//! Handles to asynchronous operations.
//!
//! An asynchronous collective runs on the communicator's communication thread
//! while the caller goes on (DistOpt overlaps gradient buckets with the rest
//! of backward this way); [`Pending::wait`] returns its result. Dropping a
//! handle does not cancel the operation, exactly like freeing an MPI request:
//! the collective still completes with the other ranks.

use crate::error::{CommError, Result};
use crate::job_slot::Awaited;
use std::fmt;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, TryRecvError};

/// The result of an asynchronous operation, once it completes.
pub struct Pending<T> {
    state: State<T>,
}

enum State<T> {
    Waiting(Receiver<Result<T>>),
    /// A job in a reusable cell ([`crate::JobSlot`]).
    InCell(Arc<dyn Awaited<T>>),
    Done(Result<T>),
}

/// The sending half a backend completes a [`Pending`] with.
#[derive(Debug)]
pub struct Completion<T> {
    tx: mpsc::SyncSender<Result<T>>,
}

impl<T> Completion<T> {
    /// Delivers the result. If the handle was dropped the result is discarded.
    pub fn complete(self, result: Result<T>) {
        // A dropped handle is a caller that does not want the value: fine.
        let _ = self.tx.send(result);
    }
}

impl<T> Pending<T> {
    /// A handle and the completion that fulfils it (for backends).
    pub fn channel() -> (Completion<T>, Pending<T>) {
        let (tx, rx) = mpsc::sync_channel(1);
        (
            Completion { tx },
            Pending {
                state: State::Waiting(rx),
            },
        )
    }

    /// A handle on a job in a reusable cell.
    pub(crate) fn from_cell(cell: Arc<dyn Awaited<T>>) -> Pending<T> {
        Pending {
            state: State::InCell(cell),
        }
    }

    /// A handle that is already complete.
    pub fn ready(result: Result<T>) -> Pending<T> {
        Pending {
            state: State::Done(result),
        }
    }

    /// Whether the operation has completed (never blocks).
    pub fn is_ready(&mut self) -> bool {
        match &self.state {
            State::Waiting(rx) => match rx.try_recv() {
                Ok(result) => self.state = State::Done(result),
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => {
                    self.state = State::Done(Err(CommError::WorkerStopped));
                }
            },
            State::InCell(cell) => match cell.try_take() {
                Some(result) => self.state = State::Done(result),
                None => return false,
            },
            State::Done(_) => {}
        }
        true
    }

    /// Blocks until the operation completes and returns its result.
    pub fn wait(self) -> Result<T> {
        match self.state {
            State::Done(result) => result,
            State::Waiting(rx) => rx.recv().unwrap_or(Err(CommError::WorkerStopped)),
            State::InCell(cell) => cell.wait(),
        }
    }
}

impl<T> fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Waiting(_) | State::InCell(_) => "waiting",
            State::Done(Ok(_)) => "done",
            State::Done(Err(_)) => "failed",
        };
        f.debug_struct("Pending").field("state", &state).finish()
    }
}

/// The message of a panic payload (`&str` or `String`), for
/// [`CommError::RankPanicked`](crate::CommError::RankPanicked).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}
