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

/// `std::result::Result` specialised to this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
