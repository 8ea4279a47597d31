//! Owned tensor memory: [`CpuStorage`] (one typed `Vec` per dtype) and
//! [`Storage`] (host or CUDA).
//!
//! An enum of typed vectors rather than a byte buffer keeps every access safe
//! and aligned without `unsafe`: kernels borrow `&[f32]` / `&[f16]` /
//! `&[bf16]` directly through [`crate::WithDType::cpu_slice`].

use half::{bf16, f16};

use crate::cuda_backend::CudaStorage;
use crate::device::Device;
use crate::dtype::private::Sealed;
use crate::dtype::{DType, WithDType};

/// Host memory holding the elements of one dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum CpuStorage {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    BF16(Vec<bf16>),
}

impl CpuStorage {
    /// `len` zeros of `dtype`, allocated zeroed (calloc): for large buffers
    /// the pages are not written until first touched.
    pub fn zeros(dtype: DType, len: usize) -> Self {
        match dtype {
            DType::F32 => CpuStorage::F32(f32::zeros_vec(len)),
            DType::F16 => CpuStorage::F16(f16::zeros_vec(len)),
            DType::BF16 => CpuStorage::BF16(bf16::zeros_vec(len)),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::F16(v) => v.len(),
            CpuStorage::BF16(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as `T`, or `None` if `T` is not this storage's dtype.
    pub fn as_slice<T: WithDType>(&self) -> Option<&[T]> {
        T::cpu_slice(self)
    }

    /// The elements as mutable `T`, or `None` if `T` is not this storage's
    /// dtype.
    pub fn as_mut_slice<T: WithDType>(&mut self) -> Option<&mut [T]> {
        T::cpu_slice_mut(self)
    }

    /// Overwrites every element with +0.0 (a memset).
    pub fn fill_zero(&mut self) {
        match self {
            CpuStorage::F32(v) => v.fill(0.0),
            CpuStorage::F16(v) => v.fill(f16::ZERO),
            CpuStorage::BF16(v) => v.fill(bf16::ZERO),
        }
    }
}

/// A tensor's memory: host or CUDA device.
#[derive(Debug, Clone)]
pub enum Storage {
    /// Host memory.
    Cpu(CpuStorage),
    /// CUDA device memory (a stub in this build; see [`crate::cuda_backend`]).
    Cuda(CudaStorage),
}

impl Storage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            Storage::Cuda(s) => s.dtype(),
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Storage::Cpu(s) => s.len(),
            Storage::Cuda(s) => s.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the memory lives.
    pub fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(s) => Device::Cuda(s.ordinal()),
        }
    }

    /// The host storage, or `None` for device memory.
    pub fn as_cpu(&self) -> Option<&CpuStorage> {
        match self {
            Storage::Cpu(s) => Some(s),
            Storage::Cuda(_) => None,
        }
    }
}
