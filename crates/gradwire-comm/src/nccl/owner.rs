//! The owner thread of one NCCL communicator: it holds the `ncclComm_t`
//! and issues every NCCL call of the rank on it, in order, the abort
//! included, so that the communicator is used from one thread only (NCCL's
//! rule for a communicator), while the caller's thread copies data and
//! waits.
//!
//! The communicator is non-blocking: every call returns at once, maybe
//! still in progress (the init, a split, a group's connections), and the
//! owner thread polls it ([`settle`]) until it is ready, its deadline
//! passes or an abort is asked for, before it takes the next job; the
//! abort itself it issues between jobs ([`Watch::abort_if_asked`]), woken
//! for it when idle. So no NCCL call ever blocks the
//! owner thread, an init or a split waiting for a peer that never comes
//! ends at its deadline with the communicator aborted (not a thread left
//! behind), and `ncclCommAbort` never runs beside another call. A call
//! queues work on a stream and returns once queued; the caller then waits
//! for the stream under the watchdog ([`super::watchdog`]), which the owner
//! starts with the communicator and stops before destroying it.

use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::NcclComm;
use super::transport::{Imp, NcclTransport};
use super::watchdog::{Watch, Watchdog};
use crate::error::{CommError, Result};

/// The longest pause between two polls of an operation in progress.
const SETTLE_PAUSE: Duration = Duration::from_millis(1);

/// How long the owner thread waits past a deadline for a job before its
/// caller gives up on it: the job itself ends at the deadline ([`settle`]),
/// so this only bounds a transport that fails to.
const GRACE: Duration = Duration::from_secs(5);

/// Polls the non-blocking communicator `comm` until the host side of its
/// last operation (`op`) is done: `Ok` once ready; the error it ended
/// with; `Timeout` past `timeout`; the reason the communicator became
/// unusable in the meantime (an abort asked for, a poisoning). A failure asks for the abort, which the owner thread then
/// performs. Runs on the owner thread.
pub(super) fn settle<T: NcclTransport>(
    watch: &Watch<T>,
    comm: &T::Comm,
    op: &'static str,
    timeout: Option<Duration>,
) -> Result<()> {
    let handle = T::abort_handle(comm);
    let start = Instant::now();
    // Short pauses first: most operations finish within microseconds, and
    // a collective init or split within the peers' arrival; a millisecond
    // at most, so an early rank starts its next call soon after the last
    // one arrives.
    let mut pause = Duration::from_micros(10);
    loop {
        // An abort asked for, or a communicator another thread poisoned
        // (a lost asynchronous lane, a departed peer): stop waiting.
        if let Some(reason) = watch.reason() {
            return Err(reason);
        }
        match T::progress(&handle) {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => {
                watch.abort_with(e.clone());
                return Err(e);
            }
        }
        let waited = start.elapsed();
        if timeout.is_some_and(|limit| waited > limit) {
            let timeout = CommError::Timeout {
                op,
                waited,
                // NCCL does not say which peer is missing.
                missing: Vec::new(),
            };
            watch.abort_with(timeout.clone());
            return Err(timeout);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(SETTLE_PAUSE);
    }
}

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
    /// collective init, or a handle from a split) with the device current,
    /// and the thread polls it until every rank has joined ([`settle`]).
    /// Then starts the watchdog with `timeout`.
    ///
    /// An init waits for every rank; past `timeout` the owner thread aborts
    /// the initialising communicator and this returns `Timeout`.
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
                if let Err(e) = settle(&state, &comm, "ncclCommInitRank", timeout) {
                    state.abort_if_asked();
                    let _ = ready_tx.send(Err(e));
                    return;
                }
                if ready_tx.send(Ok(())).is_err() {
                    if state.disarm().is_some() {
                        let _ = T::destroy(comm);
                    }
                    return;
                }
                // An abort asked for wakes this loop with an empty job.
                for job in queue {
                    if state.abort_if_asked() {
                        // Aborted: a job is dropped unrun (its caller sees
                        // the reason), and nothing uses the communicator.
                        continue;
                    }
                    job(&comm);
                    state.abort_if_asked();
                }
                // The NcclComm dropped. Abort the communicator if that was
                // asked for, else destroy it unless an abort already freed
                // it (the abort took the handle; a handle has no Drop, so
                // letting it go frees nothing).
                if !state.abort_if_asked() && state.disarm().is_some() {
                    let _ = T::destroy(comm);
                }
            })
            .map_err(|e| CommError::InvalidArgument(format!("cannot start a thread: {e}")))?;
        let start = Instant::now();
        let ready = match timeout {
            None => ready_rx
                .recv()
                .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            Some(limit) => ready_rx.recv_timeout(limit + GRACE),
        };
        let mut owner = match ready {
            Ok(Ok(())) => {
                let waker = jobs.clone();
                watch.set_owner_waker(Some(Box::new(move || {
                    let _ = waker.send(Box::new(|_| {}));
                })));
                Owner {
                    watchdog: None,
                    jobs: Some(jobs),
                    thread: Some(thread),
                    watch,
                }
            }
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

    /// Runs `job` on the owner thread, then polls the communicator until
    /// the job's calls are issued ([`settle`]: a group's first transfer
    /// with a peer waits for that peer), and returns the result (NCCL work
    /// queued, not done). Past `timeout` the communicator is aborted and
    /// this returns `Timeout`. A failed NCCL call leaves the communicator
    /// in an unknown state: it is aborted too.
    pub(super) fn call<F>(&self, op: &'static str, timeout: Option<Duration>, job: F) -> Result<()>
    where
        F: FnOnce(&T::Comm) -> Result<()> + Send + 'static,
    {
        if let Some(reason) = self.watch.reason() {
            return Err(reason);
        }
        let (tx, rx) = mpsc::channel();
        let watch = Arc::clone(&self.watch);
        let job: OwnerJob<T> = Box::new(move |comm| {
            let result = job(comm).and_then(|()| settle(&watch, comm, op, timeout));
            let _ = tx.send(result);
        });
        self.jobs
            .as_ref()
            .ok_or(CommError::WorkerStopped)?
            .send(job)
            .map_err(|_| CommError::WorkerStopped)?;
        let start = Instant::now();
        // A job the owner thread dropped unrun (the communicator was
        // aborted first) reports the abort's reason.
        let stopped = || self.watch.reason().unwrap_or(CommError::WorkerStopped);
        let result = match timeout {
            None => rx.recv().map_err(|_| stopped())?,
            Some(limit) => match rx.recv_timeout(limit + GRACE) {
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
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(stopped()),
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
        // The waker holds a sender too: the owner thread ends once both go.
        self.watch.set_owner_waker(None);
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<T: NcclTransport> NcclComm<T> {
    /// `ncclCommSplit` on the owner thread; the new communicator gets an
    /// owner thread (and a watchdog) of its own.
    ///
    /// Two jobs: the first issues the split, and the owner thread polls the
    /// parent until every rank split ([`settle`]); only then does the
    /// second take the new handle, which NCCL writes when the split
    /// completes.
    pub(super) fn split_raw(&self, color: Option<i32>, key: i32) -> Result<Option<Owner<T>>> {
        let pending = Arc::new(std::sync::Mutex::new(None));
        let issued = Arc::clone(&pending);
        self.owner
            .call("ncclCommSplit", self.config.timeout, move |comm| {
                let split = T::split(comm, color, key)?;
                *issued
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(split);
                Ok(())
            })?;
        let (tx, rx) = mpsc::channel();
        self.owner
            .call("ncclCommSplit", self.config.timeout, move |_| {
                let split = pending
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take()
                    .ok_or(CommError::WorkerStopped)?;
                let new = T::split_result(split)?;
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
