//! Flat buffers for tensor fusion: pack many small gradients into one
//! contiguous buffer, run a single collective on it, unpack the result.
//!
//! One all-reduce of a few megabytes is far cheaper than hundreds of tiny
//! ones (latency dominates small messages), so DistOpt groups gradients into
//! buckets. [`FlatLayout`] records where each tensor lives inside the bucket;
//! [`pack`] and [`unpack`] copy in and out, casting on the way when the bucket
//! has another dtype (f32 gradients into an f16 wire buffer, and back).
//!
//! Both functions validate everything (devices, lengths, shapes) before
//! writing anything, so an error leaves every tensor unchanged.

use std::ops::Range;

use bytemuck::Zeroable;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops;
use crate::shape::Shape;
use crate::tensor::{CudaWrite, Tensor};

/// Where one tensor lives inside a flat buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FlatEntry {
    offset: usize,
    len: usize,
    shape: Shape,
}

impl FlatEntry {
    /// First element of the tensor in the flat buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tensor's shape (checked again on [`unpack`]).
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// `offset..offset + len`. Cannot overflow: [`FlatLayout::new`] checked
    /// the running total.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// The layout of a list of tensors packed back to back, in list order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct FlatLayout {
    entries: Vec<FlatEntry>,
    total: usize,
}

impl FlatLayout {
    /// The layout of tensors with these shapes, in order.
    /// [`Error::ShapeOverflow`] if a count or the total overflows `usize`.
    pub fn new<'a>(shapes: impl IntoIterator<Item = &'a Shape>) -> Result<Self> {
        let mut entries = Vec::new();
        let mut total = 0usize;
        for shape in shapes {
            let len = shape.checked_elem_count()?;
            let end = total.checked_add(len).ok_or(Error::ShapeOverflow)?;
            entries.push(FlatEntry {
                offset: total,
                len,
                shape: shape.clone(),
            });
            total = end;
        }
        Ok(FlatLayout { entries, total })
    }

    /// The layout of these tensors, in order.
    pub fn of(tensors: &[&Tensor]) -> Result<Self> {
        FlatLayout::new(tensors.iter().map(|t| t.shape()))
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the layout holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The total number of elements: the length the flat buffer must have.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Tensor `i`'s element range in the flat buffer, `None` if `i` is out of
    /// range.
    pub fn range(&self, i: usize) -> Option<Range<usize>> {
        self.entries.get(i).map(FlatEntry::range)
    }

    /// Tensor `i`'s entry, `None` if `i` is out of range.
    pub fn entry(&self, i: usize) -> Option<&FlatEntry> {
        self.entries.get(i)
    }

    /// All entries, in order.
    pub fn entries(&self) -> &[FlatEntry] {
        &self.entries
    }

    /// Iterates over the entries in order.
    pub fn iter(&self) -> std::slice::Iter<'_, FlatEntry> {
        self.entries.iter()
    }
}

impl<'a> IntoIterator for &'a FlatLayout {
    type Item = &'a FlatEntry;
    type IntoIter = std::slice::Iter<'a, FlatEntry>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

/// Checks that `t` is on `device` (the flat buffer's).
fn require_device(op: &'static str, t: &Tensor, device: Device) -> Result<()> {
    if t.device() == device {
        Ok(())
    } else {
        Err(not_on(op, t, device))
    }
}

fn not_on(op: &'static str, t: &Tensor, device: Device) -> Error {
    Error::DeviceMismatch {
        op,
        expected: device,
        got: t.device(),
    }
}

fn range_error(op: &'static str) -> Error {
    Error::InvalidArgument(format!("{op}: layout range outside the flat buffer"))
}

/// Copies `tensors` back to back into `flat` and returns the layout.
///
/// `flat` and every tensor must be on one device ([`Error::DeviceMismatch`]
/// otherwise; CPU, or one CUDA device where the copies run on the device)
/// and `flat` must have exactly the total element count
/// ([`Error::LengthMismatch`] otherwise). Each tensor is cast to `flat`'s
/// dtype (one rounding when narrowing). Tensors are only read: a zeroed
/// tensor packs as zeros and keeps its flag. `flat` is written, so its own
/// flag is cleared.
pub fn pack(tensors: &[&Tensor], flat: &mut Tensor) -> Result<FlatLayout> {
    let layout = FlatLayout::of(tensors)?;
    pack_with(tensors, &layout, flat)?;
    Ok(layout)
}

/// Allocates a buffer of `dtype` on the tensors' device (the first one's;
/// the CPU when there are none) and [`pack`]s `tensors` into it.
pub fn pack_new(tensors: &[&Tensor], dtype: DType) -> Result<(Tensor, FlatLayout)> {
    let layout = FlatLayout::of(tensors)?;
    let device = tensors.first().map_or(Device::Cpu, |t| t.device());
    let mut flat = Tensor::zeros(layout.total(), dtype, device)?;
    pack_with(tensors, &layout, &mut flat)?;
    Ok((flat, layout))
}

/// [`pack`] with the layout of `tensors` already computed.
fn pack_with(tensors: &[&Tensor], layout: &FlatLayout, flat: &mut Tensor) -> Result<()> {
    let device = flat.device();
    for t in tensors {
        require_device("pack", t, device)?;
    }
    if flat.len() != layout.total() {
        return Err(Error::LengthMismatch {
            op: "pack",
            expected: layout.total(),
            got: flat.len(),
        });
    }
    if let Some(dst) = flat.cuda_write(CudaWrite::Overwrite)? {
        for (t, entry) in tensors.iter().zip(layout) {
            if t.is_zeroed() {
                dst.zero_range(entry.range())?;
            } else {
                let src = t.cuda_values()?.ok_or_else(|| not_on("pack", t, device))?;
                dst.copy_range_from(entry.offset(), &src, 0..entry.len())?;
            }
        }
        return Ok(());
    }
    with_dtype!(flat.dtype(), D => {
        let dst = flat.overwrite_slice::<D>("pack")?;
        for (t, entry) in tensors.iter().zip(layout) {
            let part = dst.get_mut(entry.range()).ok_or_else(|| range_error("pack"))?;
            if t.is_zeroed() {
                part.fill(D::zeroed());
            } else {
                with_dtype!(t.dtype(), S => ops::cast(t.as_slice::<S>()?, part)?);
            }
        }
    });
    Ok(())
}

/// Copies each range of `flat` back into the matching tensor, casting to the
/// tensor's dtype.
///
/// Errors, checked before anything is written: a tensor not on `flat`'s
/// device ([`Error::DeviceMismatch`]); `flat.len() != layout.total()` or a tensor
/// count different from the layout's ([`Error::LengthMismatch`]); a tensor
/// whose shape differs from its entry ([`Error::ShapeMismatch`], `lhs` the
/// tensor's shape, `rhs` the layout's). Every destination is written, so
/// every destination's zeroed flag is cleared; a zeroed `flat` unpacks as
/// zeros.
pub fn unpack(flat: &Tensor, layout: &FlatLayout, tensors: &mut [&mut Tensor]) -> Result<()> {
    let device = flat.device();
    if flat.len() != layout.total() {
        return Err(Error::LengthMismatch {
            op: "unpack",
            expected: layout.total(),
            got: flat.len(),
        });
    }
    if tensors.len() != layout.len() {
        return Err(Error::LengthMismatch {
            op: "unpack",
            expected: layout.len(),
            got: tensors.len(),
        });
    }
    for (t, entry) in tensors.iter().zip(layout) {
        require_device("unpack", t, device)?;
        if t.shape() != entry.shape() {
            return Err(Error::ShapeMismatch {
                op: "unpack",
                lhs: t.shape().clone(),
                rhs: entry.shape().clone(),
            });
        }
    }
    if flat.is_zeroed() {
        for t in tensors.iter_mut() {
            t.fill(0.0)?;
        }
        return Ok(());
    }
    if let Some(src) = flat.cuda_values()? {
        for (t, entry) in tensors.iter_mut().zip(layout) {
            let on = t.device();
            let dst = t
                .cuda_write(CudaWrite::Overwrite)?
                .ok_or(Error::DeviceMismatch {
                    op: "unpack",
                    expected: device,
                    got: on,
                })?;
            dst.copy_range_from(0, &src, entry.range())?;
        }
        return Ok(());
    }
    with_dtype!(flat.dtype(), S => {
        let src = flat.as_slice::<S>()?;
        for (t, entry) in tensors.iter_mut().zip(layout) {
            let part = src.get(entry.range()).ok_or_else(|| range_error("unpack"))?;
            with_dtype!(t.dtype(), D => ops::cast(part, t.overwrite_slice::<D>("unpack")?)?);
        }
    });
    Ok(())
}

/// [`pack`] of CPU tensors into the front of a buffer the caller reuses from
/// call to call: `buffer` grows to the total element count when it is
/// shorter (and never shrinks), so a caller that packs the same tensors
/// every step allocates nothing after the first. Each tensor is cast to
/// `D`; a zeroed tensor packs as zeros. Returns the total; the packed
/// values are `buffer[..total]`, laid out back to back in order (the
/// layout [`FlatLayout::of`] would give).
///
/// Errors, before anything is written: a tensor not in CPU memory
/// ([`Error::DeviceMismatch`]).
pub fn pack_into<D: crate::WithDType>(tensors: &[Tensor], buffer: &mut Vec<D>) -> Result<usize> {
    for t in tensors {
        require_device("pack_into", t, Device::Cpu)?;
    }
    let total = tensors.iter().map(Tensor::len).sum::<usize>();
    if buffer.len() < total {
        buffer.resize(total, D::zeroed());
    }
    let mut offset = 0;
    for t in tensors {
        let part = &mut buffer[offset..offset + t.len()];
        if t.is_zeroed() {
            part.fill(D::zeroed());
        } else {
            with_dtype!(t.dtype(), S => ops::cast(t.as_slice::<S>()?, part)?);
        }
        offset += t.len();
    }
    Ok(total)
}

/// [`unpack`] of a buffer packed by [`pack_into`]: each tensor takes its
/// range of `flat` (back to back, in order), cast to its dtype, and its
/// zeroed flag is cleared.
///
/// Errors, before anything is written: a tensor not in CPU memory
/// ([`Error::DeviceMismatch`]); `flat` shorter than the tensors' total
/// ([`Error::LengthMismatch`]).
pub fn unpack_from<S: crate::WithDType>(flat: &[S], tensors: &mut [Tensor]) -> Result<()> {
    let total = tensors.iter().map(Tensor::len).sum::<usize>();
    if flat.len() < total {
        return Err(Error::LengthMismatch {
            op: "unpack_from",
            expected: total,
            got: flat.len(),
        });
    }
    for t in tensors.iter() {
        require_device("unpack_from", t, Device::Cpu)?;
    }
    let mut offset = 0;
    for t in tensors.iter_mut() {
        let n = t.len();
        let part = &flat[offset..offset + n];
        with_dtype!(t.dtype(), D => ops::cast(part, t.overwrite_slice::<D>("unpack_from")?)?);
        offset += n;
    }
    Ok(())
}
