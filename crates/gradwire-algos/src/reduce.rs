//! SINGA's DistOpt primitives over any [`Communicator`]: all-reduce of one
//! tensor, fused all-reduce of a list through one buffer, half-precision
//! all-reduce, and sparse all-reduce with optional error feedback.
//!
//! Each comes twice: a blocking form that works in place on `&mut [Tensor]`
//! (call it from any thread that owns the communicator, or from a job on the
//! communication thread), and an `_async` form that moves the tensors to the
//! communication thread ([`Communicator::run_async`]) and returns a
//! [`Handle`], so that communication overlaps the rest of backward.
//!
//! Each keeps the failure model ([`crate::fault`]): whatever can fail on one
//! rank (a capacity, a dtype, a device, a NaN refused by a codec) is checked
//! before the first collective, and a rank that fails posts the fault in
//! place of that collective, so every rank returns an error from the same
//! call and the next one works.

use crate::error::{AlgoError, Result};
use crate::fault::prepare;
use crate::handle::{Handle, Reduced, Traffic};
use gradwire_comm::{Communicator, Gathered, ReduceOp};
use gradwire_compress::cast::{self, CastOptions};
use gradwire_compress::{ErrorFeedback, SelectScratch, SparseCodec, SparseVec, wire};
use gradwire_tensor::{DType, Tensor, WithDType, flat};
use half::{bf16, f16};

/// SINGA's default fusion buffer capacity (`buffSize`), in elements.
pub const DEFAULT_FUSION_CAPACITY: usize = 4_194_304;

/// All-reduces one tensor in place, in its own dtype (f16 and bf16 are
/// accumulated in f32 by the backend).
pub fn all_reduce<C: Communicator>(comm: &C, tensor: &mut Tensor, op: ReduceOp) -> Result<Traffic> {
    comm.all_reduce_tensor(tensor, op)?;
    let bytes = tensor.len() * tensor.dtype().size_in_bytes();
    Ok(Traffic::all_reduce(bytes, comm.world_size()))
}

pub(crate) fn check_capacity(tensors: &[Tensor], capacity: usize) -> Result<usize> {
    let needed = tensors.iter().map(Tensor::len).sum();
    if needed > capacity {
        return Err(AlgoError::Capacity { needed, capacity });
    }
    Ok(needed)
}

/// The one dtype of a list, or f32 for a mixed (or empty) list.
fn common_dtype(tensors: &[Tensor]) -> DType {
    match tensors.split_first() {
        Some((first, rest)) if rest.iter().all(|t| t.dtype() == first.dtype()) => first.dtype(),
        _ => DType::F32,
    }
}

/// Packs the list into one flat buffer of `dtype`.
fn pack(tensors: &[Tensor], dtype: DType) -> Result<(Tensor, flat::FlatLayout)> {
    let refs: Vec<&Tensor> = tensors.iter().collect();
    Ok(flat::pack_new(&refs, dtype)?)
}

fn unpack(buffer: &Tensor, layout: &flat::FlatLayout, tensors: &mut [Tensor]) -> Result<()> {
    let mut outs: Vec<&mut Tensor> = tensors.iter_mut().collect();
    Ok(flat::unpack(buffer, layout, &mut outs)?)
}

/// The buffers the fused strategies pack into and put on the wire, kept by
/// a caller that runs them every step (DistOpt keeps one per bucket): they
/// grow to the largest size seen and are reused, so the steady state
/// allocates nothing for them. `Default` is empty.
#[derive(Debug, Default)]
pub struct FusionBuffers {
    f32: Vec<f32>,
    f16: Vec<f16>,
    bf16: Vec<bf16>,
    /// The sparse exchange's own buffers.
    sparse: SparseBuffers,
    /// The device buffers of CUDA buckets on a communicator that takes
    /// device tensors.
    #[cfg(feature = "cuda")]
    pub(crate) device: crate::device::DeviceFusion,
}

/// What [`sparse_exchange_with`] reuses beyond the f32 fusion buffer.
#[derive(Debug, Default)]
struct SparseBuffers {
    /// This rank's selection.
    selected: SparseVec,
    /// The selectors' working memory.
    scratch: SelectScratch,
    /// The encoded selection.
    payload: Vec<u8>,
    /// Every rank's payload.
    gathered: Gathered<u8>,
    /// The values of a shared selection (random-k), summed.
    kept: Vec<f32>,
}

/// Whether every tensor is in CPU memory (the reused buffers' path).
fn all_on_cpu(tensors: &[Tensor]) -> bool {
    tensors.iter().all(|t| t.device().is_cpu())
}

/// All-reduces a list of tensors through one fusion buffer of at most
/// `capacity` elements (SINGA's `fused_all_reduce`, checked instead of
/// overflowing): one collective instead of one per tensor. The buffer has the
/// list's dtype (f32 if the list mixes dtypes).
pub fn fused_all_reduce<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    op: ReduceOp,
    capacity: usize,
) -> Result<Traffic> {
    fused_all_reduce_with(comm, tensors, op, capacity, &mut FusionBuffers::default())
}

/// [`fused_all_reduce`] through `buffers`, reused from call to call: CPU
/// tensors through host buffers; CUDA tensors on a communicator that takes
/// device tensors (with the `cuda` feature) through a device buffer (on
/// another communicator, a buffer of their own each call). The same result,
/// bit for bit.
pub fn fused_all_reduce_with<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    op: ReduceOp,
    capacity: usize,
    buffers: &mut FusionBuffers,
) -> Result<Traffic> {
    if tensors.len() > 1 && all_on_cpu(tensors) {
        let dtype = common_dtype(tensors);
        let n = prepare(comm, || {
            check_capacity(tensors, capacity)?;
            Ok(match dtype {
                DType::F32 => flat::pack_into(tensors, &mut buffers.f32)?,
                DType::F16 => flat::pack_into(tensors, &mut buffers.f16)?,
                DType::BF16 => flat::pack_into(tensors, &mut buffers.bf16)?,
            })
        })?;
        match dtype {
            DType::F32 => reduce_packed(comm, &mut buffers.f32[..n], op, tensors)?,
            DType::F16 => reduce_packed(comm, &mut buffers.f16[..n], op, tensors)?,
            DType::BF16 => reduce_packed(comm, &mut buffers.bf16[..n], op, tensors)?,
        }
        return Ok(Traffic::all_reduce(
            n * dtype.size_in_bytes(),
            comm.world_size(),
        ));
    }
    #[cfg(feature = "cuda")]
    if tensors.len() > 1 && comm.takes_device_tensors() {
        let dtype = common_dtype(tensors);
        return crate::device::fused_all_reduce(
            comm,
            tensors,
            op,
            dtype,
            capacity,
            &mut buffers.device,
        );
    }
    let packed = prepare(comm, || {
        check_capacity(tensors, capacity)?;
        match tensors {
            [_] => Ok(None),
            _ => pack(tensors, common_dtype(tensors)).map(Some),
        }
    })?;
    let Some((mut buffer, layout)) = packed else {
        return all_reduce(comm, &mut tensors[0], op);
    };
    let traffic = all_reduce(comm, &mut buffer, op)?;
    unpack(&buffer, &layout, tensors)?;
    Ok(traffic)
}

/// The all-reduce of a packed buffer, unpacked into `tensors`.
fn reduce_packed<C: Communicator, D: WithDType + gradwire_comm::Element>(
    comm: &C,
    packed: &mut [D],
    op: ReduceOp,
    tensors: &mut [Tensor],
) -> Result<()> {
    comm.all_reduce(packed, op)?;
    Ok(flat::unpack_from(packed, tensors)?)
}

/// The precision on the wire of [`half_all_reduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfPrecision {
    /// IEEE half precision (range 65504; use `Avg` or a clip for large sums).
    F16,
    /// bfloat16 (f32's range, 8 bits of mantissa).
    BF16,
}

/// Options of [`half_all_reduce`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HalfOptions {
    /// The wire precision.
    pub precision: HalfPrecision,
    /// Clamp every gradient to `[-clip, clip]` first (SINGA's clipping); the
    /// clamped values are what is reduced, and so what the update uses.
    pub clip: Option<f32>,
    /// `Sum` or `Avg`. The sum is accumulated in f32 either way and rounded
    /// once; `Avg` divides before that rounding, so an average of values that
    /// fit f16 cannot overflow (SINGA's fp16 sum overflowed past 65504).
    pub op: ReduceOp,
}

/// All-reduces a list of tensors with f16 or bf16 on the wire (SINGA's
/// `backward_and_update_half` collective), fused through one buffer of at
/// most `capacity` elements.
pub fn half_all_reduce<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    options: &HalfOptions,
    capacity: usize,
) -> Result<Traffic> {
    half_all_reduce_with(
        comm,
        tensors,
        options,
        capacity,
        &mut FusionBuffers::default(),
    )
}

/// [`half_all_reduce`] through `buffers` (the f32 fusion buffer and the
/// wire buffer), reused from call to call: the same result, bit for bit.
/// CUDA tensors on a communicator that takes device tensors (NcclComm, with
/// the `cuda` feature) stay on the device: packed, encoded, reduced and
/// decoded there, in buffers kept in `buffers` too.
pub fn half_all_reduce_with<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    options: &HalfOptions,
    capacity: usize,
    buffers: &mut FusionBuffers,
) -> Result<Traffic> {
    #[cfg(feature = "cuda")]
    if !all_on_cpu(tensors) && comm.takes_device_tensors() {
        return crate::device::half_all_reduce(
            comm,
            tensors,
            options,
            capacity,
            &mut buffers.device,
        );
    }
    let FusionBuffers { f32, f16, bf16, .. } = buffers;
    match options.precision {
        HalfPrecision::F16 => half_all_reduce_as(comm, tensors, options, capacity, f32, f16),
        HalfPrecision::BF16 => half_all_reduce_as(comm, tensors, options, capacity, f32, bf16),
    }
}

/// [`half_all_reduce`] with `H` on the wire: every tensor packed into
/// `flat` as f32 (CPU tensors; device tensors are copied out), encoded into
/// `wire`, all-reduced, decoded and unpacked.
fn half_all_reduce_as<C: Communicator, H: WithDType + gradwire_comm::Element>(
    comm: &C,
    tensors: &mut [Tensor],
    options: &HalfOptions,
    capacity: usize,
    flat_buf: &mut Vec<f32>,
    wire: &mut Vec<H>,
) -> Result<Traffic> {
    let cast_options = CastOptions {
        clip: options.clip,
        scale: 1.0,
    };
    let on_cpu = all_on_cpu(tensors);
    let (n, layout) = prepare(comm, || {
        let n = check_capacity(tensors, capacity)?;
        let layout = if on_cpu {
            flat::pack_into(tensors, flat_buf)?;
            None
        } else {
            let (buffer, layout) = pack(tensors, DType::F32)?;
            flat_buf.clear();
            flat_buf.extend_from_slice(buffer.as_slice::<f32>()?);
            Some(layout)
        };
        if wire.len() < n {
            wire.resize(n, H::zeroed());
        }
        cast::encode(&flat_buf[..n], &mut wire[..n], &cast_options)?;
        Ok((n, layout))
    })?;
    comm.all_reduce(&mut wire[..n], options.op)?;
    cast::decode(&wire[..n], &mut flat_buf[..n])?;
    match layout {
        None => flat::unpack_from(&flat_buf[..n], tensors)?,
        Some(layout) => {
            let buffer = Tensor::from_vec(flat_buf[..n].to_vec(), n)?;
            unpack(&buffer, &layout, tensors)?;
        }
    }
    Ok(Traffic::all_reduce(
        n * H::DTYPE.size_in_bytes(),
        comm.world_size(),
    ))
}

/// Sums a list of tensors across ranks, each rank sending only what `codec`
/// selects from its flattened list (SINGA's `sparsification` and
/// `fused_sparsification`), with error feedback when `feedback` is given (it
/// must have as many elements as the list).
///
/// Each rank encodes its selection in the validated wire format; the payloads
/// are exchanged with the variable-length all-gather and added, in rank order,
/// into a dense buffer of zeros (so the result is bitwise the same on every
/// rank). If exchanging the largest selection of any rank would cost more
/// than a dense all-reduce ([`sparse_costs_more`]: the all-gather's bytes
/// grow with the world size; one small max all-reduce decides, the same on
/// every rank), every rank sends its whole accumulator dense instead and the
/// residual is flushed: nothing is lost and no rank runs out of memory on an
/// all-gather. When every rank selected the same indices (random-k from a
/// shared seed: the same vote finds it out), only the values travel, summed
/// by an all-reduce of `k` entries.
///
/// The result is the sum, not the average. If the operation fails (on any
/// rank: a NaN refused by the codec on one rank fails it everywhere, see
/// [`crate::fault`]), `feedback` is as it was before the call.
pub fn sparse_all_reduce<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    codec: &SparseCodec,
    feedback: Option<&mut ErrorFeedback>,
) -> Result<Traffic> {
    match feedback {
        None => sparse_exchange(comm, tensors, codec, None),
        Some(memory) => {
            let before = memory.clone();
            let result = sparse_exchange(comm, tensors, codec, Some(memory));
            if result.is_err() {
                *memory = before;
            }
            result
        }
    }
}

/// [`sparse_all_reduce`] without its copy of the feedback memory: if the
/// operation fails, `feedback` may hold this step's gradient. For callers
/// that keep a copy of their own anyway (DistOpt keeps the memory as it was
/// before the step, to put back when any bucket of the step fails), so the
/// hot path copies the memory once, not twice.
pub fn sparse_exchange<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    codec: &SparseCodec,
    feedback: Option<&mut ErrorFeedback>,
) -> Result<Traffic> {
    sparse_exchange_with(
        comm,
        tensors,
        codec,
        feedback,
        &mut FusionBuffers::default(),
    )
}

/// [`sparse_exchange`] through `buffers` (the f32 fusion buffer, the
/// selection and its scratch, the payload, the gathered payloads), reused
/// from call to call: the same result, bit for bit, and no allocation once
/// they have grown (on a backend whose collectives allocate none, such as
/// LocalComm). CPU tensors only: a tensor elsewhere is an
/// [`AlgoError::Tensor`] on every rank.
pub fn sparse_exchange_with<C: Communicator>(
    comm: &C,
    tensors: &mut [Tensor],
    codec: &SparseCodec,
    mut feedback: Option<&mut ErrorFeedback>,
    buffers: &mut FusionBuffers,
) -> Result<Traffic> {
    let FusionBuffers {
        f32: flat_buf,
        sparse,
        ..
    } = buffers;
    let SparseBuffers {
        selected,
        scratch,
        payload,
        gathered,
        kept,
    } = sparse;
    let n = prepare(comm, || {
        let n = flat::pack_into(tensors, flat_buf)?;
        let values = &flat_buf[..n];
        match feedback.as_deref_mut() {
            Some(memory) => memory.compress_into(values, codec, selected, scratch)?,
            None => codec.select_into(values, selected, scratch)?,
        }
        Ok(n)
    })?;
    let values = &mut flat_buf[..n];
    let world = comm.world_size();
    // One vote decides, the same on every rank: the largest selection, and
    // (random-k) whether every rank selected the same indices, as the
    // maximum and the minimum of their fingerprint.
    let fingerprint = match codec {
        SparseCodec::RandomK { .. } => index_fingerprint(selected.indices()),
        _ => 0,
    };
    let mut vote = [selected.nnz() as u64, fingerprint, !fingerprint];
    comm.all_reduce(&mut vote, ReduceOp::Max)?;
    let vote_traffic = Traffic::all_reduce(8 * vote.len(), world);
    let largest = usize::try_from(vote[0]).unwrap_or(usize::MAX);
    let shared_indices = matches!(codec, SparseCodec::RandomK { .. }) && vote[1] == !vote[2];
    if shared_indices && world > 1 {
        // Every rank kept the same indices (random-k from a shared seed):
        // the values alone are summed, by a dense all-reduce of k entries.
        kept.clear();
        kept.extend_from_slice(selected.values());
        comm.all_reduce(kept, ReduceOp::Sum)?;
        values.fill(0.0);
        for (&i, &v) in selected.indices().iter().zip(kept.iter()) {
            values[i as usize] = v;
        }
        flat::unpack_from(values, tensors)?;
        return Ok(vote_traffic + Traffic::all_reduce(kept.len() * 4, world));
    }
    if sparse_costs_more(largest, n, world) {
        // Dense: what was selected plus what the memory still holds is the
        // whole accumulator (without feedback: the gradient itself).
        if let Some(memory) = feedback {
            values.fill(0.0);
            for (&i, &v) in selected.indices().iter().zip(selected.values()) {
                values[i as usize] = v;
            }
            memory.flush_into(values)?;
        }
        comm.all_reduce(values, ReduceOp::Sum)?;
        flat::unpack_from(values, tensors)?;
        return Ok(vote_traffic + Traffic::all_reduce(n * 4, world));
    }
    wire::encode_into(selected, codec.wire_id(), DType::F32, payload);
    comm.all_gather_varied_into(payload, gathered)?;
    values.fill(0.0);
    for rank in 0..world {
        wire::scatter_add(gathered.part(rank), values)?;
    }
    flat::unpack_from(values, tensors)?;
    Ok(vote_traffic + Traffic::all_gather(payload.len(), gathered.data().len(), world))
}

/// Whether exchanging selections of at most `largest` of `n` f32 entries
/// would cost more than a dense all-reduce of all `n`, on `world` ranks.
///
/// The all-gather delivers the other `world - 1` payloads to every rank
/// (and holds all `world` of them), while a ring all-reduce moves
/// `2 (world - 1) / world` of the dense buffer: sparse wins only while
/// `world * payload < 2 * dense` (about `1 / world` density once indices
/// count), which also bounds the gathered payloads to two dense buffers of
/// memory. On one rank nothing moves, and the payload alone is compared
/// with the dense buffer. Exact integer arithmetic.
pub fn sparse_costs_more(largest: usize, n: usize, world: usize) -> bool {
    let payload = wire::encoded_len(largest, DType::F32) as u128;
    let dense = n as u128 * 4;
    if world <= 1 {
        return payload > dense;
    }
    world as u128 * payload >= 2 * dense
}

/// A fingerprint of a selection's indices (FNV-1a over their bytes, with
/// the count): equal selections have equal fingerprints.
fn index_fingerprint(indices: &[u32]) -> u64 {
    use std::hash::Hasher;
    let mut hash = fnv::FnvHasher::default();
    hash.write_u64(indices.len() as u64);
    for i in indices {
        hash.write(&i.to_le_bytes());
    }
    hash.finish()
}

/// [`all_reduce`] on the communication thread.
pub fn all_reduce_async<C: Communicator>(
    comm: &C,
    mut tensor: Tensor,
    op: ReduceOp,
) -> Result<Handle<Tensor>> {
    let pending = comm.run_async(move |comm| {
        Ok(all_reduce(comm, &mut tensor, op).map(|traffic| Reduced {
            value: tensor,
            traffic,
        }))
    })?;
    Ok(Handle::from_pending(pending))
}

/// [`fused_all_reduce`] on the communication thread.
pub fn fused_all_reduce_async<C: Communicator>(
    comm: &C,
    mut tensors: Vec<Tensor>,
    op: ReduceOp,
    capacity: usize,
) -> Result<Handle<Vec<Tensor>>> {
    let pending = comm.run_async(move |comm| {
        Ok(
            fused_all_reduce(comm, &mut tensors, op, capacity).map(|traffic| Reduced {
                value: tensors,
                traffic,
            }),
        )
    })?;
    Ok(Handle::from_pending(pending))
}

/// [`half_all_reduce`] on the communication thread.
pub fn half_all_reduce_async<C: Communicator>(
    comm: &C,
    mut tensors: Vec<Tensor>,
    options: HalfOptions,
    capacity: usize,
) -> Result<Handle<Vec<Tensor>>> {
    let pending = comm.run_async(move |comm| {
        Ok(
            half_all_reduce(comm, &mut tensors, &options, capacity).map(|traffic| Reduced {
                value: tensors,
                traffic,
            }),
        )
    })?;
    Ok(Handle::from_pending(pending))
}

/// [`sparse_all_reduce`] on the communication thread; the error-feedback
/// memory travels with the job and comes back with the result.
pub fn sparse_all_reduce_async<C: Communicator>(
    comm: &C,
    mut tensors: Vec<Tensor>,
    codec: SparseCodec,
    mut feedback: Option<ErrorFeedback>,
) -> Result<Handle<(Vec<Tensor>, Option<ErrorFeedback>)>> {
    let pending = comm.run_async(move |comm| {
        Ok(
            sparse_all_reduce(comm, &mut tensors, &codec, feedback.as_mut()).map(|traffic| {
                Reduced {
                    value: (tensors, feedback),
                    traffic,
                }
            }),
        )
    })?;
    Ok(Handle::from_pending(pending))
}
