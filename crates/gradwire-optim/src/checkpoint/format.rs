//! The file's layout: the JSON header, the tensors' names, the checksum
//! over both, and the encoding of a checkpoint into a safetensors file.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use gradwire_tensor::{DType, bf16, f16};
use safetensors::tensor::{Dtype, View};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{CHECKPOINT_FORMAT, CHECKPOINT_VERSION, Checkpoint};
use crate::error::{OptimError, Result};
use crate::state::ParamState;

/// The first version with a checksum.
pub(super) const CHECKSUM_VERSION: u64 = 2;

/// The `__metadata__` key holding the JSON header.
pub(super) const METADATA_KEY: &str = "gradwire";
/// How the checksum member starts: the header's last (see the `checkpoint` module docs).
pub(super) const CHECKSUM_MEMBER: &str = ",\"crc32c\":\"";

/// The checksum of a file's JSON header and its tensors (name, data), the
/// tensors in name order.
pub(super) fn checksum<'a, D: AsRef<[u8]>>(
    json: &str,
    tensors: impl IntoIterator<Item = (&'a str, D)>,
) -> u32 {
    tensors
        .into_iter()
        .fold(crc32c::crc32c(json.as_bytes()), |crc, (name, data)| {
            crc32c::crc32c_append(crc32c::crc32c_append(crc, name.as_bytes()), data.as_ref())
        })
}

/// Prefix of the optimizer buffers' tensor names.
const OPTIM_PREFIX: &str = "optim/";
/// Prefix of the extra tensors' names.
const EXTRA_PREFIX: &str = "extra/";

/// The JSON header (the `"gradwire"` metadata entry).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Header {
    pub(super) format: String,
    pub(super) version: u32,
    pub(super) kind: String,
    pub(super) step: u64,
    pub(super) config: Value,
    pub(super) overrides: BTreeMap<String, Value>,
    pub(super) params: BTreeMap<String, ParamHeader>,
    pub(super) tensors: Vec<String>,
    pub(super) values: BTreeMap<String, Value>,
    /// The checksum (version 2), written last by [`to_bytes`] and checked
    /// on the raw text before the header is parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) crc32c: Option<String>,
}

/// One parameter in the JSON header.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ParamHeader {
    pub(super) shape: Vec<usize>,
    pub(super) updates: u64,
    pub(super) buffers: Vec<String>,
}

/// The JSON header of parameter `name`'s state, every buffer checked to
/// hold the shape's element count ([`OptimError::ShapeMismatch`]; a shape
/// whose size overflows is [`OptimError::InvalidArgument`]).
pub(super) fn param_header(name: &str, p: &ParamState) -> Result<ParamHeader> {
    let n = checked_elems(&p.shape).ok_or_else(|| {
        OptimError::InvalidArgument(format!(
            "checkpoint: parameter {name:?}: shape {:?} overflows",
            p.shape
        ))
    })?;
    if let Some((buffer, values)) = p.buffers.iter().find(|(_, b)| b.len() != n) {
        return Err(OptimError::ShapeMismatch {
            what: format!("checkpoint: buffer {buffer:?} of parameter {name:?}"),
            expected: p.shape.clone(),
            got: vec![values.len()],
        });
    }
    Ok(ParamHeader {
        shape: p.shape.clone(),
        updates: p.updates,
        buffers: p.buffers.keys().cloned().collect(),
    })
}

/// The tensor name of buffer `buffer` of parameter `param`.
pub(super) fn optim_name(param: &str, buffer: &str) -> String {
    format!("{OPTIM_PREFIX}{param}/{buffer}")
}

/// The tensor name of extra tensor `name`.
pub(super) fn extra_name(name: &str) -> String {
    format!("{EXTRA_PREFIX}{name}")
}

/// The element count of `shape`, or `None` if it overflows (or its f32 byte
/// size does).
pub(super) fn checked_elems(shape: &[usize]) -> Option<usize> {
    let n = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
    let bytes = n.checked_mul(4)?;
    isize::try_from(bytes).ok()?;
    Some(n)
}

/// Borrowed tensor data, converted to little-endian bytes only when
/// safetensors writes it (one tensor at a time, so saving never holds a
/// second copy of the whole state).
pub(super) enum Data<'a> {
    F64(&'a [f64]),
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

/// One tensor to write.
pub(super) struct Entry<'a> {
    pub(super) shape: Vec<usize>,
    pub(super) data: Data<'a>,
}

impl View for Entry<'_> {
    fn dtype(&self) -> Dtype {
        match self.data {
            Data::F64(_) => Dtype::F64,
            Data::F32(_) => Dtype::F32,
            Data::F16(_) => Dtype::F16,
            Data::BF16(_) => Dtype::BF16,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let mut out = Vec::with_capacity(self.data_len());
        match self.data {
            Data::F64(x) => x
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            Data::F32(x) => x
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            Data::F16(x) => x
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_bits().to_le_bytes())),
            Data::BF16(x) => x
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_bits().to_le_bytes())),
        }
        Cow::Owned(out)
    }

    fn data_len(&self) -> usize {
        // Sizes were checked against overflow before the entry was built.
        match self.data {
            Data::F64(x) => x.len().saturating_mul(8),
            Data::F32(x) => x.len().saturating_mul(4),
            Data::F16(x) => x.len().saturating_mul(2),
            Data::BF16(x) => x.len().saturating_mul(2),
        }
    }
}

/// Encodes `ckpt` as a checkpoint file's bytes (see the [module docs](super)).
///
/// Errors: [`OptimError::ShapeMismatch`] if a buffer's length differs from its
/// parameter's element count; [`OptimError::InvalidArgument`] if a shape's size
/// overflows or two buffers' tensor names collide; [`OptimError::Tensor`] if
/// an extra tensor is not in CPU memory.
pub fn to_bytes(ckpt: &Checkpoint) -> Result<Vec<u8>> {
    let state = &ckpt.optimizer;
    let mut entries: Vec<(String, Entry<'_>)> = Vec::new();
    let mut names = BTreeSet::new();
    let mut params = BTreeMap::new();
    for (pname, p) in &state.params {
        let header = param_header(pname, p)?;
        for (bname, buf) in &p.buffers {
            let tname = optim_name(pname, bname);
            if !names.insert(tname.clone()) {
                return Err(OptimError::InvalidArgument(format!(
                    "checkpoint: tensor name {tname:?} (buffer {bname:?} of parameter \
                     {pname:?}) collides with another buffer's"
                )));
            }
            entries.push((
                tname,
                Entry {
                    shape: p.shape.clone(),
                    data: Data::F32(buf),
                },
            ));
        }
        params.insert(pname.clone(), header);
    }
    for (name, t) in &ckpt.state.tensors {
        let data = match t.dtype() {
            DType::F32 => Data::F32(t.as_slice::<f32>()?),
            DType::F16 => Data::F16(t.as_slice::<f16>()?),
            DType::BF16 => Data::BF16(t.as_slice::<bf16>()?),
        };
        // Extra names live under their own prefix: they cannot collide with
        // buffers, nor (being map keys) with each other.
        entries.push((
            extra_name(name),
            Entry {
                shape: t.dims().to_vec(),
                data,
            },
        ));
    }
    let header = Header {
        format: CHECKPOINT_FORMAT.to_owned(),
        version: CHECKPOINT_VERSION,
        kind: state.kind.clone(),
        step: state.step,
        config: state.config.clone(),
        overrides: state.overrides.clone(),
        params,
        tensors: ckpt.state.tensors.keys().cloned().collect(),
        values: ckpt.state.values.clone(),
        crc32c: None,
    };
    let json = serde_json::to_string(&header).map_err(|e| {
        OptimError::InvalidArgument(format!("checkpoint: cannot encode the header: {e}"))
    })?;
    // One tensor's bytes at a time, as safetensors writes them: the
    // checksum holds no second copy of the state either.
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let crc = checksum(
        &json,
        entries
            .iter()
            .map(|(name, entry)| (name.as_str(), entry.data())),
    );
    // The document is a JSON object: its member list ends at the last `}`.
    let body = json.strip_suffix('}').unwrap_or(&json);
    let sealed = format!("{body}{CHECKSUM_MEMBER}{crc:08x}\"}}");
    let metadata = HashMap::from([(METADATA_KEY.to_owned(), sealed)]);
    safetensors::serialize(entries, Some(metadata))
        .map_err(|e| OptimError::InvalidArgument(format!("checkpoint: cannot encode: {e}")))
}
