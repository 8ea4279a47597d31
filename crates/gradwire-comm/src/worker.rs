//! The asynchronous-job thread of the process backends (MpiComm, NcclComm).
//!
//! Each rank's `run_async` jobs run in order on one thread that owns a
//! duplicate of the rank's communicator (made at construction, because a
//! duplicate is collective), so they never interleave with the rank's
//! blocking calls on the original: every rank's jobs form one sequence, as
//! LocalComm's asynchronous group does.

use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::error::{CommError, Result};
use crate::pending::{Pending, panic_message};

type Job<C> = Box<dyn FnOnce(&C) + Send>;

/// The thread and its queue. Dropping it lets the queued jobs finish (they
/// are collectives the peers also run), then joins the thread, whose
/// communicator drops there.
pub(crate) struct Worker<C> {
    jobs: Option<mpsc::Sender<Job<C>>>,
    thread: Option<JoinHandle<()>>,
    rank: usize,
}

impl<C: Send + 'static> Worker<C> {
    /// Starts the thread `name` owning `comm`.
    pub(crate) fn start(name: String, rank: usize, comm: C) -> Result<Worker<C>> {
        let (jobs, queue) = mpsc::channel::<Job<C>>();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                for job in queue {
                    job(&comm);
                }
            })
            .map_err(|e| CommError::InvalidArgument(format!("cannot start a comm thread: {e}")))?;
        Ok(Worker {
            jobs: Some(jobs),
            thread: Some(thread),
            rank,
        })
    }

    /// Queues `job`; its result (or its panic, as `RankPanicked`) completes
    /// the returned handle. A panicking job fails only its own handle: the
    /// thread lives on for the jobs behind it.
    pub(crate) fn submit<R, F>(&self, job: F) -> Result<Pending<R>>
    where
        R: Send + 'static,
        F: FnOnce(&C) -> Result<R> + Send + 'static,
    {
        let (completion, pending) = Pending::channel();
        let rank = self.rank;
        let job: Job<C> = Box::new(move |comm: &C| {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(comm)))
                .unwrap_or_else(|payload| {
                    Err(CommError::RankPanicked {
                        rank,
                        message: panic_message(payload.as_ref()),
                    })
                });
            completion.complete(result);
        });
        self.jobs
            .as_ref()
            .ok_or(CommError::WorkerStopped)?
            .send(job)
            .map_err(|_| CommError::WorkerStopped)?;
        Ok(pending)
    }
}

impl<C> Drop for Worker<C> {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            // Jobs catch their panics; nothing more to report from a drop.
            let _ = thread.join();
        }
    }
}
