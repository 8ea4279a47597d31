//! MpiComm's deadlines and notices: every wait polls a non-blocking MPI
//! request (spin, yield, then short sleeps) until it completes, a peer's
//! notice arrives, or the deadline passes; a rank that gives up poisons its
//! communicator and sends every peer a notice, so that they fail with the
//! same error at once instead of waiting for their own deadlines. A rank
//! that drops its communicator sends a departure notice: the peers' calls
//! it will not join fail at once with `PeerLost` naming it.
//!
//! Every notice carries its communicator's serial, agreed by the ranks when
//! it was made and never reused by a process: MPI may give a freed
//! communicator's context to a later one, and a notice still in flight
//! from the first must not reach the second.

use super::*;
use std::ffi::c_int;

/// A peer's word that it will not take part in `round` or any later
/// collective of the communicator, and the error it gave up with.
#[derive(Debug, Clone)]
pub(super) struct Notice {
    pub(super) round: u64,
    pub(super) error: CommError,
}

impl MpiComm {
    /// Fails unless this thread may call MPI and the communicator is not
    /// poisoned.
    pub(super) fn enter(&self, op: &'static str) -> Result<()> {
        self.env.check_thread(op)?;
        if let Some(err) = self.poisoned() {
            return Err(err);
        }
        // Completed eager sends release their copies here, on the next call.
        let mut outbox = self.outbox.borrow_mut();
        let mut i = 0;
        while i < outbox.len() {
            if outbox[i].test()? {
                outbox.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// The error this communicator is poisoned with, if any.
    pub(super) fn poisoned(&self) -> Option<CommError> {
        self.poison.borrow().clone()
    }

    /// Poisons the communicator with `err` (unless it already is) and
    /// returns the error every call returns from now on.
    pub(super) fn poison(&self, err: CommError) -> CommError {
        self.poison.borrow_mut().get_or_insert(err).clone()
    }

    /// Gives up: poisons the communicator with `err` and tells every peer,
    /// in a notice, that this rank takes part in no collective from round
    /// `round` on, so that the peers fail (with the same error) in the call
    /// they wait in or their next one, instead of waiting for their own
    /// deadline. Returns the error every call returns from now on.
    pub(super) fn give_up(&self, err: CommError, round: u64) -> CommError {
        if let Some(err) = self.poisoned() {
            return err;
        }
        let err = self.poison(err);
        if let Some(bytes) = encode_notice(self.serial, round, &err) {
            let mut outbox = self.outbox.borrow_mut();
            for peer in (0..self.size).filter(|&q| q != self.rank) {
                // A notice that cannot be sent leaves that peer to its own
                // deadline: nothing better to do with the error.
                if let Ok(outgoing) = sys::isend(self.comm, bytes.clone(), peer, NOTICE_TAG) {
                    outbox.push(outgoing);
                }
            }
        }
        err
    }

    /// Leaves the communicator: tells every peer that this rank takes part
    /// in nothing from the current round on (their calls from then fail at
    /// once with `PeerLost` naming it). The notices are sent without
    /// waiting; what a peer never receives is left to MPI.
    pub(super) fn depart(&self) {
        let lost = CommError::PeerLost {
            op: "drop",
            ranks: vec![self.rank],
        };
        if let Some(bytes) = encode_notice(self.serial, self.rounds.get(), &lost) {
            let mut outbox = self.outbox.borrow_mut();
            for peer in (0..self.size).filter(|&q| q != self.rank) {
                if let Ok(outgoing) = sys::isend(self.comm, bytes.clone(), peer, NOTICE_TAG) {
                    outbox.push(outgoing);
                }
            }
        }
    }

    /// Takes the notices the peers sent (one `MPI_Improbe` when there are
    /// none), then [`MpiComm::check_notice`].
    pub(super) fn heed_notices(&self, round: Option<u64>) -> Result<()> {
        while let Some(probed) = sys::improbe(self.comm, None, Some(NOTICE_TAG))? {
            self.take_notice(probed)?;
        }
        self.check_notice(round)
    }

    /// Fails (poisoning the communicator) if a notice taken so far says its
    /// sender takes no part in `round`; with no round (a point-to-point
    /// call), if any notice was taken.
    pub(super) fn check_notice(&self, round: Option<u64>) -> Result<()> {
        let notice = self.notice.borrow().clone();
        match notice {
            Some(n) if round.is_none_or(|r| n.round <= r) => Err(self.poison(n.error)),
            _ => Ok(()),
        }
    }

    /// Receives a notice and keeps the earliest round any peer gave.
    pub(super) fn take_notice(&self, probed: sys::Probed) -> Result<()> {
        let mut bytes = vec![0u8; probed.bytes];
        let source = probed.source;
        probed.receive(&mut bytes)?;
        let notice = match decode_notice(&bytes) {
            // One for an earlier communicator of the same MPI context.
            Some((serial, _)) if serial != self.serial => return Ok(()),
            Some((_, notice)) => notice,
            None => Notice {
                round: 0,
                error: CommError::PeerLost {
                    op: "notice",
                    ranks: vec![source],
                },
            },
        };
        let mut kept = self.notice.borrow_mut();
        if kept.as_ref().is_none_or(|k| notice.round < k.round) {
            *kept = Some(notice);
        }
        Ok(())
    }

    /// Polls `done` until it holds, with the deadline: spins briefly, then
    /// yields, then sleeps a little longer each time (never more than a
    /// 64th of the time already waited, at most 1 ms), so a short wait
    /// costs no sleep and a long one little CPU. A peer's notice for
    /// `round` (see [`MpiComm::heed_notices`]) ends the wait early with the
    /// peer's error; the deadline ends it with [`CommError::Timeout`] naming
    /// `missing`, and this rank gives up (poisoned, peers told).
    pub(super) fn poll(
        &self,
        op: &'static str,
        missing: &[usize],
        round: Option<u64>,
        mut done: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            if done()? {
                return Ok(());
            }
            if let Err(err) = self.heed_notices(round) {
                // One last look: what the peer sent before its notice (a
                // message, its part of a collective) still counts.
                return if done()? { Ok(()) } else { Err(err) };
            }
            let waited = start.elapsed();
            if let Some(limit) = self.config.timeout
                && waited >= limit
            {
                let err = CommError::Timeout {
                    op,
                    waited: limit,
                    missing: missing.to_vec(),
                };
                // A timed-out exchange has sent this rank's header: it gives
                // up on this round. Elsewhere, on the next one.
                return Err(self.give_up(err, round.unwrap_or(self.rounds.get())));
            }
            if waited < SPIN_FOR {
                for _ in 0..16 {
                    std::hint::spin_loop();
                }
            } else if waited < YIELD_FOR {
                std::thread::yield_now();
            } else {
                std::thread::sleep((waited / 64).clamp(MIN_SLEEP, MAX_SLEEP));
            }
        }
    }
}

/// How long `poll` spins before it yields.
const SPIN_FOR: Duration = Duration::from_micros(50);
/// How long (since the wait began) `poll` yields before it sleeps.
const YIELD_FOR: Duration = Duration::from_millis(1);
/// The shortest and longest sleep of `poll`.
const MIN_SLEEP: Duration = Duration::from_micros(10);
const MAX_SLEEP: Duration = Duration::from_millis(1);

/// The tag of a notice (point-to-point messages of data use the element
/// types' tags, 1 to 9).
pub(super) const NOTICE_TAG: c_int = 64;

/// The operations a notice can name (what `CommError::Timeout::op` holds).
const NOTICE_OPS: &[&str] = &[
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_varied",
    "reduce_scatter",
    "barrier",
    "split",
    "split_shared",
    "fault",
    "recv",
    "drop",
];

const NOTICE_TIMEOUT: u64 = 1;
const NOTICE_FAULT: u64 = 2;
const NOTICE_PEER_LOST: u64 = 3;

/// A notice's bytes: little-endian u64 words, the communicator's serial
/// and the round first, then the error (only the errors a rank gives up or
/// leaves with travel).
pub(super) fn encode_notice(serial: u64, round: u64, err: &CommError) -> Option<Vec<u8>> {
    let words: Vec<u64> = match err {
        CommError::Timeout {
            op,
            waited,
            missing,
        } => {
            let op = NOTICE_OPS
                .iter()
                .position(|o| o == op)
                .unwrap_or(usize::MAX);
            let waited = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
            [serial, round, NOTICE_TIMEOUT, op as u64, waited]
                .into_iter()
                .chain(missing.iter().map(|&r| r as u64))
                .collect()
        }
        // A communicator's fault names its rank and carries no detail.
        CommError::Fault(fault) => vec![
            serial,
            round,
            NOTICE_FAULT,
            fault.rank? as u64,
            u64::from(fault.kind.code()),
        ],
        CommError::PeerLost { op, ranks } => {
            let op = NOTICE_OPS.iter().position(|o| o == op)?;
            [serial, round, NOTICE_PEER_LOST, op as u64, 0]
                .into_iter()
                .chain(ranks.iter().map(|&r| r as u64))
                .collect()
        }
        _ => return None,
    };
    Some(words.iter().flat_map(|w| w.to_le_bytes()).collect())
}

/// A notice's serial and content (see [`encode_notice`]).
pub(super) fn decode_notice(bytes: &[u8]) -> Option<(u64, Notice)> {
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| c.try_into().map(u64::from_le_bytes))
        .collect::<std::result::Result<_, _>>()
        .ok()?;
    let (&[serial, round, kind, a, b], rest) = words.split_first_chunk::<5>()?;
    let error = match kind {
        NOTICE_TIMEOUT => CommError::Timeout {
            op: usize::try_from(a)
                .ok()
                .and_then(|i| NOTICE_OPS.get(i))
                .copied()
                .unwrap_or("a peer's call"),
            waited: Duration::from_nanos(b),
            missing: rest.iter().map(|&r| r as usize).collect(),
        },
        NOTICE_FAULT => CommError::Fault(crate::Fault::posted(
            usize::try_from(a).ok()?,
            crate::FaultKind::from_code(u32::try_from(b).ok()?),
        )),
        NOTICE_PEER_LOST => CommError::PeerLost {
            op: usize::try_from(a).ok().and_then(|i| NOTICE_OPS.get(i))?,
            ranks: rest.iter().map(|&r| r as usize).collect(),
        },
        _ => return None,
    };
    Some((serial, Notice { round, error }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_carry_the_round_and_the_error() {
        let errors = [
            CommError::Timeout {
                op: "recv",
                waited: Duration::from_millis(1500),
                missing: vec![3],
            },
            CommError::Timeout {
                op: "all_gather_varied",
                waited: Duration::from_secs(600),
                missing: vec![],
            },
            CommError::lane_lost(2),
            CommError::Fault(crate::Fault::posted(1, crate::FaultKind::NonFinite)),
            CommError::PeerLost {
                op: "drop",
                ranks: vec![3],
            },
        ];
        for (round, error) in errors.into_iter().enumerate() {
            let serial = 1000 + round as u64;
            let bytes = encode_notice(serial, round as u64, &error).expect("encodes");
            let (got_serial, notice) = decode_notice(&bytes).expect("decodes");
            assert_eq!(
                (got_serial, notice.round, notice.error),
                (serial, round as u64, error)
            );
        }
        assert!(encode_notice(1, 0, &CommError::WorkerStopped).is_none());
        assert!(decode_notice(&[1, 2, 3]).is_none());
        assert!(decode_notice(&[0; 8 * 5]).is_none());
    }
}
