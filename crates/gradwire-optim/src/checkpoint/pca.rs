//! PCA files: DimReduce's components in the checkpoints' container
//! (safetensors, a gradwire header), validated and written atomically.

use std::io::Write;
use std::path::Path;

use gradwire_algos::dimreduce::Pca;
use safetensors::tensor::{Dtype, SafeTensors};
use serde_json::Value;

use super::file::save_bytes_with;
use super::format::{Data, Entry, METADATA_KEY};
use super::read::corrupt;
use crate::error::{OptimError, Result};

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

/// Writes `pca` to `path` atomically (as [`save`](super::save) does a checkpoint).
pub fn save_pca(path: impl AsRef<Path>, pca: &Pca) -> Result<()> {
    let bytes = pca_to_bytes(pca)?;
    save_bytes_with(path, |file| file.write_all(&bytes))
}

/// Reads and validates the PCA file at `path`.
pub fn load_pca(path: impl AsRef<Path>) -> Result<Pca> {
    pca_from_bytes(&std::fs::read(path)?)
}
