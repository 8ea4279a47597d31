//! Where a rank's time goes: [`MpiComm::time_in_calls`] and the guard that
//! adds each call's duration to it.

use super::MpiComm;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What [`MpiComm::time_in_calls`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallTime {
    /// In the calls made on the communicator itself.
    pub caller: Duration,
    /// In the calls of its asynchronous jobs (DistOpt's buckets).
    pub jobs: Duration,
    /// Of both, the time this rank waited in the calls' agreements for the
    /// last rank to arrive: how much longer than this rank the last one was
    /// away from the communicator before each call (every rank sends its
    /// time away in the call's header). What remains of the calls' time is
    /// the network's.
    pub waiting: Duration,
}

impl MpiComm {
    /// The time this rank's calls have taken since the communicator was
    /// made: the network's share of a training step, beside the codecs'
    /// and the model's.
    pub fn time_in_calls(&self) -> CallTime {
        let read = |n: &AtomicU64| Duration::from_nanos(n.load(Ordering::Relaxed));
        CallTime {
            caller: read(&self.busy),
            jobs: read(&self.jobs_busy),
            waiting: read(&self.waiting) + read(&self.jobs_waiting),
        }
    }

    /// Counts the time until the guard drops into this rank's call time.
    pub(super) fn busy(&self) -> BusyGuard<'_> {
        BusyGuard {
            total: &self.busy,
            ended: &self.call_ended,
            since: Instant::now(),
            _call: self.flight.call(),
        }
    }
}

/// Adds the time from its making to its drop to a communicator's total.
pub(super) struct BusyGuard<'a> {
    total: &'a AtomicU64,
    /// Set to the call's end.
    ended: &'a Cell<Option<Instant>>,
    since: Instant,
    /// Ends the call's collective on the timeline (its data moved).
    _call: crate::flight::CallGuard<'a>,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        let now = Instant::now();
        let nanos = u64::try_from((now - self.since).as_nanos()).unwrap_or(u64::MAX);
        self.total.fetch_add(nanos, Ordering::Relaxed);
        self.ended.set(Some(now));
    }
}
