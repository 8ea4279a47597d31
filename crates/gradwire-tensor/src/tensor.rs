//! [`Tensor`]: an owned, contiguous, typed buffer with a shape, plus the lazy
//! *zeroed* flag that lets gradwire skip gradients nobody wrote.
//!
//! # The zeroed flag (nnabla's "zeroing")
//!
//! Before every backward pass each gradient is reset to zero. Writing zeros
//! into every gradient costs a full pass over model-sized memory, and worse,
//! a parameter that backward never touches (a frozen layer, an unused
//! embedding row block, a branch not taken) would then be indistinguishable
//! from one whose gradient happens to be zero. So [`Tensor::zero_`] only sets
//! a flag, in O(1):
//!
//! * a new tensor (from any constructor, [`Tensor::zeros`] included) is *not*
//!   zeroed: it holds real values somebody produced;
//! * **reads** leave the flag alone and see zeros, never the stale memory:
//!   [`Tensor::as_slice`] then returns a slice of a separate, lazily
//!   allocated zero buffer (`calloc`, so cheap), and [`Tensor::to_vec`],
//!   [`Tensor::to_f32_vec`], the reductions and [`crate::flat::pack`] treat
//!   the tensor as zeros without touching its memory;
//! * **writes** clear the flag: [`Tensor::as_mut_slice`] first overwrites the
//!   stale memory with zeros, so every read-modify-write op (axpy, scale, ...)
//!   starts from zeros. Ops that overwrite every element (fill, copy_from,
//!   unpack) skip that memset because it would be overwritten anyway.
//!
//! The optimizer and the collectives then test [`Tensor::is_zeroed`] to skip
//! work for gradients nobody wrote since the last reset.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::OnceLock;

use crate::cuda_backend::CudaStorage;
use crate::device::Device;
use crate::dtype::{DType, WithDType};
use crate::error::{Error, Result};
use crate::ops;
use crate::shape::Shape;
use crate::storage::{CpuStorage, Storage};

/// An owned, contiguous, row-major tensor of `f32`, `f16` or `bf16`.
///
/// See the [module documentation](self) for the zeroed-flag rules.
pub struct Tensor {
    storage: Storage,
    shape: Shape,
    zeroed: bool,
    /// Zeros handed out by reads while `zeroed` is set; dropped on the first
    /// write. Always the same dtype and length as `storage` when filled.
    zero_view: OnceLock<CpuStorage>,
}

/// How an op on a CUDA tensor writes it (see [`Tensor::cuda_write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CudaWrite {
    /// Reads the old values (axpy, scale, ...): a zeroed tensor starts from
    /// real zeros.
    Update,
    /// Writes every element without reading (fill, copy, unpack).
    Overwrite,
}

/// The element count of `shape`, checked so that neither the count nor the
/// byte size of a `dtype` buffer overflows (`Vec` would panic on the latter).
fn checked_len(shape: &Shape, dtype: DType) -> Result<usize> {
    let n = shape.checked_elem_count()?;
    match n.checked_mul(dtype.size_in_bytes()) {
        Some(bytes) if isize::try_from(bytes).is_ok() => Ok(n),
        _ => Err(Error::ShapeOverflow),
    }
}

impl Tensor {
    fn from_parts(storage: Storage, shape: Shape) -> Tensor {
        Tensor {
            storage,
            shape,
            zeroed: false,
            zero_view: OnceLock::new(),
        }
    }

    /// A tensor of zeros. On the CPU the buffer comes from the allocator's
    /// zeroed path (calloc), so large buffers cost nothing until touched.
    ///
    /// The result is *not* flagged zeroed (it holds real zeros; see the module
    /// docs). A CUDA device gives [`Error::NotCompiledWithCuda`] in this
    /// build; an overflowing shape gives [`Error::ShapeOverflow`].
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = shape.into();
        let n = checked_len(&shape, dtype)?;
        let storage = match device {
            Device::Cpu => Storage::Cpu(CpuStorage::zeros(dtype, n)),
            Device::Cuda(ordinal) => Storage::Cuda(CudaStorage::alloc_zeros(n, dtype, ordinal)?),
        };
        Ok(Tensor::from_parts(storage, shape))
    }

    /// A CPU tensor owning `data` (no copy). `data.len()` must equal the
    /// shape's element count, else [`Error::LengthMismatch`].
    pub fn from_vec<T: WithDType>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        let n = checked_len(&shape, T::DTYPE)?;
        if data.len() != n {
            return Err(Error::LengthMismatch {
                op: "from_vec",
                expected: n,
                got: data.len(),
            });
        }
        Ok(Tensor::from_parts(
            Storage::Cpu(T::into_storage(data)),
            shape,
        ))
    }

    /// A CPU tensor copying `data`; same rules as [`Tensor::from_vec`].
    pub fn from_slice<T: WithDType>(data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        let n = checked_len(&shape, T::DTYPE)?;
        if data.len() != n {
            return Err(Error::LengthMismatch {
                op: "from_slice",
                expected: n,
                got: data.len(),
            });
        }
        Tensor::from_vec(data.to_vec(), shape)
    }

    /// A CPU tensor of `dtype` from f32 values, each rounded once to
    /// `dtype` (nearest, ties to even). Length rules as [`Tensor::from_vec`].
    pub fn from_f32(data: &[f32], shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
        let shape = shape.into();
        let n = checked_len(&shape, dtype)?;
        if data.len() != n {
            return Err(Error::LengthMismatch {
                op: "from_f32",
                expected: n,
                got: data.len(),
            });
        }
        let mut storage = CpuStorage::zeros(dtype, n);
        with_dtype!(dtype, T => {
            if let Some(dst) = T::cpu_slice_mut(&mut storage) {
                ops::cast(data, dst)?;
            }
        });
        Ok(Tensor::from_parts(Storage::Cpu(storage), shape))
    }

    /// A tensor with every element equal to `value` rounded to `dtype`.
    pub fn full(
        value: f32,
        shape: impl Into<Shape>,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let mut t = Tensor::zeros(shape, dtype, device)?;
        if value.to_bits() != 0 {
            t.fill(value)?;
        }
        Ok(t)
    }

    /// A CPU tensor owning `storage`; its length must equal the shape's
    /// element count, else [`Error::LengthMismatch`].
    pub fn from_storage(storage: CpuStorage, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        let n = checked_len(&shape, storage.dtype())?;
        if storage.len() != n {
            return Err(Error::LengthMismatch {
                op: "from_storage",
                expected: n,
                got: storage.len(),
            });
        }
        Ok(Tensor::from_parts(Storage::Cpu(storage), shape))
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Where the memory lives.
    pub fn device(&self) -> Device {
        self.storage.device()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.storage.len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The raw storage.
    ///
    /// This ignores the zeroed flag: while [`Tensor::is_zeroed`] is set it
    /// shows stale values. Use [`Tensor::as_slice`] to read values.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Marks the tensor as all zeros in O(1), writing no memory.
    pub fn zero_(&mut self) {
        self.zeroed = true;
    }

    /// Whether the tensor has been [`zero_`](Tensor::zero_)ed and not written
    /// since.
    pub fn is_zeroed(&self) -> bool {
        self.zeroed
    }

    fn cpu(&self, op: &'static str) -> Result<&CpuStorage> {
        match &self.storage {
            Storage::Cpu(s) => Ok(s),
            Storage::Cuda(s) => Err(Error::DeviceMismatch {
                op,
                expected: Device::Cpu,
                got: Device::Cuda(s.ordinal()),
            }),
        }
    }

    fn cpu_mut(&mut self, op: &'static str) -> Result<&mut CpuStorage> {
        match &mut self.storage {
            Storage::Cpu(s) => Ok(s),
            Storage::Cuda(s) => Err(Error::DeviceMismatch {
                op,
                expected: Device::Cpu,
                got: Device::Cuda(s.ordinal()),
            }),
        }
    }

    pub(crate) fn check_dtype<T: WithDType>(&self, op: &'static str) -> Result<()> {
        if T::DTYPE == self.dtype() {
            Ok(())
        } else {
            Err(Error::DTypeMismatch {
                op,
                expected: self.dtype(),
                got: T::DTYPE,
            })
        }
    }

    /// Checks the preconditions of `op` on the CPU (device then dtype)
    /// without side effects, so a failing call leaves the flag untouched.
    pub(crate) fn check_cpu<T: WithDType>(&self, op: &'static str) -> Result<()> {
        self.cpu(op)?;
        self.check_dtype::<T>(op)
    }

    fn dtype_err<T: WithDType>(&self, op: &'static str) -> Error {
        Error::DTypeMismatch {
            op,
            expected: self.dtype(),
            got: T::DTYPE,
        }
    }

    /// The elements as `T`. While the tensor is zeroed this is a slice of
    /// zeros (allocated once, lazily, with calloc) and the flag stays set.
    ///
    /// [`Error::DTypeMismatch`] if `T` is not the tensor's dtype,
    /// [`Error::DeviceMismatch`] for device memory.
    pub fn as_slice<T: WithDType>(&self) -> Result<&[T]> {
        self.check_cpu::<T>("as_slice")?;
        let storage = if self.zeroed {
            self.zero_view
                .get_or_init(|| CpuStorage::zeros(self.dtype(), self.len()))
        } else {
            self.cpu("as_slice")?
        };
        T::cpu_slice(storage).ok_or_else(|| self.dtype_err::<T>("as_slice"))
    }

    /// The elements as mutable `T`. This is a write: if the tensor is zeroed
    /// its memory is first overwritten with zeros and the flag cleared.
    ///
    /// Errors as [`Tensor::as_slice`]; on error nothing changes.
    pub fn as_mut_slice<T: WithDType>(&mut self) -> Result<&mut [T]> {
        self.check_cpu::<T>("as_mut_slice")?;
        if self.zeroed {
            self.cpu_mut("as_mut_slice")?.fill_zero();
            self.clear_zeroed();
        }
        let err = self.dtype_err::<T>("as_mut_slice");
        T::cpu_slice_mut(self.cpu_mut("as_mut_slice")?).ok_or(err)
    }

    /// The CUDA storage, to write (kernels, communicators). This is a write:
    /// a zeroed tensor's device memory is first set to zeros and the flag
    /// cleared. [`Error::DeviceMismatch`] for a CPU tensor.
    #[cfg(feature = "cuda")]
    pub fn cuda_storage_mut(&mut self) -> Result<&mut CudaStorage> {
        self.cuda_write(CudaWrite::Update)?
            .ok_or(Error::DeviceMismatch {
                op: "cuda_storage_mut",
                expected: Device::Cuda(0),
                got: Device::Cpu,
            })
    }

    /// The CUDA storage, to read (kernels, communicators): the tensor's own,
    /// or while it is zeroed a fresh zero-filled one, so the stale memory is
    /// never seen. [`Error::DeviceMismatch`] for a CPU tensor.
    #[cfg(feature = "cuda")]
    pub fn cuda_storage(&self) -> Result<Cow<'_, CudaStorage>> {
        self.cuda_values()?.ok_or(Error::DeviceMismatch {
            op: "cuda_storage",
            expected: Device::Cuda(0),
            got: Device::Cpu,
        })
    }

    /// For a CUDA tensor, its storage to write, after applying the zeroed
    /// flag's write rule: [`CudaWrite::Update`] first sets a zeroed tensor's
    /// memory to zeros, [`CudaWrite::Overwrite`] (the op writes every
    /// element) skips that memset; both clear the flag. `None`, with nothing
    /// changed, for a CPU tensor.
    pub(crate) fn cuda_write(&mut self, mode: CudaWrite) -> Result<Option<&mut CudaStorage>> {
        let Storage::Cuda(storage) = &mut self.storage else {
            return Ok(None);
        };
        if self.zeroed {
            if mode == CudaWrite::Update {
                storage.zero_fill()?;
            }
            self.clear_zeroed();
        }
        match &mut self.storage {
            Storage::Cuda(storage) => Ok(Some(storage)),
            Storage::Cpu(_) => Ok(None),
        }
    }

    /// For an elementwise op of `self` (written per `mode`) with `x` on a
    /// CUDA device: both storages, `x`'s per [`Tensor::cuda_values`].
    /// `None`, with nothing changed, for CPU tensors;
    /// [`Error::DeviceMismatch`], with nothing changed, for two devices.
    pub(crate) fn cuda_operands<'a>(
        &'a mut self,
        x: &'a Tensor,
        mode: CudaWrite,
    ) -> Result<Option<(&'a mut CudaStorage, Cow<'a, CudaStorage>)>> {
        if self.device() != x.device() {
            return Err(Error::DeviceMismatch {
                op: "cuda_operands",
                expected: self.device(),
                got: x.device(),
            });
        }
        // One device: both CUDA or neither.
        match (x.cuda_values()?, self.cuda_write(mode)?) {
            (Some(x), Some(y)) => Ok(Some((y, x))),
            _ => Ok(None),
        }
    }

    /// For a CUDA tensor, its values as an operand of a device op: the
    /// storage itself, or while zeroed a fresh zero-filled one (so a zeroed
    /// operand behaves exactly like real zeros, `0 * inf` included). `None`
    /// for a CPU tensor.
    pub(crate) fn cuda_values(&self) -> Result<Option<Cow<'_, CudaStorage>>> {
        let Storage::Cuda(storage) = &self.storage else {
            return Ok(None);
        };
        if self.zeroed {
            let zeros = CudaStorage::alloc_zeros(self.len(), self.dtype(), storage.ordinal())?;
            Ok(Some(Cow::Owned(zeros)))
        } else {
            Ok(Some(Cow::Borrowed(storage)))
        }
    }

    /// Mutable access for an op that overwrites *every* element: clears the
    /// flag without the zero memset (the stale values are never observed).
    pub(crate) fn overwrite_slice<T: WithDType>(&mut self, op: &'static str) -> Result<&mut [T]> {
        self.check_cpu::<T>(op)?;
        self.clear_zeroed();
        let err = self.dtype_err::<T>(op);
        T::cpu_slice_mut(self.cpu_mut(op)?).ok_or(err)
    }

    fn clear_zeroed(&mut self) {
        self.zeroed = false;
        drop(self.zero_view.take());
    }

    /// The elements of `range` (element indices into the flat buffer), for
    /// reading one tensor's part of a fusion buffer.
    ///
    /// [`Error::InvalidArgument`] if the range is reversed or past the end;
    /// other errors as [`Tensor::as_slice`].
    pub fn flat_view<T: WithDType>(&self, range: Range<usize>) -> Result<&[T]> {
        self.check_range("flat_view", &range)?;
        let all = self.as_slice::<T>()?;
        all.get(range)
            .ok_or_else(|| Error::InvalidArgument("flat_view: range out of bounds".into()))
    }

    /// The elements of `range`, mutably. This is a write to the whole tensor
    /// as far as the flag is concerned (zeros materialised, flag cleared),
    /// but only after the range has been validated: a bad range changes
    /// nothing.
    pub fn flat_view_mut<T: WithDType>(&mut self, range: Range<usize>) -> Result<&mut [T]> {
        self.check_range("flat_view_mut", &range)?;
        let all = self.as_mut_slice::<T>()?;
        all.get_mut(range)
            .ok_or_else(|| Error::InvalidArgument("flat_view_mut: range out of bounds".into()))
    }

    fn check_range(&self, op: &str, range: &Range<usize>) -> Result<()> {
        if range.start <= range.end && range.end <= self.len() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{op}: range {}..{} out of bounds for {} elements",
                range.start,
                range.end,
                self.len()
            )))
        }
    }

    /// A copy of the elements as `T` (zeros while zeroed; flag unchanged).
    pub fn to_vec<T: WithDType>(&self) -> Result<Vec<T>> {
        self.check_cpu::<T>("to_vec")?;
        if self.zeroed {
            return Ok(T::zeros_vec(self.len()));
        }
        Ok(self.as_slice::<T>()?.to_vec())
    }

    /// A copy of the elements widened to f32 (exact for every dtype; zeros
    /// while zeroed; flag unchanged).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        self.cpu("to_f32_vec")?;
        let mut out = vec![0.0f32; self.len()];
        if !self.zeroed {
            with_dtype!(self.dtype(), T => ops::cast(self.as_slice::<T>()?, &mut out)?);
        }
        Ok(out)
    }

    /// Consumes the tensor, returning its elements (zeros if zeroed) without
    /// a copy when possible.
    pub fn into_vec<T: WithDType>(self) -> Result<Vec<T>> {
        self.check_cpu::<T>("into_vec")?;
        let err = self.dtype_err::<T>("into_vec");
        let n = self.len();
        let source = if self.zeroed {
            match self.zero_view.into_inner() {
                Some(z) => z,
                None => return Ok(T::zeros_vec(n)),
            }
        } else {
            match self.storage {
                Storage::Cpu(s) => s,
                Storage::Cuda(_) => return Err(err),
            }
        };
        T::take_storage(source).map_err(|_| err)
    }

    /// The same elements under another shape with the same element count
    /// (else [`Error::ShapeMismatch`]). No copy; the flag is kept.
    pub fn reshape(mut self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if shape.checked_elem_count()? != self.len() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                lhs: self.shape,
                rhs: shape,
            });
        }
        self.shape = shape;
        Ok(self)
    }

    /// A new tensor of `dtype` holding these values, converted through f32:
    /// widening is exact and narrowing rounds once (nearest, ties to even),
    /// keeping NaN and ±inf, overflowing to ±inf and producing subnormals
    /// where the target has them. f16 <-> bf16 therefore rounds exactly once.
    ///
    /// The result is on the same device (a CUDA tensor converts on the
    /// device, bitwise as on the CPU). Like every constructor it is not
    /// flagged zeroed; a zeroed source converts to real zeros.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if self.zeroed {
            return Tensor::zeros(self.shape.clone(), dtype, self.device());
        }
        let src = match &self.storage {
            Storage::Cpu(src) => src,
            Storage::Cuda(src) => {
                return Ok(Tensor::from_parts(
                    Storage::Cuda(src.to_dtype(dtype)?),
                    self.shape.clone(),
                ));
            }
        };
        let mut dst = CpuStorage::zeros(dtype, self.len());
        with_dtype!(self.dtype(), S => {
            let s = S::cpu_slice(src).ok_or_else(|| self.dtype_err::<S>("to_dtype"))?;
            with_dtype!(dtype, D => {
                if let Some(d) = D::cpu_slice_mut(&mut dst) {
                    ops::cast(s, d)?;
                }
            })
        });
        Ok(Tensor::from_parts(Storage::Cpu(dst), self.shape.clone()))
    }

    /// A copy on `device`. CPU to CPU is a clone (flag kept); a CUDA device
    /// gives [`Error::NotCompiledWithCuda`] without the `cuda` feature and
    /// [`Error::CudaUnavailable`] on a machine without that device. Host to
    /// device and device to host are copies (a zeroed tensor arrives as
    /// zeros, its stale memory is not copied).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        let shape = self.shape.clone();
        match (device, &self.storage) {
            (Device::Cpu, Storage::Cpu(_)) => Ok(self.clone()),
            (Device::Cpu, Storage::Cuda(s)) => {
                if self.zeroed {
                    return Tensor::zeros(shape, self.dtype(), Device::Cpu);
                }
                Ok(Tensor::from_parts(Storage::Cpu(s.to_cpu()?), shape))
            }
            (Device::Cuda(ordinal), _) if self.zeroed => {
                Tensor::zeros(shape, self.dtype(), Device::Cuda(ordinal))
            }
            (Device::Cuda(ordinal), Storage::Cpu(s)) => Ok(Tensor::from_parts(
                Storage::Cuda(CudaStorage::from_cpu(s, ordinal)?),
                shape,
            )),
            (Device::Cuda(ordinal), Storage::Cuda(s)) => {
                let storage = if s.ordinal() == ordinal {
                    s.clone()
                } else {
                    CudaStorage::from_cpu(&s.to_cpu()?, ordinal)?
                };
                Ok(Tensor::from_parts(Storage::Cuda(storage), shape))
            }
        }
    }
}

impl Clone for Tensor {
    /// Clones values *and* the zeroed flag. A zeroed tensor's stale memory
    /// is not copied: the clone gets a fresh calloc'd buffer instead.
    fn clone(&self) -> Self {
        let storage = match &self.storage {
            Storage::Cpu(s) if self.zeroed => Storage::Cpu(CpuStorage::zeros(s.dtype(), s.len())),
            other => other.clone(),
        };
        Tensor {
            storage,
            shape: self.shape.clone(),
            zeroed: self.zeroed,
            zero_view: OnceLock::new(),
        }
    }

    /// The same as `*self = source.clone()`, in this tensor's memory when
    /// shape, dtype and device match (no allocation: buffers kept from step
    /// to step rely on it); a zeroed source only sets the flag.
    fn clone_from(&mut self, source: &Self) {
        let same = self.dims() == source.dims()
            && self.dtype() == source.dtype()
            && self.device() == source.device();
        if same {
            if source.zeroed {
                self.zero_();
                return;
            }
            if self.copy_from(source).is_ok() {
                return;
            }
        }
        *self = source.clone();
    }
}

impl fmt::Debug for Tensor {
    /// Metadata only: a gradient can have millions of elements.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype())
            .field("device", &self.device())
            .field("zeroed", &self.zeroed)
            .finish()
    }
}

/// Tensors are handed to communication threads; keep them `Send + Sync`
/// (the `OnceLock` zero view is what makes `&Tensor` reads thread-safe).
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tensor>();
};
