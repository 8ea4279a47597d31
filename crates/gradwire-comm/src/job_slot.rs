//! Asynchronous jobs without allocation: a job type ([`AsyncJob`]) and a
//! [`JobSlot`] that its caller keeps and reuses, so that a job submitted
//! every step (DistOpt's buckets) allocates nothing once the slot exists.
//!
//! A slot holds one cell: the job while it is queued, then its result until
//! the handle takes it. The worker queues the cell itself (an `Arc` clone),
//! and the handle waits on the cell's condition variable. A slot whose last
//! handle was dropped without waiting (or whose job still runs) gets a new
//! cell: correct, only not reused.

use crate::error::{CommError, Result};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// A job for [`Communicator::run_job`](crate::Communicator::run_job): what
/// a closure given to `run_async` is, as a named type, so that the slot it
/// travels in can be reused from call to call.
pub trait AsyncJob<C>: Send + 'static {
    /// What the job returns.
    type Output: Send + 'static;

    /// Runs the job on the rank's communication thread, with the lane's
    /// communicator.
    fn run(self, comm: &C) -> Result<Self::Output>;
}

/// The reusable home of one asynchronous job at a time of type `J`, kept by
/// the caller between submissions of
/// [`Communicator::run_job`](crate::Communicator::run_job).
///
/// It holds one cell: the job while it is queued, then its result until
/// the handle takes it. Submitting through a slot whose last handle was
/// waited for reuses the cell (no allocation); one whose last handle was
/// dropped without waiting, or whose job still runs, gets a new cell.
pub struct JobSlot<J, R> {
    cell: Option<Arc<Cell<J, R>>>,
}

impl<J, R> Default for JobSlot<J, R> {
    fn default() -> Self {
        JobSlot { cell: None }
    }
}

impl<J, R> std::fmt::Debug for JobSlot<J, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSlot")
            .field("allocated", &self.cell.is_some())
            .finish()
    }
}

/// Where a job is in its cell.
enum Stage<J, R> {
    /// Free for the next job.
    Idle,
    Queued(J),
    Running,
    Finished(Result<R>),
}

/// One job's cell: the job, then its result, and the condition its handle
/// waits on.
pub(crate) struct Cell<J, R> {
    stage: Mutex<Stage<J, R>>,
    done: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<J, R> Cell<J, R> {
    /// Delivers the job's result and wakes its handle.
    pub(crate) fn finish(&self, result: Result<R>) {
        *lock(&self.stage) = Stage::Finished(result);
        self.done.notify_all();
    }

    /// The queued job, now running (`None` if none was queued).
    pub(crate) fn take_job(&self) -> Option<J> {
        let mut stage = lock(&self.stage);
        match std::mem::replace(&mut *stage, Stage::Running) {
            Stage::Queued(job) => Some(job),
            other => {
                *stage = other;
                None
            }
        }
    }
}

impl<J, R> JobSlot<J, R> {
    /// A cell holding `job`, queued: the slot's own when it is idle, else a
    /// new one (which becomes the slot's).
    pub(crate) fn prepare(&mut self, job: J) -> Arc<Cell<J, R>> {
        if let Some(cell) = &self.cell {
            let mut stage = lock(&cell.stage);
            if matches!(*stage, Stage::Idle) {
                *stage = Stage::Queued(job);
                drop(stage);
                return Arc::clone(cell);
            }
        }
        let cell = Arc::new(Cell {
            stage: Mutex::new(Stage::Queued(job)),
            done: Condvar::new(),
        });
        self.cell = Some(Arc::clone(&cell));
        cell
    }
}

/// The waiting side of a cell, its job type erased, for [`crate::Pending`].
pub(crate) trait Awaited<R>: Send + Sync {
    /// Blocks until the result is in, takes it and frees the cell.
    fn wait(&self) -> Result<R>;
    /// The result if it is in (taken, the cell freed), without blocking.
    fn try_take(&self) -> Option<Result<R>>;
}

impl<J: Send, R: Send> Awaited<R> for Cell<J, R> {
    fn wait(&self) -> Result<R> {
        let mut stage = lock(&self.stage);
        loop {
            if matches!(*stage, Stage::Finished(_))
                && let Stage::Finished(result) = std::mem::replace(&mut *stage, Stage::Idle)
            {
                return result;
            }
            if matches!(*stage, Stage::Idle) {
                // Only reachable if the result was taken already.
                return Err(CommError::WorkerStopped);
            }
            stage = self
                .done
                .wait(stage)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn try_take(&self) -> Option<Result<R>> {
        let mut stage = lock(&self.stage);
        if !matches!(*stage, Stage::Finished(_)) {
            return None;
        }
        match std::mem::replace(&mut *stage, Stage::Idle) {
            Stage::Finished(result) => Some(result),
            _ => None,
        }
    }
}
