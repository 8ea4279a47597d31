//! Fusion buckets: SINGA's grouping of the declared parameters, and a
//! bucket's job on the communication thread (the written-anywhere vote,
//! which also carries this rank's faults, then the combination by the
//! bucket's strategy).

use super::{Engine, ParamSpec, arrival};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_algos::{BucketView, Strategy};
use gradwire_algos::{FaultKind, Reduced, Traffic};
use gradwire_comm::timeline::span;
use gradwire_comm::{AsyncJob, Communicator, Pending, ReduceOp};
use gradwire_tensor::Tensor;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// SINGA's grouping ([`gradwire_algos::cost::group_buckets`], which the
/// cost model plans with too), each bucket checked against `capacity`
/// (counts summed with overflow checks; the error names the bucket's
/// parameters).
pub(super) fn plan_buckets(
    params: &[ParamSpec],
    lens: &[usize],
    threshold: usize,
    capacity: usize,
) -> Result<Vec<Range<usize>>> {
    let buckets = gradwire_algos::cost::group_buckets(lens, threshold);
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
    /// Whether `grads` are averaged already (else summed).
    pub(super) averaged: bool,
    /// How long the strategy's `combine` took.
    pub(super) combine: Duration,
    /// Who arrived last at the vote, when it carried the arrivals.
    pub(super) straggler: Option<super::StepStraggler>,
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
    /// The list of the bucket's gradients (emptied, its capacity kept).
    pub(super) grads: Vec<Tensor>,
    /// The written-anywhere vote.
    pub(super) votes: Vec<u8>,
    /// Which of the bucket's parameters some rank wrote, once decided.
    pub(super) written: Vec<bool>,
    /// The gradients no rank wrote, in order, back to the engine for reuse
    /// (as the next step's zeros of parameters not pushed).
    pub(super) unwritten: Vec<Tensor>,
    /// An empty list kept for the next step's written gradients.
    live: Vec<Tensor>,
}

/// Everything a bucket's job returns: its result, its buffers and its
/// strategy (whose state the engine keeps or puts back once every bucket of
/// the step is in).
pub(super) struct BucketOutput<C: Communicator> {
    /// The bucket's strategy, for its next step.
    pub(super) strategy: Box<dyn Strategy<C>>,
    /// The bucket's buffers, for its next step.
    pub(super) buffers: BucketBuffers,
    pub(super) result: gradwire_algos::Result<Reduced<BucketResult>>,
}

impl<C: Communicator> std::fmt::Debug for BucketOutput<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketOutput")
            .field("result", &self.result)
            .finish_non_exhaustive()
    }
}

/// What a bucket's job carries to the communication thread.
pub(super) struct BucketJob {
    bucket: usize,
    /// The element counts of the bucket's parameters.
    lens: Arc<[usize]>,
    capacity: usize,
    /// The optimizer's step count.
    step: u64,
    /// Whether the step's vote decided which parameters some rank wrote
    /// (then in the buffers' `written`).
    decided: bool,
    /// This rank's fault so far in the step, posted instead of the vote.
    fault: Option<FaultKind>,
    /// Look for NaN and infinities in this rank's gradients before the vote
    /// (strategies whose combination would not carry them to every rank).
    check_finite: bool,
    /// This rank's arrival at the step's exchange, for the step's first
    /// vote to carry (`arrival.rs`); `None` for the other votes.
    arrival: Option<Duration>,
    /// The bucket's reused buffers.
    buffers: BucketBuffers,
}

impl BucketJob {
    /// A job that combines its tensors as they are, every one taking part
    /// (no vote, no non-finite check), or posts `fault` in its place:
    /// a fragment's pseudo-gradients in Streaming DiLoCo.
    pub(super) fn combine_only(
        bucket: usize,
        lens: Arc<[usize]>,
        capacity: usize,
        step: u64,
        fault: Option<FaultKind>,
        mut buffers: BucketBuffers,
    ) -> BucketJob {
        buffers.written.clear();
        buffers.written.resize(lens.len(), true);
        BucketJob {
            bucket,
            lens,
            capacity,
            step,
            decided: true,
            fault,
            check_finite: false,
            arrival: None,
            buffers,
        }
    }

    /// The vote (or this rank's fault), then the combination by
    /// `strategy`; the strategy and the buffers come back whatever happens.
    fn run<C: Communicator + 'static>(
        mut self,
        comm: &C,
        grads: Vec<Tensor>,
        mut strategy: Box<dyn Strategy<C>>,
    ) -> BucketOutput<C> {
        let mut buffers = std::mem::take(&mut self.buffers);
        BucketOutput {
            result: reduce_bucket(self, comm, grads, &mut buffers, strategy.as_mut()),
            strategy,
            buffers,
        }
    }
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

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// Starts the next bucket's job on the communication thread, carrying
    /// this rank's fault so far.
    pub(super) fn launch_next(&mut self, written: Option<&[bool]>) -> Result<()> {
        let b = self.in_flight.len();
        let range = self.buckets[b].clone();
        let mut buffers = std::mem::take(&mut self.buffers[b]);
        let mut grads = std::mem::take(&mut buffers.grads);
        grads.clear();
        // A zero this rank cannot allocate (device memory) is a fault of
        // this rank, posted in place of the bucket's first collective, so
        // that every rank's step fails with it instead of this one
        // returning alone while the others wait for its bucket.
        let mut launch_fault = None;
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
                    match Tensor::zeros(spec.shape.clone(), spec.dtype, spec.device) {
                        Ok(mut zeros) => {
                            zeros.zero_();
                            zeros
                        }
                        Err(e) => {
                            self.record(FaultKind::Other, &e);
                            launch_fault = Some(FaultKind::Other);
                            continue;
                        }
                    }
                }
            };
            grads.push(grad);
        }
        if let Some(written) = written {
            buffers.written.clear();
            buffers.written.extend_from_slice(written);
        }
        let strategy = self.take_strategy(b);
        let job = BucketJob {
            bucket: b,
            lens: Arc::clone(&self.bucket_lens[b]),
            capacity: self.config.capacity,
            step: self.optimizer.step_count(),
            // With the step's vote decided, that vote carried this rank's
            // faults and its non-finite check; the job has no vote of its own.
            fault: launch_fault.or(self
                .fault
                .as_ref()
                .map(|f| f.kind)
                .filter(|_| written.is_none())),
            check_finite: written.is_none() && !strategy.carries_non_finite(),
            decided: written.is_some(),
            // The step's first vote: the first bucket's, without a vote
            // per step.
            arrival: (b == 0 && written.is_none()).then(|| self.arrival()),
            buffers,
        };
        let task = BucketTask {
            job,
            grads,
            strategy,
        };
        let pending = if self.comm.world_size() == 1 {
            // Alone there is nothing to overlap: the job runs here, without
            // waking the communication thread (whose hand-offs cost a lone
            // worker more than its collectives of one rank do).
            Pending::ready(task.run(&self.comm))
        } else {
            self.comm
                .run_job(&mut self.slots[b], task)
                .map_err(gradwire_algos::AlgoError::from)?
        };
        self.in_flight.push(pending);
        Ok(())
    }
}

/// A bucket's job with its gradients and its strategy: what travels in the
/// bucket's reusable job slot ([`gradwire_comm::JobSlot`]).
pub(super) struct BucketTask<C: Communicator> {
    job: BucketJob,
    grads: Vec<Tensor>,
    strategy: Box<dyn Strategy<C>>,
}

impl<C: Communicator> BucketTask<C> {
    /// `job` with its tensors and the bucket's strategy.
    pub(super) fn new(
        job: BucketJob,
        grads: Vec<Tensor>,
        strategy: Box<dyn Strategy<C>>,
    ) -> BucketTask<C> {
        BucketTask {
            job,
            grads,
            strategy,
        }
    }
}

impl<C: Communicator + 'static> AsyncJob<C> for BucketTask<C> {
    type Output = BucketOutput<C>;

    fn run(self, comm: &C) -> gradwire_comm::Result<BucketOutput<C>> {
        Ok(self.job.run(comm, self.grads, self.strategy))
    }
}

/// A bucket's job on the communication thread: this rank's fault or the
/// written-anywhere vote, then the combination of the gradients some rank
/// wrote.
fn reduce_bucket<C: Communicator + 'static>(
    job: BucketJob,
    comm: &C,
    mut grads: Vec<Tensor>,
    buffers: &mut BucketBuffers,
    strategy: &mut dyn Strategy<C>,
) -> gradwire_algos::Result<Reduced<BucketResult>> {
    let BucketJob {
        bucket,
        lens,
        capacity,
        step,
        decided,
        fault,
        check_finite,
        arrival,
        buffers: _,
    } = job;
    // This rank's fault, if any, takes the place of the bucket's first
    // collective: every rank's job ends there with the same error.
    let fault = match fault {
        Some(kind) => Some(kind),
        None if check_finite => first_non_finite(&grads).unwrap_or(Some(FaultKind::Other)),
        None => None,
    };
    let _bucket = span(comm.timeline(), "bucket", "bucket", Some(bucket as u64));
    if let Some(kind) = fault {
        return Err(comm.post_fault(kind).into());
    }
    let world = comm.world_size();
    let mut traffic = Traffic::default();
    let mut straggler = None;
    if !decided {
        let votes = &mut buffers.votes;
        votes.clear();
        votes.extend(grads.iter().map(|g| u8::from(!g.is_zeroed())));
        let flags = votes.len();
        if let Some(busy) = arrival {
            arrival::append(votes, comm.rank(), world, busy);
        }
        comm.all_reduce(votes, ReduceOp::Max)?;
        traffic = Traffic::all_reduce(votes.len(), world);
        if arrival.is_some() {
            straggler = arrival::read(&votes[flags..], world);
        }
        buffers.written.clear();
        buffers
            .written
            .extend(votes[..flags].iter().map(|&v| v != 0));
    }
    // The written gradients go on; the others (zeros on every rank) come
    // back to the engine for reuse. The two lists swap roles every step, both
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
    let mut averaged = false;
    let mut combine = Duration::ZERO;
    if !live.is_empty() {
        let view = BucketView {
            index: bucket,
            lens: &lens,
            written: &buffers.written,
            step,
            capacity,
        };
        let started = Instant::now();
        let combining = span(comm.timeline(), "combine", "combine", None);
        let combined = strategy.combine(comm, &view, &mut live)?;
        drop(combining);
        combine = started.elapsed();
        averaged = combined.averaged;
        traffic += combined.traffic;
    }
    Ok(Reduced {
        value: BucketResult {
            grads: live,
            averaged,
            combine,
            straggler,
        },
        traffic,
    })
}
