//! Handles to strategies running on the communication thread, and the
//! traffic they report.

use crate::error::{AlgoError, Result};
use gradwire_comm::Pending;

/// Bytes one rank sends and receives in a strategy, by the ring model that
/// nccl-tests use for bus bandwidth: an all-reduce of B bytes over W ranks
/// moves `2 (W - 1) / W * B` each way; an all-gather moves what the other
/// ranks contributed. W = 1 moves nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Traffic {
    /// Bytes sent by this rank.
    pub sent: u64,
    /// Bytes received by this rank.
    pub received: u64,
}

impl Traffic {
    /// An all-reduce of `bytes` over `world` ranks.
    pub fn all_reduce(bytes: usize, world: usize) -> Traffic {
        let w = world.max(1) as u128;
        let each = (2 * (w - 1) * bytes as u128 / w) as u64;
        Traffic {
            sent: each,
            received: each,
        }
    }

    /// An all-gather in which this rank contributed `own` of `total` bytes.
    pub fn all_gather(own: usize, total: usize, world: usize) -> Traffic {
        if world <= 1 {
            return Traffic::default();
        }
        let others = total.saturating_sub(own) as u64;
        Traffic {
            sent: others,
            received: others,
        }
    }
}

impl std::ops::Add for Traffic {
    type Output = Traffic;
    fn add(self, other: Traffic) -> Traffic {
        Traffic {
            sent: self.sent + other.sent,
            received: self.received + other.received,
        }
    }
}

impl std::ops::AddAssign for Traffic {
    fn add_assign(&mut self, other: Traffic) {
        *self = *self + other;
    }
}

/// What a strategy hands back: its value and the traffic it caused.
#[derive(Debug, Clone, PartialEq)]
pub struct Reduced<T> {
    /// The combined tensors (or whatever the strategy returns).
    pub value: T,
    /// Bytes this rank sent and received.
    pub traffic: Traffic,
}

/// A strategy launched on the communication thread (SINGA's `wait`).
#[derive(Debug)]
pub struct Handle<T> {
    pending: Pending<Result<Reduced<T>>>,
}

impl<T> Handle<T> {
    /// Wraps the handle of a job that returns a strategy's result (for
    /// callers that compose strategies in one job, like DistOpt's buckets).
    pub fn from_pending(pending: Pending<Result<Reduced<T>>>) -> Self {
        Handle { pending }
    }

    /// Whether the strategy has finished (never blocks).
    pub fn is_ready(&mut self) -> bool {
        self.pending.is_ready()
    }

    /// Waits for the strategy and returns its result.
    pub fn wait(self) -> Result<Reduced<T>> {
        self.pending.wait().map_err(AlgoError::from)?
    }
}
