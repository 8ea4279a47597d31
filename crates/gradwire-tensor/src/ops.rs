//! Elementwise operations and reductions, on slices and on tensors.
//!
//! The free functions work on plain slices of any [`WithDType`] so that the
//! upper crates (compression, collectives, optimizers) can use them on their
//! own buffers, e.g. `&mut [f32]` chunks of a fusion buffer, without building
//! a [`Tensor`]. The `Tensor` methods check device, dtype and shape, honour the
//! zeroed flag and dispatch to the same slice kernels, or for CUDA tensors to
//! their device forms ([`CudaStorage`]'s methods, the kernels of
//! `kernels/cuda/`), which give the same results (bitwise for the
//! elementwise ops and `max_abs`; the f64 sums add in another fixed order).
//!
//! # Precision
//!
//! All arithmetic is done in f32. For `f16` / `bf16` inputs the kernels
//! convert blocks of 256 elements into stack buffers with the SIMD slice
//! conversions, compute in f32 and round each output element *once*, so a
//! half-precision result is exactly "the f32 result, rounded". No fused
//! multiply-add is used, so results match a plain `y + a * x` reference.
//!
//! # Reductions
//!
//! Reductions accumulate in f64 and return f64. Every f32 value (and every
//! product of two f32 values) is exact in f64, so the only rounding is in the
//! additions. To let LLVM vectorise, they use eight independent accumulator
//! lanes: element `i` is added to lane `i % 8`, in increasing `i`, and the
//! lanes are combined in the fixed order
//! `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`. The order depends only
//! on the length, never on the dtype, the block size or timing, so results are
//! bitwise deterministic.

use crate::cuda_backend::CudaStorage;
use crate::dtype::{DType, WithDType};
use crate::error::{Error, Result};
use crate::storage::Storage;
use crate::tensor::{CudaWrite, Tensor};

/// Elements converted per block for half-precision kernels: 1 KiB of f32 per
/// operand, comfortably inside L1, and a multiple of [`LANES`] so the lane of
/// an element does not depend on block boundaries.
const BLOCK: usize = 256;

/// Independent f64 accumulators in reductions.
const LANES: usize = 8;

const _: () = assert!(BLOCK.is_multiple_of(LANES));

/// `s` as `&[f32]` when `T` is `f32` (a no-op cast), else `None`. This is how
/// the generic kernels pick the direct f32 path without specialisation.
#[inline]
fn as_f32<T: WithDType>(s: &[T]) -> Option<&[f32]> {
    if T::DTYPE == DType::F32 {
        bytemuck::try_cast_slice(s).ok()
    } else {
        None
    }
}

#[inline]
fn as_f32_mut<T: WithDType>(s: &mut [T]) -> Option<&mut [f32]> {
    if T::DTYPE == DType::F32 {
        bytemuck::try_cast_slice_mut(s).ok()
    } else {
        None
    }
}

fn check_len(op: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::LengthMismatch { op, expected, got })
    }
}

/// Runs `f` over `y` viewed as f32: directly for f32, block by block through
/// stack buffers (one rounding per element on the way back) for halves.
#[inline]
fn map_f32<T: WithDType>(y: &mut [T], mut f: impl FnMut(&mut [f32])) {
    if let Some(yf) = as_f32_mut(y) {
        f(yf);
        return;
    }
    let mut buf = [0.0f32; BLOCK];
    for chunk in y.chunks_mut(BLOCK) {
        let b = &mut buf[..chunk.len()];
        T::conv_to_f32(chunk, b);
        f(b);
        T::conv_from_f32(b, chunk);
    }
}

/// Like [`map_f32`] with a second, read-only operand of the same length
/// (callers check the lengths).
#[inline]
fn zip_map_f32<T: WithDType>(y: &mut [T], x: &[T], mut f: impl FnMut(&mut [f32], &[f32])) {
    if let (Some(xf), Some(yf)) = (as_f32(x), as_f32_mut(y)) {
        f(yf, xf);
        return;
    }
    let mut ybuf = [0.0f32; BLOCK];
    let mut xbuf = [0.0f32; BLOCK];
    for (yc, xc) in y.chunks_mut(BLOCK).zip(x.chunks(BLOCK)) {
        let n = yc.len().min(xc.len());
        let (yb, xb) = (&mut ybuf[..n], &mut xbuf[..n]);
        T::conv_to_f32(yc, yb);
        T::conv_to_f32(xc, xb);
        f(yb, xb);
        T::conv_from_f32(yb, yc);
    }
}

/// Feeds `a` to `f` as f32 blocks (the whole slice at once for f32).
#[inline]
fn read_f32<T: WithDType>(a: &[T], mut f: impl FnMut(&[f32])) {
    if let Some(af) = as_f32(a) {
        f(af);
        return;
    }
    let mut buf = [0.0f32; BLOCK];
    for chunk in a.chunks(BLOCK) {
        let b = &mut buf[..chunk.len()];
        T::conv_to_f32(chunk, b);
        f(b);
    }
}

/// Feeds two equal-length slices to `f` as aligned f32 blocks.
#[inline]
fn read2_f32<T: WithDType>(a: &[T], b: &[T], mut f: impl FnMut(&[f32], &[f32])) {
    if let (Some(af), Some(bf)) = (as_f32(a), as_f32(b)) {
        f(af, bf);
        return;
    }
    let mut abuf = [0.0f32; BLOCK];
    let mut bbuf = [0.0f32; BLOCK];
    for (ac, bc) in a.chunks(BLOCK).zip(b.chunks(BLOCK)) {
        let n = ac.len().min(bc.len());
        let (ab, bb) = (&mut abuf[..n], &mut bbuf[..n]);
        T::conv_to_f32(ac, ab);
        T::conv_to_f32(bc, bb);
        f(ab, bb);
    }
}

// ---------------------------------------------------------------------------
// f32 kernels. Plain zips with no bounds checks; LLVM vectorises them.

#[inline]
fn axpy_f32(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * *xi;
    }
}

#[inline]
fn scale_f32(y: &mut [f32], a: f32) {
    for yi in y.iter_mut() {
        *yi *= a;
    }
}

#[inline]
fn add_f32(y: &mut [f32], x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += *xi;
    }
}

#[inline]
fn mul_f32(y: &mut [f32], x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi *= *xi;
    }
}

#[inline]
fn clamp_f32(y: &mut [f32], c: f32) {
    // Written as two selects (not `f32::clamp`, which asserts) so it
    // vectorises; both comparisons are false for NaN, so NaN passes through.
    let lo = -c;
    for yi in y.iter_mut() {
        let v = *yi;
        let v = if v < lo { lo } else { v };
        *yi = if v > c { c } else { v };
    }
}

/// Fixed-order combination of the lanes (see the module docs).
#[inline]
fn combine(acc: &[f64; LANES]) -> f64 {
    let [l0, l1, l2, l3, l4, l5, l6, l7] = *acc;
    ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
}

/// Adds `g(a_i, b_i)` to lane `i % 8`; `a` must start at a multiple of 8 in
/// the whole input, which holds because blocks are multiples of [`LANES`].
#[inline]
fn reduce2_into(acc: &mut [f64; LANES], a: &[f32], b: &[f32], g: impl Fn(f64, f64) -> f64) {
    let (ac, at) = a.as_chunks::<LANES>();
    let (bc, bt) = b.as_chunks::<LANES>();
    for (xa, xb) in ac.iter().zip(bc) {
        for ((s, &p), &q) in acc.iter_mut().zip(xa).zip(xb) {
            *s += g(f64::from(p), f64::from(q));
        }
    }
    for ((s, &p), &q) in acc.iter_mut().zip(at).zip(bt) {
        *s += g(f64::from(p), f64::from(q));
    }
}

#[inline]
fn reduce_into(acc: &mut [f64; LANES], a: &[f32], g: impl Fn(f64) -> f64) {
    let (ac, at) = a.as_chunks::<LANES>();
    for xa in ac {
        for (s, &p) in acc.iter_mut().zip(xa) {
            *s += g(f64::from(p));
        }
    }
    for (s, &p) in acc.iter_mut().zip(at) {
        *s += g(f64::from(p));
    }
}

// ---------------------------------------------------------------------------
// Public slice API.

/// Sets every element to `v` rounded once to `T`.
pub fn fill<T: WithDType>(y: &mut [T], v: f32) {
    y.fill(T::from_f32(v));
}

/// Copies `x` into `y`; [`Error::LengthMismatch`] if the lengths differ.
pub fn copy<T: WithDType>(y: &mut [T], x: &[T]) -> Result<()> {
    check_len("copy", y.len(), x.len())?;
    y.copy_from_slice(x);
    Ok(())
}

/// Converts `src` into `dst` element by element through f32: exact when
/// widening, one rounding (nearest, ties to even) when narrowing, a plain
/// copy when the types are equal. [`Error::LengthMismatch`] if the lengths
/// differ (nothing is written then).
pub fn cast<S: WithDType, D: WithDType>(src: &[S], dst: &mut [D]) -> Result<()> {
    check_len("cast", dst.len(), src.len())?;
    if S::DTYPE == D::DTYPE
        && let Ok(same) = bytemuck::try_cast_slice::<S, D>(src)
    {
        dst.copy_from_slice(same);
        return Ok(());
    }
    if let Some(s) = as_f32(src) {
        D::conv_from_f32(s, dst);
        return Ok(());
    }
    if let Some(d) = as_f32_mut(dst) {
        S::conv_to_f32(src, d);
        return Ok(());
    }
    let mut buf = [0.0f32; BLOCK];
    for (sc, dc) in src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK)) {
        let b = &mut buf[..sc.len()];
        S::conv_to_f32(sc, b);
        D::conv_from_f32(b, dc);
    }
    Ok(())
}

/// `y += a * x` elementwise (computed as `y + (a * x)` in f32, no FMA).
/// [`Error::LengthMismatch`] if the lengths differ.
pub fn axpy<T: WithDType>(y: &mut [T], a: f32, x: &[T]) -> Result<()> {
    check_len("axpy", y.len(), x.len())?;
    zip_map_f32(y, x, |y, x| axpy_f32(y, a, x));
    Ok(())
}

/// `y *= a` elementwise.
pub fn scale<T: WithDType>(y: &mut [T], a: f32) {
    map_f32(y, |y| scale_f32(y, a));
}

/// `y += x` elementwise; [`Error::LengthMismatch`] if the lengths differ.
pub fn add<T: WithDType>(y: &mut [T], x: &[T]) -> Result<()> {
    check_len("add", y.len(), x.len())?;
    zip_map_f32(y, x, add_f32);
    Ok(())
}

/// `y *= x` elementwise; [`Error::LengthMismatch`] if the lengths differ.
pub fn mul<T: WithDType>(y: &mut [T], x: &[T]) -> Result<()> {
    check_len("mul", y.len(), x.len())?;
    zip_map_f32(y, x, mul_f32);
    Ok(())
}

/// Clamps every element to `[-c, c]` (gradient clipping by value).
///
/// `c` must be `>= 0` and not NaN, else [`Error::InvalidArgument`]; `c =
/// inf` is a no-op. NaN elements stay NaN: clipping must not hide a
/// diverging step from the inf/NaN checks that run later. For f16/bf16 the
/// clamp is done in f32 and then rounded, so the bound is effectively `c`
/// rounded to the dtype.
pub fn clamp<T: WithDType>(y: &mut [T], c: f32) -> Result<()> {
    let c = check_clamp_bound(c)?;
    map_f32(y, |y| clamp_f32(y, c));
    Ok(())
}

/// `c` as a valid clamp bound (`-0.0` normalised to `+0.0`), or
/// [`Error::InvalidArgument`].
pub(crate) fn check_clamp_bound(c: f32) -> Result<f32> {
    if c >= 0.0 {
        // Normalises -0.0 to +0.0 so the interval is [-0, +0].
        Ok(c.abs())
    } else {
        Err(Error::InvalidArgument(format!(
            "clamp: bound must be >= 0 and not NaN, got {c}"
        )))
    }
}

/// `sum_i a_i * b_i`, accumulated in f64 (see the module docs for the fixed
/// order). [`Error::LengthMismatch`] if the lengths differ.
pub fn dot<T: WithDType>(a: &[T], b: &[T]) -> Result<f64> {
    check_len("dot", a.len(), b.len())?;
    let mut acc = [0.0f64; LANES];
    read2_f32(a, b, |a, b| reduce2_into(&mut acc, a, b, |p, q| p * q));
    Ok(combine(&acc))
}

/// `sum_i a_i^2`, accumulated in f64 (fixed order, see the module docs).
pub fn sum_sq<T: WithDType>(a: &[T]) -> f64 {
    let mut acc = [0.0f64; LANES];
    read_f32(a, |a| reduce_into(&mut acc, a, |p| p * p));
    combine(&acc)
}

/// `sum_i a_i`, accumulated in f64 (fixed order, see the module docs).
pub fn sum<T: WithDType>(a: &[T]) -> f64 {
    let mut acc = [0.0f64; LANES];
    read_f32(a, |a| reduce_into(&mut acc, a, |p| p));
    combine(&acc)
}

/// `max_i |a_i|` as f64: 0 for an empty slice, NaN if any element is NaN
/// (unlike `f32::max`, which would silently skip it), inf if any element is
/// infinite and none is NaN. Exact: no rounding is involved.
pub fn max_abs<T: WithDType>(a: &[T]) -> f64 {
    T::max_abs_of(a)
}

// ---------------------------------------------------------------------------
// Tensor methods.

/// Checks that `x` can be combined elementwise with `y`: same device, dtype
/// and shape, in that order.
fn check_compatible(op: &'static str, y: &Tensor, x: &Tensor) -> Result<()> {
    if y.device() != x.device() {
        return Err(Error::DeviceMismatch {
            op,
            expected: y.device(),
            got: x.device(),
        });
    }
    if y.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            expected: y.dtype(),
            got: x.dtype(),
        });
    }
    if y.shape() != x.shape() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: y.shape().clone(),
            rhs: x.shape().clone(),
        });
    }
    Ok(())
}

impl Tensor {
    /// Sets every element to `value` rounded to the dtype. A write: clears the
    /// zeroed flag (without a useless zero memset first).
    pub fn fill(&mut self, value: f32) -> Result<()> {
        if let Some(y) = self.cuda_write(CudaWrite::Overwrite)? {
            return y.fill(value);
        }
        with_dtype!(self.dtype(), T => fill(self.overwrite_slice::<T>("fill")?, value));
        Ok(())
    }

    /// Copies `src` (same shape and dtype) into `self`. A write: clears
    /// `self`'s flag; a zeroed `src` copies as zeros and keeps its own flag.
    pub fn copy_from(&mut self, src: &Tensor) -> Result<()> {
        check_compatible("copy_from", self, src)?;
        if src.is_zeroed() {
            return self.fill(0.0);
        }
        if let Some((y, x)) = self.cuda_operands(src, CudaWrite::Overwrite)? {
            return y.copy_from(&x);
        }
        with_dtype!(self.dtype(), T => {
            copy(self.overwrite_slice::<T>("copy_from")?, src.as_slice::<T>()?)?
        });
        Ok(())
    }

    /// `self += a * x` elementwise (same shape and dtype). A write: a zeroed
    /// `self` starts from zeros; a zeroed `x` counts as zeros.
    pub fn axpy(&mut self, a: f32, x: &Tensor) -> Result<()> {
        check_compatible("axpy", self, x)?;
        if let Some((y, x)) = self.cuda_operands(x, CudaWrite::Update)? {
            return y.axpy(a, &x);
        }
        with_dtype!(self.dtype(), T => {
            axpy(self.as_mut_slice::<T>()?, a, x.as_slice::<T>()?)?
        });
        Ok(())
    }

    /// `self *= a` elementwise. A write (a zeroed tensor starts from zeros).
    pub fn scale(&mut self, a: f32) -> Result<()> {
        if let Some(y) = self.cuda_write(CudaWrite::Update)? {
            return y.scale(a);
        }
        with_dtype!(self.dtype(), T => scale(self.as_mut_slice::<T>()?, a));
        Ok(())
    }

    /// `self += x` elementwise (same shape and dtype). A write.
    pub fn add(&mut self, x: &Tensor) -> Result<()> {
        check_compatible("add", self, x)?;
        if let Some((y, x)) = self.cuda_operands(x, CudaWrite::Update)? {
            return y.add(&x);
        }
        with_dtype!(self.dtype(), T => add(self.as_mut_slice::<T>()?, x.as_slice::<T>()?)?);
        Ok(())
    }

    /// `self *= x` elementwise (same shape and dtype). A write.
    pub fn mul(&mut self, x: &Tensor) -> Result<()> {
        check_compatible("mul", self, x)?;
        if let Some((y, x)) = self.cuda_operands(x, CudaWrite::Update)? {
            return y.mul(&x);
        }
        with_dtype!(self.dtype(), T => mul(self.as_mut_slice::<T>()?, x.as_slice::<T>()?)?);
        Ok(())
    }

    /// Clamps every element to `[-c, c]`; see [`clamp`] for the rules on `c`
    /// and NaN. A write, but an invalid `c` is rejected before anything
    /// changes (the zeroed flag included).
    pub fn clamp(&mut self, c: f32) -> Result<()> {
        let c = check_clamp_bound(c)?;
        if let Some(y) = self.cuda_write(CudaWrite::Update)? {
            return y.clamp(c);
        }
        with_dtype!(self.dtype(), T => clamp(self.as_mut_slice::<T>()?, c)?);
        Ok(())
    }

    /// `sum_i self_i * other_i` in f64 (same shape and dtype). A zeroed
    /// operand counts as zeros without being read: the result is 0, or NaN
    /// if the other operand holds a NaN or an infinity (`0 * inf = NaN`),
    /// exactly as with real zeros.
    pub fn dot(&self, other: &Tensor) -> Result<f64> {
        check_compatible("dot", self, other)?;
        match (self.is_zeroed(), other.is_zeroed()) {
            (true, true) => Ok(0.0),
            (true, false) => Ok(zero_dot(other.max_abs()?)),
            (false, true) => Ok(zero_dot(self.max_abs()?)),
            (false, false) => {
                if let (Some(a), Some(b)) = (self.cuda_values()?, other.cuda_values()?) {
                    return a.dot(&b);
                }
                with_dtype!(self.dtype(), T => dot(self.as_slice::<T>()?, other.as_slice::<T>()?))
            }
        }
    }

    /// `sum_i self_i^2` in f64; 0 for a zeroed tensor (memory not read).
    pub fn sum_sq(&self) -> Result<f64> {
        self.reduce(
            |s| with_dtype!(s.dtype(), T => Ok(sum_sq(s.as_slice::<T>()?))),
            CudaStorage::sum_sq,
        )
    }

    /// `sum_i self_i` in f64; 0 for a zeroed tensor (memory not read).
    pub fn sum(&self) -> Result<f64> {
        self.reduce(
            |s| with_dtype!(s.dtype(), T => Ok(sum(s.as_slice::<T>()?))),
            CudaStorage::sum,
        )
    }

    /// `max_i |self_i|` in f64 (0 when empty or zeroed, NaN if any NaN, inf if
    /// any inf); see [`max_abs`].
    pub fn max_abs(&self) -> Result<f64> {
        self.reduce(
            |s| with_dtype!(s.dtype(), T => Ok(max_abs(s.as_slice::<T>()?))),
            CudaStorage::max_abs,
        )
    }

    /// A reduction: 0 while zeroed (memory not read), else `on_cpu` or
    /// `on_cuda` by device.
    fn reduce(
        &self,
        on_cpu: impl FnOnce(&Tensor) -> Result<f64>,
        on_cuda: impl FnOnce(&CudaStorage) -> Result<f64>,
    ) -> Result<f64> {
        if self.is_zeroed() {
            return Ok(0.0);
        }
        match self.storage() {
            Storage::Cpu(_) => on_cpu(self),
            Storage::Cuda(s) => on_cuda(s),
        }
    }
}

/// The dot product of real zeros with a vector whose `max_abs` is `m`.
fn zero_dot(m: f64) -> f64 {
    if m.is_finite() { 0.0 } else { f64::NAN }
}
