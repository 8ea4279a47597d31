//! The CLI's error: a bad flag is a usage message, everything else carries
//! the typed error of the layer it came from.

use thiserror::Error;

/// What can go wrong in a `gradwire` command.
#[derive(Debug, Error)]
pub enum ExperimentError {
    /// A flag or combination of flags that cannot work (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// A checkpoint directory that does not fit this run.
    #[error("cannot resume: {0}")]
    Resume(String),
    /// Another rank failed at a step every rank takes alike (writing its
    /// checkpoint, evaluating the model); that rank's own error is in its
    /// output. No rank goes on alone.
    #[error("rank {rank} could not {what}")]
    Peer {
        /// The lowest rank that failed.
        rank: usize,
        /// What it could not do ("write its checkpoint of epoch 3").
        what: String,
    },
    /// Training failed in the optimizer or DistOpt.
    #[error(transparent)]
    Optim(#[from] gradwire_optim::OptimError),
    /// A strategy failed (AdaSum, DimReduce, compression).
    #[error(transparent)]
    Algo(#[from] gradwire_algos::AlgoError),
    /// The communicator failed (a lost peer, a timeout).
    #[error(transparent)]
    Comm(#[from] gradwire_comm::CommError),
    /// A codec failed.
    #[error(transparent)]
    Compress(#[from] gradwire_compress::CompressError),
    /// The candle model failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// gradwire-candle refused a variable (its other errors arrive as
    /// [`ExperimentError::Optim`] or [`ExperimentError::Candle`]).
    #[error(transparent)]
    DataParallel(gradwire_candle::Error),
    /// A tensor could not be built or used.
    #[error(transparent)]
    Tensor(#[from] gradwire_tensor::Error),
    /// Writing a report, a plot or a checkpoint failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What happened.
        source: std::io::Error,
    },
    /// A plot could not be drawn.
    #[error("plot {path}: {message}")]
    Plot {
        /// The file.
        path: String,
        /// What the drawing backend said.
        message: String,
    },
    /// The shaped network of `--network` could not be set up or used; the
    /// message says what is missing (root, a tool, a capability).
    #[error("network: {0}")]
    Network(String),
    /// JSON could not be written or read.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// gradwire-candle's error by the layer it came from: gradwire's typed
/// error as [`ExperimentError::Optim`], candle's as
/// [`ExperimentError::Candle`].
impl From<gradwire_candle::Error> for ExperimentError {
    fn from(e: gradwire_candle::Error) -> Self {
        match e {
            gradwire_candle::Error::Gradwire(e) => ExperimentError::Optim(e),
            gradwire_candle::Error::Candle(e) => ExperimentError::Candle(e),
            e => ExperimentError::DataParallel(e),
        }
    }
}

impl ExperimentError {
    /// The error for `--backend mpi` in a build without MPI.
    #[cfg(not(feature = "mpi"))]
    pub(crate) fn mpi_missing() -> ExperimentError {
        ExperimentError::Usage(
            "this gradwire was built without MPI: cargo build --release -p gradwire-cli --features mpi, \
             then run it under mpirun"
                .into(),
        )
    }

    /// The error for `--backend nccl` in a build without NCCL support.
    #[cfg(not(feature = "nccl"))]
    pub(crate) fn nccl_missing() -> ExperimentError {
        ExperimentError::Usage(
            "this gradwire was built without NCCL: cargo build --release -p gradwire-cli --features nccl"
                .into(),
        )
    }

    /// The error for `gradwire bench kernels` in a build without CUDA.
    #[cfg(not(feature = "cuda"))]
    pub(crate) fn cuda_missing() -> ExperimentError {
        ExperimentError::Usage(
            "this gradwire was built without CUDA: cargo build --release -p gradwire-cli --features cuda"
                .into(),
        )
    }
}

#[cfg(test)]
impl ExperimentError {
    /// Whether this is the usage error of a build without `feature`.
    pub(crate) fn is_built_without(&self, feature: &str) -> bool {
        matches!(self, ExperimentError::Usage(m) if m.contains(&format!("--features {feature}")))
    }
}

/// Asserts that `result` is an [`ExperimentError::Usage`] whose message
/// contains `what`, and says what it was otherwise.
#[cfg(test)]
#[track_caller]
pub(crate) fn assert_usage<T>(result: Result<T>, what: &str) {
    match result {
        Err(ExperimentError::Usage(m)) if m.contains(what) => {}
        Err(e) => panic!("expected a usage error saying {what:?}, got {e:?}"),
        Ok(_) => panic!("expected a usage error saying {what:?}, got Ok"),
    }
}

/// Result alias of this crate.
pub type Result<T, E = ExperimentError> = std::result::Result<T, E>;
