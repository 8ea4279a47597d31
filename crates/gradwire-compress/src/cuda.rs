//! The codecs on CUDA device buffers (feature `cuda`): the selections
//! ([`threshold`], [`top_k`], [`sampled_top_k`]), the cast codec
//! ([`encode`]), scatter-add, [`CudaErrorFeedback`], the quantizers
//! ([`quant_encode`], [`quant_decode`], [`quant_decode_add`], in `quant.rs`)
//! and PowerSGD's low-rank products ([`lowrank`]),
//! each selecting and computing exactly what its CPU counterpart does on
//! the same values (the same indices, values bitwise, the same residuals,
//! the same payload bytes; the orthonormalisation within a few ulps), without
//! the gradient leaving the device.
//!
//! They compose the launchers of [`kernels`]
//! (`select`, `feedback`, `quant`, `lowrank`); only the selection's
//! size and a few counters cross to the host. Random-k has no device form
//! (its ChaCha8 draw is the CPU's): [`CudaErrorFeedback::compress`] refuses
//! it.

use gradwire_kernels::plan;
use gradwire_tensor::cuda_backend::DeviceVec;
use gradwire_tensor::{CpuStorage, CudaStorage, DType, Error as TensorError};
use kernels::{feedback, select};

pub use crate::cuda::kernels::select::{DeviceSelectScratch, DeviceSparse};
pub use quant::{DeviceBytes, quant_decode, quant_decode_add, quant_encode, quant_encode_into};

use crate::cast::CastOptions;
use crate::error::{CompressError, Result};
use crate::feedback::{ErrorFeedback, ErrorFeedbackState, SparseCodec};
use crate::select::{
    SAMPLE_STRIDE, SAMPLED_MIN_LEN, SAMPLED_TOP_K_SLACK, check_threshold, count_for_ratio, key,
};
use crate::sparse::check_dense_len;
use crate::wire;

pub mod kernels;
pub mod lowrank;
mod quant;

/// The value of `x[index]` (for an error report).
fn value_at(x: &CudaStorage, index: usize) -> Result<f32> {
    let value = x.read_f32(index..index + 1)?;
    Ok(value.first().copied().unwrap_or(f32::NAN))
}

/// Refuses a buffer holding a NaN or an infinity, as the CPU codecs do.
fn refuse_non_finite(x: &CudaStorage, scratch: &mut DeviceSelectScratch) -> Result<()> {
    match select::first_non_finite(x, scratch)? {
        None => Ok(()),
        Some(index) => Err(CompressError::NonFinite {
            index,
            value: value_at(x, index)?,
        }),
    }
}

/// Every `x_i` with `|x_i| >= threshold` ([`crate::select::threshold`] on the
/// device). `x` must be f32; `threshold` finite and non-negative.
pub fn threshold(x: &CudaStorage, threshold: f32) -> Result<DeviceSparse> {
    select_with(
        x,
        &SparseCodec::Threshold(threshold),
        &mut DeviceSelectScratch::default(),
    )
}

/// The `ceil(ratio * n)` entries of largest magnitude, ties to the lower
/// indices ([`crate::select::top_k`] on the device).
pub fn top_k(x: &CudaStorage, ratio: f64) -> Result<DeviceSparse> {
    select_with(
        x,
        &SparseCodec::TopK(ratio),
        &mut DeviceSelectScratch::default(),
    )
}

/// [`top_k`] with the count given ([`crate::select::top_k_count`]).
pub fn top_k_count(x: &CudaStorage, k: usize) -> Result<DeviceSparse> {
    check_dense_len(x.len())?;
    let mut scratch = DeviceSelectScratch::default();
    refuse_non_finite(x, &mut scratch)?;
    top_k_finite(x, k, &mut scratch)
}

/// Sampled top-k (Deep Gradient Compression, [`crate::select::sampled_top_k`]
/// on the device): between `k = ceil(ratio * n)` and `ceil(1.3 k)` of the
/// largest magnitudes, estimated from a strided sample of every 100th entry
/// and refined exactly as on the CPU, so both select the same entries.
pub fn sampled_top_k(x: &CudaStorage, ratio: f64) -> Result<DeviceSparse> {
    select_with(
        x,
        &SparseCodec::SampledTopK(ratio),
        &mut DeviceSelectScratch::default(),
    )
}

/// The selection of `codec` from `x` (f32), its working memory in
/// `scratch` (kept from call to call by the caller: a steady caller
/// allocates only the list returned). Refuses non-finite input and
/// random-k (its draw is the CPU's), as [`threshold`], [`top_k`] and
/// [`sampled_top_k`] do.
pub fn select_with(
    x: &CudaStorage,
    codec: &SparseCodec,
    scratch: &mut DeviceSelectScratch,
) -> Result<DeviceSparse> {
    check_dense_len(x.len())?;
    let select = Select::checked(codec, x.len())?;
    refuse_non_finite(x, scratch)?;
    select.run(x, scratch)
}

fn threshold_finite(
    x: &CudaStorage,
    threshold: f32,
    scratch: &mut DeviceSelectScratch,
) -> Result<DeviceSparse> {
    let selection = select::Selection::at_least(x.device(), key(threshold), scratch)?;
    apply(x, selection, None, x.len(), scratch)
}

/// Applies `selection` ([`select::compact`]) and keeps its state in
/// `scratch` for the next one.
fn apply(
    x: &CudaStorage,
    selection: select::Selection,
    src_index: Option<&DeviceSparse>,
    dense_len: usize,
    scratch: &mut DeviceSelectScratch,
) -> Result<DeviceSparse> {
    let selected = select::compact(x, &selection, src_index, dense_len, scratch);
    scratch.recycle(selection);
    Ok(selected?)
}

fn top_k_finite(
    x: &CudaStorage,
    k: usize,
    scratch: &mut DeviceSelectScratch,
) -> Result<DeviceSparse> {
    let k = k.min(x.len());
    let selection = if k == 0 {
        // Keys are at most 0x7f7f_ffff here: nothing is at least this.
        select::Selection::at_least(x.device(), u32::MAX, scratch)?
    } else {
        select::kth_largest(x, k, scratch)?
    };
    apply(x, selection, None, x.len(), scratch)
}

fn sampled_top_k_finite(
    x: &CudaStorage,
    ratio: f64,
    k: usize,
    scratch: &mut DeviceSelectScratch,
) -> Result<DeviceSparse> {
    let mut steps = SampledOnDevice {
        x,
        sample: None,
        scratch,
    };
    let rule = plan::SampledRule {
        min_len: SAMPLED_MIN_LEN,
        stride: SAMPLE_STRIDE,
        slack: SAMPLED_TOP_K_SLACK,
    };
    let (selected, _) = plan::sampled_top_k(&mut steps, x.len(), k, ratio, rule)?;
    Ok(selected)
}

/// Sampled top-k's steps on the device, as [`plan::sampled_top_k`]
/// sequences them.
struct SampledOnDevice<'x> {
    x: &'x CudaStorage,
    sample: Option<CudaStorage>,
    scratch: &'x mut DeviceSelectScratch,
}

impl plan::SampledSteps for SampledOnDevice<'_> {
    type Selected = DeviceSparse;
    type Error = CompressError;

    fn exact(&mut self, k: usize) -> Result<DeviceSparse> {
        top_k_finite(self.x, k, self.scratch)
    }

    fn sample(&mut self, stride: usize) -> Result<usize> {
        let sample = select::sample_strided(self.x, stride)?;
        let len = sample.len();
        self.sample = Some(sample);
        Ok(len)
    }

    fn survivors(&mut self, take: usize) -> Result<(DeviceSparse, usize)> {
        let sample = self.sample.as_ref().ok_or_else(|| {
            CompressError::InvalidArgument(
                "sampled top-k: survivors asked before the sample".into(),
            )
        })?;
        // The sample's take-th largest key, every entry at least as large.
        let mut estimate = select::kth_largest(sample, take, self.scratch)?;
        estimate.keep_all_ties()?;
        let survivors = apply(self.x, estimate, None, self.x.len(), self.scratch)?;
        let count = survivors.nnz();
        Ok((survivors, count))
    }

    fn best_among(&mut self, survivors: DeviceSparse, k: usize) -> Result<DeviceSparse> {
        let best = select::kth_largest(survivors.values(), k, self.scratch)?;
        apply(
            survivors.values(),
            best,
            Some(&survivors),
            self.x.len(),
            self.scratch,
        )
    }
}

/// The cast codec's `encode` ([`crate::cast::encode`]): `dst =
/// round(clamp(src) * scale)` from f32 into f16, bf16 or f32.
pub fn encode(src: &CudaStorage, dst: &mut CudaStorage, opts: &CastOptions) -> Result<()> {
    opts.validate()?;
    Ok(feedback::encode_cast(src, dst, opts.clip, opts.scale)?)
}

/// `dense += sparse` (f32 `dense`), as [`crate::SparseVec::scatter_add`].
pub fn scatter_add(sparse: &DeviceSparse, dense: &mut CudaStorage) -> Result<()> {
    Ok(feedback::scatter_add(dense, sparse)?)
}

/// A sparse codec's selection, its parameters checked.
enum Select {
    Threshold(f32),
    TopK(usize),
    Sampled(f64, usize),
}

impl Select {
    /// `codec`'s selection from `n` elements; random-k is refused (its
    /// draw is the CPU's).
    fn checked(codec: &SparseCodec, n: usize) -> Result<Select> {
        Ok(match *codec {
            SparseCodec::Threshold(t) => {
                check_threshold(t)?;
                Select::Threshold(t)
            }
            SparseCodec::TopK(ratio) => Select::TopK(count_for_ratio(ratio, n)?),
            SparseCodec::SampledTopK(ratio) => Select::Sampled(ratio, count_for_ratio(ratio, n)?),
            SparseCodec::RandomK { .. } => {
                return Err(CompressError::InvalidArgument(
                    "random-k has no device form: its draw is the CPU's".into(),
                ));
            }
        })
    }

    /// The selection from `x`, which is finite.
    fn run(self, x: &CudaStorage, scratch: &mut DeviceSelectScratch) -> Result<DeviceSparse> {
        match self {
            Select::Threshold(t) => threshold_finite(x, t, scratch),
            Select::TopK(k) => top_k_finite(x, k, scratch),
            Select::Sampled(ratio, k) => sampled_top_k_finite(x, ratio, k, scratch),
        }
    }
}

/// Kept device room for sparse lists that arrive in host memory (the
/// payloads a sparse exchange gathers): each list is checked as the wire
/// format checks a payload, copied into the room (grown to the longest
/// list seen) and added into a dense device buffer, so that a steady
/// exchange allocates nothing for them.
#[derive(Debug, Default)]
pub struct SparseStaging {
    indices: Option<DeviceVec<u32>>,
    values: Option<CudaStorage>,
    /// A payload's indices and values decoded on the host, kept too.
    host_indices: Vec<u32>,
    host_values: Vec<f32>,
}

impl SparseStaging {
    /// [`SparseStaging::scatter_add`] of a decoded wire payload (its
    /// values widened to f32), decoded into host vectors kept as well.
    pub fn scatter_add_payload(
        &mut self,
        payload: &wire::Payload<'_>,
        dense: &mut CudaStorage,
    ) -> Result<()> {
        let mut indices = std::mem::take(&mut self.host_indices);
        let mut values = std::mem::take(&mut self.host_values);
        indices.clear();
        indices.extend(payload.indices());
        values.clear();
        values.extend(payload.values_f32());
        let added = self.scatter_add(&indices, &values, dense);
        (self.host_indices, self.host_values) = (indices, values);
        added
    }

    /// `dense[indices[j]] += values[j]` (f32 `dense`), bitwise the CPU's
    /// [`crate::SparseVec::scatter_add`]. Indices must be strictly
    /// increasing and below `dense.len()`, with one value each.
    pub fn scatter_add(
        &mut self,
        indices: &[u32],
        values: &[f32],
        dense: &mut CudaStorage,
    ) -> Result<()> {
        const OP: &str = "SparseStaging::scatter_add";
        kernels::select::check_host_list(OP, dense.len(), indices, values.len())?;
        let count = indices.len();
        if count == 0 {
            return Ok(());
        }
        // Room grows to powers of two (a list that lengthens from step to
        // step, as a threshold's under error feedback, grows it a few
        // times, not every step), never past the dense length.
        let room = count.next_power_of_two().min(dense.len());
        let ordinal = dense.ordinal();
        let holds = |len: usize, at: usize| len >= count && at == ordinal;
        if !self
            .indices
            .as_ref()
            .is_some_and(|v| holds(v.len(), v.ordinal()))
        {
            self.indices = Some(DeviceVec::zeros(dense.device(), room)?);
        }
        if !self
            .values
            .as_ref()
            .is_some_and(|v| holds(v.len(), v.ordinal()))
        {
            self.values = Some(CudaStorage::alloc_zeros(room, DType::F32, ordinal)?);
        }
        let (Some(room_indices), Some(room_values)) = (self.indices.as_mut(), self.values.as_mut())
        else {
            return Err(CompressError::InvalidArgument(
                "the staging room went missing".into(),
            ));
        };
        room_indices.write_from_host(0, indices)?;
        room_values.write_f32(0, values)?;
        Ok(feedback::scatter_add_first(
            dense,
            room_indices,
            room_values,
            count,
        )?)
    }
}

/// [`ErrorFeedback`] with its memory in device memory: the same steps,
/// giving the same selections and residuals bitwise.
#[derive(Debug, Clone)]
pub struct CudaErrorFeedback {
    residual: CudaStorage,
    momentum: Option<(f32, CudaStorage)>,
    steps: u64,
}

impl CudaErrorFeedback {
    /// A zero memory of `len` elements on CUDA device `ordinal`.
    pub fn new(len: usize, ordinal: usize) -> Result<CudaErrorFeedback> {
        CudaErrorFeedback::from_state(ErrorFeedback::new(len).state(), ordinal)
    }

    /// With DGC's momentum correction (`mu` in `[0, 1)`).
    pub fn with_momentum(len: usize, mu: f32, ordinal: usize) -> Result<CudaErrorFeedback> {
        CudaErrorFeedback::from_state(ErrorFeedback::with_momentum(len, mu)?.state(), ordinal)
    }

    /// A memory restored from `state` (validated as
    /// [`ErrorFeedback::from_state`]) onto device `ordinal`.
    pub fn from_state(state: ErrorFeedbackState, ordinal: usize) -> Result<CudaErrorFeedback> {
        let checked = ErrorFeedback::from_state(state)?.state();
        let residual = CudaStorage::from_cpu(&CpuStorage::F32(checked.residual), ordinal)?;
        let momentum = match checked.momentum {
            None => None,
            Some((mu, velocity)) => Some((
                mu,
                CudaStorage::from_cpu(&CpuStorage::F32(velocity), ordinal)?,
            )),
        };
        Ok(CudaErrorFeedback {
            residual,
            momentum,
            steps: checked.steps,
        })
    }

    /// Makes this memory a copy of `other` (residual, velocity, steps).
    /// Where the two are alike (length, device, momentum or none) the
    /// values are copied on the device into the buffers this memory
    /// already has, so a copy kept from step to step (a strategy's memory
    /// from before the step) allocates nothing; otherwise this becomes a
    /// clone of `other` (which shares its buffers until either is written).
    pub fn copy_from(&mut self, other: &CudaErrorFeedback) -> Result<()> {
        let same_place =
            |a: &CudaStorage, b: &CudaStorage| a.len() == b.len() && a.ordinal() == b.ordinal();
        let alike = same_place(&self.residual, &other.residual)
            && match (&self.momentum, &other.momentum) {
                (None, None) => true,
                (Some((_, a)), Some((_, b))) => same_place(a, b),
                _ => false,
            };
        if !alike {
            *self = other.clone();
            return Ok(());
        }
        self.residual.copy_from(&other.residual)?;
        if let (Some((mu, velocity)), Some((other_mu, other_velocity))) =
            (&mut self.momentum, &other.momentum)
        {
            *mu = *other_mu;
            velocity.copy_from(other_velocity)?;
        }
        self.steps = other.steps;
        Ok(())
    }

    /// The memory copied to the host, as [`ErrorFeedback::state`] gives it.
    pub fn state(&self) -> Result<ErrorFeedbackState> {
        let host = |s: &CudaStorage| s.read_f32(0..s.len());
        Ok(ErrorFeedbackState {
            residual: host(&self.residual)?,
            momentum: match &self.momentum {
                None => None,
                Some((mu, velocity)) => Some((*mu, host(velocity)?)),
            },
            steps: self.steps,
        })
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.residual.len()
    }

    /// Whether the memory has no elements.
    pub fn is_empty(&self) -> bool {
        self.residual.is_empty()
    }

    /// The residual, on the device.
    pub fn residual(&self) -> &CudaStorage {
        &self.residual
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Zeroes the memory (residual and velocity).
    pub fn reset(&mut self) -> Result<()> {
        self.residual.zero_fill()?;
        if let Some((_, velocity)) = &mut self.momentum {
            velocity.zero_fill()?;
        }
        Ok(())
    }

    /// Adds the whole residual into `dense` (f32, same length) and zeroes
    /// the memory ([`ErrorFeedback::flush_into`]).
    pub fn flush_into(&mut self, dense: &mut CudaStorage) -> Result<()> {
        if dense.len() != self.len() {
            return Err(CompressError::LengthMismatch {
                op: "CudaErrorFeedback::flush_into",
                expected: self.len(),
                got: dense.len(),
            });
        }
        dense.add(&self.residual)?;
        self.reset()
    }

    /// Adds `grad` (refusing non-finite input; resetting the memory and
    /// reporting the first overflowed entry on overflow), as the CPU does.
    fn accumulate(&mut self, grad: &CudaStorage, scratch: &mut DeviceSelectScratch) -> Result<()> {
        if grad.len() != self.len() {
            return Err(CompressError::LengthMismatch {
                op: "CudaErrorFeedback",
                expected: self.len(),
                got: grad.len(),
            });
        }
        refuse_non_finite(grad, scratch)?;
        let momentum = self.momentum.as_mut().map(|(mu, v)| (v, *mu));
        if let Some(index) = feedback::accumulate(&mut self.residual, grad, momentum, scratch)? {
            let value = value_at(&self.residual, index)?;
            self.reset()?;
            return Err(CompressError::NonFinite { index, value });
        }
        Ok(())
    }

    /// One step with a sparse codec ([`ErrorFeedback::compress`]):
    /// accumulates `grad` (f32, on the memory's device), selects, and keeps
    /// what was not selected. Returns what to send, on the device.
    /// [`SparseCodec::RandomK`] is refused before anything changes.
    pub fn compress(&mut self, grad: &CudaStorage, codec: &SparseCodec) -> Result<DeviceSparse> {
        self.compress_with(grad, codec, &mut DeviceSelectScratch::default())
    }

    /// [`CudaErrorFeedback::compress`] with the selection's working memory
    /// in `scratch`, kept by the caller from step to step.
    pub fn compress_with(
        &mut self,
        grad: &CudaStorage,
        codec: &SparseCodec,
        scratch: &mut DeviceSelectScratch,
    ) -> Result<DeviceSparse> {
        // The codec's parameters are checked before the memory changes.
        let n = self.len();
        check_dense_len(n)?;
        let select = Select::checked(codec, n)?;
        self.accumulate(grad, scratch)?;
        // The residual is finite now (an overflow was reset and refused).
        let sent = select.run(&self.residual, scratch)?;
        let velocity = self.momentum.as_mut().map(|(_, v)| v);
        feedback::zero_selected(&mut self.residual, velocity, &sent)?;
        self.steps += 1;
        Ok(sent)
    }

    /// One step with a cast ([`ErrorFeedback::compress_cast`]): accumulates
    /// `grad`, rounds the accumulator into `dst` (f16, bf16 or f32, per
    /// `opts`) and keeps the rounding error for the next step.
    pub fn compress_cast(
        &mut self,
        grad: &CudaStorage,
        dst: &mut CudaStorage,
        opts: &CastOptions,
    ) -> Result<()> {
        if dst.len() != self.len() {
            return Err(CompressError::LengthMismatch {
                op: "CudaErrorFeedback::compress_cast",
                expected: self.len(),
                got: dst.len(),
            });
        }
        if dst.ordinal() != self.residual.ordinal() {
            return Err(TensorError::DeviceMismatch {
                op: "CudaErrorFeedback::compress_cast",
                expected: gradwire_tensor::Device::Cuda(self.residual.ordinal()),
                got: gradwire_tensor::Device::Cuda(dst.ordinal()),
            }
            .into());
        }
        opts.validate()?;
        self.accumulate(grad, &mut DeviceSelectScratch::default())?;
        if dst.dtype() == DType::F32 {
            // `acc -= sent * (1 / scale)`: the axpy's `acc + (-inverse) *
            // sent` is the same f32 value.
            feedback::encode_cast(&self.residual, dst, opts.clip, opts.scale)?;
            self.residual.axpy(-(1.0 / opts.scale), dst)?;
        } else {
            feedback::feedback_cast(&mut self.residual, dst, opts.clip, opts.scale)?;
        }
        self.steps += 1;
        Ok(())
    }
}
