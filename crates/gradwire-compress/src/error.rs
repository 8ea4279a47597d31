//! The error type of the codecs and the wire format.

/// What can go wrong while compressing, decoding or applying a payload.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CompressError {
    /// Two buffers that must have the same length do not.
    #[error("{op}: expected {expected} elements, got {got}")]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// The length required.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// A parameter is out of its domain (a ratio outside (0, 1], a negative
    /// threshold or clip value, a NaN parameter...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The input holds a NaN or an infinity. The codecs refuse it rather than
    /// send it (it would poison every rank's sum) or keep it in the error
    /// feedback residual (where it would stay forever, SINGA's defect); the
    /// caller skips the step, as loss scalers do on overflow.
    #[error("non-finite value {value} at index {index}")]
    NonFinite {
        /// The first offending index.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// A dense buffer is too long for the wire format's u32 indices.
    #[error("a dense buffer of {0} elements is too long for u32 indices")]
    TooLong(usize),
    /// A payload failed validation: it is never applied.
    #[error("corrupt payload: {0}")]
    Corrupt(String),
    /// A tensor could not be used (wrong dtype, device...).
    #[error(transparent)]
    Tensor(#[from] gradwire_tensor::Error),
}

impl CompressError {
    /// What kind of failure this is.
    pub fn kind(&self) -> gradwire_tensor::ErrorKind {
        use gradwire_tensor::ErrorKind;
        match self {
            CompressError::NonFinite { .. } => ErrorKind::NonFinite,
            CompressError::Corrupt(_) => ErrorKind::Corrupt,
            CompressError::LengthMismatch { .. }
            | CompressError::InvalidArgument(_)
            | CompressError::TooLong(_) => ErrorKind::InvalidArgument,
            CompressError::Tensor(e) => e.kind(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = CompressError> = std::result::Result<T, E>;
