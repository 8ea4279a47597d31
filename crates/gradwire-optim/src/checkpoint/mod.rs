//! Checkpoint files: an optimizer's whole state, plus whatever a wrapper
//! (DistOpt) adds, in one versioned, validated, atomically written file.
//!
//! # Format (version 2)
//!
//! A checkpoint is a [safetensors](https://github.com/huggingface/safetensors)
//! file, so any safetensors reader can inspect it:
//!
//! * every optimizer buffer is an `F32` tensor named
//!   `optim/<parameter name>/<buffer name>`, of the parameter's shape;
//! * every extra tensor of [`Checkpoint::state`]'s tensors is a tensor named
//!   `extra/<name>`, in its own dtype (`F32`, `F16` or `BF16`);
//! * the header's `__metadata__` string map holds one key, `"gradwire"`, whose
//!   value is a JSON document:
//!
//! ```json
//! {"format": "gradwire-checkpoint", "version": 1,
//!  "kind": "adam", "step": 12, "config": {...}, "overrides": {"w": {...}},
//!  "params": {"w": {"shape": [2, 3], "updates": 12, "buffers": ["m", "v"]}},
//!  "tensors": ["residual/0"],
//!  "values": {"partial_update_counter": 3}}
//! ```
//!
//! `tensors` lists the names of the extra tensors; `values` holds
//! [`Checkpoint::state`]'s values.
//!
//! The document ends with `"crc32c": "<eight hex digits>"`: the CRC-32C of
//! the document's bytes without that member (up to its final `}`) followed
//! by every tensor's name and data bytes, in name order, so a flipped bit
//! anywhere in what the loader decodes is
//! [`OptimError::CorruptCheckpoint`]. Version 1 files (written before the
//! checksum) still load, unchecked.
//!
//! # Validation
//!
//! Names may contain `/` (and anything else), so the loader never splits a
//! tensor name: it builds the name every listed buffer and extra tensor must
//! have, looks each one up, checks its dtype and shape, and then rejects the
//! file if it holds any tensor that was not expected. Every defect (not a
//! safetensors file, truncated, no metadata, bad JSON, another format, another
//! version, a missing buffer, a wrong dtype or shape, an unexpected tensor, a
//! negative or fractional step, a checksum that does not match...) is an
//! [`OptimError::CorruptCheckpoint`]; no input makes the loader panic, and it
//! allocates no more than the tensors the (size-checked) input holds. A NaN
//! or an infinity in a buffer or a tensor is
//! [`OptimError::NonFiniteCheckpoint`] unless [`LoadOptions`] allow it.
//!
//! Two buffers whose names would collide (parameter `a/b` with buffer `c` and
//! parameter `a` with buffer `b/c` both give `optim/a/b/c`) cannot be saved:
//! [`to_bytes`] refuses them with [`OptimError::InvalidArgument`].
//!
//! # Round trip and atomicity
//!
//! Floating-point data is stored bit for bit (little-endian), so
//! `from_bytes(&to_bytes(c)?)? == c` with [`Checkpoint`]'s bitwise equality.
//! [`save`] writes a temporary file in the destination directory, syncs it,
//! renames it over the destination and syncs the directory: a crash or an
//! error at any point leaves either the old file or the new one, never a mix.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use gradwire_tensor::{DType, Tensor, bf16, f16};
use safetensors::tensor::{Dtype, SafeTensors, TensorInfo, View};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{OptimError, Result};
use crate::state::{OptimizerState, ParamState};
use gradwire_algos::StateDict;
use gradwire_algos::dimreduce::Pca;

mod nested;

/// The `format` string of the JSON header: what identifies a gradwire
/// checkpoint among safetensors files.
pub const CHECKPOINT_FORMAT: &str = "gradwire-checkpoint";

/// The format version written by [`to_bytes`]. [`from_bytes`] reads it and
/// version 1 (the same layout without the checksum).
pub const CHECKPOINT_VERSION: u32 = 2;

/// The first version with a checksum.
const CHECKSUM_VERSION: u64 = 2;

/// The `__metadata__` key holding the JSON header.
const METADATA_KEY: &str = "gradwire";
/// How the checksum member starts: the header's last (see the module docs).
const CHECKSUM_MEMBER: &str = ",\"crc32c\":\"";

/// The checksum of a file's JSON header and its tensors (name, data), the
/// tensors in name order.
fn checksum<'a, D: AsRef<[u8]>>(
    json: &str,
    tensors: impl IntoIterator<Item = (&'a str, D)>,
) -> u32 {
    tensors
        .into_iter()
        .fold(crc32c::crc32c(json.as_bytes()), |crc, (name, data)| {
            crc32c::crc32c_append(crc32c::crc32c_append(crc, name.as_bytes()), data.as_ref())
        })
}

/// How [`from_bytes_with`] and [`load_with`] treat what they find.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Accept NaN and infinities in buffers and tensors (by default a
    /// [`OptimError::NonFiniteCheckpoint`]: a diverged run's state should
    /// not be resumed by accident).
    pub allow_non_finite: bool,
}
/// Prefix of the optimizer buffers' tensor names.
const OPTIM_PREFIX: &str = "optim/";
/// Prefix of the extra tensors' names.
const EXTRA_PREFIX: &str = "extra/";

/// Everything saved in one file: the optimizer's state plus whatever a
/// wrapper (DistOpt) adds: named tensors (error-feedback residuals) and named
/// JSON values (the partial-update counter...).
///
/// Equality is *bitwise* on all floating-point data (buffers and tensors):
/// a NaN equals itself when its bits do, and `0.0 != -0.0`. This is exactly
/// the round-trip guarantee of [`to_bytes`] / [`from_bytes`]. Tensors are
/// compared by dtype, dimensions and bits; a tensor that cannot be read on the
/// CPU (device memory) is never equal to anything.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The optimizer's state.
    pub optimizer: OptimizerState,
    /// Extra named tensors (f32, f16 or bf16: DistOpt's residuals, a
    /// strategy's warm start) and named JSON values (DistOpt's counters).
    pub state: StateDict,
}

/// The prefix under which a training checkpoint keeps the parameters
/// themselves among its tensors: `param/<name>`.
pub const PARAM_PREFIX: &str = "param/";

impl Checkpoint {
    /// A checkpoint of `optimizer` alone (no extra tensors or values).
    pub fn new(optimizer: OptimizerState) -> Checkpoint {
        Checkpoint {
            optimizer,
            state: StateDict::default(),
        }
    }

    /// Stores the parameters themselves (as `param/<name>` tensors), so the
    /// checkpoint can resume training or serve as a trajectory snapshot.
    pub fn set_parameters<'t>(&mut self, params: impl IntoIterator<Item = (&'t str, &'t Tensor)>) {
        for (name, t) in params {
            self.state
                .tensors
                .insert(format!("{PARAM_PREFIX}{name}"), t.clone());
        }
    }

    /// The parameters `names`, in that order, flattened into one f32 vector
    /// (a DimReduce trajectory snapshot). Errors if one is missing.
    pub fn flat_parameters(&self, names: &[&str]) -> Result<Vec<f32>> {
        let mut flat = Vec::new();
        for name in names {
            let t = self
                .state
                .tensors
                .get(&format!("{PARAM_PREFIX}{name}"))
                .ok_or_else(|| {
                    OptimError::StateMismatch(format!("the checkpoint holds no parameter {name}"))
                })?;
            flat.extend(t.to_f32_vec()?);
        }
        Ok(flat)
    }
}

/// Loads the parameters `names` from each checkpoint file, flattened in that
/// order: the rows of a DimReduce trajectory written by an earlier run.
pub fn load_trajectory(paths: &[impl AsRef<Path>], names: &[&str]) -> Result<Vec<Vec<f32>>> {
    paths
        .iter()
        .map(|p| load(p)?.flat_parameters(names))
        .collect()
}

impl From<OptimizerState> for Checkpoint {
    fn from(optimizer: OptimizerState) -> Checkpoint {
        Checkpoint::new(optimizer)
    }
}

impl PartialEq for Checkpoint {
    fn eq(&self, other: &Checkpoint) -> bool {
        state_eq(&self.optimizer, &other.optimizer)
            && self.state.values == other.state.values
            && self.state.tensors.len() == other.state.tensors.len()
            && self
                .state
                .tensors
                .iter()
                .zip(&other.state.tensors)
                .all(|((ka, a), (kb, b))| ka == kb && tensor_eq(a, b))
    }
}

/// Bitwise equality of two f32 slices.
fn bits_eq_f32(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn state_eq(a: &OptimizerState, b: &OptimizerState) -> bool {
    a.kind == b.kind
        && a.step == b.step
        && a.config == b.config
        && a.overrides == b.overrides
        && a.params.len() == b.params.len()
        && a.params.iter().zip(&b.params).all(|((na, pa), (nb, pb))| {
            na == nb
                && pa.shape == pb.shape
                && pa.updates == pb.updates
                && pa.buffers.len() == pb.buffers.len()
                && pa
                    .buffers
                    .iter()
                    .zip(&pb.buffers)
                    .all(|((ka, va), (kb, vb))| ka == kb && bits_eq_f32(va, vb))
        })
}

fn tensor_eq(a: &Tensor, b: &Tensor) -> bool {
    if a.dtype() != b.dtype() || a.dims() != b.dims() {
        return false;
    }
    match a.dtype() {
        DType::F32 => match (a.as_slice::<f32>(), b.as_slice::<f32>()) {
            (Ok(x), Ok(y)) => bits_eq_f32(x, y),
            _ => false,
        },
        DType::F16 => match (a.as_slice::<f16>(), b.as_slice::<f16>()) {
            (Ok(x), Ok(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
            }
            _ => false,
        },
        DType::BF16 => match (a.as_slice::<bf16>(), b.as_slice::<bf16>()) {
            (Ok(x), Ok(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
            }
            _ => false,
        },
    }
}

/// The JSON header (the `"gradwire"` metadata entry).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    format: String,
    version: u32,
    kind: String,
    step: u64,
    config: Value,
    overrides: BTreeMap<String, Value>,
    params: BTreeMap<String, ParamHeader>,
    tensors: Vec<String>,
    values: BTreeMap<String, Value>,
    /// The checksum (version 2), written last by [`to_bytes`] and checked
    /// on the raw text before the header is parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    crc32c: Option<String>,
}

/// One parameter in the JSON header.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ParamHeader {
    shape: Vec<usize>,
    updates: u64,
    buffers: Vec<String>,
}

/// The JSON header of parameter `name`'s state, every buffer checked to
/// hold the shape's element count ([`OptimError::ShapeMismatch`]; a shape
/// whose size overflows is [`OptimError::InvalidArgument`]).
fn param_header(name: &str, p: &ParamState) -> Result<ParamHeader> {
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
fn optim_name(param: &str, buffer: &str) -> String {
    format!("{OPTIM_PREFIX}{param}/{buffer}")
}

/// The tensor name of extra tensor `name`.
fn extra_name(name: &str) -> String {
    format!("{EXTRA_PREFIX}{name}")
}

/// The element count of `shape`, or `None` if it overflows (or its f32 byte
/// size does).
fn checked_elems(shape: &[usize]) -> Option<usize> {
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
enum Data<'a> {
    F64(&'a [f64]),
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

/// One tensor to write.
struct Entry<'a> {
    shape: Vec<usize>,
    data: Data<'a>,
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

/// Encodes `ckpt` as a checkpoint file's bytes (see the [module docs](self)).
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

fn corrupt(msg: impl Into<String>) -> OptimError {
    OptimError::CorruptCheckpoint(msg.into())
}

/// The raw data of tensor `name`, checked to be `dtype` of shape `shape`
/// (`None` for the shape accepts any).
fn tensor_bytes<'a>(
    infos: &HashMap<String, &TensorInfo>,
    data: &'a [u8],
    name: &str,
    dtype: &[Dtype],
    shape: Option<&[usize]>,
) -> Result<(&'a [u8], Dtype, Vec<usize>)> {
    let info = infos
        .get(name)
        .ok_or_else(|| corrupt(format!("tensor {name:?} is missing")))?;
    if !dtype.contains(&info.dtype) {
        return Err(corrupt(format!(
            "tensor {name:?} has dtype {}, expected {}",
            info.dtype,
            dtype
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" or ")
        )));
    }
    if let Some(shape) = shape
        && info.shape != shape
    {
        return Err(corrupt(format!(
            "tensor {name:?} has shape {:?}, expected {shape:?}",
            info.shape
        )));
    }
    let (start, end) = info.data_offsets;
    let bytes = data
        .get(start..end)
        .ok_or_else(|| corrupt(format!("tensor {name:?}: data offsets out of bounds")))?;
    let elem_size = match info.dtype {
        Dtype::F32 => 4,
        _ => 2,
    };
    let n = info
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| corrupt(format!("tensor {name:?}: shape overflows")))?;
    if n.checked_mul(elem_size) != Some(bytes.len()) {
        return Err(corrupt(format!(
            "tensor {name:?}: {} bytes for {n} elements",
            bytes.len()
        )));
    }
    Ok((bytes, info.dtype, info.shape.clone()))
}

/// Little-endian words of `N` bytes, decoded by `f`.
fn decode<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Result<Vec<T>> {
    bytes
        .chunks_exact(N)
        .map(|c| {
            <[u8; N]>::try_from(c)
                .map(&f)
                .map_err(|_| corrupt("tensor data is not a whole number of elements"))
        })
        .collect()
}

/// Decodes and validates a checkpoint file's bytes (see the [module
/// docs](self)), refusing NaN and infinities. Every defect is an
/// [`OptimError::CorruptCheckpoint`]; no input panics.
pub fn from_bytes(bytes: &[u8]) -> Result<Checkpoint> {
    from_bytes_with(bytes, &LoadOptions::default())
}

/// [`from_bytes`] with `options`.
pub fn from_bytes_with(bytes: &[u8], options: &LoadOptions) -> Result<Checkpoint> {
    let (header_len, meta) = SafeTensors::read_metadata(bytes)
        .map_err(|e| corrupt(format!("not a valid safetensors file: {e}")))?;
    // read_metadata checked that the header and the tensors' data fill the
    // buffer exactly; the data section starts after the length and header.
    let data = header_len
        .checked_add(8)
        .and_then(|start| bytes.get(start..))
        .ok_or_else(|| corrupt("truncated data section"))?;
    let json = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get(METADATA_KEY))
        .ok_or_else(|| corrupt(format!("no {METADATA_KEY:?} entry in the metadata")))?;
    let value: Value =
        serde_json::from_str(json).map_err(|e| corrupt(format!("header is not JSON: {e}")))?;
    match value.get("format").and_then(Value::as_str) {
        Some(CHECKPOINT_FORMAT) => {}
        Some(other) => {
            return Err(corrupt(format!(
                "format {other:?}, expected {CHECKPOINT_FORMAT:?}"
            )));
        }
        None => return Err(corrupt("header has no format string")),
    }
    let version = match value.get("version") {
        Some(v) if matches!(v.as_u64(), Some(1..=2)) => v.as_u64().unwrap_or(0),
        Some(v) => {
            return Err(corrupt(format!(
                "unsupported version {v}, this build reads versions 1 to {CHECKPOINT_VERSION}"
            )));
        }
        None => return Err(corrupt("header has no version")),
    };
    if version >= CHECKSUM_VERSION {
        verify_checksum(json, &meta, data)?;
    } else if value.get("crc32c").is_some() {
        return Err(corrupt("a version 1 header with a checksum"));
    }
    // Name the offending field (serde's messages do not).
    if let Some(step) = value.get("step")
        && step.as_u64().is_none()
    {
        return Err(corrupt(format!("step {step} is not a u64")));
    }
    if let Some(params) = value.get("params").and_then(Value::as_object) {
        for (name, p) in params {
            if let Some(updates) = p.get("updates")
                && updates.as_u64().is_none()
            {
                return Err(corrupt(format!(
                    "parameter {name:?}: updates {updates} is not a u64"
                )));
            }
        }
    }
    let header: Header =
        serde_json::from_value(value).map_err(|e| corrupt(format!("invalid header: {e}")))?;

    let infos = meta.tensors();
    let mut expected = BTreeSet::new();
    let mut params = BTreeMap::new();
    for (pname, ph) in header.params {
        let n = checked_elems(&ph.shape).ok_or_else(|| {
            corrupt(format!(
                "parameter {pname:?}: shape {:?} overflows",
                ph.shape
            ))
        })?;
        let mut buffers = BTreeMap::new();
        for bname in ph.buffers {
            let tname = optim_name(&pname, &bname);
            if !expected.insert(tname.clone()) {
                return Err(corrupt(format!("tensor {tname:?} is listed twice")));
            }
            let (raw, _, _) = tensor_bytes(&infos, data, &tname, &[Dtype::F32], Some(&ph.shape))?;
            let values = decode(raw, f32::from_le_bytes)?;
            if values.len() != n {
                return Err(corrupt(format!("tensor {tname:?}: wrong element count")));
            }
            if !options.allow_non_finite {
                refuse_non_finite(&tname, values.iter().copied())?;
            }
            buffers.insert(bname, values);
        }
        params.insert(
            pname,
            ParamState {
                shape: ph.shape,
                updates: ph.updates,
                buffers,
            },
        );
    }
    let mut tensors = BTreeMap::new();
    for name in header.tensors {
        let tname = extra_name(&name);
        if !expected.insert(tname.clone()) {
            return Err(corrupt(format!("tensor {tname:?} is listed twice")));
        }
        let (raw, dtype, shape) = tensor_bytes(
            &infos,
            data,
            &tname,
            &[Dtype::F32, Dtype::F16, Dtype::BF16],
            None,
        )?;
        let tensor = match dtype {
            Dtype::F32 => Tensor::from_vec(decode(raw, f32::from_le_bytes)?, shape),
            Dtype::F16 => Tensor::from_vec(
                decode(raw, |b| f16::from_bits(u16::from_le_bytes(b)))?,
                shape,
            ),
            _ => Tensor::from_vec(
                decode(raw, |b| bf16::from_bits(u16::from_le_bytes(b)))?,
                shape,
            ),
        }
        .map_err(|e| corrupt(format!("tensor {tname:?}: {e}")))?;
        if !options.allow_non_finite {
            refuse_non_finite(&tname, tensor.to_f32_vec()?)?;
        }
        tensors.insert(name, tensor);
    }
    if let Some(name) = infos.keys().filter(|k| !expected.contains(*k)).min() {
        return Err(corrupt(format!("unexpected tensor {name:?}")));
    }
    Ok(Checkpoint {
        optimizer: OptimizerState {
            kind: header.kind,
            step: header.step,
            config: header.config,
            overrides: header.overrides,
            params,
        },
        state: StateDict {
            tensors,
            values: header.values,
        },
    })
}

/// Whether the checksum at the end of the JSON header `json` matches the
/// rest of it and the tensors of `meta` over the data section `data`.
fn verify_checksum(json: &str, meta: &safetensors::tensor::Metadata, data: &[u8]) -> Result<()> {
    let (body, stored) = json
        .rsplit_once(CHECKSUM_MEMBER)
        .ok_or_else(|| corrupt("the header has no checksum (\"crc32c\") at its end"))?;
    let stored = stored
        .strip_suffix("\"}")
        .filter(|hex| hex.len() == 8)
        .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        .ok_or_else(|| corrupt("the checksum is not eight hex digits closing the header"))?;
    let mut tensors = Vec::new();
    for (name, info) in meta.tensors() {
        let (start, end) = info.data_offsets;
        let bytes = data
            .get(start..end)
            .ok_or_else(|| corrupt(format!("tensor {name:?}: data offsets out of bounds")))?;
        tensors.push((name, bytes));
    }
    tensors.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let unsealed = format!("{body}}}");
    let computed = checksum(&unsealed, tensors.iter().map(|(n, b)| (n.as_str(), b)));
    if computed == stored {
        Ok(())
    } else {
        Err(corrupt(format!(
            "checksum mismatch: the file says {stored:08x}, its contents give {computed:08x}"
        )))
    }
}

/// [`OptimError::NonFiniteCheckpoint`] at the first NaN or infinity of
/// tensor `name`'s `values`.
fn refuse_non_finite(name: &str, values: impl IntoIterator<Item = f32>) -> Result<()> {
    match values.into_iter().enumerate().find(|(_, v)| !v.is_finite()) {
        None => Ok(()),
        Some((index, value)) => Err(OptimError::NonFiniteCheckpoint {
            tensor: name.to_owned(),
            index,
            value,
        }),
    }
}

/// Writes `ckpt` to `path` atomically: the file at `path` is either the
/// previous one or the complete new one, whatever fails or crashes.
///
/// Errors: those of [`to_bytes`], and [`OptimError::Io`] if writing, syncing
/// or renaming fails (the previous file is then untouched and the temporary
/// file removed).
pub fn save(path: impl AsRef<Path>, ckpt: &Checkpoint) -> Result<()> {
    let bytes = to_bytes(ckpt)?;
    save_bytes_with(path, |file| file.write_all(&bytes))
}

/// The atomic write of [`save`], with the writing of the contents left to
/// `write` (the CLI's timeline file is written with it; tests use it to
/// simulate a write failing halfway).
///
/// Creates a temporary file next to `path`, calls `write` on it, syncs it,
/// renames it to `path` and syncs the directory. If any step fails the
/// temporary file is removed and `path` is left as it was.
#[doc(hidden)]
pub fn save_bytes_with<F: FnOnce(&mut File) -> io::Result<()>>(
    path: impl AsRef<Path>,
    write: F,
) -> Result<()> {
    let path = path.as_ref();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".gradwire-checkpoint-").suffix(".tmp");
    // The temporary file becomes the checkpoint: give it the permissions a
    // plain `File::create` would (0666 minus the umask), not tempfile's 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    // On every early return below, dropping `tmp` deletes the temporary file.
    let mut tmp = builder.tempfile_in(dir)?;
    write(tmp.as_file_mut())?;
    tmp.as_file_mut().flush()?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| OptimError::Io(e.error))?;
    // Make the rename durable: a failing directory sync is an error (the
    // new file may not survive a crash). Only where a directory cannot be
    // opened as a file at all (Windows) is there nothing to sync.
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    if let Ok(d) = File::open(dir) {
        d.sync_all()?;
    }
    Ok(())
}

/// Reads and validates the checkpoint at `path`.
///
/// Errors: [`OptimError::Io`] if it cannot be read, and those of
/// [`from_bytes`].
pub fn load(path: impl AsRef<Path>) -> Result<Checkpoint> {
    load_with(path, &LoadOptions::default())
}

/// [`load`] with `options`.
pub fn load_with(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Checkpoint> {
    let bytes = std::fs::read(path)?;
    from_bytes_with(&bytes, options)
}

/// The `format` string of a PCA file's header.
pub const PCA_FORMAT: &str = "gradwire-pca";

/// Encodes DimReduce's components as a PCA file's bytes: a safetensors file
/// with one F64 tensor `components` (`n x M`, exact) and a header
/// `{"format": "gradwire-pca", "version": 1}`.
pub fn pca_to_bytes(pca: &Pca) -> Result<Vec<u8>> {
    let flat: Vec<f64> = pca.components.iter().copied().collect();
    let entry = Entry {
        shape: vec![pca.components.nrows(), pca.components.ncols()],
        data: Data::F64(&flat),
    };
    let header = serde_json::json!({ "format": PCA_FORMAT, "version": 1 }).to_string();
    let metadata = std::collections::HashMap::from([(METADATA_KEY.to_owned(), header)]);
    safetensors::serialize([("components", entry)], Some(metadata))
        .map_err(|e| OptimError::InvalidArgument(format!("PCA file: {e}")))
}

/// Decodes and validates a PCA file's bytes ([`pca_to_bytes`]); every defect
/// is an [`OptimError::CorruptCheckpoint`], non-finite components included.
pub fn pca_from_bytes(bytes: &[u8]) -> Result<Pca> {
    let file = SafeTensors::deserialize(bytes)
        .map_err(|e| corrupt(format!("not a valid safetensors file: {e}")))?;
    let (_, meta) = SafeTensors::read_metadata(bytes)
        .map_err(|e| corrupt(format!("not a valid safetensors file: {e}")))?;
    let header: Value = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get(METADATA_KEY))
        .ok_or_else(|| corrupt("no gradwire header: not a PCA file"))
        .and_then(|h| serde_json::from_str(h).map_err(|e| corrupt(format!("header: {e}"))))?;
    if header.get("format").and_then(Value::as_str) != Some(PCA_FORMAT)
        || header.get("version").and_then(Value::as_u64) != Some(1)
    {
        return Err(corrupt(format!(
            "not a version 1 PCA file: header {header}"
        )));
    }
    let view = file
        .tensor("components")
        .map_err(|e| corrupt(format!("components: {e}")))?;
    let &[n, m] = view.shape() else {
        return Err(corrupt(format!(
            "components of shape {:?}, expected 2 dimensions",
            view.shape()
        )));
    };
    if view.dtype() != Dtype::F64 {
        return Err(corrupt(format!(
            "components are {:?}, expected F64",
            view.dtype()
        )));
    }
    let values: Vec<f64> = view
        .data()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    if values.len() != n * m || values.iter().any(|v| !v.is_finite()) {
        return Err(corrupt("components: wrong size or non-finite values"));
    }
    let components = ndarray::Array2::from_shape_vec((n, m), values)
        .map_err(|e| corrupt(format!("components: {e}")))?;
    Ok(Pca { components })
}

/// Writes `pca` to `path` atomically (as [`save`] does a checkpoint).
pub fn save_pca(path: impl AsRef<Path>, pca: &Pca) -> Result<()> {
    let bytes = pca_to_bytes(pca)?;
    save_bytes_with(path, |file| file.write_all(&bytes))
}

/// Reads and validates the PCA file at `path`.
pub fn load_pca(path: impl AsRef<Path>) -> Result<Pca> {
    pca_from_bytes(&std::fs::read(path)?)
}
