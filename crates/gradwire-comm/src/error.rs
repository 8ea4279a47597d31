//! The one error type of every communicator.
//!
//! Errors that concern a collective as a whole (`Mismatch`, `PeerLost`,
//! `Timeout`, and `InvalidArgument` found while validating a collective) are
//! decided once per collective and returned to *every* rank that took part, so
//! that no rank continues while another gives up.

use crate::fault::Fault;
use gradwire_tensor::ErrorKind;
use std::time::Duration;

/// What can go wrong in a communicator call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// Ranks called the same collective with different arguments (kind,
    /// element type, length, reduction op or root). Detected before any data
    /// moves; every rank receives this error and the communicator stays usable.
    #[error("collective mismatch: {detail}")]
    Mismatch {
        /// Which ranks disagreed, and on what.
        detail: String,
    },
    /// A peer left (its communicator was dropped, or its thread panicked)
    /// before the operation could complete. The communicator is unusable
    /// afterwards.
    #[error("peer rank(s) {ranks:?} lost during {op}")]
    PeerLost {
        /// The operation that was under way.
        op: &'static str,
        /// The ranks that left.
        ranks: Vec<usize>,
    },
    /// The deadline passed before every rank arrived. The communicator is
    /// unusable afterwards (every later call returns this error again, and
    /// the peers' calls return it too: LocalComm's ranks share the poisoned
    /// group, MpiComm's rank tells its peers).
    #[error("{}", describe_timeout(.op, .waited, .missing))]
    Timeout {
        /// The operation that timed out.
        op: &'static str,
        /// The configured deadline.
        waited: Duration,
        /// The ranks that had not arrived; empty where the backend cannot
        /// tell (an MPI or NCCL collective: only a receive knows whom it
        /// waited for).
        missing: Vec<usize>,
    },
    /// An argument is invalid on its own (a root or peer rank out of range, a
    /// receive buffer of the wrong length, an op the element type does not
    /// support). For a collective, every rank receives it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A rank took part in this collective as failed
    /// ([`crate::Communicator::post_fault`]): something that rank found
    /// before the collective (a NaN, a bad argument) ends the collective on
    /// every rank with this error, naming the lowest such rank and the
    /// [`FaultKind`](crate::FaultKind) it posted. No data moved, and the
    /// communicator stays usable: every rank is at the same point of its
    /// collective sequence.
    ///
    /// The one exception is [`FaultKind::LaneLost`](crate::FaultKind::LaneLost):
    /// the asynchronous lane of the named rank is lost (one of its jobs
    /// panicked), and every later call on the communicator returns the same
    /// error, on every rank (see [`crate::Communicator::run_async`]).
    #[error(transparent)]
    Fault(Fault),
    /// A rank out of range for this communicator.
    #[error("rank {rank} is out of range for a world of {world_size}")]
    InvalidRank {
        /// The rank asked for.
        rank: usize,
        /// The size of the communicator.
        world_size: usize,
    },
    /// A rank's closure panicked (reported by [`crate::local::run`]), or
    /// one of its asynchronous jobs did (the job's own handle; the peers see
    /// a [`FaultKind::LaneLost`](crate::FaultKind::LaneLost) fault).
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank whose thread panicked.
        rank: usize,
        /// The panic message, when it was a string.
        message: String,
    },
    /// The communicator's background thread for asynchronous operations is
    /// gone (it can only stop when its communicator is dropped). A panicking
    /// job does not stop it: see [`FaultKind::LaneLost`](crate::FaultKind::LaneLost).
    #[error("the asynchronous communication thread has stopped")]
    WorkerStopped,
    /// An MPI call failed (feature `mpi`): the call, MPI's error code and the
    /// library's message for it. Communicators set `MPI_ERRORS_RETURN`, so
    /// MPI reports failures this way instead of aborting where it can.
    #[error("MPI error {code} in {op}: {message}")]
    Mpi {
        /// The MPI function that failed.
        op: &'static str,
        /// The error code it returned.
        code: i32,
        /// The library's description of the code (`MPI_Error_string`).
        message: String,
    },
    /// An NCCL call failed (NcclComm, feature `nccl`), with NCCL's code and
    /// its description of it (and the communicator's last error message).
    /// After a failed collective the communicator is aborted: every later
    /// call returns this error again.
    #[error("NCCL error {code} in {op}: {message}")]
    Nccl {
        /// The NCCL function that failed.
        op: &'static str,
        /// The `ncclResult_t` it returned.
        code: i32,
        /// NCCL's description of it.
        message: String,
    },
    /// NcclComm cannot run here: no NCCL library, one older than 2.18, or no
    /// CUDA device. The message says which.
    #[error("NCCL unavailable: {0}")]
    NcclUnavailable(String),
    /// The backend cannot do this in the current environment (for example
    /// asynchronous jobs when MPI provides less than `MPI_THREAD_MULTIPLE`).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A tensor could not be used (wrong device, dtype accessor...).
    #[error(transparent)]
    Tensor(#[from] gradwire_tensor::Error),
}

fn describe_timeout(op: &str, waited: &Duration, missing: &[usize]) -> String {
    if missing.is_empty() {
        format!("{op} timed out after {waited:?}: not every rank arrived")
    } else {
        format!("{op} timed out after {waited:?}: rank(s) {missing:?} did not arrive")
    }
}

impl CommError {
    /// What kind of failure this is: a lost asynchronous lane is a lost
    /// peer (the communicator is unusable), any other posted fault a
    /// [`ErrorKind::Fault`].
    pub fn kind(&self) -> ErrorKind {
        match self {
            CommError::Mismatch { .. } => ErrorKind::Mismatch,
            CommError::PeerLost { .. }
            | CommError::RankPanicked { .. }
            | CommError::WorkerStopped => ErrorKind::PeerLost,
            CommError::Fault(fault) => fault.error_kind(),
            CommError::Timeout { .. } => ErrorKind::Timeout,
            CommError::InvalidArgument(_) | CommError::InvalidRank { .. } => {
                ErrorKind::InvalidArgument
            }
            CommError::Mpi { .. } | CommError::Nccl { .. } => ErrorKind::Backend,
            CommError::NcclUnavailable(_) | CommError::Unsupported(_) => ErrorKind::Unavailable,
            CommError::Tensor(e) => e.kind(),
        }
    }

    /// Whether this is the fault of a lost asynchronous lane
    /// ([`FaultKind::LaneLost`](crate::FaultKind::LaneLost)), which poisons
    /// the communicator that sees it.
    pub fn is_lane_lost(&self) -> bool {
        matches!(self, CommError::Fault(fault) if fault.kind == crate::FaultKind::LaneLost)
    }

    /// The fault of lane lost by `rank`, as every rank sees it.
    pub fn lane_lost(rank: usize) -> CommError {
        CommError::Fault(Fault::posted(rank, crate::FaultKind::LaneLost))
    }
}

/// Result alias of this crate.
pub type Result<T, E = CommError> = std::result::Result<T, E>;
