//! The element types a communicator moves, and the reduction kernels behind them.
//!
//! Collectives take plain slices of any [`Element`]: the three tensor dtypes
//! (f32, f16, bf16) plus f64 (AdaSum's partial dot products), bytes (encoded
//! sparse payloads) and integers (indices, counts, votes). The trait is
//! sealed: a backend must know how to reduce every element type it is given.
//!
//! f16 and bf16 are reduced in f32 and rounded once at the end, so a sum of W
//! half-precision buffers is as exact as the f32 sum of them rounded once;
//! summing in half precision (SINGA's fp16 all-reduce) loses bits at every
//! rank and overflows past 65504 on the way even when the final value fits.

use crate::op::ReduceOp;
pub use gradwire_tensor::ElemType;
use half::{bf16, f16};
use std::fmt;

/// A type a communicator can move and reduce. Sealed.
pub trait Element:
    kernel::Kernel + bytemuck::Pod + Send + Sync + fmt::Debug + PartialEq + 'static
{
    /// The runtime tag of this type.
    const TYPE: ElemType;
}

/// Elements reduced per block. A block of every rank's buffer is combined in an
/// accumulator that stays in L1 (8 KiB of f32), then written back, so each
/// byte of each buffer is read once and written once.
pub(crate) const BLOCK: usize = 2048;

pub(crate) mod kernel {
    //! Block reduction kernels, one implementation per element type.
    //!
    //! The caller loads the first rank's block into the accumulator, combines
    //! the other ranks' blocks in rank order, optionally averages, and stores
    //! the accumulator into every destination: a fixed order, hence bitwise
    //! reproducible results.

    use super::*;

    /// How one element type is reduced. Not part of the public API.
    pub trait Kernel: Copy + Sized {
        /// The accumulator element (f32 for the half types).
        type Acc: Copy + Default + Send + Sync + 'static;
        /// `acc = src` (converted).
        fn load(src: &[Self], acc: &mut [Self::Acc]);
        /// `acc = op(acc, src)` element-wise.
        fn combine(src: &[Self], acc: &mut [Self::Acc], op: ReduceOp);
        /// `acc /= world` (only called for `ReduceOp::Avg`, which validation
        /// allows for floating-point types alone).
        fn average(acc: &mut [Self::Acc], world: usize);
        /// `dst = acc` (converted, rounding to nearest even).
        fn store(acc: &[Self::Acc], dst: &mut [Self]);
    }

    macro_rules! float_combine {
        ($acc:expr, $src:expr, $op:expr) => {
            match $op {
                ReduceOp::Sum | ReduceOp::Avg => {
                    for (a, &x) in $acc.iter_mut().zip($src) {
                        *a += x;
                    }
                }
                ReduceOp::Max => {
                    for (a, &x) in $acc.iter_mut().zip($src) {
                        // NaN-propagating: a NaN already in `a` is kept, a NaN in `x` replaces.
                        if x > *a || x.is_nan() {
                            *a = x;
                        }
                    }
                }
                ReduceOp::Min => {
                    for (a, &x) in $acc.iter_mut().zip($src) {
                        if x < *a || x.is_nan() {
                            *a = x;
                        }
                    }
                }
            }
        };
    }

    macro_rules! impl_float {
        ($t:ty) => {
            impl Kernel for $t {
                type Acc = $t;
                #[inline(always)]
                fn load(src: &[Self], acc: &mut [Self::Acc]) {
                    acc.copy_from_slice(src);
                }
                #[inline(always)]
                fn combine(src: &[Self], acc: &mut [Self::Acc], op: ReduceOp) {
                    float_combine!(acc, src, op);
                }
                #[inline(always)]
                fn average(acc: &mut [Self::Acc], world: usize) {
                    let w = world as $t;
                    for a in acc {
                        *a /= w;
                    }
                }
                #[inline(always)]
                fn store(acc: &[Self::Acc], dst: &mut [Self]) {
                    dst.copy_from_slice(acc);
                }
            }
        };
    }
    impl_float!(f32);
    impl_float!(f64);

    /// The half types' conversions to and from the f32 accumulator. f16 uses
    /// [`crate::f16_convert`] (F16C instructions where the CPU has them);
    /// bf16 is the top half of an f32, so its loops are written here in a
    /// form the compiler vectorises (half's bf16 slice conversions are scalar).
    trait Widen: Copy {
        fn widen(src: &[Self], dst: &mut [f32]);
        fn narrow(src: &[f32], dst: &mut [Self]);
    }

    impl Widen for f16 {
        #[inline(always)]
        fn widen(src: &[Self], dst: &mut [f32]) {
            crate::f16_convert::widen(src, dst);
        }
        #[inline(always)]
        fn narrow(src: &[f32], dst: &mut [Self]) {
            crate::f16_convert::narrow(src, dst);
        }
    }

    impl Widen for bf16 {
        #[inline(always)]
        fn widen(src: &[Self], dst: &mut [f32]) {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = f32::from_bits(u32::from(s.to_bits()) << 16);
            }
        }
        #[inline(always)]
        fn narrow(src: &[f32], dst: &mut [Self]) {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = bf16::from_bits(f32_to_bf16_bits(*s));
            }
        }
    }

    /// Rounds an f32 to bf16 bits, to nearest with ties to even; a NaN stays
    /// a (quiet) NaN. Bit-identical to `half::bf16::from_f32`.
    #[inline(always)]
    fn f32_to_bf16_bits(x: f32) -> u16 {
        let bits = x.to_bits();
        let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
        let nan = ((bits >> 16) | 0x40) as u16;
        if x.is_nan() { nan } else { rounded as u16 }
    }

    macro_rules! impl_half {
        ($t:ty) => {
            impl Kernel for $t {
                type Acc = f32;
                #[inline(always)]
                fn load(src: &[Self], acc: &mut [Self::Acc]) {
                    <$t as Widen>::widen(src, acc);
                }
                #[inline(always)]
                fn combine(src: &[Self], acc: &mut [Self::Acc], op: ReduceOp) {
                    let mut wide = [0f32; BLOCK];
                    for (src, acc) in src.chunks(BLOCK).zip(acc.chunks_mut(BLOCK)) {
                        let wide = &mut wide[..src.len()];
                        <$t as Widen>::widen(src, wide);
                        float_combine!(acc, &*wide, op);
                    }
                }
                #[inline(always)]
                fn average(acc: &mut [Self::Acc], world: usize) {
                    <f32 as Kernel>::average(acc, world);
                }
                #[inline(always)]
                fn store(acc: &[Self::Acc], dst: &mut [Self]) {
                    <$t as Widen>::narrow(acc, dst);
                }
            }
        };
    }
    impl_half!(f16);
    impl_half!(bf16);

    macro_rules! impl_int {
        ($t:ty) => {
            impl Kernel for $t {
                type Acc = $t;
                #[inline(always)]
                fn load(src: &[Self], acc: &mut [Self::Acc]) {
                    acc.copy_from_slice(src);
                }
                #[inline(always)]
                fn combine(src: &[Self], acc: &mut [Self::Acc], op: ReduceOp) {
                    match op {
                        ReduceOp::Sum | ReduceOp::Avg => {
                            for (a, &x) in acc.iter_mut().zip(src) {
                                *a = a.wrapping_add(x);
                            }
                        }
                        ReduceOp::Max => {
                            for (a, &x) in acc.iter_mut().zip(src) {
                                *a = (*a).max(x);
                            }
                        }
                        ReduceOp::Min => {
                            for (a, &x) in acc.iter_mut().zip(src) {
                                *a = (*a).min(x);
                            }
                        }
                    }
                }
                #[inline(always)]
                fn average(acc: &mut [Self::Acc], world: usize) {
                    // Unreachable through the public API (validation rejects
                    // Avg on integers); defined anyway so nothing can panic.
                    let w = <$t>::try_from(world).unwrap_or(<$t>::MAX).max(1);
                    for a in acc {
                        *a /= w;
                    }
                }
                #[inline(always)]
                fn store(acc: &[Self::Acc], dst: &mut [Self]) {
                    dst.copy_from_slice(acc);
                }
            }
        };
    }
    impl_int!(u8);
    impl_int!(u32);
    impl_int!(u64);
    impl_int!(i32);
    impl_int!(i64);
}

macro_rules! impl_element {
    ($($t:ty => $tag:ident),* $(,)?) => {
        $(impl Element for $t {
            const TYPE: ElemType = ElemType::$tag;
        })*
    };
}
impl_element!(
    f16 => F16,
    bf16 => BF16,
    f32 => F32,
    f64 => F64,
    u8 => U8,
    u32 => U32,
    u64 => U64,
    i32 => I32,
    i64 => I64,
);

#[cfg(test)]
mod tests {
    use super::kernel::Kernel;
    use half::bf16;

    /// The hand-written bf16 conversions agree with half's, bit for bit, on
    /// every bf16 value and on f32 values around every rounding boundary.
    #[test]
    fn bf16_conversions_match_half() {
        let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        let mut wide = vec![0f32; all.len()];
        <bf16 as Kernel>::load(&all, &mut wide);
        for (b, w) in all.iter().zip(&wide) {
            if b.is_nan() {
                // half quiets a signalling NaN when widening; the shift keeps
                // its payload. Either is a NaN, and a store quiets it.
                assert!(w.is_nan());
            } else {
                assert_eq!(b.to_f32().to_bits(), w.to_bits());
            }
        }
        let probes: Vec<f32> = (0..=u16::MAX as u32)
            .flat_map(|hi| {
                [0u32, 0x7fff, 0x8000, 0x8001, 0xffff].map(move |lo| f32::from_bits(hi << 16 | lo))
            })
            .collect();
        let mut narrow = vec![bf16::ZERO; probes.len()];
        <bf16 as Kernel>::store(&probes, &mut narrow);
        for (p, n) in probes.iter().zip(&narrow) {
            let want = bf16::from_f32(*p);
            if p.is_nan() {
                assert!(n.is_nan(), "{p:?}");
            } else {
                assert_eq!(want.to_bits(), n.to_bits(), "{p:?} ({:#010x})", p.to_bits());
            }
        }
    }
}
