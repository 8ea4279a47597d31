//! The quantizers of `kernels/cuda/quant.cu` on device buffers: 1-bit
//! scaled sign, QSGD and min-max uint8 ([`QuantCodec`]), encoding f32
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

use gradwire_kernels::quant as k;

use crate::QsgdNorm;
use gradwire_tensor::cuda_backend::launch::{
    Blocks, Launch, MAX_GRID, require_f32, require_len, require_ordinal, u32_arg,
};
use gradwire_tensor::cuda_backend::{CudaDevice, DeviceVec, first_index_cell, read_first_index};
use gradwire_tensor::{CudaStorage, Error, Result};

/// Entries per chunk (gradwire-compress's `QUANT_CHUNK`, `GW_QUANT_CHUNK`
/// in `quant.cu`): each chunk has its own scale.
pub const QUANT_CHUNK: usize = 512;

/// Which quantizer a kernel runs: gradwire-compress's `Quantizer`, with
/// QSGD's seed already mixed with the caller's stream into `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantCodec {
    /// One sign bit per entry and the chunk's mean magnitude.
    Sign,
    /// QSGD: an `i8` level in `-levels..=levels` per entry (`levels` in
    /// 1..=127) and the chunk's scale (its 2-norm or largest magnitude,
    /// `norm`); stochastic rounding from the counter-based hash of `key`
    /// and the entry's index.
    Qsgd {
        /// Levels per sign.
        levels: u8,
        /// The rounding's stream key (`mix(seed ^ mix(stream))`).
        key: u64,
        /// The norm each chunk is scaled by.
        norm: QsgdNorm,
    },
    /// A `u8` step between the chunk's minimum and maximum.
    MinMaxU8,
}

impl QuantCodec {
    /// The bytes of a chunk's header (its scales).
    pub fn header_bytes(self) -> usize {
        match self {
            QuantCodec::Sign | QuantCodec::Qsgd { .. } => 4,
            QuantCodec::MinMaxU8 => 8,
        }
    }

    /// The bytes of a whole chunk of [`QUANT_CHUNK`] entries: header and
    /// codes (chunk `c` of a payload starts at `c` times this).
    pub fn chunk_bytes(self) -> usize {
        match self {
            QuantCodec::Sign => 4 + QUANT_CHUNK / 8,
            QuantCodec::Qsgd { .. } => 4 + QUANT_CHUNK,
            QuantCodec::MinMaxU8 => 8 + QUANT_CHUNK,
        }
    }

    /// The payload bytes of `n` entries (gradwire-compress's
    /// `Quantizer::encoded_len`).
    pub fn encoded_len(self, n: usize) -> usize {
        let chunks = n.div_ceil(QUANT_CHUNK);
        match self {
            QuantCodec::Sign => 4 * chunks + n.div_ceil(8),
            QuantCodec::Qsgd { .. } => 4 * chunks + n,
            QuantCodec::MinMaxU8 => 8 * chunks + n,
        }
    }

    /// QSGD's levels as the kernels take them, checked to lie in 1..=127
    /// (0 for the others).
    fn levels(self) -> Result<u32> {
        match self {
            QuantCodec::Qsgd { levels, .. } if !(1..=127).contains(&levels) => Err(
                Error::InvalidArgument(format!("QSGD's levels must be 1 to 127, got {levels}")),
            ),
            QuantCodec::Qsgd { levels, .. } => Ok(u32::from(levels)),
            QuantCodec::Sign | QuantCodec::MinMaxU8 => Ok(0),
        }
    }
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
/// [`super::select::first_non_finite`]) into `payload`, which must hold
/// exactly `codec.encoded_len(x.len())` bytes: bitwise gradwire-compress's
/// `Quantizer::encode` (the scales summed, maximised and folded in the
/// CPU's order, QSGD's draws from the same hash).
pub fn encode(codec: QuantCodec, x: &CudaStorage, payload: &mut DeviceBytes) -> Result<()> {
    const OP: &str = "quant_encode";
    require_f32(OP, x)?;
    require_same_device(OP, x, payload)?;
    let n = x.len();
    require_len(OP, codec.encoded_len(n), payload.len())?;
    let levels = codec.levels()?;
    if n == 0 {
        return Ok(());
    }
    let chunks = n.div_ceil(QUANT_CHUNK);
    let grid = Blocks::Exactly(u32_arg("chunks", chunks.min(MAX_GRID as usize))?, 1);
    let device = x.device();
    let launch = match codec {
        QuantCodec::Sign => Launch::new(device, &k::QUANT_SIGN_ENCODE_F32)
            .read(x)
            .len(n),
        QuantCodec::Qsgd { key, norm, .. } => Launch::new(device, &k::QUANT_QSGD_ENCODE_F32)
            .read(x)
            .len(n)
            .value(levels)
            .value(u32::from(norm == QsgdNorm::Max))
            .value(key),
        QuantCodec::MinMaxU8 => Launch::new(device, &k::QUANT_MINMAX_ENCODE_F32)
            .read(x)
            .len(n),
    };
    launch.write(&mut payload.data).run(grid)
}

/// The smallest chunk of `payload` (the encoding of `n` entries) that
/// gradwire-compress's `Quantizer::decode` refuses: a non-finite scale, a
/// minimum above its maximum, a QSGD level beyond `levels`. `None` when
/// every chunk is sound (waits for the stream).
fn first_corrupt_chunk(
    codec: QuantCodec,
    payload: &DeviceBytes,
    n: usize,
) -> Result<Option<usize>> {
    let levels = codec.levels()?;
    let chunks = n.div_ceil(QUANT_CHUNK);
    let device = payload.device();
    let mut first = first_index_cell(device)?;
    let (launch, blocks) = match codec {
        QuantCodec::Sign => (
            Launch::new(device, &k::QUANT_SIGN_CHECK)
                .read(&payload.data)
                .len(n),
            chunks,
        ),
        QuantCodec::Qsgd { .. } => (
            Launch::new(device, &k::QUANT_QSGD_CHECK)
                .read(&payload.data)
                .len(n)
                .value(levels),
            n,
        ),
        QuantCodec::MinMaxU8 => (
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
/// the first chunk the CPU refuses (a non-finite scale, a minimum above
/// the maximum, a QSGD level beyond `levels`), and then nothing was
/// written.
pub fn decode(
    codec: QuantCodec,
    payload: &DeviceBytes,
    out: &mut CudaStorage,
    add: bool,
) -> Result<Option<usize>> {
    const OP: &str = "quant_decode";
    require_f32(OP, out)?;
    require_same_device(OP, out, payload)?;
    let n = out.len();
    require_len(OP, codec.encoded_len(n), payload.len())?;
    let levels = codec.levels()?;
    if n == 0 {
        return Ok(None);
    }
    if let Some(chunk) = first_corrupt_chunk(codec, payload, n)? {
        return Ok(Some(chunk));
    }
    let device = Arc::clone(out.device());
    let launch = match codec {
        QuantCodec::Sign => Launch::new(&device, &k::QUANT_SIGN_DECODE_F32)
            .read(&payload.data)
            .len(n),
        QuantCodec::Qsgd { .. } => Launch::new(&device, &k::QUANT_QSGD_DECODE_F32)
            .read(&payload.data)
            .len(n)
            .value(levels),
        QuantCodec::MinMaxU8 => Launch::new(&device, &k::QUANT_MINMAX_DECODE_F32)
            .read(&payload.data)
            .len(n),
    };
    launch
        .write(out)
        .value(i32::from(add))
        .run(Blocks::Over(n))?;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_chunking() {
        let codecs = [
            QuantCodec::Sign,
            QuantCodec::Qsgd {
                levels: 7,
                key: 1,
                norm: QsgdNorm::L2,
            },
            QuantCodec::MinMaxU8,
        ];
        for codec in codecs {
            assert_eq!(codec.encoded_len(0), 0);
            assert_eq!(codec.encoded_len(QUANT_CHUNK), codec.chunk_bytes());
            assert_eq!(
                codec.encoded_len(3 * QUANT_CHUNK + 1),
                3 * codec.chunk_bytes() + codec.header_bytes() + 1
            );
        }
        for levels in [0, 128] {
            let result = QuantCodec::Qsgd {
                levels,
                key: 0,
                norm: QsgdNorm::L2,
            }
            .levels();
            assert!(
                matches!(&result, Err(Error::InvalidArgument(m)) if m.contains("levels")),
                "{levels}: {result:?}"
            );
        }
        assert_eq!(
            QuantCodec::Qsgd {
                levels: 127,
                key: 0,
                norm: QsgdNorm::Max,
            }
            .levels()
            .ok(),
            Some(127)
        );
    }
}
