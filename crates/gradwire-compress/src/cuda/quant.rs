//! The quantizers of [`crate::quant`] on CUDA device buffers: a
//! [`Quantizer`] encodes an f32 storage into a [`DeviceBytes`] payload and
//! decodes (or decode-adds) one back, with the CPU's checks and errors and
//! bitwise its results: the same payload bytes for the same entries and
//! stream, the same decoded values.
//!
//! They compose the launchers of [`super::kernels::quant`]
//! (and `select::first_non_finite`, which refuses NaN and infinities at the
//! index the CPU reports). Decoding checks the whole payload before it
//! writes anything (the CPU has written the chunks before a corrupt one by
//! the time it refuses it); the error is the CPU's own, found by decoding
//! the first corrupt chunk on the host. Decoding also checks the settings
//! ([`Quantizer::validate`]), as encoding does on both: the CPU's decode
//! takes any QSGD levels, and zero levels would decode to NaN.

use crate::cuda::kernels::quant as kernels;
use gradwire_tensor::CudaStorage;

pub use crate::cuda::kernels::quant::DeviceBytes;

use super::{DeviceSelectScratch, refuse_non_finite};
use crate::error::{CompressError, Result};
use crate::quant::{QUANT_CHUNK, Quantizer};

/// The draws' key for `stream` (QSGD's and E3M0's, as the CPU mixes the seed), `q`'s
/// settings checked first.
fn stream_key(q: &Quantizer, stream: u64) -> Result<u64> {
    q.validate()?;
    Ok(q.stream_key(stream))
}

/// Encodes `x` (f32) into a new payload of [`Quantizer::encoded_len`] bytes
/// on `x`'s device, as [`Quantizer::encode`] with `stream` does: settings
/// checked first, then NaN and infinities refused
/// ([`CompressError::NonFinite`] at the first such index).
pub fn quant_encode(q: &Quantizer, x: &CudaStorage, stream: u64) -> Result<DeviceBytes> {
    let key = stream_key(q, stream)?;
    refuse_non_finite(x, &mut DeviceSelectScratch::default())?;
    let mut payload = DeviceBytes::zeros(q.encoded_len(x.len()), x.ordinal())?;
    kernels::encode(*q, key, x, &mut payload)?;
    Ok(payload)
}

/// [`quant_encode`] into a payload the caller keeps, which must hold
/// exactly [`Quantizer::encoded_len`] bytes (else
/// [`CompressError::LengthMismatch`], as the CPU).
pub fn quant_encode_into(
    q: &Quantizer,
    x: &CudaStorage,
    stream: u64,
    payload: &mut DeviceBytes,
) -> Result<()> {
    let key = stream_key(q, stream)?;
    let expected = q.encoded_len(x.len());
    if payload.len() != expected {
        return Err(CompressError::LengthMismatch {
            op: "quantize",
            expected,
            got: payload.len(),
        });
    }
    refuse_non_finite(x, &mut DeviceSelectScratch::default())?;
    Ok(kernels::encode(*q, key, x, payload)?)
}

/// Decodes `payload` (of `out.len()` entries) into `out` (f32), as
/// [`Quantizer::decode`].
pub fn quant_decode(q: &Quantizer, payload: &DeviceBytes, out: &mut CudaStorage) -> Result<()> {
    decode_with(q, payload, out, false)
}

/// Decodes `payload` (of `acc.len()` entries) and adds it to `acc` (f32),
/// as [`Quantizer::decode_add`].
pub fn quant_decode_add(q: &Quantizer, payload: &DeviceBytes, acc: &mut CudaStorage) -> Result<()> {
    decode_with(q, payload, acc, true)
}

fn decode_with(
    q: &Quantizer,
    payload: &DeviceBytes,
    out: &mut CudaStorage,
    add: bool,
) -> Result<()> {
    q.validate()?;
    let n = out.len();
    let expected = q.encoded_len(n);
    if payload.len() != expected {
        return Err(CompressError::Corrupt(format!(
            "a quantized payload of {} bytes for {n} entries (expected {expected})",
            payload.len(),
        )));
    }
    match kernels::decode(*q, payload, out, add)? {
        None => Ok(()),
        Some(chunk) => Err(refusal(q, payload, n, chunk)?),
    }
}

/// The CPU's error for chunk `chunk` of `payload`, which the device's
/// check refused: the chunk decoded on the host, so the message is the
/// CPU's own.
fn refusal(q: &Quantizer, payload: &DeviceBytes, n: usize, chunk: usize) -> Result<CompressError> {
    let start = chunk * q.chunk_bytes();
    let end = (start + q.chunk_bytes()).min(payload.len());
    let bytes = payload.read(start..end)?;
    let entries = n.saturating_sub(chunk * QUANT_CHUNK).min(QUANT_CHUNK);
    let mut scratch = vec![0f32; entries];
    Ok(match q.decode(&bytes, &mut scratch) {
        Err(e) => e,
        Ok(()) => CompressError::Corrupt(format!(
            "chunk {chunk} of a quantized payload failed the device's check"
        )),
    })
}
