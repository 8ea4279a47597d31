//! The CUDA forms of gradwire-tensor's operations (`crate::ops`, casts and
//! the flat pack/unpack copies) on [`CudaStorage`], launching the kernels of
//! `kernels/cuda/{elementwise,cast,reduce}.cu` on the device's stream.
//!
//! The results match the CPU's: elementwise ops and casts bitwise (f32
//! arithmetic, one rounding per half-precision element, no FMA: the PTX is
//! built with `--fmad=false`); `max_abs` exactly (it involves no rounding);
//! the f64 sums within the rounding of f64 additions, since the GPU adds in a
//! different, but fixed, order (see `reduce.cu`): a result depends only on
//! the data, never on timing.
//!
//! Every method checks its operands (device, dtype, length) before queuing
//! anything, so an error leaves the memory unchanged. Kernels are queued
//! asynchronously; the reductions and [`CudaStorage::to_cpu`] wait for them.
//! The kernels take `T*` for the element type `T`; launchers pass the
//! storage's byte view ([`CudaStorage::bytes`]), which is the same device
//! address, so one launcher serves the three dtypes.

use std::ops::Range;
use std::sync::Arc;

use gradwire_kernels::{Kernel, cast, elementwise, reduce};

use super::device_vec::DeviceVec;
use super::driver::{CudaDevice, CudaStorage};
use super::launch::{
    Blocks, Launch, by_dtype, driver_error, out_of_bounds, require_like, require_same_device,
    window,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The conversion kernel from `src` to `dst` (`None` when they are equal: a
/// copy).
fn cast_kernel(src: DType, dst: DType) -> Option<&'static Kernel> {
    use DType::{BF16, F16, F32};
    Some(match (src, dst) {
        (F32, F16) => &cast::CAST_F32_F16,
        (F32, BF16) => &cast::CAST_F32_BF16,
        (F16, F32) => &cast::CAST_F16_F32,
        (BF16, F32) => &cast::CAST_BF16_F32,
        (F16, BF16) => &cast::CAST_F16_BF16,
        (BF16, F16) => &cast::CAST_BF16_F16,
        (F32, F32) | (F16, F16) | (BF16, BF16) => return None,
    })
}

impl CudaStorage {
    fn device_arc(&self) -> Arc<CudaDevice> {
        Arc::clone(self.device())
    }

    /// Sets every element to `value` rounded once to the dtype.
    pub fn fill(&mut self, value: f32) -> Result<()> {
        let n = self.len();
        if n == 0 {
            return Ok(());
        }
        let kernel = by_dtype(
            self.dtype(),
            [
                &elementwise::FILL_F32,
                &elementwise::FILL_F16,
                &elementwise::FILL_BF16,
            ],
        );
        let device = self.device_arc();
        Launch::new(&device, kernel)
            .write(self)
            .len(n)
            .value(value)
            .run(Blocks::Over(n))
    }

    /// Copies `src` (same device, dtype and length) into this storage, on the
    /// device.
    pub fn copy_from(&mut self, src: &CudaStorage) -> Result<()> {
        require_like("copy_from", self, src)?;
        let len = self.len();
        self.copy_range_from(0, src, 0..len)
    }

    /// Copies elements `src_range` of `src` into this storage starting at
    /// element `dst_offset`, converting to this storage's dtype (one
    /// rounding when narrowing, as [`crate::ops::cast`]). Used by the flat
    /// pack/unpack of fusion buffers. Both storages must be on the same
    /// device and the ranges in bounds ([`Error::InvalidArgument`]).
    pub fn copy_range_from(
        &mut self,
        dst_offset: usize,
        src: &CudaStorage,
        src_range: Range<usize>,
    ) -> Result<()> {
        const OP: &str = "copy_range_from";
        require_same_device(OP, self, src)?;
        if src_range.start > src_range.end || src_range.end > src.len() {
            return Err(out_of_bounds(OP, &src_range, src.len()));
        }
        let n = src_range.len();
        let dst_range = dst_offset..dst_offset.checked_add(n).ok_or(Error::ShapeOverflow)?;
        if dst_range.end > self.len() {
            return Err(out_of_bounds(OP, &dst_range, self.len()));
        }
        if n == 0 {
            return Ok(());
        }
        let device = self.device_arc();
        let Some(kernel) = cast_kernel(src.dtype(), self.dtype()) else {
            // Same dtype: a copy of the bytes.
            let size = src.dtype().size_in_bytes();
            let dst_len = self.len();
            let src_bytes = src.bytes()?;
            let src_view = src_bytes
                .try_slice(src_range.start * size..src_range.end * size)
                .ok_or_else(|| out_of_bounds(OP, &src_range, src.len()))?;
            let mut dst_bytes = self.bytes_mut()?;
            let mut dst_view = dst_bytes
                .try_slice_mut(dst_range.start * size..dst_range.end * size)
                .ok_or_else(|| out_of_bounds(OP, &dst_range, dst_len))?;
            return device
                .stream()
                .memcpy_dtod(&src_view, &mut dst_view)
                .map_err(|e| driver_error("cuMemcpyDtoD", e));
        };
        Launch::new(&device, kernel)
            .read(window(src, src_range))
            .write(window(self, dst_range))
            .len(n)
            .run(Blocks::Over(n))
    }

    /// Sets elements `range` to +0.0 (a memset; all-zero bits are +0.0 in
    /// every dtype).
    pub fn zero_range(&mut self, range: Range<usize>) -> Result<()> {
        let len = self.len();
        if range.start > range.end || range.end > len {
            return Err(out_of_bounds("zero_range", &range, len));
        }
        if range.is_empty() {
            return Ok(());
        }
        let size = self.dtype().size_in_bytes();
        let bytes = range.start * size..range.end * size;
        let device = self.device_arc();
        let mut all = self.bytes_mut()?;
        let mut part = all
            .try_slice_mut(bytes)
            .ok_or_else(|| out_of_bounds("zero_range", &range, len))?;
        device
            .stream()
            .memset_zeros(&mut part)
            .map_err(|e| driver_error("cuMemsetD8", e))
    }

    /// A new storage on the same device holding these values converted to
    /// `dtype` (a device copy when the dtype is the same).
    pub fn to_dtype(&self, dtype: DType) -> Result<CudaStorage> {
        let mut out = CudaStorage::alloc_zeros(self.len(), dtype, self.ordinal())?;
        out.copy_range_from(0, self, 0..self.len())?;
        Ok(out)
    }

    /// `self += a * x` elementwise (computed as `y + (a * x)` in f32).
    pub fn axpy(&mut self, a: f32, x: &CudaStorage) -> Result<()> {
        require_like("axpy", self, x)?;
        let kernel = [
            &elementwise::AXPY_F32,
            &elementwise::AXPY_F16,
            &elementwise::AXPY_BF16,
        ];
        self.launch_update(kernel, Some(a), Some(x))
    }

    /// `self *= a` elementwise.
    pub fn scale(&mut self, a: f32) -> Result<()> {
        let kernel = [
            &elementwise::SCALE_F32,
            &elementwise::SCALE_F16,
            &elementwise::SCALE_BF16,
        ];
        self.launch_update(kernel, Some(a), None)
    }

    /// Clamps every element to `[-c, c]`; `c` must be `>= 0` and not NaN
    /// ([`Error::InvalidArgument`]). NaN elements stay NaN, as on the CPU.
    pub fn clamp(&mut self, c: f32) -> Result<()> {
        let c = crate::ops::check_clamp_bound(c)?;
        let kernel = [
            &elementwise::CLAMP_F32,
            &elementwise::CLAMP_F16,
            &elementwise::CLAMP_BF16,
        ];
        self.launch_update(kernel, Some(c), None)
    }

    /// `self += x` elementwise.
    pub fn add(&mut self, x: &CudaStorage) -> Result<()> {
        require_like("add", self, x)?;
        let kernel = [
            &elementwise::ADD_F32,
            &elementwise::ADD_F16,
            &elementwise::ADD_BF16,
        ];
        self.launch_update(kernel, None, Some(x))
    }

    /// `self *= x` elementwise.
    pub fn mul(&mut self, x: &CudaStorage) -> Result<()> {
        require_like("mul", self, x)?;
        let kernel = [
            &elementwise::MUL_F32,
            &elementwise::MUL_F16,
            &elementwise::MUL_BF16,
        ];
        self.launch_update(kernel, None, Some(x))
    }

    /// Launches one of the read-modify-write kernels of `elementwise.cu`,
    /// whose arguments are `(T* y, [float s,] [const T* x,] u64 n)`: axpy
    /// (both), scale and clamp (a scalar), add and mul (an operand). The
    /// caller has checked `x` against `self`.
    fn launch_update(
        &mut self,
        kernels: [&'static Kernel; 3],
        scalar: Option<f32>,
        x: Option<&CudaStorage>,
    ) -> Result<()> {
        let n = self.len();
        if n == 0 {
            return Ok(());
        }
        let kernel = by_dtype(self.dtype(), kernels);
        let device = self.device_arc();
        let mut launch = Launch::new(&device, kernel).write(self);
        if let Some(s) = scalar {
            launch = launch.value(s);
        }
        if let Some(x) = x {
            launch = launch.read(x);
        }
        launch.len(n).run(Blocks::Over(n))
    }

    /// `sum_i self_i * other_i`, accumulated in f64 on the device.
    pub fn dot(&self, other: &CudaStorage) -> Result<f64> {
        require_like("dot", self, other)?;
        let kernel = by_dtype(
            self.dtype(),
            [
                &reduce::DOT_PARTIAL_F32,
                &reduce::DOT_PARTIAL_F16,
                &reduce::DOT_PARTIAL_BF16,
            ],
        );
        self.sum_f64(kernel, Some(other))
    }

    /// `sum_i self_i`, accumulated in f64 on the device.
    pub fn sum(&self) -> Result<f64> {
        let kernel = by_dtype(
            self.dtype(),
            [
                &reduce::SUM_PARTIAL_F32,
                &reduce::SUM_PARTIAL_F16,
                &reduce::SUM_PARTIAL_BF16,
            ],
        );
        self.sum_f64(kernel, None)
    }

    /// `sum_i self_i^2`, accumulated in f64 on the device.
    pub fn sum_sq(&self) -> Result<f64> {
        let kernel = by_dtype(
            self.dtype(),
            [
                &reduce::SUM_SQ_PARTIAL_F32,
                &reduce::SUM_SQ_PARTIAL_F16,
                &reduce::SUM_SQ_PARTIAL_BF16,
            ],
        );
        self.sum_f64(kernel, None)
    }

    /// The two-stage f64 sum of `reduce.cu`: `kernel` leaves one partial per
    /// block, `finish_sum_f64` adds them; waits for the result. The partials
    /// and the total live in the device's kept [`ReductionScratch`].
    fn sum_f64(&self, kernel: &'static Kernel, other: Option<&CudaStorage>) -> Result<f64> {
        let n = self.len();
        if n == 0 {
            return Ok(0.0);
        }
        let device = self.device_arc();
        device.with_reductions(|kept| self.sum_f64_in(kernel, other, &device, kept))
    }

    fn sum_f64_in(
        &self,
        kernel: &'static Kernel,
        other: Option<&CudaStorage>,
        device: &Arc<CudaDevice>,
        kept: &mut ReductionScratch,
    ) -> Result<f64> {
        let n = self.len();
        let plan = gradwire_kernels::plan::partial_sums(n);
        let blocks = plan.grid().0 as usize;
        let partials = DeviceVec::kept(&mut kept.partials, device, blocks)?;
        let mut launch = Launch::new(device, kernel).read(self);
        if let Some(other) = other {
            launch = launch.read(other);
        }
        launch
            .len(n)
            .write(window(&mut *partials, 0..blocks))
            .run(plan)?;
        let total = DeviceVec::kept(&mut kept.total, device, 1)?;
        Launch::new(device, &reduce::FINISH_SUM_F64)
            .read(window(&*partials, 0..blocks))
            .len(blocks)
            .write(window(&mut *total, 0..1))
            .run(Blocks::Exactly(1, 1))?;
        total
            .read(0..1)?
            .first()
            .copied()
            .ok_or_else(|| Error::Cuda("finish_sum_f64 returned nothing".into()))
    }

    /// `max_i |self_i|` as f64, exactly: 0 when empty, NaN if any element is
    /// NaN, inf if any is infinite and none NaN (as [`crate::ops::max_abs`]).
    pub fn max_abs(&self) -> Result<f64> {
        let n = self.len();
        if n == 0 {
            return Ok(0.0);
        }
        let device = self.device_arc();
        let key = device.with_reductions(|kept| self.max_abs_key_in(&device, kept))?;
        Ok(key_to_magnitude(key))
    }

    fn max_abs_key_in(&self, device: &Arc<CudaDevice>, kept: &mut ReductionScratch) -> Result<u32> {
        let n = self.len();
        let kernel = by_dtype(
            self.dtype(),
            [
                &reduce::MAX_ABS_KEY_F32,
                &reduce::MAX_ABS_KEY_F16,
                &reduce::MAX_ABS_KEY_BF16,
            ],
        );
        let key = DeviceVec::kept(&mut kept.key, device, 1)?;
        // The kernel raises the key with atomic maxima from 0.
        key.write_from_host(0, &[0])?;
        Launch::new(device, kernel)
            .read(self)
            .len(n)
            .write(window(&mut *key, 0..1))
            .run(Blocks::Over(n))?;
        Ok(key.read(0..1)?.first().copied().unwrap_or(0))
    }
}

/// The reductions' working memory on one device (the f64 partial sums,
/// their total, `max_abs`'s key), kept by the [`CudaDevice`] between calls
/// so that a reduction in a training step allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct ReductionScratch {
    partials: Option<DeviceVec<f64>>,
    total: Option<DeviceVec<f64>>,
    key: Option<DeviceVec<u32>>,
}

/// The magnitude a `max_abs_key` result stands for: keys above the infinity
/// key are NaNs.
fn key_to_magnitude(key: u32) -> f64 {
    const INFINITY_KEY: u32 = 0x7f80_0000;
    if key > INFINITY_KEY {
        f64::NAN
    } else {
        f64::from(f32::from_bits(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magnitude_keys_decode_like_the_cpu() {
        assert_eq!(key_to_magnitude(0), 0.0);
        assert_eq!(key_to_magnitude(1.5f32.to_bits()), 1.5);
        assert_eq!(key_to_magnitude(0x7f80_0000), f64::INFINITY);
        assert!(key_to_magnitude(0x7fc0_0000).is_nan());
        assert!(key_to_magnitude(0x7f80_0001).is_nan());
    }

    #[test]
    fn every_dtype_pair_has_a_cast_or_is_a_copy() {
        for src in [DType::F32, DType::F16, DType::BF16] {
            for dst in [DType::F32, DType::F16, DType::BF16] {
                let kernel = cast_kernel(src, dst);
                assert_eq!(kernel.is_none(), src == dst, "{src:?} -> {dst:?}");
                if let Some(kernel) = kernel {
                    assert!(
                        cast::ALL.iter().any(|k| k.name() == kernel.name()),
                        "{}",
                        kernel.name()
                    );
                }
            }
        }
    }
}
