//! Dense casts: f32 to f16 or bf16 for the wire, and back.
//!
//! Rounding is to nearest, ties to even (half's conversions, F16C where the
//! CPU has it). Two options come before the rounding: a clamp to [-c, c]
//! (SINGA's `clip_value`) and a scale (e.g. 1/W, so that a sum of W values
//! cannot overflow f16's 65504; the receiver divides it back out, or uses the
//! scaled sum as the average).
//!
//! Non-finite values are sent as they are (NaN stays NaN, an infinity stays
//! infinite, a finite value beyond f16's range becomes infinite): the sum of
//! every rank's buffer is then non-finite on every rank alike, and the step is
//! skipped the way loss scalers skip an overflow.

use crate::error::{CompressError, Result};
use gradwire_tensor::{DType, WithDType};

/// What happens to values before they are rounded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CastOptions {
    /// Clamp to `[-clip, clip]` first (finite, non-negative).
    pub clip: Option<f32>,
    /// Multiply by this after clamping (finite, positive); 1 leaves values as
    /// they are.
    pub scale: f32,
}

impl Default for CastOptions {
    fn default() -> Self {
        CastOptions {
            clip: None,
            scale: 1.0,
        }
    }
}

impl CastOptions {
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(c) = self.clip
            && !(c >= 0.0 && c.is_finite())
        {
            return Err(CompressError::InvalidArgument(format!(
                "clip value {c} must be finite and non-negative"
            )));
        }
        if !(self.scale > 0.0 && self.scale.is_finite()) {
            return Err(CompressError::InvalidArgument(format!(
                "scale {} must be finite and positive",
                self.scale
            )));
        }
        Ok(())
    }

    /// Whether values go through unchanged before rounding.
    fn is_identity(&self) -> bool {
        self.clip.is_none() && self.scale == 1.0
    }

    #[inline(always)]
    fn apply(&self, v: f32) -> f32 {
        let v = match self.clip {
            // NaN stays NaN; `c` was validated (finite, >= 0), so no panic.
            Some(c) => v.clamp(-c, c),
            None => v,
        };
        v * self.scale
    }
}

/// Elements per stack block when options apply.
const BLOCK: usize = 1024;

/// Rounds `src` (clamped and scaled per `opts`) into `dst`, of the same length,
/// in `H` (f16, bf16, or f32 for a plain copy).
pub fn encode<H: WithDType>(src: &[f32], dst: &mut [H], opts: &CastOptions) -> Result<()> {
    opts.validate()?;
    if src.len() != dst.len() {
        return Err(CompressError::LengthMismatch {
            op: "cast::encode",
            expected: src.len(),
            got: dst.len(),
        });
    }
    if opts.is_identity() {
        if H::DTYPE == DType::F16 && streaming::narrow(src, bytemuck::cast_slice_mut(dst)) {
            return Ok(());
        }
        H::from_f32_slice(src, dst)?;
        return Ok(());
    }
    let mut block = [0f32; BLOCK];
    for (src, dst) in src.chunks(BLOCK).zip(dst.chunks_mut(BLOCK)) {
        let block = &mut block[..src.len()];
        for (b, &v) in block.iter_mut().zip(src) {
            *b = opts.apply(v);
        }
        H::from_f32_slice(block, dst)?;
    }
    Ok(())
}

/// Widens `src` into `dst` (exact), of the same length.
pub fn decode<H: WithDType>(src: &[H], dst: &mut [f32]) -> Result<()> {
    if src.len() == dst.len()
        && H::DTYPE == DType::F16
        && streaming::widen(bytemuck::cast_slice(src), dst)
    {
        return Ok(());
    }
    H::to_f32_slice(src, dst)?;
    Ok(())
}

/// f16 conversions of large buffers with non-temporal stores.
///
/// A buffer larger than the caches is not read back soon, and an ordinary
/// store first reads each destination line into the cache (write-allocate):
/// for f32 -> f16 -> f32 that is a third more memory traffic than the
/// conversions need. Streaming stores write around the cache. Same rounding
/// as half's conversions (both use the F16C instructions, round to nearest
/// even). Only on x86-64 with AVX and F16C, only for buffers of at least
/// [`streaming::MIN_LEN`] elements; otherwise the caller's path runs.
mod streaming {
    use half::f16;

    /// Smaller buffers stay in the cache for whoever reads them next.
    pub(super) const MIN_LEN: usize = 4 << 20;

    /// Narrows `src` into `dst` (same length); false if not done here.
    pub(super) fn narrow(src: &[f32], dst: &mut [f16]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if src.len() == dst.len()
            && src.len() >= MIN_LEN
            && std::arch::is_x86_feature_detected!("avx")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the CPU has AVX and F16C (checked), lengths are equal.
            unsafe { x86::narrow(src, dst) };
            return true;
        }
        let _ = (src, dst);
        false
    }

    /// Widens `src` into `dst` (same length); false if not done here.
    pub(super) fn widen(src: &[f16], dst: &mut [f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if src.len() == dst.len()
            && src.len() >= MIN_LEN
            && std::arch::is_x86_feature_detected!("avx")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the CPU has AVX and F16C (checked), lengths are equal.
            unsafe { x86::widen(src, dst) };
            return true;
        }
        let _ = (src, dst);
        false
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use half::f16;
        use std::arch::x86_64::{
            __m128i, _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm_sfence, _mm_stream_si128,
            _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps, _mm256_stream_ps,
        };

        /// # Safety
        /// The CPU supports AVX and F16C; `src.len() == dst.len()`.
        #[target_feature(enable = "avx,f16c")]
        pub(super) unsafe fn narrow(src: &[f32], dst: &mut [f16]) {
            let n = src.len().min(dst.len());
            // Scalar until the destination is 16-byte aligned (streaming
            // stores need it), then 8 at a time, then the tail.
            let mut i = 0;
            while i < n && !(dst.as_ptr().wrapping_add(i) as usize).is_multiple_of(16) {
                dst[i] = f16::from_f32(src[i]);
                i += 1;
            }
            while i + 8 <= n {
                // SAFETY: i + 8 <= n for both slices; the store address is
                // 16-byte aligned (2-byte elements, aligned at the start).
                unsafe {
                    let v = _mm256_loadu_ps(src.as_ptr().add(i));
                    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                    _mm_stream_si128(dst.as_mut_ptr().add(i).cast::<__m128i>(), h);
                }
                i += 8;
            }
            while i < n {
                dst[i] = f16::from_f32(src[i]);
                i += 1;
            }
            // Streaming stores are weakly ordered: fence before anyone reads.
            _mm_sfence();
        }

        /// # Safety
        /// The CPU supports AVX and F16C; `src.len() == dst.len()`.
        #[target_feature(enable = "avx,f16c")]
        pub(super) unsafe fn widen(src: &[f16], dst: &mut [f32]) {
            let n = src.len().min(dst.len());
            let mut i = 0;
            while i < n && !(dst.as_ptr().wrapping_add(i) as usize).is_multiple_of(32) {
                dst[i] = src[i].to_f32();
                i += 1;
            }
            while i + 8 <= n {
                // SAFETY: i + 8 <= n for both slices; the store address is
                // 32-byte aligned (4-byte elements, aligned at the start).
                unsafe {
                    let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
                    _mm256_stream_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
                }
                i += 8;
            }
            while i < n {
                dst[i] = src[i].to_f32();
                i += 1;
            }
            _mm_sfence();
        }
    }
}
