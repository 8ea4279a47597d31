//! Element types: the [`DType`] tag and the [`WithDType`] trait tying it to a
//! Rust type.
//!
//! gradwire moves gradients in three formats: `f32` (what optimizers keep),
//! and `f16` / `bf16` (half the bytes on the wire). [`DType`] is the runtime
//! tag carried by every tensor; [`WithDType`] is the compile-time side that
//! lets generic code (`as_slice::<T>()`, the slice kernels in [`crate::ops`])
//! name the element type and convert it to and from `f32`, the precision all
//! arithmetic is done in. The trait is sealed: the kernels rely on exactly
//! these three types (bit layouts, conversion rounding), so no outside type
//! may implement it.

use std::fmt;
use std::str::FromStr;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::storage::CpuStorage;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16 (5 exponent bits, 10 mantissa bits).
    F16,
    /// bfloat16 (8 exponent bits, 7 mantissa bits): f32's range, less precision.
    BF16,
}

impl DType {
    /// Every dtype, in declaration order; handy for exhaustive tests and CLIs.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// The element type this dtype is.
    pub const fn elem_type(self) -> ElemType {
        match self {
            DType::F32 => ElemType::F32,
            DType::F16 => ElemType::F16,
            DType::BF16 => ElemType::BF16,
        }
    }

    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        self.elem_type().size_in_bytes()
    }

    /// The canonical lower-case name: `"f32"`, `"f16"` or `"bf16"`. This is
    /// what [`FromStr`] accepts and [`fmt::Display`] prints, so names round-trip
    /// through configs and reports.
    pub const fn as_str(self) -> &'static str {
        self.elem_type().as_str()
    }
}

impl From<DType> for ElemType {
    fn from(dtype: DType) -> ElemType {
        dtype.elem_type()
    }
}

impl TryFrom<ElemType> for DType {
    type Error = Error;

    /// The dtype of a tensor element type; [`Error::InvalidArgument`] for
    /// the others (f64, integers, bytes).
    fn try_from(elem: ElemType) -> Result<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.elem_type() == elem)
            .ok_or_else(|| Error::InvalidArgument(format!("no tensor dtype is {elem}")))
    }
}

/// Every element type gradwire moves or computes with: the tensor dtypes
/// ([`DType`], a subset) plus f64 (AdaSum's partial sums), bytes (encoded
/// payloads) and integers (indices, counts, votes). Communicators tag and
/// validate buffers with it across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemType {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// Bytes.
    U8,
    /// Unsigned 32-bit integers.
    U32,
    /// Unsigned 64-bit integers.
    U64,
    /// Signed 32-bit integers.
    I32,
    /// Signed 64-bit integers.
    I64,
}

impl ElemType {
    /// Every element type.
    pub const ALL: [ElemType; 9] = [
        ElemType::F16,
        ElemType::BF16,
        ElemType::F32,
        ElemType::F64,
        ElemType::U8,
        ElemType::U32,
        ElemType::U64,
        ElemType::I32,
        ElemType::I64,
    ];

    /// Size of one element in bytes.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            ElemType::U8 => 1,
            ElemType::F16 | ElemType::BF16 => 2,
            ElemType::F32 | ElemType::U32 | ElemType::I32 => 4,
            ElemType::F64 | ElemType::U64 | ElemType::I64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            ElemType::F16 | ElemType::BF16 | ElemType::F32 | ElemType::F64
        )
    }

    /// The lowercase name ("f32", "u8", ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            ElemType::F16 => "f16",
            ElemType::BF16 => "bf16",
            ElemType::F32 => "f32",
            ElemType::F64 => "f64",
            ElemType::U8 => "u8",
            ElemType::U32 => "u32",
            ElemType::U64 => "u64",
            ElemType::I32 => "i32",
            ElemType::I64 => "i64",
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = Error;

    /// Parses exactly the names produced by [`DType::as_str`]; anything else
    /// is [`Error::UnknownDType`] (no guessing: a typo in a config must not
    /// silently select another precision).
    fn from_str(s: &str) -> Result<Self> {
        DType::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| Error::UnknownDType(s.to_owned()))
    }
}

pub(crate) mod private {
    //! The seal of [`super::WithDType`], plus crate-internal helpers that must
    //! not be part of the public contract.

    use crate::storage::CpuStorage;

    /// Implemented for exactly `f32`, `f16` and `bf16`; unnameable outside the
    /// crate, so nobody else can implement `WithDType`.
    pub trait Sealed: Sized {
        /// Converts `min(src.len(), dst.len())` elements to f32. Never panics;
        /// internal callers always pass equal lengths.
        fn conv_to_f32(src: &[Self], dst: &mut [f32]);
        /// Converts `min(src.len(), dst.len())` elements from f32, rounding to
        /// nearest even. Never panics.
        fn conv_from_f32(src: &[f32], dst: &mut [Self]);
        /// `n` zeros through the allocator's zeroed path (calloc), so a large
        /// buffer costs no writes until it is touched.
        fn zeros_vec(n: usize) -> Vec<Self>;
        /// Largest `|x|` as f64: 0 for an empty slice, NaN if any element is
        /// NaN, inf if any is infinite (and none is NaN).
        fn max_abs_of(s: &[Self]) -> f64;
        /// Moves the vector out of a storage of this dtype, or gives it back.
        fn take_storage(s: CpuStorage) -> std::result::Result<Vec<Self>, CpuStorage>;
    }
}

/// A Rust element type a tensor can hold: `f32`, [`struct@f16`] or [`bf16`].
///
/// All arithmetic in this crate is done in f32; `to_f32` is exact for every
/// type (both halves widen losslessly) and `from_f32` rounds to nearest, ties
/// to even, keeping NaN as NaN and ±inf as ±inf; finite values beyond the
/// type's range become ±inf.
pub trait WithDType:
    private::Sealed + Copy + Send + Sync + 'static + bytemuck::Pod + fmt::Debug + PartialEq
{
    /// The runtime tag of this type.
    const DTYPE: DType;

    /// Exact widening to f32.
    fn to_f32(self) -> f32;

    /// Rounds an f32 to this type (nearest, ties to even).
    fn from_f32(v: f32) -> Self;

    /// Converts a whole slice to f32 (SIMD where available: half's F16C path
    /// for f16, a vectorisable shift for bf16, a copy for f32).
    ///
    /// Returns [`Error::LengthMismatch`] if the slices differ in length
    /// (instead of half's panic), and writes nothing in that case.
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) -> Result<()> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch {
                op: "to_f32_slice",
                expected: src.len(),
                got: dst.len(),
            });
        }
        Self::conv_to_f32(src, dst);
        Ok(())
    }

    /// Converts a whole f32 slice to this type, rounding each element once
    /// (nearest, ties to even).
    ///
    /// Returns [`Error::LengthMismatch`] if the slices differ in length, and
    /// writes nothing in that case.
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) -> Result<()> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch {
                op: "from_f32_slice",
                expected: src.len(),
                got: dst.len(),
            });
        }
        Self::conv_from_f32(src, dst);
        Ok(())
    }

    /// The storage's elements if it holds this type, else `None`.
    fn cpu_slice(s: &CpuStorage) -> Option<&[Self]>;

    /// The storage's elements, mutably, if it holds this type, else `None`.
    fn cpu_slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;

    /// Wraps a vector of this type as storage (no copy).
    fn into_storage(v: Vec<Self>) -> CpuStorage;
}

impl private::Sealed for f32 {
    #[inline]
    fn conv_to_f32(src: &[f32], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
    }

    #[inline]
    fn conv_from_f32(src: &[f32], dst: &mut [f32]) {
        Self::conv_to_f32(src, dst);
    }

    fn zeros_vec(n: usize) -> Vec<f32> {
        // `vec![0.0; n]` is specialised to `alloc_zeroed` for all-zero bits.
        vec![0.0; n]
    }

    fn max_abs_of(s: &[f32]) -> f64 {
        // On the bit pattern with the sign cleared, IEEE ordering of
        // non-negative values is integer ordering, and every NaN is above
        // +inf (0x7f80_0000). An integer max therefore propagates NaN, which
        // `f32::max` would drop, and vectorises without branches.
        let m = s.iter().fold(0u32, |m, x| m.max(x.to_bits() & 0x7fff_ffff));
        f64::from(f32::from_bits(m))
    }

    fn take_storage(s: CpuStorage) -> std::result::Result<Vec<f32>, CpuStorage> {
        match s {
            CpuStorage::F32(v) => Ok(v),
            other => Err(other),
        }
    }
}

impl WithDType for f32 {
    const DTYPE: DType = DType::F32;

    #[inline]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline]
    fn from_f32(v: f32) -> f32 {
        v
    }

    fn cpu_slice(s: &CpuStorage) -> Option<&[f32]> {
        match s {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }

    fn cpu_slice_mut(s: &mut CpuStorage) -> Option<&mut [f32]> {
        match s {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }

    fn into_storage(v: Vec<f32>) -> CpuStorage {
        CpuStorage::F32(v)
    }
}

impl private::Sealed for f16 {
    #[inline]
    fn conv_to_f32(src: &[f16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        // Equal lengths by construction, so half's length assert cannot fire.
        // half picks F16C / NEON at run time and falls back to software.
        src[..n].convert_to_f32_slice(&mut dst[..n]);
    }

    #[inline]
    fn conv_from_f32(src: &[f32], dst: &mut [f16]) {
        let n = src.len().min(dst.len());
        dst[..n].convert_from_f32_slice(&src[..n]);
    }

    fn zeros_vec(n: usize) -> Vec<f16> {
        // calloc'd u16 zeros reinterpreted in place: +0.0 is all-zero bits.
        half::vec::HalfBitsVecExt::reinterpret_into(vec![0u16; n])
    }

    fn max_abs_of(s: &[f16]) -> f64 {
        // Same integer-max trick as f32: f16 NaNs are above +inf (0x7c00).
        let m = s.iter().fold(0u16, |m, x| m.max(x.to_bits() & 0x7fff));
        f16::from_bits(m).to_f64()
    }

    fn take_storage(s: CpuStorage) -> std::result::Result<Vec<f16>, CpuStorage> {
        match s {
            CpuStorage::F16(v) => Ok(v),
            other => Err(other),
        }
    }
}

impl WithDType for f16 {
    const DTYPE: DType = DType::F16;

    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    #[inline]
    fn from_f32(v: f32) -> f16 {
        f16::from_f32(v)
    }

    fn cpu_slice(s: &CpuStorage) -> Option<&[f16]> {
        match s {
            CpuStorage::F16(v) => Some(v),
            _ => None,
        }
    }

    fn cpu_slice_mut(s: &mut CpuStorage) -> Option<&mut [f16]> {
        match s {
            CpuStorage::F16(v) => Some(v),
            _ => None,
        }
    }

    fn into_storage(v: Vec<f16>) -> CpuStorage {
        CpuStorage::F16(v)
    }
}

impl private::Sealed for bf16 {
    #[inline]
    fn conv_to_f32(src: &[bf16], dst: &mut [f32]) {
        // half's own bf16 slice conversion is an indexed scalar loop; a zip
        // over the same scalar conversion gives bitwise the same results
        // without bounds checks, and widening is a plain shift that LLVM
        // vectorises.
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }

    #[inline]
    fn conv_from_f32(src: &[f32], dst: &mut [bf16]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = bf16::from_f32(*s);
        }
    }

    fn zeros_vec(n: usize) -> Vec<bf16> {
        half::vec::HalfBitsVecExt::reinterpret_into(vec![0u16; n])
    }

    fn max_abs_of(s: &[bf16]) -> f64 {
        // bf16 NaNs are above +inf (0x7f80) once the sign is cleared.
        let m = s.iter().fold(0u16, |m, x| m.max(x.to_bits() & 0x7fff));
        bf16::from_bits(m).to_f64()
    }

    fn take_storage(s: CpuStorage) -> std::result::Result<Vec<bf16>, CpuStorage> {
        match s {
            CpuStorage::BF16(v) => Ok(v),
            other => Err(other),
        }
    }
}

impl WithDType for bf16 {
    const DTYPE: DType = DType::BF16;

    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }

    #[inline]
    fn from_f32(v: f32) -> bf16 {
        bf16::from_f32(v)
    }

    fn cpu_slice(s: &CpuStorage) -> Option<&[bf16]> {
        match s {
            CpuStorage::BF16(v) => Some(v),
            _ => None,
        }
    }

    fn cpu_slice_mut(s: &mut CpuStorage) -> Option<&mut [bf16]> {
        match s {
            CpuStorage::BF16(v) => Some(v),
            _ => None,
        }
    }

    fn into_storage(v: Vec<bf16>) -> CpuStorage {
        CpuStorage::BF16(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dtype_is_its_element_type_and_back() {
        for dtype in DType::ALL {
            let elem = ElemType::from(dtype);
            assert_eq!(elem.size_in_bytes(), dtype.size_in_bytes());
            assert_eq!(elem.as_str(), dtype.as_str());
            assert!(elem.is_float());
            assert_eq!(DType::try_from(elem).ok(), Some(dtype));
        }
        let others = ElemType::ALL
            .into_iter()
            .filter(|e| DType::ALL.iter().all(|d| d.elem_type() != *e));
        for elem in others {
            let err = DType::try_from(elem).expect_err("not a tensor dtype");
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{elem}");
        }
    }

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.as_str().parse::<DType>(), Ok(d));
            assert_eq!(d.to_string(), d.as_str());
        }
        assert_eq!(
            "F32".parse::<DType>(),
            Err(Error::UnknownDType("F32".into()))
        );
    }

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::F32.size_in_bytes(), size_of::<f32>());
        assert_eq!(DType::F16.size_in_bytes(), size_of::<f16>());
        assert_eq!(DType::BF16.size_in_bytes(), size_of::<bf16>());
    }

    #[test]
    fn max_abs_bits_trick() {
        assert_eq!(<f32 as private::Sealed>::max_abs_of(&[]), 0.0);
        assert_eq!(<f32 as private::Sealed>::max_abs_of(&[-3.0, 2.0]), 3.0);
        assert_eq!(
            <f32 as private::Sealed>::max_abs_of(&[f32::NEG_INFINITY, 1.0]),
            f64::INFINITY
        );
        assert!(<f32 as private::Sealed>::max_abs_of(&[f32::INFINITY, f32::NAN]).is_nan());
        let h = [f16::from_f32(-2.5), f16::from_f32(1.0)];
        assert_eq!(<f16 as private::Sealed>::max_abs_of(&h), 2.5);
        assert!(<bf16 as private::Sealed>::max_abs_of(&[bf16::NAN, bf16::INFINITY]).is_nan());
    }

    #[test]
    fn slice_conversions_reject_length_mismatch() {
        let mut dst = [0.0f32; 2];
        assert!(matches!(
            f16::to_f32_slice(&[f16::ONE; 3], &mut dst),
            Err(Error::LengthMismatch { .. })
        ));
        assert_eq!(dst, [0.0, 0.0]);
    }
}
