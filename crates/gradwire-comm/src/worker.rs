//! The asynchronous lane of every backend: the thread that runs a rank's
//! [`Communicator::run_async`] jobs (LocalComm, MpiComm and NcclComm alike).
//!
//! Each rank's jobs run in order on one thread that owns the rank's *lane*:
//! a duplicate of the rank's communicator (LocalComm's duplicate group,
//! MpiComm's `MPI_Comm_dup`, NcclComm's split), made when the communicator
//! is, because a duplicate is collective. So jobs never interleave with the
//! rank's blocking calls on the original, and every rank's jobs form one
//! sequence of collectives that the ranks pair in order.
//!
//! The failure model (the trait's [`Communicator::run_async`] documents it
//! for users) lives here, once for every backend:
//!
//! - A job that panics completes its own handle with
//!   [`CommError::RankPanicked`]. The lane cannot be trusted any more (the
//!   job may have left its peers inside a collective it never reached), so
//!   it is *lost*: the jobs queued behind it fail without running, later
//!   submissions fail at once, and the backend announces the loss to the
//!   peers ([`Lane::announce_lost`]) so that their lanes fail too, promptly,
//!   with `CommError::Fault` of kind `LaneLost` naming this rank.
//! - A lane that a peer's loss (or a timeout, or a lost peer) poisoned is
//!   lost the same way on this rank: every job from then on fails at once
//!   with the error that poisoned it.
//! - Dropping the communicator lets the queued jobs finish (they are
//!   collectives the peers also run), then joins the thread. An announcement
//!   that cannot finish (a backend whose announcement waits for the peers,
//!   which may never call the lane again) is cut short after
//!   [`ANNOUNCE_GRACE`] by poisoning the lane from the dropping thread.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[cfg(doc)]
use crate::communicator::Communicator;
use crate::error::{CommError, Result};
use crate::job_slot::{AsyncJob, Cell, JobSlot};
use crate::pending::{Pending, panic_message};

/// What a backend's lane communicator does for the worker (a
/// [`Communicator`] in every backend; the worker needs only this).
pub(crate) trait Lane: Send + 'static {
    /// The error this communicator is poisoned with, if any: every call on
    /// it fails with that error, so the worker fails jobs with it at once.
    fn poisoned(&self) -> Option<CommError>;

    /// Called on the worker thread after one of this rank's jobs panicked:
    /// poisons this communicator with `lost` (the lost-lane fault naming
    /// this rank) and tells the peers, so that each peer's lane fails with
    /// the same error in the call it is waiting in, or in its next one.
    /// LocalComm and MpiComm return at once; NcclComm waits (at most its
    /// deadline) for the peers to meet the fault in a collective.
    fn announce_lost(&self, lost: &CommError);

    /// A handle that poisons this communicator from another thread, ending
    /// a wait in [`Lane::announce_lost`] (used by the worker's drop).
    fn interrupter(&self) -> Interrupter {
        Box::new(|_| {})
    }
}

/// Poisons a lane from another thread (see [`Lane::interrupter`]).
pub(crate) type Interrupter = Box<dyn Fn(CommError) + Send>;

/// How long a dropping communicator waits for its lane's announcement of a
/// panicking job before cutting it short.
pub(crate) const ANNOUNCE_GRACE: Duration = Duration::from_secs(2);

/// A job: run on the lane (`Ok`), or refused with the lane's error (`Err`).
type Job<C> = Box<dyn FnOnce(std::result::Result<&C, CommError>) -> Ran + Send>;

/// A job in a reusable cell ([`JobSlot`]), its type erased for the queue.
pub(crate) trait Runnable<C>: Send + Sync {
    /// Runs the cell's job on the lane (or refuses it with the lane's
    /// error), completing its handle.
    fn run_on(&self, lane: std::result::Result<&C, CommError>, rank: usize) -> Ran;
    /// Completes the handle with `err` without running the job.
    fn refuse(&self, err: CommError);
}

impl<C, J: AsyncJob<C>> Runnable<C> for Cell<J, J::Output> {
    fn run_on(&self, lane: std::result::Result<&C, CommError>, rank: usize) -> Ran {
        let Some(job) = self.take_job() else {
            return Ran::Refused; // nothing queued: cannot happen
        };
        match lane {
            Err(lost) => {
                self.finish(Err(lost));
                Ran::Refused
            }
            Ok(comm) => {
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(comm))) {
                    Ok(result) => {
                        self.finish(result);
                        Ran::Returned
                    }
                    Err(payload) => {
                        self.finish(Err(CommError::RankPanicked {
                            rank,
                            message: panic_message(payload.as_ref()),
                        }));
                        Ran::Panicked
                    }
                }
            }
        }
    }

    fn refuse(&self, err: CommError) {
        if self.take_job().is_some() {
            self.finish(Err(err));
        }
    }
}

/// A queued cell; one dropped without running (the queue itself dropped)
/// completes its handle with [`CommError::WorkerStopped`], as a dropped
/// boxed job's channel does.
struct QueuedCell<C> {
    cell: Arc<dyn Runnable<C>>,
    ran: bool,
}

impl<C> Drop for QueuedCell<C> {
    fn drop(&mut self) {
        if !self.ran {
            self.cell.refuse(CommError::WorkerStopped);
        }
    }
}

/// What the queue carries.
enum Item<C> {
    /// A closure, boxed ([`Worker::submit`]).
    Boxed(Job<C>),
    /// A job in its reusable cell ([`Worker::submit_slot`]).
    Slot(QueuedCell<C>),
}

impl<C> Item<C> {
    fn run(self, lane: std::result::Result<&C, CommError>, rank: usize) -> Ran {
        match self {
            Item::Boxed(job) => job(lane),
            Item::Slot(mut queued) => {
                queued.ran = true;
                queued.cell.run_on(lane, rank)
            }
        }
    }
}

/// What became of a job.
pub(crate) enum Ran {
    /// It ran and returned (its handle has its result).
    Returned,
    /// It ran and panicked (its handle has `RankPanicked`).
    Panicked,
    /// It did not run (its handle has the lane's error).
    Refused,
}

/// The queue and the lane's state, under one lock, so that no job can be
/// queued after the lane was found lost.
struct State<C> {
    /// The jobs waiting, in order. Unbounded, like MPI's nonblocking calls
    /// (a bounded queue could deadlock a rank that queues many jobs before
    /// a blocking call); it grows when needed and never shrinks, so queuing
    /// allocates nothing in steady state.
    jobs: VecDeque<Item<C>>,
    /// No more jobs are taken (the worker is dropped): the thread ends once
    /// the queue is empty.
    closed: bool,
    /// Why the lane is lost, once it is: every later job fails with it.
    lost: Option<CommError>,
}

/// The state and the condition the thread waits on for jobs.
struct Shared<C> {
    state: Mutex<State<C>>,
    ready: Condvar,
}

/// A rank's asynchronous lane: the thread and its queue.
pub(crate) struct Worker<C> {
    shared: Arc<Shared<C>>,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the thread ends (its sender is dropped there).
    finished: mpsc::Receiver<()>,
    interrupt: Interrupter,
    rank: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<C: Lane> Worker<C> {
    /// Starts the thread `name` owning `lane`, rank `rank`'s lane.
    pub(crate) fn start(name: String, rank: usize, lane: C) -> Result<Worker<C>> {
        let (finishing, finished) = mpsc::channel::<()>();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                closed: false,
                lost: None,
            }),
            ready: Condvar::new(),
        });
        let interrupt = lane.interrupter();
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _finishing = finishing;
                serve(&lane, rank, &theirs);
            })
            .map_err(|e| CommError::InvalidArgument(format!("cannot start a comm thread: {e}")))?;
        Ok(Worker {
            shared,
            thread: Some(thread),
            finished,
            interrupt,
            rank,
        })
    }

    /// Queues `job`; its result (or its panic, as `RankPanicked`) completes
    /// the returned handle. Fails at once, with the lane's error, once the
    /// lane is lost.
    pub(crate) fn submit<R, F>(&self, job: F) -> Result<Pending<R>>
    where
        R: Send + 'static,
        F: FnOnce(&C) -> Result<R> + Send + 'static,
    {
        let (completion, pending) = Pending::channel();
        let rank = self.rank;
        let job: Job<C> = Box::new(move |lane| match lane {
            Err(lost) => {
                completion.complete(Err(lost));
                Ran::Refused
            }
            Ok(comm) => {
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(comm))) {
                    Ok(result) => {
                        completion.complete(result);
                        Ran::Returned
                    }
                    Err(payload) => {
                        completion.complete(Err(CommError::RankPanicked {
                            rank,
                            message: panic_message(payload.as_ref()),
                        }));
                        Ran::Panicked
                    }
                }
            }
        });
        self.queue(Item::Boxed(job))?;
        Ok(pending)
    }

    /// Queues `job` in `slot`'s cell (reused when its last job was waited
    /// for): the same as [`Worker::submit`], without allocating.
    pub(crate) fn submit_slot<J: AsyncJob<C>>(
        &self,
        slot: &mut JobSlot<J, J::Output>,
        job: J,
    ) -> Result<Pending<J::Output>> {
        let cell = slot.prepare(job);
        let queued = QueuedCell {
            cell: Arc::clone(&cell) as Arc<dyn Runnable<C>>,
            ran: false,
        };
        // A refused submission completes the cell (the queued item's drop),
        // so the slot is free again once this handle is dropped.
        self.queue(Item::Slot(queued))?;
        Ok(Pending::from_cell(cell))
    }

    /// Puts `item` in the queue, unless the lane is lost or stopped.
    fn queue(&self, item: Item<C>) -> Result<()> {
        let mut state = lock(&self.shared.state);
        if let Some(lost) = &state.lost {
            return Err(lost.clone());
        }
        if state.closed {
            return Err(CommError::WorkerStopped);
        }
        state.jobs.push_back(item);
        drop(state);
        self.shared.ready.notify_one();
        Ok(())
    }
}

/// The next job, waiting for one; `None` once the queue is closed and empty.
fn next_job<C>(shared: &Shared<C>) -> Option<Item<C>> {
    let mut state = lock(&shared.state);
    loop {
        if let Some(job) = state.jobs.pop_front() {
            return Some(job);
        }
        if state.closed {
            return None;
        }
        state = shared
            .ready
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// The thread's loop: runs the jobs in order until the queue closes.
fn serve<C: Lane>(lane: &C, rank: usize, shared: &Shared<C>) {
    let lose = |err: &CommError| {
        let mut state = lock(&shared.state);
        state.lost.get_or_insert_with(|| err.clone()).clone()
    };
    while let Some(job) = next_job(shared) {
        let lost = lock(&shared.state).lost.clone().or_else(|| lane.poisoned());
        if let Some(err) = lost {
            job.run(Err(lose(&err)), rank);
            continue;
        }
        match job.run(Ok(lane), rank) {
            Ran::Returned | Ran::Refused => {
                // A peer's loss, a timeout or a lost peer poisoned the lane
                // during the job: the jobs after it fail at once.
                if let Some(err) = lane.poisoned() {
                    lose(&err);
                }
            }
            Ran::Panicked => {
                let err = lose(&CommError::lane_lost(rank));
                // The jobs already queued fail now, not after the
                // announcement (which may wait for the peers).
                let queued = std::mem::take(&mut lock(&shared.state).jobs);
                for job in queued {
                    job.run(Err(err.clone()), rank);
                }
                lane.announce_lost(&err);
            }
        }
    }
}

impl<C> Drop for Worker<C> {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.ready.notify_all();
        // Queued jobs finish (they are collectives the peers also run); a
        // lost lane's announcement gets a grace period, then is cut short.
        let mut lost_since: Option<Instant> = None;
        while let Err(mpsc::RecvTimeoutError::Timeout) =
            self.finished.recv_timeout(Duration::from_millis(20))
        {
            let lost = lock(&self.shared.state).lost.clone();
            if let Some(err) = lost {
                let since = *lost_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= ANNOUNCE_GRACE {
                    (self.interrupt)(err);
                    break;
                }
            }
        }
        if let Some(thread) = self.thread.take() {
            // Jobs catch their panics; nothing more to report from a drop.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A lane whose announcement waits until it is interrupted, as
    /// NcclComm's does when the peers never meet its fault.
    #[derive(Default)]
    struct Stubborn {
        poison: Arc<Mutex<Option<CommError>>>,
        announced: Arc<AtomicUsize>,
    }

    impl Lane for Stubborn {
        fn poisoned(&self) -> Option<CommError> {
            lock(&self.poison).clone()
        }

        fn announce_lost(&self, _lost: &CommError) {
            self.announced.fetch_add(1, Ordering::SeqCst);
            while self.poisoned().is_none() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }

        fn interrupter(&self) -> Interrupter {
            let poison = Arc::clone(&self.poison);
            Box::new(move |err| {
                lock(&poison).get_or_insert(err);
            })
        }
    }

    #[test]
    fn a_panicking_job_fails_the_jobs_behind_it_and_every_later_one() {
        let lane = Stubborn::default();
        let announced = Arc::clone(&lane.announced);
        let worker = Worker::start("test-lane".into(), 3, lane).expect("starts");
        let ran = Arc::new(AtomicBool::new(false));
        let first = worker.submit(|_| Ok(1)).expect("queued");
        let boom = worker
            .submit(|_| -> Result<()> { panic!("job fails") })
            .expect("queued");
        let flag = Arc::clone(&ran);
        let behind = worker
            .submit(move |_| {
                flag.store(true, Ordering::SeqCst);
                Ok(())
            })
            .expect("queued");
        assert_eq!(first.wait(), Ok(1));
        assert!(
            matches!(boom.wait(), Err(CommError::RankPanicked { rank: 3, message }) if message == "job fails")
        );
        let lost = CommError::lane_lost(3);
        // Failed without running, although the announcement still waits.
        assert_eq!(behind.wait(), Err(lost.clone()));
        assert!(!ran.load(Ordering::SeqCst));
        assert_eq!(worker.submit(|_| Ok(())).err(), Some(lost));
        // The announcement starts right after the queue is emptied, on the
        // lane's thread: wait for it (it then waits to be interrupted).
        let asked = Instant::now();
        while announced.load(Ordering::SeqCst) == 0 && asked.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(announced.load(Ordering::SeqCst), 1);
        // The drop cuts the announcement short after the grace period.
        let start = Instant::now();
        drop(worker);
        let took = start.elapsed();
        assert!(
            took >= ANNOUNCE_GRACE && took < ANNOUNCE_GRACE + Duration::from_secs(3),
            "{took:?}"
        );
    }

    #[test]
    fn a_poisoned_lane_refuses_jobs_and_a_drop_lets_queued_jobs_finish() {
        let lane = Stubborn::default();
        let poison = Arc::clone(&lane.poison);
        let worker = Worker::start("test-lane".into(), 0, lane).expect("starts");
        // Queued jobs all run before the drop returns.
        let done = Arc::new(AtomicUsize::new(0));
        let pending: Vec<_> = (0..5)
            .map(|_| {
                let done = Arc::clone(&done);
                worker
                    .submit(move |_| {
                        std::thread::sleep(Duration::from_millis(10));
                        done.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    })
                    .expect("queued")
            })
            .collect();
        drop(pending);
        // A peer's loss poisons the lane during a job: the next ones fail.
        let timeout = CommError::Timeout {
            op: "barrier",
            waited: Duration::from_secs(1),
            missing: vec![],
        };
        let err = timeout.clone();
        let during = worker
            .submit(move |_| {
                lock(&poison).get_or_insert(err);
                Ok(())
            })
            .expect("queued");
        assert_eq!(during.wait(), Ok(()));
        let after = worker.submit(|_| Ok(())).and_then(Pending::wait);
        assert_eq!(after, Err(timeout));
        drop(worker);
        assert_eq!(done.load(Ordering::SeqCst), 5);
    }
}
