//! gradwire-algos: how ranks combine what they computed.
//!
//! Strategies over any [`gradwire_comm::Communicator`], usable without
//! DistOpt: dense all-reduce of one tensor or of a fused list, half-precision
//! all-reduce (f32 accumulation), and sparse all-reduce with optional error
//! feedback and an automatic dense fallback; [`adasum`] for any world size;
//! [`powersgd`]'s low-rank all-reduce with error feedback; [`quantized`]'s
//! 1-bit and 8-bit all-reduce (compressed both ways, error feedback).
//! [`dimreduce`] for PCA-subspace quasi-Newton steps. [`cost`] models what
//! each of them costs per step on a network (alpha-beta, ring / tree /
//! hierarchical collectives), byte for byte what they send.
//!
//! ```
//! use gradwire_algos::{DEFAULT_FUSION_CAPACITY, fused_all_reduce_async};
//! use gradwire_comm::{ReduceOp, local};
//! use gradwire_tensor::Tensor;
//!
//! let sums = local::run(3, |comm| {
//!     let grads = vec![Tensor::from_vec(vec![1.0f32; 4], 4)?, Tensor::from_vec(vec![2.0f32; 2], 2)?];
//!     let handle = fused_all_reduce_async(&comm, grads, ReduceOp::Sum, DEFAULT_FUSION_CAPACITY)?;
//!     // ... backward goes on here ...
//!     let reduced = handle.wait()?;
//!     Ok::<_, gradwire_algos::AlgoError>(reduced.value[1].to_vec::<f32>()?)
//! })
//! .unwrap();
//! assert_eq!(sums[0].as_ref().unwrap(), &vec![6.0, 6.0]);
//! ```

#![deny(missing_docs)]
// `deny`, not `forbid`: ndarray's `s!` expands to an `unsafe` block under
// `#[allow(unsafe_code)]`, which `forbid` rejects. No unsafe code of our own.
#![deny(unsafe_code)]

pub mod adasum;
pub mod cost;
#[cfg(feature = "cuda")]
mod device;
pub mod dimreduce;
mod error;
pub mod fault;
mod handle;
pub mod powersgd;
pub mod quantized;
mod reduce;

pub use adasum::AdaSum;
#[cfg(feature = "cuda")]
pub use device::sparse_exchange_on_device;
pub use error::{AlgoError, Result};
pub use fault::FaultKind;
pub use handle::{Handle, Reduced, Traffic};
pub use powersgd::{PowerSgd, PowerSgdConfig};
pub use quantized::QuantizedAllReduce;
pub use reduce::{
    DEFAULT_FUSION_CAPACITY, FusionBuffers, HalfOptions, HalfPrecision, all_reduce,
    all_reduce_async, fused_all_reduce, fused_all_reduce_async, fused_all_reduce_with,
    half_all_reduce, half_all_reduce_async, half_all_reduce_with, sparse_all_reduce,
    sparse_all_reduce_async, sparse_costs_more, sparse_exchange, sparse_exchange_with,
};
