//! Tensors for gradwire: owned, contiguous `f32` / `f16` / `bf16` buffers on
//! the CPU (CUDA behind the `cuda` feature), with a lazy
//! *zeroed* flag for gradients.
//!
//! This is the bottom layer of the workspace. The communication, compression
//! and optimizer crates build on four things from here:
//!
//! * [`Tensor`]: shape + dtype + storage, with O(1) [`Tensor::zero_`] whose
//!   flag lets the upper layers skip gradients that backward never wrote
//!   (nnabla's "zeroing", see the [`tensor`] module docs);
//! * [`WithDType`]: the sealed trait naming the element types in generic
//!   code, with exact widening to f32 and nearest-even rounding back;
//! * [`ops`]: elementwise kernels and f64-accumulated, deterministic
//!   reductions, on plain slices and on tensors;
//! * [`flat`]: packing many tensors into one fusion buffer and back.
//!
//! With the `cuda` feature the same operations run on CUDA tensors, and
//! `cuda_backend::launch` is the typed launch through which every crate
//! queues kernels: each launch is checked against the kernel's signature in
//! gradwire-kernels, so the upper crates launch their device forms
//! (optimizer updates, sparse selection, error feedback, quantizers,
//! AdaSum) without `unsafe`.
//!
//! ```
//! use gradwire_tensor::{DType, Device, Tensor};
//!
//! # fn main() -> gradwire_tensor::Result<()> {
//! let mut g = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], 3)?;
//! g.zero_(); // O(1): nothing written
//! assert!(g.is_zeroed());
//! assert_eq!(g.as_slice::<f32>()?, &[0.0, 0.0, 0.0]); // reads see zeros
//! g.axpy(2.0, &Tensor::full(1.0, 3, DType::F32, Device::Cpu)?)?; // a write
//! assert!(!g.is_zeroed());
//! assert_eq!(g.to_vec::<f32>()?, vec![2.0, 2.0, 2.0]);
//! # Ok(())
//! # }
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
// Without CUDA there is no unsafe code at all; with it, only `cuda_backend/`
// opts in, item by item with a SAFETY comment: the driver probe and byte views
// in `driver.rs`, and the kernel launches of `ops.rs`, `collective.rs` and
// `kernels/`.
#![cfg_attr(not(feature = "cuda"), forbid(unsafe_code))]
#![cfg_attr(feature = "cuda", deny(unsafe_code))]

/// Runs `$body` with the type alias `$T` bound to the Rust type of the
/// runtime dtype `$dtype`: the one place where runtime dtypes become
/// monomorphised kernels.
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                #[allow(unused)]
                type $T = f32;
                $body
            }
            $crate::DType::F16 => {
                #[allow(unused)]
                type $T = ::half::f16;
                $body
            }
            $crate::DType::BF16 => {
                #[allow(unused)]
                type $T = ::half::bf16;
                $body
            }
        }
    };
}

pub mod cuda_backend;
pub mod device;
pub mod dtype;
pub mod error;
pub mod flat;
pub mod ops;
pub mod shape;
pub mod storage;
pub mod tensor;

pub use cuda_backend::CudaStorage;
#[cfg(feature = "cuda")]
pub use cuda_backend::{CudaDevice, DeviceAllocations, DeviceBuffer, note_device_allocation};
/// The cudarc crate gradwire-tensor is built on (feature `cuda`), so upper
/// crates name its types (streams, slices, events) at the same version.
#[cfg(feature = "cuda")]
pub use cudarc;
pub use device::Device;
pub use dtype::{DType, ElemType, WithDType};
pub use error::{Error, ErrorKind, Result};
pub use flat::{FlatEntry, FlatLayout, pack, pack_new, unpack};
pub use half::{bf16, f16};
pub use shape::Shape;
pub use storage::{CpuStorage, Storage};
pub use tensor::Tensor;
