//! Strategies: how one bucket's tensors are combined across ranks.
//!
//! One trait, [`Combiner`], and one file per strategy: [`dense`] (the f32
//! sum), [`half`] (f16/bf16 on the wire), [`sparse`] (a codec's selection,
//! with error feedback), [`powersgd`] (low-rank factors with error
//! feedback), [`quantized`] (1 or 8 bits per entry both ways),
//! [`onebit_adam`] (Adam's momentum in 1 bit after a warm-up), AdaSum (its impl below) and whatever a user plugs in with
//! [`super::DistOpt::with_combiner`]. DistOpt holds one strategy per
//! bucket, made from its [`StrategyConfig`](super::StrategyConfig) by this module's registry
//! (`for_bucket`): a new strategy is its file, a `StrategyConfig` variant and one
//! arm there. A strategy owns its state (error-feedback
//! residuals, warm starts) and its scratch buffers; DistOpt owns the
//! buckets, the overlap, the skip vote, averaging, clipping, the
//! non-finite check and checkpoints, and tells each strategy whether the
//! step it combined was kept ([`Combiner::end_step`]).

pub mod dense;
pub mod half;
pub mod onebit_adam;
pub mod powersgd;
pub mod quantized;
pub mod sparse;

use super::StrategyConfig;
use crate::checkpoint::Checkpoint;
use crate::error::Result;
use gradwire_algos::adasum::AdaSum;
use gradwire_algos::fault::fail;
use gradwire_algos::{AlgoError, Traffic};
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;
use std::sync::{Arc, Mutex};

/// How DistOpt combines one bucket's tensors across ranks: the built-in
/// strategies implement it, and so can any of your own (AdaSum is one),
/// plugged in with [`super::DistOpt::with_combiner`] without changing
/// DistOpt. It runs on the communication thread, one bucket at a time, in
/// bucket order on every rank.
///
/// A combiner keeps the failure model ([`gradwire_algos::fault`]): it
/// completes on every rank or fails on every rank, never returning early
/// on one rank between two of its collectives; a rank that fails locally
/// posts the fault in place of its next collective
/// ([`gradwire_algos::fault::fail`]). Its first collective may also be
/// where another rank's fault arrives: it then returns that error.
///
/// A combiner with state that a step changes (an error-feedback residual,
/// a warm start) keeps what it needs to put it back: a step may fail or be
/// skipped on every rank after its combination ([`Combiner::end_step`]
/// says which), and a failed step must leave the state as it was.
pub trait Combiner<C: Communicator>: Send + 'static {
    /// Combines `tensors` (this rank's written gradients, or weight deltas,
    /// of the bucket `bucket` describes, in declaration order) across the
    /// ranks of `comm`, in place.
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined>;

    /// Whether the combination is a plain sum, through which a NaN or an
    /// infinity of any rank reaches every rank (DistOpt's check after the
    /// reduction then finds it alike everywhere). When `false` (the
    /// default), DistOpt checks each rank's tensors before they are sent.
    fn carries_non_finite(&self) -> bool {
        false
    }

    /// The step in which bucket `bucket` was combined (or was to be: its
    /// job may have failed before the combination) is over: `kept` when it
    /// completed on every rank; when it failed or was skipped, the
    /// combiner puts back the state it had before the step.
    fn end_step(&mut self, bucket: usize, kept: bool) {
        let _ = (bucket, kept);
    }

    /// Writes bucket `bucket`'s state into `ckpt` (tensors and values under
    /// keys of the combiner's own; none by default).
    fn save_state(&self, bucket: usize, ckpt: &mut Checkpoint) -> Result<()> {
        let _ = (bucket, ckpt);
        Ok(())
    }

    /// Reads bucket `bucket`'s state from `ckpt`, all or nothing: on an
    /// error (a missing or mismatched entry) the combiner is unchanged.
    /// DistOpt first calls it with `apply == false` for every bucket (a
    /// check that changes nothing), then with `true`.
    fn load_state(&mut self, bucket: usize, ckpt: &Checkpoint, apply: bool) -> Result<()> {
        let _ = (bucket, ckpt, apply);
        Ok(())
    }
}

impl<C: Communicator> std::fmt::Debug for dyn Combiner<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Combiner")
    }
}

/// A strategy's state as it was before the combination of the current
/// step, to put back when that step fails or is skipped on any rank (a copy
/// into memory reused from step to step).
#[derive(Debug, Default)]
pub(super) struct BeforeStep<S> {
    copy: S,
    taken: bool,
}

impl<S: Clone> BeforeStep<S> {
    /// Copies `state`, at the start of a combination.
    pub(super) fn keep(&mut self, state: &S) {
        self.copy.clone_from(state);
        self.taken = true;
    }

    /// The step is over: `state` goes back to the copy unless `kept`.
    pub(super) fn end(&mut self, state: &mut S, kept: bool) {
        if std::mem::take(&mut self.taken) && !kept {
            std::mem::swap(state, &mut self.copy);
        }
    }

    /// Forgets the copy (the state was replaced from a checkpoint).
    pub(super) fn forget(&mut self) {
        self.taken = false;
    }
}

/// What a [`Combiner`] knows of the bucket it combines.
#[derive(Debug, Clone, Copy)]
pub struct BucketView<'a> {
    /// The bucket's index (buckets are combined in order on every rank).
    pub index: usize,
    /// The element counts of all the bucket's parameters, in order.
    pub lens: &'a [usize],
    /// Which of them some rank wrote: the tensors given to
    /// [`Combiner::combine`] are these, in order (the others, zeros on every
    /// rank, are not combined).
    pub written: &'a [bool],
    /// The optimizer's step count, the same on every rank (a seed for
    /// strategies that draw at random).
    pub step: u64,
    /// The most elements a fusion buffer may hold.
    pub capacity: usize,
}

/// What a [`Combiner`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Combined {
    /// Bytes this rank sent and received.
    pub traffic: Traffic,
    /// Whether the result is already an average-like combination; if not it
    /// is a sum, which DistOpt divides by the world size.
    pub averaged: bool,
}

/// AdaSum as a combiner: orthogonal gradients add, identical ones average,
/// so the result is used as it is (`averaged`). Prepare it with
/// [`AdaSum::new`] (or [`AdaSum::hierarchical`]) on the DistOpt's
/// communicator, on every rank.
impl<C: Communicator + 'static> Combiner<C> for AdaSum<C> {
    fn combine(
        &mut self,
        comm: &C,
        _bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        // Its own buffers, reused every step: no allocation once warm.
        let traffic = self.combine_reusing_buffers(comm, tensors)?;
        Ok(Combined {
            traffic,
            averaged: true,
        })
    }
}

/// The combiner given to [`super::DistOpt::with_combiner`], shared by all
/// the buckets (their jobs run one at a time on the communication thread;
/// the lock is never contended).
pub(super) struct SharedCombiner<C>(Arc<Mutex<Box<dyn Combiner<C>>>>);

impl<C: Communicator + 'static> SharedCombiner<C> {
    pub(super) fn new(combiner: impl Combiner<C>) -> Self {
        SharedCombiner(Arc::new(Mutex::new(Box::new(combiner))))
    }
}

impl<C> Clone for SharedCombiner<C> {
    fn clone(&self) -> Self {
        SharedCombiner(Arc::clone(&self.0))
    }
}

impl<C> std::fmt::Debug for SharedCombiner<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Combiner")
    }
}

impl<C: Communicator + 'static> Combiner<C> for SharedCombiner<C> {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        // A local failure comes before the combiner's first collective, so
        // it is posted in its place: the other ranks' combiners fail there.
        let Ok(mut guard) = self.0.lock() else {
            let err = AlgoError::InvalidArgument("the combiner panicked in an earlier step".into());
            return Err(fail(comm, err));
        };
        guard.combine(comm, bucket, tensors)
    }

    fn carries_non_finite(&self) -> bool {
        self.0.lock().is_ok_and(|c| c.carries_non_finite())
    }

    fn end_step(&mut self, bucket: usize, kept: bool) {
        if let Ok(mut guard) = self.0.lock() {
            guard.end_step(bucket, kept);
        }
    }

    fn save_state(&self, bucket: usize, ckpt: &mut Checkpoint) -> Result<()> {
        match self.0.lock() {
            Ok(guard) => guard.save_state(bucket, ckpt),
            Err(_) => Err(poisoned()),
        }
    }

    fn load_state(&mut self, bucket: usize, ckpt: &Checkpoint, apply: bool) -> Result<()> {
        match self.0.lock() {
            Ok(mut guard) => guard.load_state(bucket, ckpt, apply),
            Err(_) => Err(poisoned()),
        }
    }
}

fn poisoned() -> crate::OptimError {
    crate::OptimError::InvalidArgument("the combiner panicked in an earlier step".into())
}

/// The strategy of a bucket whose own could not be made (a mode that needs
/// a combiner when none was given, settings refused): every combination
/// fails, alike on every rank, with the reason.
#[derive(Debug)]
struct Refused(String);

impl<C: Communicator + 'static> Combiner<C> for Refused {
    fn combine(
        &mut self,
        comm: &C,
        _bucket: &BucketView<'_>,
        _tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        Err(fail(comm, AlgoError::InvalidArgument(self.0.clone())))
    }
}

/// Builds the registry's `strategy` for a bucket `len` elements long
/// (`shared` is the combiner of `AdaSum`, `Custom` and `DeltaWeight`, if
/// DistOpt has one). Every
/// bucket has one; `Partial` never combines gradients (its own averaging
/// is in `local_step`) and `DimReduce` averages them as `Dense` does.
pub(super) fn for_bucket<C: Communicator + 'static>(
    strategy: StrategyConfig,
    len: usize,
    shared: Option<&SharedCombiner<C>>,
) -> Box<dyn Combiner<C>> {
    match strategy {
        StrategyConfig::Dense | StrategyConfig::DimReduce | StrategyConfig::Partial { .. } => {
            Box::new(dense::DenseSum::default())
        }
        StrategyConfig::Half { precision, clip } => {
            Box::new(half::HalfAverage::new(precision, clip))
        }
        StrategyConfig::Sparse {
            codec,
            error_feedback,
        } => Box::new(sparse::SparseSelect::new(
            codec,
            error_feedback.then_some(len),
        )),
        StrategyConfig::PowerSgd(config) => match powersgd::PowerSgdAverage::new(config) {
            Ok(strategy) => Box::new(strategy),
            // Checked by DistOpt::new: not reached.
            Err(e) => Box::new(Refused(e.to_string())),
        },
        StrategyConfig::Quantized {
            quantizer,
            error_feedback,
            momentum,
        } => match quantized::QuantizedAverage::new(quantizer, error_feedback, momentum) {
            Ok(strategy) => Box::new(strategy),
            // Checked by DistOpt::new: not reached.
            Err(e) => Box::new(Refused(e.to_string())),
        },
        StrategyConfig::OneBitAdam { beta1, freeze_step } => {
            match onebit_adam::OneBitAdamMomentum::new(beta1, freeze_step) {
                Ok(strategy) => Box::new(strategy),
                // Checked by DistOpt::new: not reached.
                Err(e) => Box::new(Refused(e.to_string())),
            }
        }
        StrategyConfig::AdaSum { .. }
        | StrategyConfig::Custom
        | StrategyConfig::DeltaWeight { .. } => match shared {
            Some(shared) => Box::new(shared.clone()),
            None => Box::new(Refused("this strategy needs DistOpt::with_combiner".into())),
        },
    }
}
