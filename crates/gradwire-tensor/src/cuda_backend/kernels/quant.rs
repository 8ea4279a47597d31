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

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, PushKernelArg};
use gradwire_kernels::quant as k;

use crate::cuda_backend::CudaStorage;
use crate::cuda_backend::driver::CudaDevice;
use crate::cuda_backend::launch::{
    MAX_GRID, blocks, download, driver_error, first_index_cell, grid_stride, launched, len_arg,
    out_of_bounds, read_first_index, require_f32, require_len, u32_arg, upload, zeros,
};
use crate::device::Device;
use crate::error::{Error, Result};

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
    /// 1..=127) and the chunk's largest magnitude; stochastic rounding from
    /// the counter-based hash of `key` and the entry's index.
    Qsgd {
        /// Levels per sign.
        levels: u8,
        /// The rounding's stream key (`mix(seed ^ mix(stream))`).
        key: u64,
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

/// Bytes in device memory: a quantized payload. CUDA cannot allocate zero
/// bytes, so an empty one holds a one-byte buffer; [`DeviceBytes::len`] is
/// the payload's length and the views cover exactly that.
#[derive(Debug)]
pub struct DeviceBytes {
    device: Arc<CudaDevice>,
    len: usize,
    data: CudaSlice<u8>,
}

impl DeviceBytes {
    /// `len` zero bytes on device `ordinal` ([`Error::CudaUnavailable`]
    /// without one).
    pub fn zeros(len: usize, ordinal: usize) -> Result<DeviceBytes> {
        let device = CudaDevice::get(ordinal)?;
        let data = zeros::<u8>(&device, len)?;
        Ok(DeviceBytes { device, len, data })
    }

    /// A device copy of `bytes` on device `ordinal`.
    pub fn from_host(bytes: &[u8], ordinal: usize) -> Result<DeviceBytes> {
        let device = CudaDevice::get(ordinal)?;
        let data = upload(&device, bytes)?;
        Ok(DeviceBytes {
            device,
            len: bytes.len(),
            data,
        })
    }

    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CUDA device ordinal holding the bytes.
    pub fn ordinal(&self) -> usize {
        self.device.ordinal()
    }

    /// The device holding the bytes.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The bytes, on the host (waits for the stream).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        download(&self.device, &self.data, self.len)
    }

    /// Bytes `range`, on the host (waits for the stream);
    /// [`Error::InvalidArgument`] for a range outside.
    pub fn read(&self, range: Range<usize>) -> Result<Vec<u8>> {
        if range.start > range.end || range.end > self.len {
            return Err(out_of_bounds("DeviceBytes::read", &range, self.len));
        }
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let view = self
            .data
            .try_slice(range.clone())
            .ok_or_else(|| out_of_bounds("DeviceBytes::read", &range, self.len))?;
        self.device
            .stream()
            .clone_dtoh(&view)
            .map_err(|e| driver_error("cuMemcpyDtoH", e))
    }

    /// The bytes as a device view, exactly [`DeviceBytes::len`] of them
    /// (for a transport that moves bytes). Work on it must be queued on
    /// the device's stream or ordered after it.
    pub fn view(&self) -> Result<CudaView<'_, u8>> {
        self.data
            .try_slice(..self.len)
            .ok_or_else(|| Error::Cuda("a byte view larger than its buffer".into()))
    }

    /// The bytes as a writable device view, exactly [`DeviceBytes::len`].
    pub fn view_mut(&mut self) -> Result<CudaViewMut<'_, u8>> {
        let len = self.len;
        self.data
            .try_slice_mut(..len)
            .ok_or_else(|| Error::Cuda("a byte view larger than its buffer".into()))
    }
}

/// `payload` must live on `storage`'s device.
fn require_same_device(
    op: &'static str,
    storage: &CudaStorage,
    payload: &DeviceBytes,
) -> Result<()> {
    if storage.ordinal() == payload.ordinal() {
        Ok(())
    } else {
        Err(Error::DeviceMismatch {
            op,
            expected: Device::Cuda(storage.ordinal()),
            got: Device::Cuda(payload.ordinal()),
        })
    }
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
    let config = blocks(u32_arg("chunks", chunks.min(MAX_GRID as usize))?);
    let device = Arc::clone(x.device());
    let n_arg = len_arg(n)?;
    let view = x.bytes()?;
    let mut out = payload.view_mut()?;
    let stream = device.stream();
    match codec {
        QuantCodec::Sign => {
            let function = device.function(k::NAME, k::QUANT_SIGN_ENCODE_F32)?;
            let mut args = stream.launch_builder(&function);
            args.arg(&view).arg(&n_arg).arg(&mut out);
            #[allow(unsafe_code)]
            // SAFETY: quant_sign_encode_f32(const float* x, u64 n, u8*
            // payload): n f32 in, the encoded length of n entries out
            // (checked); BLOCK threads per block as the kernel requires.
            let result = unsafe { args.launch(config) };
            launched(k::QUANT_SIGN_ENCODE_F32, result)
        }
        QuantCodec::Qsgd { key, .. } => {
            let function = device.function(k::NAME, k::QUANT_QSGD_ENCODE_F32)?;
            let mut args = stream.launch_builder(&function);
            args.arg(&view)
                .arg(&n_arg)
                .arg(&levels)
                .arg(&key)
                .arg(&mut out);
            #[allow(unsafe_code)]
            // SAFETY: quant_qsgd_encode_f32(const float* x, u64 n, u32
            // levels, u64 key, u8* payload): n f32 in, the encoded length of
            // n entries out (checked), levels in 1..=127 (checked); BLOCK
            // threads per block as the kernel requires.
            let result = unsafe { args.launch(config) };
            launched(k::QUANT_QSGD_ENCODE_F32, result)
        }
        QuantCodec::MinMaxU8 => {
            let function = device.function(k::NAME, k::QUANT_MINMAX_ENCODE_F32)?;
            let mut args = stream.launch_builder(&function);
            args.arg(&view).arg(&n_arg).arg(&mut out);
            #[allow(unsafe_code)]
            // SAFETY: quant_minmax_encode_f32(const float* x, u64 n, u8*
            // payload): n f32 in, the encoded length of n entries out
            // (checked); BLOCK threads per block as the kernel requires.
            let result = unsafe { args.launch(config) };
            launched(k::QUANT_MINMAX_ENCODE_F32, result)
        }
    }
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
    let device = Arc::clone(payload.device());
    let mut first = first_index_cell(&device)?;
    let n_arg = len_arg(n)?;
    let bytes = payload.view()?;
    let stream = device.stream();
    match codec {
        QuantCodec::Sign => {
            let function = device.function(k::NAME, k::QUANT_SIGN_CHECK)?;
            let mut args = stream.launch_builder(&function);
            args.arg(&bytes).arg(&n_arg).arg(&mut first);
            #[allow(unsafe_code)]
            // SAFETY: quant_sign_check(const u8* payload, u64 n, u64*
            // first_bad) reads the chunk headers of the encoded length of n
            // entries, which the payload holds (checked); one u64 cell.
            let result = unsafe { args.launch(grid_stride(chunks)) };
            launched(k::QUANT_SIGN_CHECK, result)?;
        }
        QuantCodec::Qsgd { .. } => {
            let function = device.function(k::NAME, k::QUANT_QSGD_CHECK)?;
            let mut args = stream.launch_builder(&function);
            args.arg(&bytes).arg(&n_arg).arg(&levels).arg(&mut first);
            #[allow(unsafe_code)]
            // SAFETY: quant_qsgd_check(const u8* payload, u64 n, u32 levels,
            // u64* first_bad) reads the encoded length of n entries, which
            // the payload holds (checked); one u64 cell.
            let result = unsafe { args.launch(grid_stride(n)) };
            launched(k::QUANT_QSGD_CHECK, result)?;
        }
        QuantCodec::MinMaxU8 => {
            let function = device.function(k::NAME, k::QUANT_MINMAX_CHECK)?;
            let mut args = stream.launch_builder(&function);
            args.arg(&bytes).arg(&n_arg).arg(&mut first);
            #[allow(unsafe_code)]
            // SAFETY: quant_minmax_check(const u8* payload, u64 n, u64*
            // first_bad) reads the chunk headers of the encoded length of n
            // entries, which the payload holds (checked); one u64 cell.
            let result = unsafe { args.launch(grid_stride(chunks)) };
            launched(k::QUANT_MINMAX_CHECK, result)?;
        }
    }
    read_first_index(&device, &first)
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
    let n_arg = len_arg(n)?;
    let add_arg = i32::from(add);
    let bytes = payload.view()?;
    let mut values = out.bytes_mut()?;
    let stream = device.stream();
    match codec {
        QuantCodec::Sign => {
            let function = device.function(k::NAME, k::QUANT_SIGN_DECODE_F32)?;
            let mut args = stream.launch_builder(&function);
            args.arg(&bytes).arg(&n_arg).arg(&mut values).arg(&add_arg);
            #[allow(unsafe_code)]
            // SAFETY: quant_sign_decode_f32(const u8* payload, u64 n, float*
            // out, int add): the encoded length of n entries in (checked),
            // n f32 out (checked dtype and length).
            let result = unsafe { args.launch(grid_stride(n)) };
            launched(k::QUANT_SIGN_DECODE_F32, result)?;
        }
        QuantCodec::Qsgd { .. } => {
            let function = device.function(k::NAME, k::QUANT_QSGD_DECODE_F32)?;
            let mut args = stream.launch_builder(&function);
            args.arg(&bytes)
                .arg(&n_arg)
                .arg(&levels)
                .arg(&mut values)
                .arg(&add_arg);
            #[allow(unsafe_code)]
            // SAFETY: quant_qsgd_decode_f32(const u8* payload, u64 n, u32
            // levels, float* out, int add): the encoded length of n entries
            // in (checked), n f32 out (checked), levels in 1..=127.
            let result = unsafe { args.launch(grid_stride(n)) };
            launched(k::QUANT_QSGD_DECODE_F32, result)?;
        }
        QuantCodec::MinMaxU8 => {
            let function = device.function(k::NAME, k::QUANT_MINMAX_DECODE_F32)?;
            let mut args = stream.launch_builder(&function);
            args.arg(&bytes).arg(&n_arg).arg(&mut values).arg(&add_arg);
            #[allow(unsafe_code)]
            // SAFETY: quant_minmax_decode_f32(const u8* payload, u64 n,
            // float* out, int add): the encoded length of n entries in
            // (checked), n f32 out (checked dtype and length).
            let result = unsafe { args.launch(grid_stride(n)) };
            launched(k::QUANT_MINMAX_DECODE_F32, result)?;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_chunking() {
        let codecs = [
            QuantCodec::Sign,
            QuantCodec::Qsgd { levels: 7, key: 1 },
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
        assert!(QuantCodec::Qsgd { levels: 0, key: 0 }.levels().is_err());
        assert!(
            QuantCodec::Qsgd {
                levels: 128,
                key: 0
            }
            .levels()
            .is_err()
        );
        assert_eq!(
            QuantCodec::Qsgd {
                levels: 127,
                key: 0
            }
            .levels()
            .ok(),
            Some(127)
        );
    }
}
