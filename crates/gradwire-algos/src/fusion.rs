//! The fusion buffers the dense, half-precision and sparse strategies pack
//! a bucket's tensors into and put on the wire, reused from step to step,
//! and the packing they share.

use crate::error::{AlgoError, Result};
use gradwire_comm::Gathered;
use gradwire_compress::{SelectScratch, SparseVec};
use gradwire_tensor::{DType, Tensor, flat};
use half::{bf16, f16};

/// SINGA's default fusion buffer capacity (`buffSize`), in elements.
pub const DEFAULT_FUSION_CAPACITY: usize = 4_194_304;

/// The list's element count, refused when it exceeds `capacity`.
pub(crate) fn check_capacity(tensors: &[Tensor], capacity: usize) -> Result<usize> {
    let needed = tensors.iter().map(Tensor::len).sum();
    if needed > capacity {
        return Err(AlgoError::Capacity { needed, capacity });
    }
    Ok(needed)
}

/// The one dtype of a list, or f32 for a mixed (or empty) list.
pub(crate) fn common_dtype(tensors: &[Tensor]) -> DType {
    match tensors.split_first() {
        Some((first, rest)) if rest.iter().all(|t| t.dtype() == first.dtype()) => first.dtype(),
        _ => DType::F32,
    }
}

/// Packs the list into one flat buffer of `dtype`.
pub(crate) fn pack(tensors: &[Tensor], dtype: DType) -> Result<(Tensor, flat::FlatLayout)> {
    let refs: Vec<&Tensor> = tensors.iter().collect();
    Ok(flat::pack_new(&refs, dtype)?)
}

/// Unpacks `buffer`, laid out as `layout`, into the list.
pub(crate) fn unpack(
    buffer: &Tensor,
    layout: &flat::FlatLayout,
    tensors: &mut [Tensor],
) -> Result<()> {
    let mut outs: Vec<&mut Tensor> = tensors.iter_mut().collect();
    Ok(flat::unpack(buffer, layout, &mut outs)?)
}

/// The buffers the fused strategies pack into and put on the wire, kept by
/// a caller that runs them every step (DistOpt keeps one per bucket): they
/// grow to the largest size seen and are reused, so the steady state
/// allocates nothing for them. `Default` is empty.
#[derive(Debug, Default)]
pub struct FusionBuffers {
    pub(crate) f32: Vec<f32>,
    pub(crate) f16: Vec<f16>,
    pub(crate) bf16: Vec<bf16>,
    /// The sparse exchange's own buffers.
    pub(crate) sparse: SparseBuffers,
    /// The device buffers of CUDA buckets on a communicator that takes
    /// device tensors.
    #[cfg(feature = "cuda")]
    pub(crate) device: crate::device::DeviceFusion,
}

/// What [`crate::sparse_exchange_with`] reuses beyond the f32 fusion buffer.
#[derive(Debug, Default)]
pub(crate) struct SparseBuffers {
    /// This rank's selection.
    pub(crate) selected: SparseVec,
    /// The selectors' working memory.
    pub(crate) scratch: SelectScratch,
    /// The encoded selection.
    pub(crate) payload: Vec<u8>,
    /// Every rank's payload.
    pub(crate) gathered: Gathered<u8>,
    /// The values of a shared selection (random-k), summed.
    pub(crate) kept: Vec<f32>,
}

/// Whether every tensor is in CPU memory (the reused buffers' path).
pub(crate) fn all_on_cpu(tensors: &[Tensor]) -> bool {
    tensors.iter().all(|t| t.device().is_cpu())
}

/// The tensors' values as they lie, one f32 slice each, in order, for a
/// codec that reads a bucket part by part instead of packed: `None` unless
/// every tensor is f32 in host memory and not zeroed (a zeroed tensor's
/// values would be made, and allocated, to be read).
pub(crate) fn host_f32_parts(tensors: &[Tensor]) -> Option<impl Iterator<Item = &[f32]> + Clone> {
    let direct = tensors
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == DType::F32 && !t.is_zeroed());
    // Every slice is there then; one that were not would shorten the parts,
    // which their consumers refuse as a length mismatch.
    direct.then(|| tensors.iter().filter_map(|t| t.as_slice::<f32>().ok()))
}
