//! f16 <-> f32 conversion of whole blocks, compiled once in this crate.
//!
//! Why not `half`'s slice conversions: they convert eight at a time through
//! a function pointer to their F16C routine, and whether the compiler turns
//! that into a tight loop depends on the crate and codegen unit where the
//! generic reduction that calls them is instantiated (MpiComm's collectives
//! are generic, so that is whichever crate calls them with concrete types).
//! The same f16 all-reduce of 1 M elements between 2 ranks (10 Gbit/s
//! shaped links, 2026-11-28) took 2.4 to 2.8 ms in one build and 6.4 to 8.0
//! ms in builds that differed only in code elsewhere, with `half`'s
//! conversion loop at 4 % of all samples instead of 0.3. Here the loop is a
//! non-generic function with F16C enabled: one codegen, whoever calls it.
//! The instructions are the ones `half` uses on such a CPU (`vcvtph2ps`,
//! and `vcvtps2ph` rounding to nearest even), so the bits are the same;
//! without F16C, `half`'s own conversions run. gradwire-compress' `cast`
//! converts with the same instructions but streaming stores: a whole
//! gradient written once, past the caches; a reduction block is read again
//! at once from L1, so its stores here are plain ones.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Widens the first `min(src.len(), dst.len())` elements of `src` into
/// `dst`, exactly (every f16 is an f32).
pub(crate) fn widen(src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: the CPU has F16C and AVX (checked just above), all the
        // target-feature function requires beyond its safe signature.
        unsafe { x86::widen(src, dst) };
        return;
    }
    src.convert_to_f32_slice(dst);
}

/// Rounds the first `min(src.len(), dst.len())` elements of `src` into
/// `dst`, to nearest with ties to even (`f16::from_f32`'s rounding).
pub(crate) fn narrow(src: &[f32], dst: &mut [f16]) {
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: as in `widen`.
        unsafe { x86::narrow(src, dst) };
        return;
    }
    dst.convert_from_f32_slice(src);
}

/// F16C and the AVX it is encoded with (the detection is cached by std).
#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx")
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::{
        __m128i, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_storeu_si128, _mm256_cvtph_ps,
        _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_storeu_ps,
    };

    /// [`super::widen`] of equal-length slices, eight lanes at a time.
    #[target_feature(enable = "avx,f16c")]
    pub(super) fn widen(src: &[f16], dst: &mut [f32]) {
        let mut src_chunks = src.chunks_exact(8);
        let mut dst_chunks = dst.chunks_exact_mut(8);
        for (s, d) in (&mut src_chunks).zip(&mut dst_chunks) {
            // SAFETY: `s` holds 8 f16 (16 bytes) and `d` 8 f32 (32 bytes);
            // both accesses are unaligned ones.
            unsafe {
                let h = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
                _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
        for (d, s) in dst_chunks
            .into_remainder()
            .iter_mut()
            .zip(src_chunks.remainder())
        {
            *d = s.to_f32();
        }
    }

    /// [`super::narrow`] of equal-length slices, eight lanes at a time.
    #[target_feature(enable = "avx,f16c")]
    pub(super) fn narrow(src: &[f32], dst: &mut [f16]) {
        let mut src_chunks = src.chunks_exact(8);
        let mut dst_chunks = dst.chunks_exact_mut(8);
        for (s, d) in (&mut src_chunks).zip(&mut dst_chunks) {
            // SAFETY: `s` holds 8 f32 (32 bytes) and `d` 8 f16 (16 bytes);
            // both accesses are unaligned ones.
            unsafe {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
                _mm_storeu_si128(d.as_mut_ptr().cast::<__m128i>(), h);
            }
        }
        for (d, s) in dst_chunks
            .into_remainder()
            .iter_mut()
            .zip(src_chunks.remainder())
        {
            *d = f16::from_f32(*s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Bits of an f16 as the comparison sees them: any NaN as one (the
    /// hardware and the software conversion may quiet a signalling NaN
    /// differently; both keep it a NaN).
    fn bits16(x: f16) -> u16 {
        if x.is_nan() { 0x7e00 } else { x.to_bits() }
    }

    fn bits32(x: f32) -> u32 {
        if x.is_nan() { 0x7fc0_0000 } else { x.to_bits() }
    }

    /// Every f16, at every offset and length around the 8-lane chunks,
    /// widens to `f16::to_f32`'s value.
    #[test]
    fn every_f16_widens_as_half_does() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut wide = vec![0f32; all.len()];
        widen(&all, &mut wide);
        for (h, w) in all.iter().zip(&wide) {
            assert_eq!(bits32(*w), bits32(h.to_f32()), "{:#06x}", h.to_bits());
        }
        for (start, len) in [(0, 0), (1, 1), (3, 7), (5, 8), (7, 9), (11, 17), (13, 31)] {
            let mut out = vec![-1f32; len + 2];
            widen(&all[start..start + len], &mut out[..len]);
            for (k, w) in out[..len].iter().enumerate() {
                assert_eq!(bits32(*w), bits32(all[start + k].to_f32()));
            }
            assert_eq!(&out[len..], &[-1.0, -1.0], "written past the length");
        }
        // Unequal lengths: the shorter decides.
        let mut short = [0f32; 3];
        widen(&all[10..20], &mut short);
        assert_eq!(
            short,
            [all[10].to_f32(), all[11].to_f32(), all[12].to_f32()]
        );
    }

    /// f32s near every rounding boundary of f16 (halfway points, the
    /// subnormal range, overflow to infinity, NaN) narrow to
    /// `f16::from_f32`'s value.
    #[test]
    fn boundary_f32s_narrow_as_half_does() {
        let mut probes = vec![
            0.0,
            -0.0,
            65504.0,
            65519.99,
            65520.0,
            -65520.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            5.96e-8,
            2.98e-8,
            2.99e-8,
            1e-10,
        ];
        // Every f16 and the f32s just around the halfway point above it.
        for bits in 0..=u16::MAX {
            let x = f16::from_bits(bits).to_f32();
            if x.is_finite() {
                let up = f16::from_bits(bits.wrapping_add(1)).to_f32();
                if up.is_finite() {
                    let mid = 0.5 * (x + up);
                    probes.extend([
                        x,
                        mid,
                        f32::from_bits(mid.to_bits() + 1),
                        f32::from_bits(mid.to_bits() - 1),
                    ]);
                }
            }
        }
        let mut narrow_out = vec![f16::ZERO; probes.len()];
        narrow(&probes, &mut narrow_out);
        for (p, h) in probes.iter().zip(&narrow_out) {
            assert_eq!(bits16(*h), bits16(f16::from_f32(*p)), "{p:e}");
        }
    }

    proptest! {
        /// Any f32 bits, any length, narrow as `f16::from_f32` does.
        #[test]
        fn any_f32_narrows_as_half_does(bits in proptest::collection::vec(any::<u32>(), 0..67)) {
            let src: Vec<f32> = bits.iter().map(|b| f32::from_bits(*b)).collect();
            let mut out = vec![f16::ZERO; src.len()];
            narrow(&src, &mut out);
            for (s, h) in src.iter().zip(&out) {
                prop_assert_eq!(bits16(*h), bits16(f16::from_f32(*s)));
            }
        }
    }
}
