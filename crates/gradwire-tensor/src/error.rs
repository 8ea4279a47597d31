//! The crate's one error type.
//!
//! Every fallible operation in `gradwire-tensor` returns [`Result`], so upper
//! crates (communication, compression, optimizers) can match on *why* a call
//! failed instead of parsing strings, and a library never panics on bad input.
//! The enum is `#[non_exhaustive]` so new failure modes (for example real CUDA
//! driver errors once the GPU backend lands) are not breaking changes.

use crate::{DType, Device, Shape};

/// Everything that can go wrong in a tensor operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Two tensors that must have the same shape do not.
    #[error("{op}: shape mismatch, lhs {lhs} vs rhs {rhs}")]
    ShapeMismatch {
        /// The operation that found the mismatch.
        op: &'static str,
        /// Shape of the left-hand side (usually `self` or the destination).
        lhs: Shape,
        /// Shape of the right-hand side (usually the argument or the source).
        rhs: Shape,
    },

    /// A buffer, slice or list has the wrong number of elements.
    #[error("{op}: length mismatch, expected {expected} elements, got {got}")]
    LengthMismatch {
        /// The operation that found the mismatch.
        op: &'static str,
        /// The length the operation needed.
        expected: usize,
        /// The length it was given.
        got: usize,
    },

    /// A tensor or element type has the wrong dtype for the operation.
    #[error("{op}: dtype mismatch, expected {expected}, got {got}")]
    DTypeMismatch {
        /// The operation that found the mismatch.
        op: &'static str,
        /// The dtype the operation needed.
        expected: DType,
        /// The dtype it was given.
        got: DType,
    },

    /// A tensor lives on the wrong device for the operation.
    #[error("{op}: device mismatch, expected {expected}, got {got}")]
    DeviceMismatch {
        /// The operation that found the mismatch.
        op: &'static str,
        /// The device the operation needed.
        expected: Device,
        /// The device it was given.
        got: Device,
    },

    /// A dtype name that is not one of `f32`, `f16`, `bf16`.
    #[error("unknown dtype {0:?} (expected one of f32, f16, bf16)")]
    UnknownDType(String),

    /// A CUDA device was requested but this build has no CUDA backend.
    #[error("gradwire-tensor was not compiled with CUDA support")]
    NotCompiledWithCuda,

    /// No usable CUDA device: the driver library is missing (no NVIDIA
    /// driver on this machine), it has no device with the requested ordinal,
    /// or it failed to initialise. The message says which.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),

    /// A CUDA driver call failed on a device that exists (out of memory, a
    /// PTX module the driver cannot load, ...). The message names the call
    /// and the driver's error.
    #[error("CUDA error: {0}")]
    Cuda(String),

    /// The product of a shape's dimensions (or the byte size of a buffer, or
    /// the total of a flat layout) does not fit in `usize` / `isize`.
    #[error("shape too large: element count or byte size overflows")]
    ShapeOverflow,

    /// An input that must be finite holds a NaN or an infinity (the
    /// selection and error-feedback kernels refuse it, as gradwire-compress
    /// does on the CPU); `index` is the first such element.
    #[error("{op}: element {index} is not finite")]
    NonFinite {
        /// The operation that refused the input.
        op: &'static str,
        /// The smallest index of a NaN or an infinity.
        index: usize,
    },

    /// An argument is outside the operation's domain (negative or NaN clamp
    /// bound, range out of bounds, ...). The message says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// What kind of failure an error is, the same vocabulary at every layer
/// (the `std::io::ErrorKind` shape): each crate's error has a `kind()`, and
/// the `gradwire` facade's error is matched by it, so a caller can branch
/// on the cause without naming the layer it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A bad input: an argument out of its domain, a tensor of the wrong
    /// shape, dtype, length or device, an unknown name, a setting refused.
    InvalidArgument,
    /// A NaN or an infinity where finite values are required.
    NonFinite,
    /// The ranks disagreed (the same collective called with different
    /// arguments), or a saved state does not match what loads it.
    Mismatch,
    /// A peer is gone: it left, dropped its communicator, or panicked (its
    /// thread or one of its asynchronous jobs). The communicator is
    /// unusable afterwards.
    PeerLost,
    /// A deadline passed before every rank arrived.
    Timeout,
    /// A rank failed locally and its failure ended the step on every rank
    /// (the failure model): the same error on every rank, naming the
    /// lowest failing rank.
    Fault,
    /// What the call needs is not here: CUDA, NCCL or MPI missing or not
    /// compiled in, an operation the backend cannot do in this environment.
    Unavailable,
    /// A call into CUDA, NCCL or MPI failed.
    Backend,
    /// Bytes that do not decode: a corrupt payload or checkpoint.
    Corrupt,
    /// Reading or writing a file failed.
    Io,
}

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NotCompiledWithCuda | Error::CudaUnavailable(_) => ErrorKind::Unavailable,
            Error::Cuda(_) => ErrorKind::Backend,
            Error::NonFinite { .. } => ErrorKind::NonFinite,
            Error::ShapeMismatch { .. }
            | Error::LengthMismatch { .. }
            | Error::DTypeMismatch { .. }
            | Error::DeviceMismatch { .. }
            | Error::UnknownDType(_)
            | Error::ShapeOverflow
            | Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
        }
    }
}

/// `std::result::Result` specialised to this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
