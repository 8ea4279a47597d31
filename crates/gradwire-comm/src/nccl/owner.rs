//! The owner thread of one NCCL communicator: it holds the `ncclComm_t`
//! and issues every NCCL call of the rank on it, in order, so that the
//! communicator is used from one thread only (NCCL's rule for a
//! communicator), while the caller's thread copies data and waits.
//!
//! A call queues work on a CUDA stream and returns once queued (NCCL's
//! calls are asynchronous); the caller then waits for the stream under the
//! watchdog ([`super::watchdog`]), which the owner starts with the
//! communicator and stops before destroying it.

use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::NcclComm;
use super::transport::{Imp, NcclTransport};
use super::watchdog::{Watch, Watchdog};
use crate::error::{CommError, Result};

type OwnerJob<T> = Box<dyn FnOnce(&<T as Imp>::Comm) + Send>;

/// The thread that holds a rank's NCCL communicator and issues every NCCL
/// call on it, in order, with the communicator's watchdog. Dropping it
/// stops the watchdog, then destroys the communicator on the owner thread
/// (or leaves it, if it was aborted).
pub(super) struct Owner<T: NcclTransport> {
    /// Declared first: dropped (the watchdog thread joined) before the
    /// owner thread is.
    watchdog: Option<Watchdog<T>>,
    jobs: Option<mpsc::Sender<OwnerJob<T>>>,
    thread: Option<JoinHandle<()>>,
    pub(super) watch: Arc<Watch<T>>,
}

impl<T: NcclTransport> Owner<T> {
    /// Starts the owner thread; `make` creates the communicator there (a
    /// collective init, or a handle from a split) with the device current.
    /// Then starts the watchdog with `timeout`.
    ///
    /// An init waits for every rank; past `timeout` this returns
    /// `Timeout` (the blocked thread is left behind: NCCL cannot abort a
    /// communicator that does not exist yet).
    pub(super) fn start<M>(
        rank: usize,
        device: T::Device,
        timeout: Option<Duration>,
        make: M,
    ) -> Result<Owner<T>>
    where
        M: FnOnce() -> Result<T::Comm> + Send + 'static,
    {
        let watch = Watch::new();
        let (jobs, queue) = mpsc::channel::<OwnerJob<T>>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let state = Arc::clone(&watch);
        let context = device.clone();
        let thread = std::thread::Builder::new()
            .name(format!("gradwire-nccl-{rank}"))
            .spawn(move || {
                // NCCL uses the thread's current CUDA context.
                if let Err(e) = T::bind(&context) {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                let comm = match make() {
                    Ok(comm) => comm,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                state.arm(T::abort_handle(&comm));
                if ready_tx.send(Ok(())).is_err() {
                    if state.disarm().is_some() {
                        let _ = T::destroy(comm);
                    }
                    return;
                }
                for job in queue {
                    job(&comm);
                }
                // The NcclComm dropped. Destroy the communicator unless an
                // abort already freed it (the abort took the handle; a
                // handle has no Drop, so letting it go frees nothing).
                if state.disarm().is_some() {
                    let _ = T::destroy(comm);
                }
            })
            .map_err(|e| CommError::InvalidArgument(format!("cannot start a thread: {e}")))?;
        let start = Instant::now();
        let ready = match timeout {
            None => ready_rx
                .recv()
                .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            Some(limit) => ready_rx.recv_timeout(limit),
        };
        let mut owner = match ready {
            Ok(Ok(())) => Owner {
                watchdog: None,
                jobs: Some(jobs),
                thread: Some(thread),
                watch,
            },
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(CommError::Timeout {
                    op: "ncclCommInitRank",
                    waited: start.elapsed(),
                    missing: Vec::new(),
                });
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
                return Err(CommError::WorkerStopped);
            }
        };
        // On failure `owner` drops: its thread destroys the communicator.
        owner.watchdog = Some(Watchdog::start(
            rank,
            device,
            Arc::clone(&owner.watch),
            timeout,
        )?);
        Ok(owner)
    }

    /// Runs `job` on the owner thread and returns its result (NCCL work
    /// queued, not done), waiting at most `timeout` for the thread (then
    /// aborting the communicator: a call that does not return is a peer
    /// that never joined a connection NCCL sets up). A failed NCCL call
    /// leaves the communicator in an unknown state: it is aborted too.
    pub(super) fn call<F>(&self, op: &'static str, timeout: Option<Duration>, job: F) -> Result<()>
    where
        F: FnOnce(&T::Comm) -> Result<()> + Send + 'static,
    {
        if let Some(reason) = self.watch.reason() {
            return Err(reason);
        }
        let (tx, rx) = mpsc::channel();
        let job: OwnerJob<T> = Box::new(move |comm| {
            let _ = tx.send(job(comm));
        });
        self.jobs
            .as_ref()
            .ok_or(CommError::WorkerStopped)?
            .send(job)
            .map_err(|_| CommError::WorkerStopped)?;
        let start = Instant::now();
        let result = match timeout {
            None => rx.recv().map_err(|_| CommError::WorkerStopped)?,
            Some(limit) => match rx.recv_timeout(limit) {
                Ok(result) => result,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let timeout = CommError::Timeout {
                        op,
                        waited: start.elapsed(),
                        missing: Vec::new(),
                    };
                    self.watch.abort_with(timeout.clone());
                    return Err(self.watch.reason().unwrap_or(timeout));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(CommError::WorkerStopped),
            },
        };
        if let Err(e) = &result {
            self.watch.abort_with(e.clone());
            return Err(self.watch.reason().unwrap_or_else(|| e.clone()));
        }
        result
    }

    /// The communicator's unusable reason, if any.
    pub(super) fn aborted(&self) -> Option<CommError> {
        self.watch.reason()
    }

    /// Aborts the communicator (a rank unwinding, a send nobody received).
    pub(super) fn abort(&self) {
        self.watch.abort_with(CommError::Nccl {
            op: "ncclCommAbort",
            code: 0,
            message: "the communicator was aborted".into(),
        });
    }

    /// Makes every later call return `reason`, without aborting unless a
    /// wait is in progress (a lost asynchronous lane).
    pub(super) fn poison(&self, reason: CommError) {
        self.watch.poison(reason);
    }
}

impl<T: NcclTransport> Drop for Owner<T> {
    fn drop(&mut self) {
        drop(self.watchdog.take());
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<T: NcclTransport> NcclComm<T> {
    /// `ncclCommSplit` on the owner thread; the new communicator gets an
    /// owner thread (and a watchdog) of its own.
    pub(super) fn split_raw(&self, color: Option<i32>, key: i32) -> Result<Option<Owner<T>>> {
        let (tx, rx) = mpsc::channel();
        self.owner
            .call("ncclCommSplit", self.config.timeout, move |comm| {
                let new = T::split(comm, color, key)?;
                // The raw handle moves to its own owner thread below.
                tx.send(new).map_err(|_| CommError::WorkerStopped)
            })?;
        let new = rx.recv().map_err(|_| CommError::WorkerStopped)?;
        match new {
            None => Ok(None),
            Some(raw) => Owner::start(
                self.rank,
                self.device.clone(),
                self.config.timeout,
                move || Ok(raw),
            )
            .map(Some),
        }
    }
}
