//! The sparse wire format: a [`SparseVec`] as bytes, and a validated,
//! zero-copy view of such bytes.
//!
//! SINGA's sparse all-reduce exchanged raw `(index, value)` arrays whose
//! count was computed wrongly, so receivers summed stale tail entries,
//! duplicates and out-of-range pairs. Here a payload carries
//! its own header, and [`decode`] checks *everything* (length, magic,
//! version, codec, dtype, ranges, exact size, every index in range and
//! strictly increasing) before a single value can be read: a [`Payload`]
//! exists only for bytes that passed, and a corrupt payload is
//! [`CompressError::Corrupt`] with the reason, never applied, never a panic.
//!
//! # Layout
//!
//! All integers are little-endian; `n` is the count.
//!
//! | offset        | size           | field                                           |
//! |---------------|----------------|-------------------------------------------------|
//! | 0             | 4              | magic `b"GWSP"`                                 |
//! | 4             | 1              | format version, [`WIRE_VERSION`] (= 1)          |
//! | 5             | 1              | codec id, [`CodecId`] (1..=4)                   |
//! | 6             | 1              | value dtype: 0 = f32, 1 = f16, 2 = bf16         |
//! | 7             | 1              | reserved, must be 0                             |
//! | 8             | 8              | dense length `d`, u64, at most `u32::MAX + 1`   |
//! | 16            | 8              | count `n`, u64, at most `d`                     |
//! | 24            | `4 n`          | indices, u32, strictly increasing, each `< d`   |
//! | 24 + 4 n      | `s n`          | values: f32, or f16 / bf16 bit patterns as u16  |
//!
//! `s` is the value size (4 for f32, 2 for f16 and bf16); the payload is
//! exactly `24 + n (4 + s)` bytes ([`encoded_len`]), no more, no less.
//!
//! # Values
//!
//! Values narrowed to f16 or bf16 by [`encode`] round to nearest, ties to
//! even; reading widens them exactly. A NaN or infinite value is *not* a
//! decoding error: values are data, the format only guarantees where they
//! go. The codecs never produce non-finite values (they refuse such input
//! with [`CompressError::NonFinite`]); a receiver that does not trust its
//! peers may check [`Payload::values_f32`] itself.
//!
//! ```
//! use gradwire_compress::{CompressError, SparseVec};
//! use gradwire_compress::wire::{self, CodecId};
//! use gradwire_tensor::DType;
//!
//! # fn main() -> gradwire_compress::Result<()> {
//! let sparse = SparseVec::new(6, vec![1, 4], vec![0.5, -2.0])?;
//! let bytes = wire::encode(&sparse, CodecId::TopK, DType::F16);
//! assert_eq!(bytes.len(), wire::encoded_len(2, DType::F16));
//!
//! let mut dense = vec![1.0f32; 6];
//! wire::scatter_add(&bytes, &mut dense)?;
//! assert_eq!(dense, [1.0, 1.5, 1.0, 1.0, -1.0, 1.0]);
//!
//! // A payload cut short is refused, and nothing is written.
//! let cut = wire::scatter_add(&bytes[..bytes.len() - 1], &mut dense);
//! assert!(matches!(cut, Err(CompressError::Corrupt(_))), "{cut:?}");
//! assert_eq!(dense, [1.0, 1.5, 1.0, 1.0, -1.0, 1.0]);
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

use std::fmt;

use gradwire_tensor::DType;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::error::{CompressError, Result};
use crate::sparse::SparseVec;

/// The format version this build writes and the only one it reads.
pub const WIRE_VERSION: u8 = 1;

/// Length of the fixed header in bytes.
pub const HEADER_LEN: usize = 24;

/// The four magic bytes every payload starts with.
const MAGIC: [u8; 4] = *b"GWSP";

/// Largest dense length: indices are u32.
const MAX_DENSE_LEN: u64 = u32::MAX as u64 + 1;

/// Values narrowed per block on the stack while encoding f16 / bf16.
const NARROW_BLOCK: usize = 1024;

/// Which codec produced a payload (byte 5 of the header).
///
/// Informational for the receiver (statistics, logs): every codec's payload
/// is applied the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum CodecId {
    /// Keeps the entries whose magnitude reaches a threshold.
    Threshold = 1,
    /// Keeps the k entries of largest magnitude.
    TopK = 2,
    /// Top-k with the threshold estimated from a sample.
    SampledTopK = 3,
    /// Keeps k entries chosen at random.
    RandomK = 4,
}

impl CodecId {
    /// Every codec id, in numeric order.
    pub const ALL: [CodecId; 4] = [
        CodecId::Threshold,
        CodecId::TopK,
        CodecId::SampledTopK,
        CodecId::RandomK,
    ];

    /// The canonical lower-case name: `"threshold"`, `"topk"`,
    /// `"sampled_topk"` or `"randomk"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CodecId::Threshold => "threshold",
            CodecId::TopK => "topk",
            CodecId::SampledTopK => "sampled_topk",
            CodecId::RandomK => "randomk",
        }
    }
}

impl fmt::Display for CodecId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<u8> for CodecId {
    type Error = CompressError;

    /// The codec with this wire id, or [`CompressError::Corrupt`].
    fn try_from(id: u8) -> Result<CodecId> {
        match id {
            1 => Ok(CodecId::Threshold),
            2 => Ok(CodecId::TopK),
            3 => Ok(CodecId::SampledTopK),
            4 => Ok(CodecId::RandomK),
            _ => Err(corrupt(format!("unknown codec id {id}"))),
        }
    }
}

/// The wire code of a value dtype (byte 6 of the header).
const fn dtype_code(dtype: DType) -> u8 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
    }
}

/// The value dtype of a wire code, if known.
const fn dtype_from_code(code: u8) -> Option<DType> {
    match code {
        0 => Some(DType::F32),
        1 => Some(DType::F16),
        2 => Some(DType::BF16),
        _ => None,
    }
}

fn corrupt(reason: String) -> CompressError {
    CompressError::Corrupt(reason)
}

/// Bytes of a payload of `count` entries with values in `value_dtype`:
/// `24 + count * (4 + size)`. Saturates at `usize::MAX` for counts no
/// payload can have.
pub fn encoded_len(count: usize, value_dtype: DType) -> usize {
    count
        .saturating_mul(4 + value_dtype.size_in_bytes())
        .saturating_add(HEADER_LEN)
}

/// Whether sending `count` of `n` entries sparsely would take more bytes
/// than sending all `n` densely in `value_dtype`: `true` when
/// `24 + count * (4 + size) > n * size`, and then the caller sends dense.
/// Equal sizes give `false` (sparse is kept). Exact for every input.
pub fn should_send_dense(count: usize, n: usize, value_dtype: DType) -> bool {
    let size = value_dtype.size_in_bytes() as u128;
    let sparse = HEADER_LEN as u128 + count as u128 * (4 + size);
    let dense = n as u128 * size;
    sparse > dense
}

/// Encodes `sparse` as a new payload; see [`encode_into`].
pub fn encode(sparse: &SparseVec, codec: CodecId, value_dtype: DType) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(sparse, codec, value_dtype, &mut out);
    out
}

/// Encodes `sparse` into `out`, which is cleared first (its allocation is
/// reused): the header, the indices, then the values narrowed to
/// `value_dtype` (round to nearest, ties to even). Cannot fail: a
/// [`SparseVec`]'s invariants are exactly what the format requires.
pub fn encode_into(sparse: &SparseVec, codec: CodecId, value_dtype: DType, out: &mut Vec<u8>) {
    let indices = sparse.indices();
    let values = sparse.values();
    out.clear();
    out.reserve(encoded_len(indices.len(), value_dtype));

    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[WIRE_VERSION, codec as u8, dtype_code(value_dtype), 0]);
    out.extend_from_slice(&(sparse.dense_len() as u64).to_le_bytes());
    out.extend_from_slice(&(indices.len() as u64).to_le_bytes());

    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice::<u32, u8>(indices));
    } else {
        for &i in indices {
            out.extend_from_slice(&i.to_le_bytes());
        }
    }

    match value_dtype {
        DType::F32 => {
            if cfg!(target_endian = "little") {
                out.extend_from_slice(bytemuck::cast_slice::<f32, u8>(values));
            } else {
                for &v in values {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        DType::F16 => {
            let mut block = [f16::ZERO; NARROW_BLOCK];
            for chunk in values.chunks(NARROW_BLOCK) {
                if let Some(narrow) = block.get_mut(..chunk.len()) {
                    narrow.convert_from_f32_slice(chunk);
                    extend_u16(out, bytemuck::cast_slice::<f16, u16>(narrow));
                }
            }
        }
        DType::BF16 => {
            let mut block = [bf16::ZERO; NARROW_BLOCK];
            for chunk in values.chunks(NARROW_BLOCK) {
                for (b, &v) in block.iter_mut().zip(chunk) {
                    *b = bf16::from_f32(v);
                }
                if let Some(narrow) = block.get(..chunk.len()) {
                    extend_u16(out, bytemuck::cast_slice::<bf16, u16>(narrow));
                }
            }
        }
    }
}

/// Appends u16s little-endian: one copy on little-endian targets.
fn extend_u16(out: &mut Vec<u8>, bits: &[u16]) {
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice::<u16, u8>(bits));
    } else {
        for &b in bits {
            out.extend_from_slice(&b.to_le_bytes());
        }
    }
}

/// Validates `bytes` as a payload; see [`Payload::decode`].
pub fn decode(bytes: &[u8]) -> Result<Payload<'_>> {
    Payload::decode(bytes)
}

/// Validates `payload` and adds it into `dense` ([`Payload::scatter_add`]).
/// A corrupt payload, or a `dense` of the wrong length, writes nothing.
pub fn scatter_add(payload: &[u8], dense: &mut [f32]) -> Result<()> {
    Payload::decode(payload)?.scatter_add(dense)
}

/// A validated payload: a zero-copy view of bytes that passed every check
/// of [`Payload::decode`], so its indices are known to be strictly
/// increasing and below [`Payload::dense_len`].
#[derive(Clone, Copy)]
pub struct Payload<'a> {
    bytes: &'a [u8],
    codec: CodecId,
    value_dtype: DType,
    dense_len: usize,
    count: usize,
    /// `4 * count` bytes of u32 indices.
    indices: &'a [u8],
    /// `size * count` bytes of values.
    values: &'a [u8],
}

impl fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Payload")
            .field("codec", &self.codec)
            .field("value_dtype", &self.value_dtype)
            .field("dense_len", &self.dense_len)
            .field("count", &self.count)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// Reads the little-endian u64 at `at`, if the bytes are there.
fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

impl<'a> Payload<'a> {
    /// Validates everything before returning: the length covers the header;
    /// magic, version, codec id, value dtype and the reserved byte are
    /// right; the dense length is at most `u32::MAX + 1` and fits `usize`;
    /// the count is at most the dense length; the total length is exactly
    /// [`encoded_len`]; every index is below the dense length and the
    /// indices strictly increase (so none repeats). Any failure is
    /// [`CompressError::Corrupt`] naming it. Values are not checked (see the
    /// module docs).
    pub fn decode(bytes: &'a [u8]) -> Result<Payload<'a>> {
        let header = match bytes.get(..HEADER_LEN) {
            Some(h) => h,
            None => {
                return Err(corrupt(format!(
                    "payload of {} bytes is shorter than the {HEADER_LEN}-byte header",
                    bytes.len()
                )));
            }
        };
        if header.get(..4) != Some(&MAGIC[..]) {
            return Err(corrupt(format!(
                "bad magic {:02x?}, expected {:02x?} (\"GWSP\")",
                header.get(..4).unwrap_or_default(),
                MAGIC
            )));
        }
        let byte = |at: usize| header.get(at).copied().unwrap_or_default();
        let version = byte(4);
        if version != WIRE_VERSION {
            return Err(corrupt(format!(
                "unsupported format version {version} (this build reads {WIRE_VERSION})"
            )));
        }
        let codec = CodecId::try_from(byte(5))?;
        let dtype_byte = byte(6);
        let value_dtype = dtype_from_code(dtype_byte)
            .ok_or_else(|| corrupt(format!("unknown value dtype code {dtype_byte}")))?;
        let reserved = byte(7);
        if reserved != 0 {
            return Err(corrupt(format!("reserved byte is {reserved}, must be 0")));
        }
        let (Some(dense_len), Some(count)) = (read_u64(header, 8), read_u64(header, 16)) else {
            return Err(corrupt("truncated header".to_string()));
        };
        if dense_len > MAX_DENSE_LEN {
            return Err(corrupt(format!(
                "dense length {dense_len} exceeds {MAX_DENSE_LEN}, the u32 index range"
            )));
        }
        let Ok(dense_len) = usize::try_from(dense_len) else {
            return Err(corrupt(format!(
                "dense length {dense_len} does not fit usize"
            )));
        };
        if count > dense_len as u64 {
            return Err(corrupt(format!(
                "count {count} exceeds the dense length {dense_len}"
            )));
        }
        // count <= dense_len, which fits usize.
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        let size = value_dtype.size_in_bytes();
        let index_bytes = count.checked_mul(4);
        let value_bytes = count.checked_mul(size);
        let expected = index_bytes
            .zip(value_bytes)
            .and_then(|(i, v)| i.checked_add(v))
            .and_then(|body| body.checked_add(HEADER_LEN));
        let (Some(index_bytes), Some(expected)) = (index_bytes, expected) else {
            return Err(corrupt(format!(
                "count {count} of {} values overflows the address space",
                value_dtype.as_str()
            )));
        };
        if bytes.len() != expected {
            return Err(corrupt(format!(
                "payload is {} bytes, expected exactly {expected} for {count} {} entries",
                bytes.len(),
                value_dtype.as_str()
            )));
        }
        let body = bytes.get(HEADER_LEN..).unwrap_or_default();
        let (indices, values) = body.split_at_checked(index_bytes).unwrap_or_default();
        check_indices(indices, dense_len)?;
        Ok(Payload {
            bytes,
            codec,
            value_dtype,
            dense_len,
            count,
            indices,
            values,
        })
    }

    /// The codec that produced the payload.
    pub fn codec(&self) -> CodecId {
        self.codec
    }

    /// The dtype the values travel in.
    pub fn value_dtype(&self) -> DType {
        self.value_dtype
    }

    /// Length of the dense vector the payload selects from.
    pub fn dense_len(&self) -> usize {
        self.dense_len
    }

    /// Number of (index, value) entries.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The whole payload, header included.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The indices, strictly increasing and below [`Payload::dense_len`].
    pub fn indices(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        let (chunks, _) = self.indices.as_chunks::<4>();
        chunks.iter().map(|&c| u32::from_le_bytes(c))
    }

    /// The values widened to f32 (exactly, from f16 or bf16).
    pub fn values_f32(&self) -> impl ExactSizeIterator<Item = f32> + '_ {
        let dtype = self.value_dtype;
        self.values
            .chunks_exact(dtype.size_in_bytes())
            .map(move |c| match (dtype, c) {
                (DType::F32, &[a, b, c, d]) => f32::from_le_bytes([a, b, c, d]),
                (DType::F16, &[a, b]) => f16::from_bits(u16::from_le_bytes([a, b])).to_f32(),
                (DType::BF16, &[a, b]) => bf16::from_bits(u16::from_le_bytes([a, b])).to_f32(),
                // Unreachable: chunks have the dtype's size.
                _ => 0.0,
            })
    }

    /// Copies the payload out as a [`SparseVec`] (values widened to f32).
    pub fn to_sparse(&self) -> SparseVec {
        SparseVec::from_parts_unchecked(
            self.dense_len,
            self.indices().collect(),
            self.values_f32().collect(),
        )
    }

    /// `dense[index[i]] += value[i]` for every entry: the receiver side of a
    /// sparse all-reduce. `dense` must have [`Payload::dense_len`] elements,
    /// else [`CompressError::LengthMismatch`] and nothing is written.
    pub fn scatter_add(&self, dense: &mut [f32]) -> Result<()> {
        if dense.len() != self.dense_len {
            return Err(CompressError::LengthMismatch {
                op: "wire::scatter_add",
                expected: self.dense_len,
                got: dense.len(),
            });
        }
        let (indices, _) = self.indices.as_chunks::<4>();
        match self.value_dtype {
            DType::F32 => scatter::<4>(indices, self.values, dense, f32::from_le_bytes),
            DType::F16 => scatter::<2>(indices, self.values, dense, |b| {
                f16::from_bits(u16::from_le_bytes(b)).to_f32()
            }),
            DType::BF16 => scatter::<2>(indices, self.values, dense, |b| {
                bf16::from_bits(u16::from_le_bytes(b)).to_f32()
            }),
        }
        Ok(())
    }
}

/// The hot loop of [`Payload::scatter_add`], monomorphised per value size.
#[inline]
fn scatter<const N: usize>(
    indices: &[[u8; 4]],
    values: &[u8],
    dense: &mut [f32],
    widen: impl Fn([u8; N]) -> f32,
) {
    let (values, _) = values.as_chunks::<N>();
    for (&i, &v) in indices.iter().zip(values) {
        // In range: decode checked every index; `get_mut` keeps this
        // panic-free regardless.
        if let Some(d) = dense.get_mut(u32::from_le_bytes(i) as usize) {
            *d += widen(v);
        }
    }
}

/// Checks that the u32 indices in `bytes` strictly increase and stay below
/// `dense_len`: a branch-free pass, then a second one to name the culprit.
fn check_indices(bytes: &[u8], dense_len: usize) -> Result<()> {
    let (chunks, _) = bytes.as_chunks::<4>();
    let read = |c: &[u8; 4]| u32::from_le_bytes(*c);
    let increasing = chunks
        .iter()
        .zip(chunks.iter().skip(1))
        .fold(true, |ok, (a, b)| ok & (read(a) < read(b)));
    // Strictly increasing, so the last index is the largest.
    let in_range = chunks
        .last()
        .is_none_or(|c| (read(c) as u64) < dense_len as u64);
    if increasing && in_range {
        return Ok(());
    }
    let mut prev = 0u32;
    for (pos, c) in chunks.iter().enumerate() {
        let i = read(c);
        if i as u64 >= dense_len as u64 {
            return Err(corrupt(format!(
                "index {i} at position {pos} is out of range for a dense length of {dense_len}"
            )));
        }
        if pos > 0 && i <= prev {
            return Err(corrupt(format!(
                "index {i} at position {pos} follows {prev}: indices must strictly increase"
            )));
        }
        prev = i;
    }
    // Not reached: the fast pass failed, so the slow one returns above.
    Err(corrupt(
        "indices out of range or not strictly increasing".to_string(),
    ))
}

#[cfg(test)]
mod tests;
