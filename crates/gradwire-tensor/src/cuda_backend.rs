//! CUDA storage: device memory through cudarc with the `cuda` feature, a stub
//! without it.
//!
//! This follows candle's pattern: the rest of the crate is written against
//! [`CudaStorage`]'s API. With the `cuda` feature it is the real thing (see
//! the `driver` module: `CudaDevice`, the driver probed before any call,
//! PTX modules loaded lazily and cached per device, host<->device copies;
//! `launch`, the launch geometry of every kernel; `collective`, the kernels
//! communicators run between transfers).
//! Without it, a stand-in whose every constructor returns
//! [`Error::NotCompiledWithCuda`](crate::Error::NotCompiledWithCuda).
//!
//! The stub is *uninhabited*: it holds an
//! [`Infallible`](std::convert::Infallible), so no value of it can exist. That makes the compiler prove that every `Storage::Cuda` branch
//! in the crate is unreachable in such a build, instead of relying on runtime
//! checks.

#[cfg(feature = "cuda")]
pub mod collective;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
pub mod launch;

#[cfg(feature = "cuda")]
pub use driver::{CudaDevice, CudaStorage, DeviceBuffer};

#[cfg(not(feature = "cuda"))]
pub use stub::CudaStorage;

#[cfg(not(feature = "cuda"))]
mod stub {
    use std::convert::Infallible;

    use crate::dtype::DType;
    use crate::error::{Error, Result};
    use crate::storage::CpuStorage;

    /// Device memory on a CUDA GPU. In this build it cannot be constructed: every
    /// constructor returns [`Error::NotCompiledWithCuda`].
    #[derive(Debug, Clone)]
    pub struct CudaStorage {
        never: Infallible,
    }

    impl CudaStorage {
        /// Allocates `len` zeros of `dtype` on device `ordinal`.
        ///
        /// Always [`Error::NotCompiledWithCuda`] in this build.
        pub fn alloc_zeros(len: usize, dtype: DType, ordinal: usize) -> Result<Self> {
            let _ = (len, dtype, ordinal);
            Err(Error::NotCompiledWithCuda)
        }

        /// Copies host memory to device `ordinal`.
        ///
        /// Always [`Error::NotCompiledWithCuda`] in this build.
        pub fn from_cpu(src: &CpuStorage, ordinal: usize) -> Result<Self> {
            let _ = (src, ordinal);
            Err(Error::NotCompiledWithCuda)
        }

        /// Copies the device memory back to the host.
        pub fn to_cpu(&self) -> Result<CpuStorage> {
            match self.never {}
        }

        /// The element type.
        pub fn dtype(&self) -> DType {
            match self.never {}
        }

        /// The number of elements.
        pub fn len(&self) -> usize {
            match self.never {}
        }

        /// Whether there are no elements.
        pub fn is_empty(&self) -> bool {
            match self.never {}
        }

        /// The CUDA device ordinal holding the memory.
        pub fn ordinal(&self) -> usize {
            match self.never {}
        }
    }
}
