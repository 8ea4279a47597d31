//! The error type of the optimizers and checkpoints, and the one every
//! core crate's error converts into: a tensor's, a communicator's, a
//! codec's and a strategy's (`?` works across the layers).

/// What can go wrong in an update, a configuration or a checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OptimError {
    /// A hyper-parameter or argument is out of its domain (negative momentum,
    /// nesterov without momentum, a schedule with a zero period...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A strategy's text or settings were refused (an unknown name, a
    /// ratio outside (0, 1], ...).
    #[error(transparent)]
    Strategy(#[from] crate::StrategyError),
    /// A parameter and its gradient (or a saved buffer) differ in shape.
    #[error("{what}: shape {expected:?} expected, got {got:?}")]
    ShapeMismatch {
        /// What was compared.
        what: String,
        /// The shape required.
        expected: Vec<usize>,
        /// The shape given.
        got: Vec<usize>,
    },
    /// A state or checkpoint names a parameter, buffer or optimizer kind that
    /// does not match the optimizer it is loaded into.
    #[error("state mismatch: {0}")]
    StateMismatch(String),
    /// A checkpoint file is truncated, corrupt, or of an unknown version.
    #[error("corrupt checkpoint: {0}")]
    CorruptCheckpoint(String),
    /// A checkpoint holds a NaN or an infinity (in an optimizer buffer, a
    /// parameter or a strategy's state), refused unless the loader is told
    /// to accept them ([`crate::checkpoint::LoadOptions`]).
    #[error("checkpoint: {tensor} holds the non-finite value {value} at index {index}")]
    NonFiniteCheckpoint {
        /// The tensor's name in the file.
        tensor: String,
        /// The first non-finite element's index.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// Reading or writing a checkpoint failed.
    #[error("checkpoint I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A fault ended a DistOpt step on every rank (the failure model, see
    /// [`crate::DistOpt`]): every rank returns this error from the same
    /// step, naming the same rank (the lowest that failed; `None` when the
    /// fault is in a value every rank computed alike, such as an averaged
    /// gradient) and the same kind. Its `detail` is the failing rank's own
    /// description on that rank (empty elsewhere: only the kind travels).
    /// The communicator's [`Fault`](gradwire_algos::Fault), unchanged.
    #[error("step failed: {0}")]
    Fault(gradwire_algos::Fault),
    /// Combining gradients across ranks failed (a lost peer, a mismatch, a
    /// timeout...).
    #[error(transparent)]
    Distributed(gradwire_algos::AlgoError),
    /// A tensor could not be used (wrong dtype, device...).
    #[error(transparent)]
    Tensor(#[from] gradwire_tensor::Error),
}

impl OptimError {
    /// `what` (a checkpoint, a restore, a strategy change) asked for while
    /// a step is between its micro-batches, `done` of `of` taken: it must
    /// come between steps. The one wording of the engine's accumulation
    /// and of the front ends that sum a framework's gradients themselves.
    pub fn between_micro_batches(what: &str, done: u32, of: u32) -> OptimError {
        OptimError::InvalidArgument(format!(
            "{what} between the micro-batches of a step ({done} of {of} accumulated): call it \
             after the step's last micro-batch"
        ))
    }

    /// What kind of failure this is, whichever layer it came from
    /// (`std::io::Error`'s shape): a lost peer is
    /// [`ErrorKind::PeerLost`](gradwire_tensor::ErrorKind::PeerLost)
    /// whether the communicator, a strategy or DistOpt saw it.
    pub fn kind(&self) -> gradwire_tensor::ErrorKind {
        use gradwire_tensor::ErrorKind;
        match self {
            OptimError::InvalidArgument(_)
            | OptimError::Strategy(_)
            | OptimError::ShapeMismatch { .. } => ErrorKind::InvalidArgument,
            OptimError::StateMismatch(_) => ErrorKind::Mismatch,
            OptimError::CorruptCheckpoint(_) => ErrorKind::Corrupt,
            OptimError::NonFiniteCheckpoint { .. } => ErrorKind::NonFinite,
            OptimError::Io(_) => ErrorKind::Io,
            OptimError::Fault(fault) => fault.error_kind(),
            OptimError::Distributed(e) => e.kind(),
            OptimError::Tensor(e) => e.kind(),
        }
    }
}

/// A strategy's error: a saved state that does not match
/// ([`gradwire_algos::AlgoError::StateMismatch`]) is this crate's
/// [`OptimError::StateMismatch`], as the rest of a checkpoint's; anything
/// else is [`OptimError::Distributed`].
impl From<gradwire_algos::AlgoError> for OptimError {
    fn from(e: gradwire_algos::AlgoError) -> Self {
        match e {
            gradwire_algos::AlgoError::StateMismatch(what) => OptimError::StateMismatch(what),
            e => OptimError::Distributed(e),
        }
    }
}

/// A communicator's error (a lost peer, a timeout, a mismatch), as the
/// strategies report it: so `?` works on a collective inside a function
/// returning [`OptimError`].
impl From<gradwire_comm::CommError> for OptimError {
    fn from(e: gradwire_comm::CommError) -> Self {
        OptimError::Distributed(e.into())
    }
}

/// A codec's error, as the strategies report it.
impl From<gradwire_compress::CompressError> for OptimError {
    fn from(e: gradwire_compress::CompressError) -> Self {
        OptimError::Distributed(e.into())
    }
}

/// Result alias of this crate.
pub type Result<T, E = OptimError> = std::result::Result<T, E>;
