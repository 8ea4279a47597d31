//! CUDA storage: device memory through cudarc with the `cuda` feature, a stub
//! without it.
//!
//! This follows candle's pattern: the rest of the crate is written against
//! [`CudaStorage`]'s API. With the `cuda` feature it is the real thing (see
//! the `driver` module: `CudaDevice`, the driver probed before any call,
//! PTX modules loaded lazily and cached per device, host<->device copies;
//! `launch`, the typed launch, the one place a kernel is queued, checking
//! every launch against the kernel's signature in gradwire-kernels;
//! `device_vec`, device vectors of plain values, the launchers' working
//! memory; `ops`, the CUDA forms of every tensor operation; `collective`,
//! the kernels communicators run between transfers). The domain kernels'
//! launchers live beside their CPU forms in the crates that own them
//! (optimizer rules in gradwire-optim, codecs in gradwire-compress, AdaSum
//! in gradwire-algos) and launch through `launch::Launch` without
//! `unsafe`.
//! Without it, a stand-in whose every constructor returns
//! [`Error::NotCompiledWithCuda`](crate::Error::NotCompiledWithCuda).
//!
//! The stub is *uninhabited*: it holds an
//! [`Infallible`](std::convert::Infallible), so no value of it can exist. That makes the compiler prove that every `Storage::Cuda` branch
//! in the crate is unreachable in such a build, instead of relying on runtime
//! checks.

#[cfg(feature = "cuda")]
mod allocations;
#[cfg(feature = "cuda")]
pub mod collective;
#[cfg(feature = "cuda")]
mod device_vec;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
pub mod launch;
#[cfg(feature = "cuda")]
mod ops;
#[cfg(feature = "cuda")]
pub mod testing;

#[cfg(feature = "cuda")]
pub use allocations::{DeviceAllocations, note_device_allocation};
#[cfg(feature = "cuda")]
pub use device_vec::{DeviceScalar, DeviceVec, NO_INDEX, first_index_cell, read_first_index};
#[cfg(feature = "cuda")]
pub use driver::{CudaDevice, CudaStorage, DeviceBuffer};

#[cfg(not(feature = "cuda"))]
pub use stub::CudaStorage;

#[cfg(not(feature = "cuda"))]
mod stub {
    use std::convert::Infallible;
    use std::ops::Range;

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

        /// Overwrites every element with zero.
        pub fn zero_fill(&mut self) -> Result<()> {
            match self.never {}
        }

        /// Sets every element to `value`.
        pub fn fill(&mut self, value: f32) -> Result<()> {
            let _ = value;
            match self.never {}
        }

        /// Copies `src` into this storage.
        pub fn copy_from(&mut self, src: &CudaStorage) -> Result<()> {
            let _ = src;
            match self.never {}
        }

        /// Copies elements `src_range` of `src` to `dst_offset`, converting.
        pub fn copy_range_from(
            &mut self,
            dst_offset: usize,
            src: &CudaStorage,
            src_range: Range<usize>,
        ) -> Result<()> {
            let _ = (dst_offset, src, src_range);
            match self.never {}
        }

        /// Sets elements `range` to zero.
        pub fn zero_range(&mut self, range: Range<usize>) -> Result<()> {
            let _ = range;
            match self.never {}
        }

        /// These values converted to `dtype`.
        pub fn to_dtype(&self, dtype: DType) -> Result<CudaStorage> {
            let _ = dtype;
            match self.never {}
        }

        /// `self += a * x`.
        pub fn axpy(&mut self, a: f32, x: &CudaStorage) -> Result<()> {
            let _ = (a, x);
            match self.never {}
        }

        /// `self *= a`.
        pub fn scale(&mut self, a: f32) -> Result<()> {
            let _ = a;
            match self.never {}
        }

        /// Clamps to `[-c, c]`.
        pub fn clamp(&mut self, c: f32) -> Result<()> {
            let _ = c;
            match self.never {}
        }

        /// `self += x`.
        pub fn add(&mut self, x: &CudaStorage) -> Result<()> {
            let _ = x;
            match self.never {}
        }

        /// `self *= x`.
        pub fn mul(&mut self, x: &CudaStorage) -> Result<()> {
            let _ = x;
            match self.never {}
        }

        /// `sum_i self_i * other_i` in f64.
        pub fn dot(&self, other: &CudaStorage) -> Result<f64> {
            let _ = other;
            match self.never {}
        }

        /// `sum_i self_i` in f64.
        pub fn sum(&self) -> Result<f64> {
            match self.never {}
        }

        /// `sum_i self_i^2` in f64.
        pub fn sum_sq(&self) -> Result<f64> {
            match self.never {}
        }

        /// `max_i |self_i|` in f64.
        pub fn max_abs(&self) -> Result<f64> {
            match self.never {}
        }
    }
}
