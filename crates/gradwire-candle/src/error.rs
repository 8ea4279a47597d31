//! gradwire-candle's error: gradwire's typed error, candle's, or a variable
//! this version cannot train. It converts into [`candle_core::Error`] with
//! `?`, so a candle training loop keeps its `candle_core::Result`; a loop that
//! needs to tell a lost peer from a bad shape matches this type (or its
//! [`Error::kind`]) before converting.

use candle_core::DType;
use gradwire_optim::OptimError;
use gradwire_tensor::ErrorKind;

/// What can go wrong in gradwire-candle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// gradwire failed: the communicator (a lost peer, a timeout, a
    /// mismatch), a strategy, the optimizer or a checkpoint. The typed
    /// error of the layer it came from; [`OptimError::kind`] says which
    /// kind of failure it is.
    #[error(transparent)]
    Gradwire(#[from] OptimError),
    /// candle failed: an operation on the model's tensors, a backward
    /// pass, a conversion.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// A variable this version cannot train (it trains f32 parameters in
    /// CPU memory).
    #[error(
        "gradwire-candle: {name} is {dtype:?} on {device}; this version trains f32 parameters on the CPU"
    )]
    Unsupported {
        /// The variable's name.
        name: String,
        /// Its dtype.
        dtype: DType,
        /// Its device, as candle prints it.
        device: String,
    },
}

impl Error {
    /// What kind of failure this is, in the vocabulary of every gradwire
    /// error: gradwire's own kind for [`Error::Gradwire`] (`PeerLost`,
    /// `Timeout`, `Mismatch`, ...), `Backend` for a candle failure,
    /// `InvalidArgument` for a variable it cannot train.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Gradwire(e) => e.kind(),
            Error::Candle(_) => ErrorKind::Backend,
            Error::Unsupported { .. } => ErrorKind::InvalidArgument,
        }
    }

    /// gradwire's typed error, if this is one.
    pub fn as_gradwire(&self) -> Option<&OptimError> {
        match self {
            Error::Gradwire(e) => Some(e),
            _ => None,
        }
    }
}

/// Into candle's error, for `?` in a loop returning `candle_core::Result`:
/// a candle error comes back as it was; gradwire's are wrapped (their text
/// kept; candle's wrapper cannot be matched on, which is why gradwire-candle
/// returns this type).
impl From<Error> for candle_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Candle(e) => e,
            e => candle_core::Error::wrap(e),
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

/// A tensor's error (building gradwire tensors of the variables).
impl From<gradwire_tensor::Error> for Error {
    fn from(e: gradwire_tensor::Error) -> Self {
        Error::Gradwire(e.into())
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
