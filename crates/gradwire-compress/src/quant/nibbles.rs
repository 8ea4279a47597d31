//! The 4-bit codes of QSGD (up to 7 levels) and E3M0: two entries a byte,
//! entry `2j` in the low half of byte `j`; an odd chunk's last byte holds
//! one entry, its high half (the padding) zero, so a payload has one
//! spelling.

use super::QUANT_CHUNK;
use crate::error::{CompressError, Result};

/// Packs a chunk's codes (each in its low 4 bits) two to a byte. The codes
/// past the chunk's entries are zero: an odd chunk's padding half.
#[inline(always)]
pub(super) fn pack(codes: &[u8; QUANT_CHUNK], out: &mut [u8]) {
    for (o, pair) in out.iter_mut().zip(codes.chunks_exact(2)) {
        *o = (pair[0] & 0x0f) | (pair[1] << 4);
    }
}

/// Puts `value` of each entry's nibble into `out` with `put`.
#[inline(always)]
pub(super) fn decode(
    codes: &[u8],
    out: &mut [f32],
    value: impl Fn(u8) -> f32,
    put: impl Fn(&mut f32, f32),
) {
    for (pair, &b) in out.chunks_mut(2).zip(codes) {
        put(&mut pair[0], value(b & 0x0f));
        if let Some(o) = pair.get_mut(1) {
            put(o, value(b >> 4));
        }
    }
}

/// Refuses a set padding nibble: the high half of an odd chunk's last
/// byte, of a chunk of `entries` entries.
pub(super) fn check_padding(codes: &[u8], entries: usize, codec: &str) -> Result<()> {
    if entries % 2 == 1 && codes[entries / 2] >> 4 != 0 {
        return Err(padding_not_zero(codec));
    }
    Ok(())
}

/// A payload whose odd chunk's padding nibble is set.
pub(super) fn padding_not_zero(codec: &str) -> CompressError {
    CompressError::Corrupt(format!("a {codec} payload's padding nibble is not zero"))
}
