//! The failure model of every multi-collective operation: a fault found on
//! one rank ends the operation on *every* rank, at the same point of the
//! collective sequence, so the next operation works.
//!
//! A rank that fails between two collectives (a NaN in its gradient, a bad
//! argument, an optimizer error) does not return early: it takes part in
//! its next collective as failed ([`Communicator::post_fault`], with a
//! [`FaultKind`] as the code) and then returns its own error; every other
//! rank's call of that collective returns [`AlgoError::Fault`] naming the
//! rank and the kind. Everything a strategy can check locally is checked
//! before its first collective, so a fault never leaves a rank halfway.

use crate::error::{AlgoError, Result};
use gradwire_comm::Communicator;

/// What kind of fault a rank posted (the code of
/// [`Communicator::post_fault`] in gradwire's strategies and DistOpt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultKind {
    /// A NaN or an infinity in a gradient (or a value computed from it).
    NonFinite,
    /// A bad call: an unknown parameter, a wrong shape, dtype, device or
    /// length, a capacity exceeded, a misuse of a mode.
    InvalidArgument,
    /// The optimizer's update failed.
    Optimizer,
    /// A strategy (AdaSum or a user's strategy) failed.
    Strategy,
    /// Anything else (a tensor operation, a codec).
    Other,
}

impl FaultKind {
    const ALL: [FaultKind; 5] = [
        FaultKind::NonFinite,
        FaultKind::InvalidArgument,
        FaultKind::Optimizer,
        FaultKind::Strategy,
        FaultKind::Other,
    ];

    /// The code posted for this kind (1..=5; the comm layer reserves codes
    /// of its own far above these).
    pub fn code(self) -> u32 {
        match self {
            FaultKind::NonFinite => 1,
            FaultKind::InvalidArgument => 2,
            FaultKind::Optimizer => 3,
            FaultKind::Strategy => 4,
            FaultKind::Other => 5,
        }
    }

    /// The kind of a posted code, if it is one of these.
    pub fn from_code(code: u32) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.code() == code)
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FaultKind::NonFinite => "non-finite value",
            FaultKind::InvalidArgument => "invalid argument",
            FaultKind::Optimizer => "optimizer error",
            FaultKind::Strategy => "strategy error",
            FaultKind::Other => "error",
        })
    }
}

/// Ends this rank's part of an operation with the local error `err`: posts
/// it as a fault in place of the rank's next collective (so that the other
/// ranks' call of it fails too, with [`AlgoError::Fault`]) and returns `err`.
/// If that collective failed for a reason of its own (a lost peer), `err` is
/// still what this rank returns.
pub fn fail<C: Communicator>(comm: &C, err: AlgoError) -> AlgoError {
    let _ = comm.post_fault(err.fault_kind().code());
    err
}

/// Runs `local` (this rank's checks and preparation, which issue no
/// collective) and, if it fails, ends the operation on every rank through
/// [`fail`]: the rank's next collective carries the fault.
pub fn prepare<C: Communicator, T>(comm: &C, local: impl FnOnce() -> Result<T>) -> Result<T> {
    local().map_err(|e| fail(comm, e))
}

/// An agreement on its own: one header-only collective in which this rank
/// posts `fault`, if it has one, or else waits at a barrier. Afterwards
/// every rank knows whether any rank had a fault: `Ok` on every rank when
/// none did, else [`AlgoError::Fault`] naming the lowest faulting rank and
/// its kind on every rank (the faulting ones too). For a step that has no
/// collective of its own to carry a fault (DistOpt's local-step modes, the
/// agreement after its updates).
pub fn agree<C: Communicator>(comm: &C, fault: Option<FaultKind>) -> Result<()> {
    match fault {
        Some(kind) => Err(comm.post_fault(kind.code()).into()),
        None => Ok(comm.barrier()?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_stay_below_the_comm_layers_own() {
        for kind in FaultKind::ALL {
            assert_eq!(FaultKind::from_code(kind.code()), Some(kind));
            assert!(kind.code() < 1 << 16);
        }
        assert_eq!(FaultKind::from_code(0), None);
        assert_eq!(FaultKind::from_code(u32::MAX), None);
    }
}
