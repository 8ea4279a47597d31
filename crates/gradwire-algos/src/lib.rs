//! gradwire-algos: how ranks combine what they computed.
//!
//! The strategies, over any [`gradwire_comm::Communicator`] and usable
//! without DistOpt, each in its own module with its CPU and CUDA forms side
//! by side and implementing the one [`Strategy`] trait (a bucket combined
//! per call; state put back after a failed step; saved through a
//! [`StateDict`]): [`dense`] (all-reduce of one tensor or of a fused list),
//! [`half`] (f16/bf16 on the wire, f32 accumulation), [`sparse`] (a codec's
//! selection with optional error feedback and an automatic dense fallback),
//! [`powersgd`] (low-rank factors with error feedback), [`quantized`]
//! (1 and 8 bits both ways, error feedback), [`onebit_adam`] (Adam's
//! momentum in 1 bit after a warm-up) and [`adasum`] (any world size).
//! Each module also offers its collectives as plain functions, blocking or
//! on the communication thread (`_async`). [`dimreduce`] is the
//! PCA-subspace quasi-Newton step. [`cost`] models what each of them costs
//! per step on a network (alpha-beta, ring / tree / hierarchical
//! collectives), byte for byte what they send.
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
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]
// `deny`, not `forbid`: ndarray's `s!` expands to an `unsafe` block under
// `#[allow(unsafe_code)]`, which `forbid` rejects. No unsafe code of our own.
#![deny(unsafe_code)]

pub mod adasum;
pub mod cost;
pub mod dense;
#[cfg(feature = "cuda")]
mod device;
pub mod dimreduce;
mod error;
pub mod fault;
mod fusion;
pub mod half;
mod handle;
pub mod onebit_adam;
pub mod powersgd;
pub mod quantized;
pub mod reshard;
pub mod sparse;
pub mod strategy;

pub use adasum::AdaSum;
pub use dense::{
    DenseSum, all_reduce, all_reduce_async, fused_all_reduce, fused_all_reduce_async,
    fused_all_reduce_with,
};
#[cfg(feature = "cuda")]
pub use device::sparse_exchange_on_device;
pub use error::{AlgoError, Result};
pub use fault::{Fault, FaultKind};
pub use fusion::{DEFAULT_FUSION_CAPACITY, FusionBuffers};
pub use half::{
    HalfAverage, HalfOptions, HalfPrecision, half_all_reduce, half_all_reduce_async,
    half_all_reduce_with,
};
pub use handle::{Handle, Reduced, Traffic};
pub use onebit_adam::OneBitAdamExchange;
pub use powersgd::{PowerSgd, PowerSgdConfig};
pub use quantized::QuantizedAllReduce;
pub use sparse::{
    SparseSelect, sparse_all_reduce, sparse_all_reduce_async, sparse_costs_more, sparse_exchange,
    sparse_exchange_with,
};
pub use strategy::{BucketView, Combined, StateDict, Strategy};
