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
pub use gradwire_comm::{Fault, FaultKind};

/// Ends this rank's part of an operation with the local error `err`: posts
/// it as a fault in place of the rank's next collective (so that the other
/// ranks' call of it fails too, with [`AlgoError::Fault`]) and returns `err`.
/// If that collective failed for a reason of its own (a lost peer), `err` is
/// still what this rank returns.
pub fn fail<C: Communicator>(comm: &C, err: AlgoError) -> AlgoError {
    let _ = comm.post_fault(err.fault_kind());
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
        Some(kind) => Err(comm.post_fault(kind).into()),
        None => Ok(comm.barrier()?),
    }
}
