//! Reading a checkpoint file's bytes back: every name, dtype, shape and the
//! checksum checked, every defect an error, never a panic.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gradwire_tensor::{Tensor, bf16, f16};
use safetensors::tensor::{Dtype, SafeTensors, TensorInfo};
use serde_json::Value;

use super::format::{
    CHECKSUM_MEMBER, CHECKSUM_VERSION, Header, METADATA_KEY, checked_elems, checksum, extra_name,
    optim_name,
};
use super::{CHECKPOINT_FORMAT, CHECKPOINT_VERSION, Checkpoint, LoadOptions};
use crate::error::{OptimError, Result};
use crate::state::{OptimizerState, ParamState};
use gradwire_algos::StateDict;

pub(super) fn corrupt(msg: impl Into<String>) -> OptimError {
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
/// docs](super)), refusing NaN and infinities. Every defect is an
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
