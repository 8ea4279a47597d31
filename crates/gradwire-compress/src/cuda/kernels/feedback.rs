//! Error feedback, the cast codec and scatter-add of `kernels/cuda/
//! {feedback,cast}.cu` on device buffers, matching gradwire-compress's
//! `ErrorFeedback`, `cast::encode` and `SparseVec::scatter_add` bitwise.

use gradwire_kernels::{cast, feedback as k};
use gradwire_tensor::cuda_backend::launch::{
    Blocks, Launch, by_dtype, require_f32, require_len, require_ordinal, require_same_device,
    window,
};
use gradwire_tensor::cuda_backend::{DeviceVec, read_first_index};
use gradwire_tensor::{CudaStorage, DType, Error, Result};

use super::select::{DeviceSelectScratch, DeviceSparse};

/// `residual += grad` (f32, same length), or with DGC's momentum correction
/// `velocity = mu velocity + grad; residual += velocity`. Returns the
/// smallest index whose new residual is not finite (the caller then resets
/// the memory, as the CPU's `ErrorFeedback` does), `None` when all are.
///
/// The gradient's own finiteness is the caller's to check first
/// ([`super::select::first_non_finite`]), so that a refused gradient
/// changes nothing.
pub fn accumulate(
    residual: &mut CudaStorage,
    grad: &CudaStorage,
    momentum: Option<(&mut CudaStorage, f32)>,
    scratch: &mut DeviceSelectScratch,
) -> Result<Option<usize>> {
    const OP: &str = "accumulate";
    require_f32(OP, residual)?;
    require_f32(OP, grad)?;
    require_same_device(OP, residual, grad)?;
    let n = residual.len();
    require_len(OP, n, grad.len())?;
    if let Some((velocity, _)) = &momentum {
        require_f32(OP, velocity)?;
        require_same_device(OP, residual, velocity)?;
        require_len(OP, n, velocity.len())?;
    }
    if n == 0 {
        return Ok(None);
    }
    let device = residual.device().clone();
    let first_bad = scratch.first_index_cell(&device)?;
    let launch = match momentum {
        None => Launch::new(&device, &k::EF_ACCUMULATE_F32)
            .write(residual)
            .read(grad)
            .len(n),
        Some((velocity, mu)) => Launch::new(&device, &k::EF_ACCUMULATE_MOMENTUM_F32)
            .write(residual)
            .write(velocity)
            .read(grad)
            .len(n)
            .value(mu),
    };
    launch
        .write(window(&mut *first_bad, 0..1))
        .run(Blocks::Over(n))?;
    read_first_index(first_bad)
}

/// Zeroes `residual` (and `velocity`) at the indices of `sent`, which must
/// index into them (`sent.dense_len()` equal to their length).
pub fn zero_selected(
    residual: &mut CudaStorage,
    velocity: Option<&mut CudaStorage>,
    sent: &DeviceSparse,
) -> Result<()> {
    const OP: &str = "zero_selected";
    require_f32(OP, residual)?;
    let n = residual.len();
    require_len(OP, n, sent.dense_len())?;
    require_same_device(OP, residual, sent.values())?;
    if let Some(velocity) = &velocity {
        require_f32(OP, velocity)?;
        require_same_device(OP, residual, velocity)?;
        require_len(OP, n, velocity.len())?;
    }
    let count = sent.nnz();
    if count == 0 {
        return Ok(());
    }
    let device = residual.device().clone();
    Launch::new(&device, &k::EF_ZERO_SELECTED)
        .write(residual)
        .write_or_null(velocity)
        .len(n)
        .read(sent.indices())
        .len(count)
        .run(Blocks::Over(count))
}

/// The cast codec's options as the kernels take them: `has_clip`, `clip`
/// and `scale`, validated as gradwire-compress's `CastOptions` (clip finite
/// and >= 0, scale finite and > 0).
fn codec_args(clip: Option<f32>, scale: f32) -> Result<(i32, f32, f32)> {
    if let Some(c) = clip
        && !(c >= 0.0 && c.is_finite())
    {
        return Err(Error::InvalidArgument(format!(
            "clip value {c} must be finite and non-negative"
        )));
    }
    if !(scale > 0.0 && scale.is_finite()) {
        return Err(Error::InvalidArgument(format!(
            "scale {scale} must be finite and positive"
        )));
    }
    Ok((i32::from(clip.is_some()), clip.unwrap_or(0.0), scale))
}

/// The cast codec's `encode`: `dst = round(clamp(src, clip) * scale)` from
/// f32 `src` into f16, bf16 or f32 `dst` of the same length, bitwise as
/// gradwire-compress's `cast::encode`.
pub fn encode_cast(
    src: &CudaStorage,
    dst: &mut CudaStorage,
    clip: Option<f32>,
    scale: f32,
) -> Result<()> {
    const OP: &str = "encode_cast";
    require_f32(OP, src)?;
    require_same_device(OP, src, dst)?;
    require_len(OP, src.len(), dst.len())?;
    let (has_clip, clip_value, scale) = codec_args(clip, scale)?;
    let kernel = match dst.dtype() {
        DType::F16 => &cast::ENCODE_F32_F16,
        DType::BF16 => &cast::ENCODE_F32_BF16,
        DType::F32 => {
            // A copy, then the same f32 clamp and multiply as the CPU.
            dst.copy_from(src)?;
            if has_clip != 0 {
                dst.clamp(clip_value)?;
            }
            if scale != 1.0 {
                dst.scale(scale)?;
            }
            return Ok(());
        }
    };
    let n = src.len();
    if n == 0 {
        return Ok(());
    }
    Launch::new(src.device(), kernel)
        .read(src)
        .write(dst)
        .len(n)
        .value(has_clip)
        .value(clip_value)
        .value(scale)
        .run(Blocks::Over(n))
}

/// One error-feedback step of the cast codec on the accumulator `residual`
/// (f32; the gradient already added): `dst = round(clamp(residual) *
/// scale)` into f16 or bf16, and `residual -= widen(dst) * (1 / scale)`,
/// bitwise as `ErrorFeedback::compress_cast`.
pub fn feedback_cast(
    residual: &mut CudaStorage,
    dst: &mut CudaStorage,
    clip: Option<f32>,
    scale: f32,
) -> Result<()> {
    const OP: &str = "feedback_cast";
    require_f32(OP, residual)?;
    require_same_device(OP, residual, dst)?;
    require_len(OP, residual.len(), dst.len())?;
    let (has_clip, clip_value, scale) = codec_args(clip, scale)?;
    let kernel = match dst.dtype() {
        DType::F16 => &k::EF_CAST_F32_F16,
        DType::BF16 => &k::EF_CAST_F32_BF16,
        DType::F32 => {
            return Err(Error::InvalidArgument(format!(
                "{OP}: the destination must be f16 or bf16"
            )));
        }
    };
    let n = residual.len();
    if n == 0 {
        return Ok(());
    }
    // As the CPU: the inverse in f32, then one multiply per element.
    let inverse = 1.0f32 / scale;
    let device = residual.device().clone();
    Launch::new(&device, kernel)
        .write(residual)
        .write(dst)
        .len(n)
        .value(has_clip)
        .value(clip_value)
        .value(scale)
        .value(inverse)
        .run(Blocks::Over(n))
}

/// `dense[index] += value` for every entry of `sparse` (f32 `dense` of
/// `sparse.dense_len()` elements). The indices of a [`DeviceSparse`] are
/// strictly increasing, so the result is bitwise the CPU's scatter-add.
pub fn scatter_add(dense: &mut CudaStorage, sparse: &DeviceSparse) -> Result<()> {
    scatter_add_values(dense, sparse, sparse.values())
}

/// [`scatter_add`] with the values in another dtype (f16 or bf16 from a
/// half-precision payload, widened exactly): `values` holds one value per
/// index of `sparse`, whose own values are ignored.
pub fn scatter_add_values(
    dense: &mut CudaStorage,
    sparse: &DeviceSparse,
    values: &CudaStorage,
) -> Result<()> {
    require_len("scatter_add", sparse.dense_len(), dense.len())?;
    require_len("scatter_add", sparse.nnz(), values.len())?;
    scatter_add_first(dense, sparse.indices(), values, sparse.nnz())
}

/// `dense[indices[j]] += values[j]` for the first `count` entries of
/// `indices` and `values` (kept buffers may be longer). The caller has
/// checked that those indices are strictly increasing and below
/// `dense.len()`: the kernel trusts them.
pub(crate) fn scatter_add_first(
    dense: &mut CudaStorage,
    indices: &DeviceVec<u32>,
    values: &CudaStorage,
    count: usize,
) -> Result<()> {
    const OP: &str = "scatter_add";
    require_f32(OP, dense)?;
    require_same_device(OP, dense, values)?;
    require_ordinal(OP, dense.ordinal(), indices.ordinal())?;
    if count > indices.len() || count > values.len() {
        return Err(Error::LengthMismatch {
            op: OP,
            expected: count,
            got: indices.len().min(values.len()),
        });
    }
    if count == 0 {
        return Ok(());
    }
    let kernel = by_dtype(
        values.dtype(),
        [
            &k::SCATTER_ADD_F32,
            &k::SCATTER_ADD_F16,
            &k::SCATTER_ADD_BF16,
        ],
    );
    let device = dense.device().clone();
    let n = dense.len();
    Launch::new(&device, kernel)
        .write(dense)
        .len(n)
        .read(window(indices, 0..count))
        .read(window(values, 0..count))
        .len(count)
        .run(Blocks::Over(count))
}
