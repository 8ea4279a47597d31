//! The error type of the strategies.

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
    /// The collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A codec failed (non-finite input, a corrupt payload...).
    #[error(transparent)]
    Compress(#[from] CompressError),
    /// A tensor could not be used.
    #[error(transparent)]
    Tensor(#[from] gradwire_tensor::Error),
}

/// Result alias of this crate.
pub type Result<T, E = AlgoError> = std::result::Result<T, E>;
