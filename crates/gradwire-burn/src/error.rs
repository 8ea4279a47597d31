//! gradwire-burn's error: gradwire's typed error, or a tensor burn could not
//! read. A training loop that needs to tell a lost peer from a bad shape
//! matches this type (or its [`Error::kind`]).

use gradwire_optim::OptimError;
use gradwire_tensor::ErrorKind;

/// What can go wrong in gradwire-burn.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// gradwire failed: the communicator (a lost peer, a timeout, a
    /// mismatch), a strategy or a checkpoint. The typed error of the layer
    /// it came from; [`OptimError::kind`] says which kind of failure it is.
    #[error(transparent)]
    Gradwire(#[from] OptimError),
    /// burn could not hand over a tensor's values (a backend's execution
    /// error, a dtype it cannot convert to f32).
    #[error("gradwire-burn: reading {what}: {detail}")]
    Burn {
        /// Which tensor: a parameter or a gradient, by name.
        what: String,
        /// burn's message.
        detail: String,
    },
}

impl Error {
    /// What kind of failure this is, in the vocabulary of every gradwire
    /// error: gradwire's own kind for [`Error::Gradwire`] (`PeerLost`,
    /// `Timeout`, `Mismatch`, ...), `Backend` for a tensor burn could not
    /// read.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Gradwire(e) => e.kind(),
            Error::Burn { .. } => ErrorKind::Backend,
        }
    }

    /// gradwire's typed error, if this is one.
    pub fn as_gradwire(&self) -> Option<&OptimError> {
        match self {
            Error::Gradwire(e) => Some(e),
            Error::Burn { .. } => None,
        }
    }
}

/// A strategy's text or settings refused.
impl From<gradwire_optim::StrategyError> for Error {
    fn from(e: gradwire_optim::StrategyError) -> Self {
        Error::Gradwire(e.into())
    }
}

/// A communicator's error.
impl From<gradwire_comm::CommError> for Error {
    fn from(e: gradwire_comm::CommError) -> Self {
        Error::Gradwire(e.into())
    }
}

/// gradwire-burn's error where GradSync's callbacks need gradwire's:
/// gradwire's own as it was, a burn failure as an invalid argument (its
/// text).
pub(crate) fn into_optim(e: Error) -> OptimError {
    match e {
        Error::Gradwire(e) => e,
        e => OptimError::InvalidArgument(e.to_string()),
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
