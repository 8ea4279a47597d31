//! Fusion buckets: SINGA's grouping of the declared parameters, and a
//! bucket's job on the communication thread (the written-anywhere vote,
//! which also carries this rank's faults, then the combination).

use super::combiner::{SharedCombiner, run_combiner};
use super::{DistOpt, Mode, ParamSpec};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_algos::fault::prepare;
use gradwire_algos::{
    FaultKind, FusionBuffers, HalfOptions, Reduced, Traffic, fused_all_reduce_with,
    half_all_reduce_with, sparse_exchange_with,
};
use gradwire_comm::{AsyncJob, Communicator, ReduceOp};
use gradwire_compress::{ErrorFeedback, SparseCodec};
use gradwire_tensor::Tensor;
use std::ops::Range;

/// SINGA's grouping: a tensor above the threshold alone; smaller ones
/// together until the group's count exceeds the threshold. Every bucket
/// must fit `capacity`; counts are summed with overflow checks.
pub(super) fn plan_buckets(
    params: &[ParamSpec],
    lens: &[usize],
    threshold: usize,
    capacity: usize,
) -> Result<Vec<Range<usize>>> {
    let mut buckets = Vec::new();
    let mut start = 0;
    let mut count = 0usize;
    for (i, &n) in lens.iter().enumerate() {
        if n > threshold {
            if start < i {
                buckets.push(start..i);
            }
            buckets.push(i..i + 1);
            start = i + 1;
            count = 0;
            continue;
        }
        // Both are at most the threshold here, so the sum cannot overflow
        // unless the threshold is near usize::MAX: saturated anyway.
        count = count.saturating_add(n);
        if count > threshold {
            buckets.push(start..i + 1);
            start = i + 1;
            count = 0;
        }
    }
    if start < lens.len() {
        buckets.push(start..lens.len());
    }
    for b in &buckets {
        let needed = lens[b.clone()]
            .iter()
            .try_fold(0usize, |sum, &n| sum.checked_add(n));
        if needed.is_none_or(|needed| needed > capacity) {
            return Err(OptimError::InvalidArgument(format!(
                "a bucket of {} elements ({}) exceeds the fusion capacity of {capacity}",
                needed.map_or_else(|| "more than usize::MAX".to_string(), |n| n.to_string()),
                params[b.clone()]
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(buckets)
}

/// What a bucket's job hands back: the combined gradients of the
/// parameters some rank wrote (which ones: the buffers' `written`).
pub(super) struct BucketResult {
    pub(super) grads: Vec<Tensor>,
    pub(super) residual: Option<ErrorFeedback>,
    /// Whether `grads` are averaged already (else summed).
    pub(super) averaged: bool,
}

impl std::fmt::Debug for BucketResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketResult")
            .field("grads", &self.grads.len())
            .finish_non_exhaustive()
    }
}

/// A bucket's buffers, reused from step to step: taken by its job, given
/// back with its output (a job that is lost takes them along, and the
/// next step starts afresh). In steady state a step allocates none.
#[derive(Debug, Default)]
pub(super) struct BucketBuffers {
    /// The fusion and wire buffers of the combination.
    pub(super) fusion: FusionBuffers,
    /// The list of the bucket's gradients (emptied, its capacity kept).
    pub(super) grads: Vec<Tensor>,
    /// The written-anywhere vote.
    pub(super) votes: Vec<u8>,
    /// Which of the bucket's parameters some rank wrote, once decided.
    pub(super) written: Vec<bool>,
    /// The memory that holds the residual as it was before a step (sparse
    /// mode with error feedback), refilled in place every step.
    pub(super) residual_before: Option<ErrorFeedback>,
    /// Sparse mode with error feedback when only some of the bucket's
    /// parameters were written: their ranges of the residual, and the
    /// residual of those ranges that goes through the step.
    written_ranges: Vec<Range<usize>>,
    written_residual: Option<ErrorFeedback>,
    /// The gradients no rank wrote, in order, back to DistOpt for reuse
    /// (as the next step's zeros of parameters not pushed).
    pub(super) unwritten: Vec<Tensor>,
    /// An empty list kept for the next step's written gradients.
    live: Vec<Tensor>,
}

/// Everything a bucket's job returns: its result, and the error-feedback
/// residual as it was before the step, which DistOpt puts back when the
/// step fails or is skipped on any rank.
#[derive(Debug)]
pub(super) struct BucketOutput {
    pub(super) residual_before: Option<ErrorFeedback>,
    /// The bucket's buffers, for its next step.
    pub(super) buffers: BucketBuffers,
    pub(super) result: gradwire_algos::Result<Reduced<BucketResult>>,
}

/// What a bucket's job carries to the communication thread.
pub(super) struct BucketJob<C: Communicator> {
    bucket: usize,
    mode: Mode,
    capacity: usize,
    residual: Option<ErrorFeedback>,
    combiner: Option<SharedCombiner<C>>,
    /// Whether the step's vote decided which parameters some rank wrote
    /// (then in the buffers' `written`).
    decided: bool,
    /// This rank's fault so far in the step, posted instead of the vote.
    fault: Option<FaultKind>,
    /// Look for NaN and infinities in this rank's gradients before the vote
    /// (modes whose combination would not carry them to every rank).
    check_finite: bool,
    /// The bucket's reused buffers.
    buffers: BucketBuffers,
}

impl<C: Communicator + 'static> BucketJob<C> {
    /// The vote (or this rank's fault), then the combination; the residual
    /// before the step comes back whatever happens.
    fn run(mut self, comm: &C, grads: Vec<Tensor>) -> BucketOutput {
        let mut buffers = std::mem::take(&mut self.buffers);
        let residual_before = match (&self.residual, buffers.residual_before.take()) {
            (Some(residual), Some(mut copy)) => {
                copy.clone_from(residual);
                Some(copy)
            }
            (residual, _) => residual.clone(),
        };
        BucketOutput {
            residual_before,
            result: reduce_bucket(self, comm, grads, &mut buffers),
            buffers,
        }
    }
}

/// Whether a mode looks for NaN and infinities in each rank's gradients
/// before they are sent: every mode but those whose combination is a sum
/// (a NaN or an infinity anywhere is then one in the result, on every rank
/// alike, which the step's check after the reduction finds).
pub(super) fn checks_finite_locally(mode: Mode) -> bool {
    !matches!(mode, Mode::Dense | Mode::DimReduce)
}

/// The kind of fault `grads` hold: `NonFinite` for a NaN or an infinity,
/// `None` if every value is finite. A lazily zeroed gradient (not written)
/// is not read; an error of the check itself is returned as it is.
pub(super) fn first_non_finite<'t>(
    grads: impl IntoIterator<Item = &'t Tensor>,
) -> gradwire_algos::Result<Option<FaultKind>> {
    for g in grads {
        if !g.is_zeroed() && !g.max_abs()?.is_finite() {
            return Ok(Some(FaultKind::NonFinite));
        }
    }
    Ok(None)
}

/// This rank's non-finite check of `grads` (those pushed), as the fault to
/// record: `None` when every value is finite.
pub(super) fn scan_non_finite(grads: &[Option<Tensor>]) -> Option<(FaultKind, String)> {
    match first_non_finite(grads.iter().flatten()) {
        Ok(None) => None,
        Ok(Some(kind)) => Some((kind, "a gradient holds a NaN or an infinity".into())),
        Err(e) => Some((FaultKind::Other, e.to_string())),
    }
}

impl<O: Optimizer, C: Communicator + 'static> DistOpt<O, C> {
    /// Starts the next bucket's job on the communication thread, carrying
    /// this rank's fault so far.
    pub(super) fn launch_next(&mut self, written: Option<&[bool]>) -> Result<()> {
        let b = self.in_flight.len();
        let range = self.buckets[b].clone();
        let mut buffers = std::mem::take(&mut self.buffers[b]);
        let mut grads = std::mem::take(&mut buffers.grads);
        grads.clear();
        for i in range {
            let grad = match (self.grads[i].take(), self.unpushed[i].take()) {
                (Some(g), _) => g,
                // Never pushed: not written on this rank. A zero of the
                // declared dtype on the declared device, so every rank
                // packs the same buffer (an earlier step's, reused).
                (None, Some(mut zeros)) => {
                    zeros.zero_();
                    zeros
                }
                (None, None) => {
                    let spec = &self.params[i];
                    let mut zeros = Tensor::zeros(spec.shape.clone(), spec.dtype, spec.device)?;
                    zeros.zero_();
                    zeros
                }
            };
            grads.push(grad);
        }
        if let Some(written) = written {
            buffers.written.clear();
            buffers.written.extend_from_slice(written);
        }
        let mode = match self.config.mode {
            // Without error feedback nothing counts the steps for random-k:
            // mix the optimizer's step into the seed, or every step would
            // draw the same indices.
            Mode::Sparse {
                codec: SparseCodec::RandomK { ratio, seed },
                error_feedback: false,
            } => Mode::Sparse {
                codec: SparseCodec::RandomK {
                    ratio,
                    seed: seed
                        ^ self
                            .optimizer
                            .step_count()
                            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
                },
                error_feedback: false,
            },
            mode => mode,
        };
        let job = BucketJob {
            bucket: b,
            mode,
            capacity: self.config.capacity,
            residual: self.residuals[b].take(),
            combiner: self.combiner.clone(),
            // With the step's vote decided, that vote carried this rank's
            // faults and its non-finite check; the job has no vote of its own.
            fault: self
                .fault
                .as_ref()
                .map(|f| f.kind)
                .filter(|_| written.is_none()),
            check_finite: written.is_none() && checks_finite_locally(mode),
            decided: written.is_some(),
            buffers,
        };
        let pending = self
            .comm
            .run_job(&mut self.slots[b], BucketTask { job, grads })
            .map_err(gradwire_algos::AlgoError::from)?;
        self.in_flight.push(pending);
        Ok(())
    }
}

/// A bucket's job with its gradients: what travels in the bucket's
/// reusable job slot ([`gradwire_comm::JobSlot`]).
pub(super) struct BucketTask<C: Communicator> {
    job: BucketJob<C>,
    grads: Vec<Tensor>,
}

impl<C: Communicator + 'static> AsyncJob<C> for BucketTask<C> {
    type Output = BucketOutput;

    fn run(self, comm: &C) -> gradwire_comm::Result<BucketOutput> {
        Ok(self.job.run(comm, self.grads))
    }
}

/// A bucket's job on the communication thread: this rank's fault or the
/// written-anywhere vote, then the combination of the gradients some rank
/// wrote.
fn reduce_bucket<C: Communicator + 'static>(
    job: BucketJob<C>,
    comm: &C,
    mut grads: Vec<Tensor>,
    buffers: &mut BucketBuffers,
) -> gradwire_algos::Result<Reduced<BucketResult>> {
    let BucketJob {
        bucket,
        mode,
        capacity,
        mut residual,
        combiner,
        decided,
        fault,
        check_finite,
        buffers: _,
    } = job;
    // This rank's fault, if any, takes the place of the bucket's first
    // collective: every rank's job ends there with the same error.
    let fault = match fault {
        Some(kind) => Some(kind),
        None if check_finite => first_non_finite(&grads).unwrap_or(Some(FaultKind::Other)),
        None => None,
    };
    if let Some(kind) = fault {
        return Err(comm.post_fault(kind.code()).into());
    }
    let combiner = &combiner;
    let world = comm.world_size();
    let mut traffic = Traffic::default();
    if !decided {
        let votes = &mut buffers.votes;
        votes.clear();
        votes.extend(grads.iter().map(|g| u8::from(!g.is_zeroed())));
        comm.all_reduce(votes, ReduceOp::Max)?;
        traffic = Traffic::all_reduce(votes.len(), world);
        buffers.written.clear();
        buffers.written.extend(votes.iter().map(|&v| v != 0));
    }
    // Sparse mode with error feedback, when only some parameters were
    // written: the ranges of the residual those go through.
    let partial_residual = matches!(mode, Mode::Sparse { .. })
        && residual.is_some()
        && !buffers.written.iter().all(|&w| w);
    if partial_residual {
        buffers.written_ranges.clear();
        let mut offset = 0;
        for (g, &w) in grads.iter().zip(&buffers.written) {
            if w {
                buffers.written_ranges.push(offset..offset + g.len());
            }
            offset += g.len();
        }
    }
    // The written gradients go on; the others (zeros on every rank) come
    // back to DistOpt for reuse. The two lists swap roles every step, both
    // keeping their capacity.
    let mut live = std::mem::take(&mut buffers.live);
    live.clear();
    buffers.unwritten.clear();
    for (k, g) in grads.drain(..).enumerate() {
        if buffers.written.get(k).copied().unwrap_or(false) {
            live.push(g);
        } else {
            buffers.unwritten.push(g);
        }
    }
    buffers.live = grads;
    let mut averaged = matches!(mode, Mode::Half { .. });
    if !live.is_empty() {
        traffic += match mode {
            Mode::Custom | Mode::DeltaWeight => {
                let combined = run_combiner(combiner, comm, bucket, &mut live)?;
                averaged = combined.averaged;
                combined.traffic
            }
            Mode::Dense | Mode::Partial { .. } | Mode::DimReduce => fused_all_reduce_with(
                comm,
                &mut live,
                ReduceOp::Sum,
                capacity,
                &mut buffers.fusion,
            )?,
            Mode::Half { precision, clip } => {
                let options = HalfOptions {
                    precision,
                    clip,
                    op: ReduceOp::Avg,
                };
                half_all_reduce_with(comm, &mut live, &options, capacity, &mut buffers.fusion)?
            }
            Mode::Sparse { codec, .. } => match residual.as_mut() {
                // The job keeps the residual as it was (`BucketJob::run`),
                // so the exchange need not keep a copy of its own.
                None => sparse_exchange_with(comm, &mut live, &codec, None, &mut buffers.fusion)?,
                Some(memory) if !partial_residual => sparse_exchange_with(
                    comm,
                    &mut live,
                    &codec,
                    Some(memory),
                    &mut buffers.fusion,
                )?,
                Some(memory) => {
                    // Only the written parameters take part: their part of the
                    // residual goes through the step, the rest stays as it is.
                    let ranges = &buffers.written_ranges;
                    let sub = buffers
                        .written_residual
                        .get_or_insert_with(|| ErrorFeedback::new(0));
                    prepare(comm, || Ok(sub.load_parts(memory, ranges)?))?;
                    let t = sparse_exchange_with(
                        comm,
                        &mut live,
                        &codec,
                        Some(sub),
                        &mut buffers.fusion,
                    )?;
                    // Cannot fail: the same ranges, and `sub` was loaded from `memory`.
                    sub.store_parts(memory, ranges)?;
                    t
                }
            },
        };
    }
    Ok(Reduced {
        value: BucketResult {
            grads: live,
            residual,
            averaged,
        },
        traffic,
    })
}
