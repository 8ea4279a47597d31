//! The [`Combiner`] hook of `Mode::Custom` and `Mode::DeltaWeight`, AdaSum
//! as a combiner, and the shared handle DistOpt's bucket jobs use.

use gradwire_algos::adasum::AdaSum;
use gradwire_algos::fault::fail;
use gradwire_algos::{AlgoError, Traffic};
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;
use std::sync::{Arc, Mutex};

/// How DistOpt combines one bucket's tensors across ranks, beyond the
/// built-in modes: the hook AdaSum (or any strategy) plugs into without
/// changing DistOpt. It runs on the communication thread, one bucket at a
/// time, in bucket order on every rank.
///
/// A combiner keeps the failure model ([`gradwire_algos::fault`]): it
/// completes on every rank or fails on every rank, never returning early
/// on one rank between two of its collectives; a rank that fails locally
/// posts the fault in place of its next collective
/// ([`gradwire_algos::fault::fail`]). Its first collective may also be
/// where another rank's fault arrives: it then returns that error.
pub trait Combiner<C: Communicator>: Send + 'static {
    /// Combines `tensors` (this rank's written gradients, or weight deltas, of
    /// bucket `bucket`, in declaration order) across the ranks of `comm`, in
    /// place.
    fn combine(
        &mut self,
        comm: &C,
        bucket: usize,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined>;
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
        _bucket: usize,
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

/// A combiner shared between DistOpt and its bucket jobs (they run one at a
/// time on the communication thread; the lock is never contended).
pub(super) struct SharedCombiner<C>(pub(super) Arc<Mutex<Box<dyn Combiner<C>>>>);

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

pub(super) fn run_combiner<C: Communicator + 'static>(
    combiner: &Option<SharedCombiner<C>>,
    comm: &C,
    bucket: usize,
    tensors: &mut [Tensor],
) -> gradwire_algos::Result<Combined> {
    // Local failures come before the combiner's first collective, so they
    // are posted in its place: the other ranks' combiners fail there too.
    let Some(combiner) = combiner.as_ref() else {
        let err = AlgoError::InvalidArgument("this mode needs DistOpt::with_combiner".into());
        return Err(fail(comm, err));
    };
    let Ok(mut guard) = combiner.0.lock() else {
        let err = AlgoError::InvalidArgument("the combiner panicked in an earlier step".into());
        return Err(fail(comm, err));
    };
    guard.combine(comm, bucket, tensors)
}
