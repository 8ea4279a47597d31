//! The watchdog of one NCCL communicator: the deadline of every wait,
//! NCCL's asynchronous errors, and the abort that ends a wait which would
//! otherwise never end.
//!
//! The thread that uses the communicator blocks in CUDA (a stream
//! synchronisation, a device-to-host copy) with no timeout of its own, as
//! PyTorch's blocking wait does, so a finished collective is seen at once,
//! without sleeping. Before it blocks it registers the wait here
//! ([`Watch::begin`]); a thread per communicator polls the registered wait
//! every [`POLL`] and asks for an abort when the wait passes its deadline,
//! when `ncclCommGetAsyncError` reports an error (a peer's network failure,
//! a remote abort), or when another thread poisoned the communicator (a
//! lost asynchronous lane). The owner thread, which issues every call of
//! the communicator, performs the abort ([`Watch::abort_if_asked`]) between
//! calls, woken for it, so `ncclCommAbort` never runs beside another call
//! on the same communicator (NCCL allows one thread at a time on one). The abort makes
//! NCCL's kernels leave their loops, so the stream drains and the blocked
//! wait returns; [`Watch::end`] then reports why, and every later call
//! fails with that reason. No wait registered: the thread sleeps until one
//! is.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::transport::{Imp, NcclTransport};
use crate::error::{CommError, Result};

/// How often a registered wait is checked: the delay with which an
/// asynchronous error or a passed deadline ends a wait (not the latency of
/// a wait that succeeds, which the CUDA synchronisation returns at once).
pub(super) const POLL: Duration = Duration::from_millis(10);

/// What the caller, the watchdog and the owner thread share.
pub(super) struct Watch<T: NcclTransport> {
    state: Mutex<State<T>>,
    wake: Condvar,
}

struct State<T: NcclTransport> {
    /// The communicator's abort handle, until it is aborted (taken here)
    /// or destroyed (taken by the owner thread when it ends).
    handle: Option<<T as Imp>::Abort>,
    /// Why the communicator is unusable, returned by every later call.
    reason: Option<CommError>,
    /// The wait in progress: what it waits for and since when.
    waiting: Option<(&'static str, Instant)>,
    /// The watchdog sleeps without a timeout (nothing registered): a new
    /// wait must wake it.
    sleeping: bool,
    /// The communicator is going away: the watchdog ends.
    closed: bool,
    /// A deadline shorter than the configured one for every later wait
    /// (a communicator posting its departure notice).
    cap: Option<Duration>,
    /// An abort was asked for: the owner thread performs it.
    abort_asked: bool,
    /// Wakes the owner thread when an abort is asked for (set while the
    /// owner runs).
    wake_owner: Option<Box<dyn Fn() + Send>>,
}

/// Locks a mutex, ignoring poisoning (the data are plain values).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<T: NcclTransport> Watch<T> {
    /// A watch with no communicator yet ([`Watch::arm`] gives it one).
    pub(super) fn new() -> Arc<Watch<T>> {
        Arc::new(Watch {
            state: Mutex::new(State {
                handle: None,
                reason: None,
                waiting: None,
                sleeping: false,
                closed: false,
                cap: None,
                abort_asked: false,
                wake_owner: None,
            }),
            wake: Condvar::new(),
        })
    }

    /// Hands the watch the live communicator's abort handle.
    pub(super) fn arm(&self, handle: T::Abort) {
        lock(&self.state).handle = Some(handle);
    }

    /// Takes the abort handle back (the owner thread, before destroying the
    /// communicator); `None` if an abort already freed it.
    pub(super) fn disarm(&self) -> Option<T::Abort> {
        lock(&self.state).handle.take()
    }

    /// Why the communicator is unusable, if it is.
    pub(super) fn reason(&self) -> Option<CommError> {
        lock(&self.state).reason.clone()
    }

    /// Registers the wait `op` that starts now; any reason the
    /// communicator is unusable is returned instead (nothing registered).
    pub(super) fn begin(&self, op: &'static str) -> Result<()> {
        let mut state = lock(&self.state);
        if let Some(reason) = &state.reason {
            return Err(reason.clone());
        }
        state.waiting = Some((op, Instant::now()));
        if state.sleeping {
            self.wake.notify_all();
        }
        Ok(())
    }

    /// Ends the registered wait; returns the reason the communicator was
    /// aborted or poisoned, if it was (during the wait or before).
    pub(super) fn end(&self) -> Option<CommError> {
        let mut state = lock(&self.state);
        state.waiting = None;
        state.reason.clone()
    }

    /// Makes every later call return `reason` (the first reason stays),
    /// without aborting unless a wait is in progress: the watchdog then
    /// aborts, which ends the wait. Any thread may call it.
    pub(super) fn poison(&self, reason: CommError) {
        let mut state = lock(&self.state);
        state.reason.get_or_insert(reason);
        self.wake.notify_all();
    }

    /// Asks for the communicator's abort, remembering why (the first
    /// reason stays): every later call fails with the reason, and the owner
    /// thread aborts (`ncclCommAbort`) before it issues anything else,
    /// woken for it when idle. Any thread may call it.
    pub(super) fn abort_with(&self, reason: CommError) {
        let mut state = lock(&self.state);
        state.reason.get_or_insert(reason);
        state.abort_asked = true;
        if let Some(wake_owner) = &state.wake_owner {
            wake_owner();
        }
        self.wake.notify_all();
    }

    /// Gives the watch the owner thread's waker (`None`: the owner is
    /// going away).
    pub(super) fn set_owner_waker(&self, wake_owner: Option<Box<dyn Fn() + Send>>) {
        lock(&self.state).wake_owner = wake_owner;
    }

    /// Performs an abort that was asked for (`ncclCommAbort`), once; called
    /// by the owner thread only, between the calls it issues. Returns
    /// whether the communicator is aborted (now or before).
    pub(super) fn abort_if_asked(&self) -> bool {
        let handle = {
            let mut state = lock(&self.state);
            if !state.abort_asked {
                return false;
            }
            state.handle.take()
        };
        if let Some(handle) = handle {
            #[allow(unsafe_code)]
            // SAFETY: the handle was taken out of the state under its lock,
            // so this is the only abort, and only the owner thread calls
            // this, between its calls: no other call of the communicator
            // runs beside it, and the owner thread, which would destroy it,
            // finds the handle gone and leaves it. The watchdog only uses
            // the handle while it is in the state; every later call checks
            // the reason, set when the abort was asked for, before queuing
            // work. A CUDA wait on the communicator's stream is released by
            // the abort, which is what NCCL provides it for.
            let _ = unsafe { T::abort(handle) };
        }
        true
    }

    /// Gives every later wait at most `limit`, whatever the configured
    /// deadline (the shorter of the two holds).
    pub(super) fn cap_waits(&self, limit: Duration) {
        lock(&self.state).cap = Some(limit);
    }

    /// Ends the watchdog thread (the communicator is going away).
    fn close(&self) {
        lock(&self.state).closed = true;
        self.wake.notify_all();
    }
}

/// The decision of one look at the state.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Nothing to do until woken.
    Sleep,
    /// Look again after this long.
    Poll(Duration),
    /// Abort the communicator with this reason.
    Abort(CommError),
}

/// What the watchdog does about a wait registered `since` (as `op`) when it
/// looks `now`, given the deadline, a reason set by another thread, and
/// NCCL's asynchronous error.
fn judge(
    waiting: Option<(&'static str, Instant)>,
    poisoned: Option<&CommError>,
    async_error: impl FnOnce() -> Result<()>,
    timeout: Option<Duration>,
    now: Instant,
) -> Verdict {
    let Some((op, since)) = waiting else {
        return Verdict::Sleep;
    };
    if let Some(reason) = poisoned {
        return Verdict::Abort(reason.clone());
    }
    if let Err(e) = async_error() {
        return Verdict::Abort(e);
    }
    let waited = now.saturating_duration_since(since);
    match timeout {
        Some(limit) if waited > limit => Verdict::Abort(CommError::Timeout {
            op,
            waited,
            // NCCL does not say which peer is missing.
            missing: Vec::new(),
        }),
        Some(limit) => Verdict::Poll(POLL.min(limit - waited + Duration::from_millis(1))),
        None => Verdict::Poll(POLL),
    }
}

/// The deadline of a wait: the configured one, or the cap if shorter
/// (`None`: no deadline).
fn capped(timeout: Option<Duration>, cap: Option<Duration>) -> Option<Duration> {
    match (timeout, cap) {
        (Some(limit), Some(cap)) => Some(limit.min(cap)),
        (limit, cap) => limit.or(cap),
    }
}

/// The watchdog thread of one communicator; dropping it ends the thread.
pub(super) struct Watchdog<T: NcclTransport> {
    watch: Arc<Watch<T>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: NcclTransport> Watchdog<T> {
    /// Starts the thread watching `watch` with the deadline `timeout`
    /// (`None`: only errors and poisoning end a wait). The device's context
    /// is made current there (ncclCommAbort switches to the communicator's
    /// device itself, but the driver calls around it want a context).
    pub(super) fn start(
        rank: usize,
        device: T::Device,
        watch: Arc<Watch<T>>,
        timeout: Option<Duration>,
    ) -> Result<Watchdog<T>> {
        let theirs = Arc::clone(&watch);
        let thread = std::thread::Builder::new()
            .name(format!("gradwire-nccl-watch-{rank}"))
            .spawn(move || {
                let _ = T::bind(&device);
                serve(&theirs, timeout);
            })
            .map_err(|e| CommError::InvalidArgument(format!("cannot start a thread: {e}")))?;
        Ok(Watchdog {
            watch,
            thread: Some(thread),
        })
    }
}

/// The watchdog's loop: sleeps while nothing is registered, polls a
/// registered wait, aborts when [`judge`] says so.
fn serve<T: NcclTransport>(watch: &Watch<T>, timeout: Option<Duration>) {
    let mut state = lock(&watch.state);
    loop {
        if state.closed {
            return;
        }
        // Once aborted, or asked to be (the owner thread does it), there
        // is nothing left to do but wait for the caller (or the end).
        let verdict = match &state.handle {
            Some(_) if state.abort_asked => Verdict::Sleep,
            None => Verdict::Sleep,
            Some(handle) => judge(
                state.waiting,
                state.reason.as_ref(),
                // Under the lock: the owner thread takes the handle under
                // it before destroying the communicator.
                || T::async_error(handle),
                capped(timeout, state.cap),
                Instant::now(),
            ),
        };
        match verdict {
            Verdict::Sleep => {
                state.sleeping = true;
                state = watch
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                state.sleeping = false;
            }
            Verdict::Poll(after) => {
                state = watch
                    .wake
                    .wait_timeout(state, after)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            Verdict::Abort(reason) => {
                drop(state);
                watch.abort_with(reason);
                state = lock(&watch.state);
            }
        }
    }
}

impl<T: NcclTransport> Drop for Watchdog<T> {
    fn drop(&mut self) {
        self.watch.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fine() -> Result<()> {
        Ok(())
    }

    #[test]
    fn nothing_registered_sleeps() {
        let now = Instant::now();
        let lost = CommError::WorkerStopped;
        assert_eq!(
            judge(None, Some(&lost), fine, Some(Duration::ZERO), now),
            Verdict::Sleep
        );
    }

    #[test]
    fn a_wait_is_polled_until_its_deadline_then_aborted() {
        let start = Instant::now();
        let limit = Duration::from_secs(5);
        let at = |s: u64| start + Duration::from_secs(s);
        assert_eq!(
            judge(Some(("op", start)), None, fine, Some(limit), at(1)),
            Verdict::Poll(POLL)
        );
        assert_eq!(
            judge(Some(("op", start)), None, fine, None, at(100)),
            Verdict::Poll(POLL)
        );
        // Close to the deadline the poll shortens to reach it.
        let near = start + limit - Duration::from_millis(2);
        match judge(Some(("op", start)), None, fine, Some(limit), near) {
            Verdict::Poll(after) => assert!(after <= Duration::from_millis(3), "{after:?}"),
            other => panic!("{other:?}"),
        }
        match judge(Some(("all_reduce", start)), None, fine, Some(limit), at(6)) {
            Verdict::Abort(CommError::Timeout { op, waited, .. }) => {
                assert_eq!(op, "all_reduce");
                assert_eq!(waited, Duration::from_secs(6));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_and_poisoning_abort_before_the_deadline() {
        let start = Instant::now();
        let nccl = CommError::Nccl {
            op: "asynchronous NCCL error",
            code: 6,
            message: "remote".into(),
        };
        let failed = || Err(nccl.clone());
        assert_eq!(
            judge(Some(("op", start)), None, failed, None, start),
            Verdict::Abort(nccl.clone())
        );
        let lost = CommError::Fault(crate::Fault::posted(1, crate::FaultKind::Code(7)));
        assert_eq!(
            judge(Some(("op", start)), Some(&lost), failed, None, start),
            Verdict::Abort(lost)
        );
    }

    #[test]
    fn a_cap_shortens_the_deadline_and_never_lengthens_it() {
        let (short, long) = (Duration::from_secs(10), Duration::from_secs(600));
        assert_eq!(capped(Some(long), Some(short)), Some(short));
        assert_eq!(capped(Some(short), Some(long)), Some(short));
        assert_eq!(capped(None, Some(short)), Some(short));
        assert_eq!(capped(Some(long), None), Some(long));
        assert_eq!(capped(None, None), None);
    }

    #[test]
    fn the_first_reason_stays() {
        let watch = Watch::<crate::nccl::HostTransport>::new();
        watch.begin("op").expect("not poisoned");
        assert_eq!(watch.end(), None);
        watch.poison(CommError::WorkerStopped);
        watch.abort_with(CommError::Fault(crate::Fault::posted(
            0,
            crate::FaultKind::NonFinite,
        )));
        assert_eq!(watch.reason(), Some(CommError::WorkerStopped));
        assert_eq!(watch.begin("op"), Err(CommError::WorkerStopped));
    }
}
