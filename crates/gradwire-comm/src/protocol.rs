//! The agreement protocol of the library backends, implemented once: before
//! any data moves, every rank's description of its call ([`Call`], encoded
//! by `header.rs`) is all-gathered and validated alike on every rank, so a
//! mismatch, an invalid argument or a posted fault is the same error on
//! every rank and the communicator stays usable. MpiComm and NcclComm
//! provide the one thing that differs, the exchange of the headers
//! ([`HeaderTransport`]: MPI's non-blocking all-gather under a deadline,
//! NCCL's all-gather on the device under its watchdog); the agreement, the
//! barrier, the posting of a fault and the split's plan are here.

use crate::call::{Call, Kind};
use crate::error::{CommError, Result};
use crate::fault::{Fault, FaultKind};
use crate::flight::FlightRecorder;
use crate::header::{self, WORDS};
use std::time::Duration;

/// A communicator's exchange of the headers.
pub(crate) trait HeaderTransport: crate::Communicator {
    /// All-gathers `mine` (this rank's encoded call, for operation `op`)
    /// with every rank's, in rank order, `WORDS` words each, and hands them
    /// to `then`. The transport's own conditions (a poisoned communicator,
    /// a deadline, a peer's notice) are checked here.
    fn gather_headers<R>(
        &self,
        op: &'static str,
        mine: [i64; WORDS],
        then: impl FnOnce(&[i64]) -> Result<R>,
    ) -> Result<R>;

    /// Poisons the communicator with `err` (a lost asynchronous lane, which
    /// ends it on every backend) and returns it.
    fn poison(&self, err: CommError) -> CommError;

    /// The communicator's flight recorder, which the agreement keeps.
    fn flight(&self) -> &FlightRecorder;

    /// How long since this rank's previous call on the communicator ended
    /// (`None`: the transport keeps no count, or no call ended yet): sent
    /// in the header, so that every rank learns how long it waits for the
    /// last one ([`header::wait_for_last`]).
    fn away(&self) -> Option<Duration> {
        None
    }

    /// Counts `wait`, this rank's wait in an agreement for the last rank
    /// to arrive (by default, no count is kept).
    fn waited(&self, wait: Duration) {
        let _ = wait;
    }
}

/// Agrees on `call`: every rank's calls, once validated alike on every
/// rank. A posted fault, a mismatch or an invalid argument is the same
/// error on every rank; a lost lane's fault also poisons the communicator.
pub(crate) fn agree(transport: &impl HeaderTransport, call: Call) -> Result<Vec<Call>> {
    let seq = transport.flight().enter(&call);
    let away = transport.away();
    let agreed = transport
        .gather_headers(call.kind.name(), header::encode(&call, away), |words| {
            if let Some(own) = away {
                transport.waited(header::wait_for_last(words, own));
            }
            header::decode_all(words)
        })
        .and_then(|calls| {
            crate::call::validate(&calls).map_err(|err| {
                // A lost lane ends it everywhere; a departed peer takes no
                // part in any later collective.
                if err.is_lane_lost() || matches!(err, CommError::PeerLost { .. }) {
                    transport.poison(err)
                } else {
                    err
                }
            })?;
            Ok(calls)
        });
    match &agreed {
        Ok(_) => transport.flight().agreed(seq),
        Err(err) => transport.flight().failed(seq, err),
    }
    agreed
}

/// The barrier: the header exchange is itself one, since no rank can hold
/// every rank's description before every rank has sent it.
pub(crate) fn barrier(transport: &impl HeaderTransport) -> Result<()> {
    agree(transport, Call::new(Kind::Barrier)).map(|_| ())
}

/// Takes part in the next round as a rank that failed with `kind` (see
/// [`crate::Communicator::post_fault`]).
pub(crate) fn post_fault(transport: &impl HeaderTransport, kind: FaultKind) -> CommError {
    let call = Call {
        key: i64::from(kind.code()),
        ..Call::new(Kind::Fault)
    };
    match agree(transport, call) {
        Err(err) => err,
        // Unreachable: validation fails every round with a fault in it.
        Ok(_) => CommError::Fault(Fault::posted(transport.rank(), kind)),
    }
}

/// Takes part in the next round as a rank that is leaving: the peers'
/// collective (the one they wait in, or their next) fails with
/// [`CommError::PeerLost`] naming this rank, and poisons their
/// communicator. Returns what this rank's own round gave.
#[cfg(feature = "nccl")]
pub(crate) fn depart(transport: &impl HeaderTransport) -> Result<()> {
    // Not a collective of the caller's: kept out of the flight record and
    // the timeline.
    let call = Call::new(Kind::Departed);
    transport.gather_headers(call.kind.name(), header::encode(&call, None), |words| {
        header::decode_all(words).map(|_| ())
    })
}

/// The agreed split of [`crate::Communicator::split`]: every rank's color
/// and key in the library's terms (`None` for a rank that takes no part),
/// the same on every rank.
pub(crate) fn split_plan(
    transport: &impl HeaderTransport,
    color: Option<u32>,
    key: i64,
) -> Result<Vec<(Option<i32>, i32)>> {
    let calls = agree(
        transport,
        Call {
            color,
            key,
            ..Call::new(Kind::Split)
        },
    )?;
    header::split_plan(&calls)
}
