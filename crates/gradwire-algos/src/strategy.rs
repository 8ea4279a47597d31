//! The [`Strategy`] trait: how one bucket's tensors are combined across
//! ranks, step after step, with the state that survives a step (error
//! feedback, warm starts) put back when a step fails and saved through a
//! [`StateDict`].
//!
//! Each strategy lives in its own module, its CPU and CUDA forms side by
//! side: [`crate::dense`] ([`DenseSum`](crate::DenseSum)),
//! [`crate::half`] ([`HalfAverage`](crate::HalfAverage)),
//! [`crate::sparse`] ([`SparseSelect`](crate::SparseSelect)),
//! [`crate::powersgd`] ([`PowerSgd`](crate::PowerSgd)),
//! [`crate::quantized`] ([`QuantizedAllReduce`](crate::QuantizedAllReduce)),
//! [`crate::onebit_adam`] ([`OneBitAdamExchange`](crate::OneBitAdamExchange)) and
//! [`crate::adasum`] ([`AdaSum`](crate::AdaSum)). A caller that runs
//! training steps (gradwire-optim's DistOpt) owns the buckets, the overlap,
//! the skip vote, the averaging and the checkpoints, and tells each
//! strategy whether the step it combined was kept ([`Strategy::end_step`]).

use crate::error::Result;
use crate::handle::Traffic;
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;
use std::collections::BTreeMap;

/// How one bucket's tensors are combined across ranks: the built-in
/// strategies implement it, and so can any of your own. It runs on the
/// communication thread, one bucket at a time, in bucket order on every
/// rank.
///
/// A strategy keeps the failure model ([`crate::fault`]): it completes on
/// every rank or fails on every rank, never returning early on one rank
/// between two of its collectives; a rank that fails locally posts the
/// fault in place of its next collective ([`crate::fault::fail`]). Its
/// first collective may also be where another rank's fault arrives: it
/// then returns that error.
///
/// A strategy with state that a step changes (an error-feedback residual,
/// a warm start) keeps what it needs to put it back: a step may fail or be
/// skipped on every rank after its combination ([`Strategy::end_step`] says
/// which), and a failed step must leave the state as it was.
pub trait Strategy<C: Communicator>: Send + 'static {
    /// Combines `tensors` (this rank's written gradients, or weight deltas,
    /// of the bucket `bucket` describes, in declaration order) across the
    /// ranks of `comm`, in place.
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> Result<Combined>;

    /// Whether the combination is a plain sum, through which a NaN or an
    /// infinity of any rank reaches every rank (the caller's check after
    /// the reduction then finds it alike everywhere). When `false` (the
    /// default), the caller checks each rank's tensors before they are sent.
    fn carries_non_finite(&self) -> bool {
        false
    }

    /// The step in which bucket `bucket` was combined (or was to be: its
    /// job may have failed before the combination) is over: `kept` when it
    /// completed on every rank; when it failed or was skipped, the
    /// strategy puts back the state it had before the step.
    fn end_step(&mut self, bucket: usize, kept: bool) {
        let _ = (bucket, kept);
    }

    /// Writes bucket `bucket`'s state into `state` (tensors and values
    /// under keys of the strategy's own, naming the bucket; none by
    /// default).
    fn save_state(&self, bucket: usize, state: &mut StateDict) -> Result<()> {
        let _ = (bucket, state);
        Ok(())
    }

    /// Reads bucket `bucket`'s state from `state`, all or nothing: on an
    /// error ([`crate::AlgoError::StateMismatch`]: a missing or mismatched
    /// entry) the strategy is unchanged. A caller first calls it with
    /// `apply == false` for every bucket (a check that changes nothing),
    /// then with `true`.
    fn load_state(&mut self, bucket: usize, state: &StateDict, apply: bool) -> Result<()> {
        let _ = (bucket, state, apply);
        Ok(())
    }

    /// Writes into `out` bucket `bucket`'s state for a rank of a world of
    /// another size than the one that saved `saved` (`saved[r]`: what old
    /// rank `r` saved), for [`Strategy::load_state`]: every new rank gets
    /// the same, made by the rules of [`crate::reshard`] (per-rank
    /// residuals and momentum averaged, so that they owe the combined
    /// result what they owed it; state held alike taken from rank 0).
    /// `out` holds rank 0's state when this is called: a strategy whose
    /// state differs by rank overrides it; the default keeps rank 0's,
    /// right for state that every rank holds alike, and for none.
    fn reshard_state(
        &self,
        bucket: usize,
        saved: &[&StateDict],
        out: &mut StateDict,
    ) -> Result<()> {
        let _ = (bucket, saved, out);
        Ok(())
    }
}

impl<C: Communicator> std::fmt::Debug for dyn Strategy<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Strategy")
    }
}

/// What a [`Strategy`] knows of the bucket it combines.
#[derive(Debug, Clone, Copy)]
pub struct BucketView<'a> {
    /// The bucket's index (buckets are combined in order on every rank).
    pub index: usize,
    /// The element counts of all the bucket's parameters, in order.
    pub lens: &'a [usize],
    /// Which of them some rank wrote: the tensors given to
    /// [`Strategy::combine`] are these, in order (the others, zeros on every
    /// rank, are not combined).
    pub written: &'a [bool],
    /// The optimizer's step count, the same on every rank (a seed for
    /// strategies that draw at random).
    pub step: u64,
    /// The most elements a fusion buffer may hold.
    pub capacity: usize,
}

impl BucketView<'_> {
    /// The written parameters' ranges of the bucket's full layout (its
    /// parameters back to back) into `ranges`; returns the full length.
    pub fn written_ranges(&self, ranges: &mut Vec<std::ops::Range<usize>>) -> usize {
        ranges.clear();
        let mut at = 0;
        for (&n, &written) in self.lens.iter().zip(self.written) {
            if written {
                ranges.push(at..at + n);
            }
            at += n;
        }
        at
    }
}

/// What a [`Strategy`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Combined {
    /// Bytes this rank sent and received.
    pub traffic: Traffic,
    /// Whether the result is already an average-like combination; if not it
    /// is a sum, which the caller divides by the world size.
    pub averaged: bool,
}

/// A strategy's saved state: named tensors and named JSON values, the
/// form a checkpoint stores them in (gradwire-optim's `Checkpoint` holds
/// one).
#[derive(Debug, Clone, Default)]
pub struct StateDict {
    /// Named tensors (f32, f16 or bf16): residuals, warm starts.
    pub tensors: BTreeMap<String, Tensor>,
    /// Named values: counters, shapes, layouts.
    pub values: BTreeMap<String, serde_json::Value>,
}

impl StateDict {
    /// The tensor under `key` as f32 values, or a
    /// [`crate::AlgoError::StateMismatch`] naming it.
    pub fn f32s(&self, key: &str) -> Result<Vec<f32>> {
        Ok(self
            .tensors
            .get(key)
            .ok_or_else(|| crate::AlgoError::StateMismatch(format!("no {key}")))?
            .to_vec::<f32>()?)
    }

    /// Stores `values` as the one-dimensional f32 tensor `key`.
    pub fn insert_f32s(&mut self, key: String, values: Vec<f32>) -> Result<()> {
        let n = values.len();
        self.tensors.insert(key, Tensor::from_vec(values, n)?);
        Ok(())
    }
}

/// A strategy's state as it was before the combination of the current
/// step, to put back when that step fails or is skipped on any rank (a copy
/// into memory reused from step to step).
#[derive(Debug, Default)]
pub(crate) struct BeforeStep<S> {
    copy: S,
    taken: bool,
}

impl<S: Clone> BeforeStep<S> {
    /// Copies `state`, at the start of a combination.
    pub(crate) fn keep(&mut self, state: &S) {
        self.copy.clone_from(state);
        self.taken = true;
    }

    /// The step is over: `state` goes back to the copy unless `kept`.
    pub(crate) fn end(&mut self, state: &mut S, kept: bool) {
        if std::mem::take(&mut self.taken) && !kept {
            std::mem::swap(state, &mut self.copy);
        }
    }

    /// Forgets the copy (the state was replaced from a checkpoint).
    pub(crate) fn forget(&mut self) {
        self.taken = false;
    }
}
