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
use gradwire_tensor::WithDType;

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
    fn validate(&self) -> Result<()> {
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
    H::to_f32_slice(src, dst)?;
    Ok(())
}
