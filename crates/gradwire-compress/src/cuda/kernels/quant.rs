//! The quantizers of `kernels/cuda/quant.cu` on device buffers: 1-bit
//! scaled sign, QSGD, E3M0 and min-max uint8 ([`Quantizer`]), encoding f32
//! entries into a byte payload ([`DeviceBytes`]) and decoding (or
//! decode-adding) a payload back, bitwise as gradwire-compress's
//! `Quantizer::{encode, decode, decode_add}`: the same payload bytes, in
//! the same layout (chunks of [`QUANT_CHUNK`] entries), the same decoded
//! values.
//!
//! [`encode`] takes finite input (callers refuse NaN and infinities first
//! with [`super::select::first_non_finite`], as the CPU does); [`decode`]
//! checks the payload's scales and levels before it writes anything and
//! reports the first chunk the CPU would refuse.

use std::ops::Range;
use std::sync::Arc;

use gradwire_kernels::{plan, quant as k};

use crate::QsgdNorm;
use crate::quant::{QUANT_CHUNK, Quantizer};
use gradwire_tensor::cuda_backend::launch::{
    Blocks, Launch, require_f32, require_len, require_ordinal,
};
use gradwire_tensor::cuda_backend::{CudaDevice, DeviceVec, first_index_cell, read_first_index};
use gradwire_tensor::{CudaStorage, Error, Result};

/// QSGD's levels as the kernels take them (0 for the others), the
/// settings checked as the CPU checks them.
fn levels(q: Quantizer) -> Result<u32> {
    q.validate()
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    Ok(match q {
        Quantizer::Qsgd { levels, .. } => u32::from(levels),
        Quantizer::Sign | Quantizer::E3m0 { .. } | Quantizer::MinMaxU8 => 0,
    })
}

/// Bytes in device memory: a quantized payload.
#[derive(Debug)]
pub struct DeviceBytes {
    data: DeviceVec<u8>,
}

impl DeviceBytes {
    /// `len` zero bytes on device `ordinal` ([`Error::CudaUnavailable`]
    /// without one).
    pub fn zeros(len: usize, ordinal: usize) -> Result<DeviceBytes> {
        let device = CudaDevice::get(ordinal)?;
        Ok(DeviceBytes {
            data: DeviceVec::zeros(&device, len)?,
        })
    }

    /// A device copy of `bytes` on device `ordinal`.
    pub fn from_host(bytes: &[u8], ordinal: usize) -> Result<DeviceBytes> {
        let device = CudaDevice::get(ordinal)?;
        Ok(DeviceBytes {
            data: DeviceVec::from_host(&device, bytes)?,
        })
    }

    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The CUDA device ordinal holding the bytes.
    pub fn ordinal(&self) -> usize {
        self.data.ordinal()
    }

    /// The device holding the bytes.
    pub fn device(&self) -> &Arc<CudaDevice> {
        self.data.device()
    }

    /// The bytes, on the host (waits for the stream).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        self.data.to_host()
    }

    /// Bytes `range`, on the host (waits for the stream);
    /// [`Error::InvalidArgument`] for a range outside.
    pub fn read(&self, range: Range<usize>) -> Result<Vec<u8>> {
        self.data.read(range)
    }
}

/// `payload` must live on `storage`'s device.
fn require_same_device(
    op: &'static str,
    storage: &CudaStorage,
    payload: &DeviceBytes,
) -> Result<()> {
    require_ordinal(op, storage.ordinal(), payload.ordinal())
}

/// Encodes `x` (f32, finite: callers check with
/// [`super::select::first_non_finite`]) with `q` (QSGD's draws from the
/// stream key `key`) into `payload`, which must hold exactly
/// `q.encoded_len(x.len())` bytes: bitwise gradwire-compress's
/// `Quantizer::encode` (the scales summed, maximised and folded in the
/// CPU's order, QSGD's draws from the same hash).
pub fn encode(q: Quantizer, key: u64, x: &CudaStorage, payload: &mut DeviceBytes) -> Result<()> {
    const OP: &str = "quant_encode";
    require_f32(OP, x)?;
    require_same_device(OP, x, payload)?;
    let n = x.len();
    require_len(OP, q.encoded_len(n), payload.len())?;
    let levels = levels(q)?;
    if n == 0 {
        return Ok(());
    }
    let grid = plan::quant_encode(n.div_ceil(QUANT_CHUNK));
    let device = x.device();
    let launch = match q {
        Quantizer::Sign => Launch::new(device, &k::QUANT_SIGN_ENCODE_F32)
            .read(x)
            .len(n),
        Quantizer::Qsgd { norm, .. } => Launch::new(device, &k::QUANT_QSGD_ENCODE_F32)
            .read(x)
            .len(n)
            .value(levels)
            .value(u32::from(norm == QsgdNorm::Max))
            .value(key),
        Quantizer::E3m0 { .. } => Launch::new(device, &k::QUANT_E3M0_ENCODE_F32)
            .read(x)
            .len(n)
            .value(key),
        Quantizer::MinMaxU8 => Launch::new(device, &k::QUANT_MINMAX_ENCODE_F32)
            .read(x)
            .len(n),
    };
    launch.write(&mut payload.data).run(grid)
}

/// The smallest chunk of `payload` (the encoding of `n` entries) that
/// gradwire-compress's `Quantizer::decode` refuses: a non-finite scale, a
/// negative E3M0 scale, a minimum above its maximum, a QSGD level beyond
/// `levels`, E3M0's negative zero, a set padding nibble. `None` when every
/// chunk is sound (waits for the stream).
fn first_corrupt_chunk(q: Quantizer, payload: &DeviceBytes, n: usize) -> Result<Option<usize>> {
    let levels = levels(q)?;
    let chunks = n.div_ceil(QUANT_CHUNK);
    let device = payload.device();
    let mut first = first_index_cell(device)?;
    let (launch, blocks) = match q {
        Quantizer::Sign => (
            Launch::new(device, &k::QUANT_SIGN_CHECK)
                .read(&payload.data)
                .len(n),
            chunks,
        ),
        Quantizer::Qsgd { .. } => (
            Launch::new(device, &k::QUANT_QSGD_CHECK)
                .read(&payload.data)
                .len(n)
                .value(levels),
            n,
        ),
        Quantizer::E3m0 { .. } => (
            Launch::new(device, &k::QUANT_E3M0_CHECK)
                .read(&payload.data)
                .len(n),
            n,
        ),
        Quantizer::MinMaxU8 => (
            Launch::new(device, &k::QUANT_MINMAX_CHECK)
                .read(&payload.data)
                .len(n),
            chunks,
        ),
    };
    launch.write(&mut first).run(Blocks::Over(blocks))?;
    read_first_index(&first)
}

/// Decodes `payload` into `out` (f32; its length is the number of entries,
/// and the payload must hold exactly their encoded length), or adds the
/// decoded values to it with `add`: bitwise gradwire-compress's
/// `Quantizer::decode` / `decode_add`.
///
/// The payload is checked first, as the CPU checks it: `Some(chunk)` is
/// the first chunk the CPU refuses (a non-finite or negative scale, a
/// minimum above its maximum, a level beyond the setting, E3M0's negative
/// zero, a set padding nibble), and then nothing was written.
pub fn decode(
    q: Quantizer,
    payload: &DeviceBytes,
    out: &mut CudaStorage,
    add: bool,
) -> Result<Option<usize>> {
    const OP: &str = "quant_decode";
    require_f32(OP, out)?;
    require_same_device(OP, out, payload)?;
    let n = out.len();
    require_len(OP, q.encoded_len(n), payload.len())?;
    let levels = levels(q)?;
    if n == 0 {
        return Ok(None);
    }
    if let Some(chunk) = first_corrupt_chunk(q, payload, n)? {
        return Ok(Some(chunk));
    }
    let device = Arc::clone(out.device());
    let launch = match q {
        Quantizer::Sign => Launch::new(&device, &k::QUANT_SIGN_DECODE_F32)
            .read(&payload.data)
            .len(n),
        Quantizer::Qsgd { .. } => Launch::new(&device, &k::QUANT_QSGD_DECODE_F32)
            .read(&payload.data)
            .len(n)
            .value(levels),
        Quantizer::E3m0 { .. } => Launch::new(&device, &k::QUANT_E3M0_DECODE_F32)
            .read(&payload.data)
            .len(n),
        Quantizer::MinMaxU8 => Launch::new(&device, &k::QUANT_MINMAX_DECODE_F32)
            .read(&payload.data)
            .len(n),
    };
    launch
        .write(out)
        .value(i32::from(add))
        .run(Blocks::Over(n))?;
    Ok(None)
}
