//! gradwire-compress: the codecs that shrink what crosses the wire.
//!
//! This crate never communicates: it turns a gradient into a payload and a
//! payload back into a dense contribution, and it keeps the error-feedback
//! memory. It depends on gradwire-tensor only and works on plain `&[f32]`.
//!
//! - [`cast`]: f32 to f16 / bf16 and back, with clamp and scale;
//! - [`select`]: threshold, exact top-k (radix select), sampled top-k (DGC),
//!   random-k, each giving a [`SparseVec`];
//! - [`ErrorFeedback`]: the residual memory (SINGA's `corr`), with optional
//!   DGC momentum correction;
//! - [`lowrank`]: PowerSGD's low-rank factors (projections, orthonormalisation);
//! - [`quant`]: 1-bit scaled sign, QSGD, E3M0 and min-max uint8 quantizers;
//! - [`wire`]: the validated sparse payload format, `scatter_add` and the
//!   dense fallback test;
//! - `cuda` (feature `cuda`): the same codecs, quantizers and error feedback
//!   on CUDA device buffers, selecting and encoding exactly what the CPU
//!   does.
//!
//! ```
//! use gradwire_compress::{ErrorFeedback, SparseCodec};
//!
//! let mut memory = ErrorFeedback::new(6);
//! let sent = memory.compress(&[0.1, -3.0, 0.2, 2.0, -0.1, 0.0], &SparseCodec::TopK(0.3))?;
//! assert_eq!(sent.indices(), &[1, 3]);
//! assert_eq!(memory.residual(), &[0.1, 0.0, 0.2, 0.0, -0.1, 0.0]);
//! # Ok::<(), gradwire_compress::CompressError>(())
//! ```

#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]

pub mod cast;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod feedback;
pub mod lowrank;
pub mod quant;
pub mod select;
mod sparse;
pub mod wire;

pub use error::{CompressError, Result};
pub use feedback::{ErrorFeedback, ErrorFeedbackState, SparseCodec};
pub use quant::{QsgdNorm, Quantizer};
pub use select::SelectScratch;
pub use sparse::SparseVec;
