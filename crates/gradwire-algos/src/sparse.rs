//! The sparse strategy (SINGA's `sparsification`, done right): each rank
//! sends what its codec selects, with error feedback when asked, and a
//! selection not sparse enough for the world size travels dense;
//! blocking, on the communication thread (`_async`), and [`SparseSelect`],
//! a bucket's sum as a [`Strategy`] whose residual a failed or skipped step
//! puts back. Buckets of CUDA tensors select and keep their residual on
//! the device (`device.rs`).

use crate::error::{AlgoError, Result};
use crate::fault::prepare;
use crate::fusion::{FusionBuffers, SparseBuffers, host_f32_parts};
use crate::handle::{Handle, Reduced, Traffic};
use crate::strategy::{BeforeStep, BucketView, Combined, StateDict, Strategy};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_compress::{ErrorFeedback, ErrorFeedbackState, SparseCodec, wire};
use gradwire_tensor::{DType, Tensor, flat};
use std::ops::Range;

#[cfg(feature = "cuda")]
mod device;

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
    // With error feedback the gradients are only read by its accumulate,
    // which takes f32 host tensors as they lie: no packed copy (the buffer
    // below is then only scratch, zeroed before it is read).
    let n = prepare(comm, || {
        match (feedback.as_deref_mut(), host_f32_parts(tensors)) {
            (Some(memory), Some(parts)) => {
                let n = tensors.iter().map(Tensor::len).sum();
                if flat_buf.len() < n {
                    flat_buf.resize(n, 0.0);
                }
                memory.compress_parts_into(parts, codec, selected, scratch)?;
                Ok(n)
            }
            (memory, _) => {
                let n = flat::pack_into(tensors, flat_buf)?;
                let values = &flat_buf[..n];
                match memory {
                    Some(memory) => memory.compress_into(values, codec, selected, scratch)?,
                    None => codec.select_into(values, selected, scratch)?,
                }
                Ok(n)
            }
        }
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

/// A codec's selection, exchanged, with an optional error-feedback
/// residual that a failed or skipped step puts back.
#[derive(Debug)]
pub struct SparseSelect {
    codec: SparseCodec,
    /// The residual (with error feedback), as the last kept step left it.
    residual: Option<ErrorFeedback>,
    /// The residual as it was before this step's combination.
    before: BeforeStep<Option<ErrorFeedback>>,
    /// When only some of the bucket's parameters were written: their
    /// ranges of the residual, and the residual of those ranges that goes
    /// through the step.
    written_ranges: Vec<Range<usize>>,
    written_residual: ErrorFeedback,
    fusion: FusionBuffers,
    /// The residual in device memory, for buckets of CUDA tensors.
    #[cfg(feature = "cuda")]
    device: device::DeviceResidual,
}

impl SparseSelect {
    /// `codec`'s selections, with an error-feedback residual of
    /// `feedback_len` elements (the bucket's) when given.
    pub fn new(codec: SparseCodec, feedback_len: Option<usize>) -> Self {
        SparseSelect {
            codec,
            residual: feedback_len.map(ErrorFeedback::new),
            before: BeforeStep::default(),
            written_ranges: Vec::new(),
            written_residual: ErrorFeedback::new(0),
            fusion: FusionBuffers::default(),
            #[cfg(feature = "cuda")]
            device: Default::default(),
        }
    }

    /// The codec of this step: without error feedback nothing counts the
    /// steps for random-k, so the optimizer's step is mixed into its seed
    /// (else every step would draw the same indices, alike on every rank).
    fn codec_at(&self, step: u64) -> SparseCodec {
        match self.codec {
            SparseCodec::RandomK { ratio, seed } if self.residual.is_none() => {
                SparseCodec::RandomK {
                    ratio,
                    seed: seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                }
            }
            codec => codec,
        }
    }
}

impl<C: Communicator + 'static> Strategy<C> for SparseSelect {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> Result<Combined> {
        let codec = self.codec_at(bucket.step);
        // A bucket of CUDA tensors keeps its residual (and its copy from
        // before the step) on the device.
        #[cfg(feature = "cuda")]
        if let Some(gradwire_tensor::Device::Cuda(ordinal)) = tensors.first().map(Tensor::device) {
            return self.combine_on_device(comm, bucket, tensors, &codec, ordinal);
        }
        // The residual as it was (none without error feedback), in memory
        // kept from step to step; the exchange need not keep a copy of its
        // own.
        self.before.keep(&self.residual);
        let Some(memory) = self.residual.as_mut() else {
            let traffic = sparse_exchange_with(comm, tensors, &codec, None, &mut self.fusion)?;
            return Ok(Combined {
                traffic,
                averaged: false,
            });
        };
        let traffic = if bucket.written.iter().all(|&w| w) {
            sparse_exchange_with(comm, tensors, &codec, Some(memory), &mut self.fusion)?
        } else {
            // Only the written parameters take part: their part of the
            // residual goes through the step, the rest stays as it is.
            bucket.written_ranges(&mut self.written_ranges);
            let (ranges, sub) = (&self.written_ranges, &mut self.written_residual);
            prepare(comm, || Ok(sub.load_parts(memory, ranges)?))?;
            let traffic = sparse_exchange_with(comm, tensors, &codec, Some(sub), &mut self.fusion)?;
            // Cannot fail: the same ranges, and `sub` was loaded from `memory`.
            sub.store_parts(memory, ranges)?;
            traffic
        };
        Ok(Combined {
            traffic,
            averaged: false,
        })
    }

    fn end_step(&mut self, _bucket: usize, kept: bool) {
        self.before.end(&mut self.residual, kept);
        #[cfg(feature = "cuda")]
        self.device.end_step(kept);
    }

    /// The residual as tensor `residual/<bucket>` and its step count as
    /// value `residual_steps/<bucket>`.
    fn save_state(&self, bucket: usize, state: &mut StateDict) -> Result<()> {
        let residual = self.residual.as_ref();
        // A residual on a device (only with `cuda`) is saved from its host
        // copy; the default build runs the featured one's CPU path.
        #[cfg(feature = "cuda")]
        let on_device = self.device.host_copy()?;
        #[cfg(feature = "cuda")]
        let residual = on_device.as_ref().or(residual);
        if let Some(memory) = residual {
            state.insert_f32s(format!("residual/{bucket}"), memory.residual().to_vec())?;
            state
                .values
                .insert(format!("residual_steps/{bucket}"), memory.steps().into());
        }
        Ok(())
    }

    fn load_state(&mut self, bucket: usize, state: &StateDict, apply: bool) -> Result<()> {
        let mismatch = AlgoError::StateMismatch;
        let saved = state.tensors.get(&format!("residual/{bucket}"));
        let restored = match (&self.residual, saved) {
            (None, None) => None,
            (Some(memory), Some(t)) if t.len() == memory.len() => {
                let steps = state
                    .values
                    .get(&format!("residual_steps/{bucket}"))
                    .and_then(|v| v.as_u64())
                    .ok_or_else(|| mismatch(format!("no residual_steps/{bucket}")))?;
                Some(
                    ErrorFeedback::from_state(ErrorFeedbackState {
                        residual: t.to_vec::<f32>()?,
                        momentum: None,
                        steps,
                    })
                    .map_err(|e| mismatch(format!("residual {bucket}: {e}")))?,
                )
            }
            _ => {
                return Err(mismatch(format!(
                    "residual of bucket {bucket} does not match"
                )));
            }
        };
        if apply {
            self.residual = restored;
            self.before.forget();
            #[cfg(feature = "cuda")]
            self.device.forget();
        }
        Ok(())
    }

    /// The residual: the old ranks' mean ([`crate::reshard`]); its step
    /// count, the same on every rank, rank 0's.
    fn reshard_state(
        &self,
        bucket: usize,
        saved: &[&StateDict],
        out: &mut StateDict,
    ) -> Result<()> {
        let key = format!("residual/{bucket}");
        if let Some(mean) = crate::reshard::mean_of(saved, &key)? {
            out.insert_f32s(key, mean)?;
            crate::reshard::copy_value(saved, &format!("residual_steps/{bucket}"), out);
        }
        Ok(())
    }
}
