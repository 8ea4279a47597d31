//! CUDA storage: currently a stub, with or without the `cuda` feature.
//!
//! This follows candle's pattern: the rest of the crate is written against
//! [`CudaStorage`]'s API, and a build without a working GPU backend gets a
//! stand-in whose every constructor returns [`Error::NotCompiledWithCuda`].
//! Enabling the `cuda` feature selects this same stub for now; the GPU work
//! (cudarc driver + the `gradwire-kernels` PTX) replaces it without changing
//! any signature outside this module.
//!
//! The stub is *uninhabited*: it holds an [`Infallible`], so no value of it
//! can exist. That makes the compiler prove that every `Storage::Cuda` branch
//! in the crate is unreachable today, instead of relying on runtime checks.

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
