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
//!
//! # Modules
//!
//! The layout and the checksum are `format` (encoding, [`to_bytes`]);
//! `read` decodes and validates ([`from_bytes`]); `file` writes atomically
//! and loads ([`save`], [`load`]); `pca` stores DimReduce's components in
//! the same container; `nested` keeps a second optimizer's state inside.

use std::path::Path;

use gradwire_tensor::{DType, Tensor, bf16, f16};

use crate::error::{OptimError, Result};
use crate::state::OptimizerState;
use gradwire_algos::StateDict;

mod file;
mod format;
mod nested;
mod pca;
mod read;

pub use file::{load, load_with, save, save_bytes_with};
pub use format::to_bytes;
pub use pca::{PCA_FORMAT, load_pca, pca_from_bytes, pca_to_bytes, save_pca};
pub use read::{from_bytes, from_bytes_with};
// What `nested` takes from the format and the reader.
use format::{ParamHeader, checked_elems, param_header};
use read::corrupt;

/// The `format` string of the JSON header: what identifies a gradwire
/// checkpoint among safetensors files.
pub const CHECKPOINT_FORMAT: &str = "gradwire-checkpoint";

/// The format version written by [`to_bytes`]. [`from_bytes`] reads it and
/// version 1 (the same layout without the checksum).
pub const CHECKPOINT_VERSION: u32 = 2;

/// How [`from_bytes_with`] and [`load_with`] treat what they find.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Accept NaN and infinities in buffers and tensors (by default a
    /// [`OptimError::NonFiniteCheckpoint`]: a diverged run's state should
    /// not be resumed by accident).
    pub allow_non_finite: bool,
}

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
