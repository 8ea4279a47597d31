//! gradwire: communication-efficient data-parallel training.
//!
//! The facade over the gradwire crates: depend on this one crate and pick the
//! layers with features, or depend on the layer crates directly.
//!
//! | module | crate | what |
//! |---|---|---|
//! | [`tensor`] | gradwire-tensor | tensors (f32/f16/bf16) with the lazy zeroed flag |
//! | [`comm`] | gradwire-comm (feature `comm`, default) | the `Communicator` trait and its backends |
//! | [`compress`] | gradwire-compress (feature `compress`, default) | casts, sparsifiers, error feedback, the sparse wire format |
//! | [`optim`] | gradwire-optim (feature `optim`, default) | optimizers, schedules, checkpoints |
//!
//! ```
//! use gradwire::{Communicator, ReduceOp, comm::local};
//!
//! let averaged = local::run(2, |comm| {
//!     let mut grad = vec![comm.rank() as f32 * 2.0; 4];
//!     comm.all_reduce(&mut grad, ReduceOp::Avg).map(|()| grad)
//! })?;
//! assert_eq!(averaged[0].as_ref().unwrap(), &vec![1.0; 4]);
//! # Ok::<(), gradwire::CommError>(())
//! ```

#![deny(missing_docs)]

pub use gradwire_tensor as tensor;
pub use gradwire_tensor::{DType, Device, Shape, Tensor};

#[cfg(feature = "comm")]
pub use gradwire_comm as comm;
#[cfg(feature = "comm")]
pub use gradwire_comm::{CommError, Communicator, LocalComm, ReduceOp};

#[cfg(feature = "compress")]
pub use gradwire_compress as compress;

#[cfg(feature = "optim")]
pub use gradwire_optim as optim;
