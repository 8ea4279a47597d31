//! The error type of the strategies.

use crate::fault::{Fault, FaultKind};
use gradwire_comm::CommError;
use gradwire_compress::CompressError;

/// What can go wrong while combining gradients.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AlgoError {
    /// A fused list holds more elements than the fusion buffer: SINGA wrote
    /// past its buffer here; gradwire refuses before anything is sent.
    #[error("{needed} elements do not fit a fusion buffer of {capacity}")]
    Capacity {
        /// Elements of the list.
        needed: usize,
        /// The buffer's capacity.
        capacity: usize,
    },
    /// An argument is out of its domain.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A saved state ([`crate::StateDict`]) does not match the strategy it
    /// is loaded into (a missing entry, a wrong length or layout).
    #[error("state mismatch: {0}")]
    StateMismatch(String),
    /// A rank failed (see [`crate::fault`]): it posted a fault in place of
    /// the collective this rank was in, so this rank's operation ends here
    /// too, at the same point of the sequence as every other rank's. The
    /// communicator's [`Fault`], unchanged.
    #[error(transparent)]
    Fault(Fault),
    /// The collective failed.
    #[error(transparent)]
    Comm(CommError),
    /// A codec failed (non-finite input, a corrupt payload...).
    #[error(transparent)]
    Compress(#[from] CompressError),
    /// A tensor could not be used.
    #[error(transparent)]
    Tensor(#[from] gradwire_tensor::Error),
}

impl From<CommError> for AlgoError {
    /// A [`CommError::Fault`] becomes [`AlgoError::Fault`], the fault
    /// unchanged, except a lost asynchronous lane, which poisons the
    /// communicator and stays a `Comm` error; anything else too.
    fn from(e: CommError) -> Self {
        match e {
            CommError::Fault(fault) if fault.kind != FaultKind::LaneLost => AlgoError::Fault(fault),
            e => AlgoError::Comm(e),
        }
    }
}

impl AlgoError {
    /// What kind of failure this is.
    pub fn kind(&self) -> gradwire_tensor::ErrorKind {
        use gradwire_tensor::ErrorKind;
        match self {
            AlgoError::Capacity { .. } | AlgoError::InvalidArgument(_) => {
                ErrorKind::InvalidArgument
            }
            AlgoError::StateMismatch(_) => ErrorKind::Mismatch,
            AlgoError::Fault(fault) => fault.error_kind(),
            AlgoError::Comm(e) => e.kind(),
            AlgoError::Compress(e) => e.kind(),
            AlgoError::Tensor(e) => e.kind(),
        }
    }

    /// The kind of fault this error is, as posted to the other ranks: the
    /// same on the rank that failed and on every rank it failed.
    pub fn fault_kind(&self) -> FaultKind {
        match self {
            AlgoError::Fault(fault) => fault.kind,
            AlgoError::Capacity { .. } | AlgoError::InvalidArgument(_) => {
                FaultKind::InvalidArgument
            }
            AlgoError::Compress(CompressError::NonFinite { .. })
            | AlgoError::Tensor(gradwire_tensor::Error::NonFinite { .. }) => FaultKind::NonFinite,
            AlgoError::Tensor(e) if e.kind() == gradwire_tensor::ErrorKind::InvalidArgument => {
                FaultKind::InvalidArgument
            }
            _ => FaultKind::Other,
        }
    }
}

/// `Ok` for an f32 tensor in host memory, what `op` runs on; otherwise the
/// typed mismatch ([`gradwire_tensor::Error::DTypeMismatch`] or
/// [`gradwire_tensor::Error::DeviceMismatch`]).
pub(crate) fn require_f32_on_host(op: &'static str, t: &gradwire_tensor::Tensor) -> Result<()> {
    use gradwire_tensor::{DType, Device, Error};
    if t.dtype() != DType::F32 {
        return Err(Error::DTypeMismatch {
            op,
            expected: DType::F32,
            got: t.dtype(),
        }
        .into());
    }
    if !t.device().is_cpu() {
        return Err(Error::DeviceMismatch {
            op,
            expected: Device::Cpu,
            got: t.device(),
        }
        .into());
    }
    Ok(())
}

/// Result alias of this crate.
pub type Result<T, E = AlgoError> = std::result::Result<T, E>;
