//! The strategy of each bucket, made from the [`StrategyConfig`]
//! ([`for_bucket`]): the built-in strategies of gradwire-algos (each in its
//! own module there, its CPU and CUDA forms side by side), or the one
//! strategy given to a front end's `with_strategy` (or the AdaSum the
//! engine prepares), shared by every bucket.

use super::StrategyConfig;
use gradwire_algos::fault::fail;
use gradwire_algos::{
    AlgoError, BucketView, Combined, DenseSum, HalfAverage, OneBitAdamExchange, PowerSgd,
    QuantizedAllReduce, Result, SparseSelect, StateDict, Strategy,
};
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;
use std::sync::{Arc, Mutex};

/// The strategy given to a front end's `with_strategy`, shared by all
/// the buckets (their jobs run one at a time on the communication thread;
/// the lock is never contended).
pub(crate) struct SharedStrategy<C>(Arc<Mutex<Box<dyn Strategy<C>>>>);

impl<C: Communicator + 'static> SharedStrategy<C> {
    pub(crate) fn new(strategy: impl Strategy<C>) -> Self {
        SharedStrategy(Arc::new(Mutex::new(Box::new(strategy))))
    }
}

impl<C> Clone for SharedStrategy<C> {
    fn clone(&self) -> Self {
        SharedStrategy(Arc::clone(&self.0))
    }
}

impl<C> std::fmt::Debug for SharedStrategy<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedStrategy")
    }
}

/// The error of a strategy that panicked in an earlier step.
fn poisoned() -> AlgoError {
    AlgoError::InvalidArgument("the strategy panicked in an earlier step".into())
}

impl<C: Communicator + 'static> Strategy<C> for SharedStrategy<C> {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> Result<Combined> {
        // A local failure comes before the strategy's first collective, so
        // it is posted in its place: the other ranks' strategies fail there.
        let Ok(mut guard) = self.0.lock() else {
            return Err(fail(comm, poisoned()));
        };
        guard.combine(comm, bucket, tensors)
    }

    fn carries_non_finite(&self) -> bool {
        self.0.lock().is_ok_and(|s| s.carries_non_finite())
    }

    fn end_step(&mut self, bucket: usize, kept: bool) {
        if let Ok(mut guard) = self.0.lock() {
            guard.end_step(bucket, kept);
        }
    }

    fn save_state(&self, bucket: usize, state: &mut StateDict) -> Result<()> {
        self.0
            .lock()
            .map_err(|_| poisoned())?
            .save_state(bucket, state)
    }

    fn load_state(&mut self, bucket: usize, state: &StateDict, apply: bool) -> Result<()> {
        self.0
            .lock()
            .map_err(|_| poisoned())?
            .load_state(bucket, state, apply)
    }
}

/// The strategy of a bucket whose own could not be made (a strategy that
/// needs a front end's `with_strategy` when none was given, settings
/// refused): every combination fails, alike on every rank, with the reason.
#[derive(Debug)]
struct Refused(String);

impl<C: Communicator + 'static> Strategy<C> for Refused {
    fn combine(
        &mut self,
        comm: &C,
        _bucket: &BucketView<'_>,
        _tensors: &mut [Tensor],
    ) -> Result<Combined> {
        Err(fail(comm, AlgoError::InvalidArgument(self.0.clone())))
    }
}

/// Settings checked by `Engine::build` (`StrategyConfig::validate`): a
/// refusal here is not reached, and would fail alike on every rank.
fn or_refused<C: Communicator + 'static, S: Strategy<C>>(made: Result<S>) -> Box<dyn Strategy<C>> {
    match made {
        Ok(strategy) => Box::new(strategy),
        Err(e) => Box::new(Refused(e.to_string())),
    }
}

/// Builds the registry's `strategy` for a bucket `len` elements long
/// (`shared` is the strategy of `AdaSum`, `Custom` and `DeltaWeight`, if
/// the engine has one). Every bucket has one; `Partial` never combines
/// gradients (its own averaging is in `local_step`), `DimReduce`
/// averages them as `Dense` does, and `DiLoCo` combines its
/// pseudo-gradients through its codec's strategy.
pub(super) fn for_bucket<C: Communicator + 'static>(
    strategy: StrategyConfig,
    len: usize,
    shared: Option<&SharedStrategy<C>>,
) -> Box<dyn Strategy<C>> {
    match strategy {
        StrategyConfig::Dense | StrategyConfig::DimReduce | StrategyConfig::Partial { .. } => {
            Box::new(DenseSum::default())
        }
        StrategyConfig::Half { precision, clip } => Box::new(HalfAverage::new(precision, clip)),
        StrategyConfig::Sparse {
            codec,
            error_feedback,
        } => Box::new(SparseSelect::new(codec, error_feedback.then_some(len))),
        StrategyConfig::PowerSgd(config) => or_refused(PowerSgd::new(config)),
        StrategyConfig::Quantized {
            quantizer,
            error_feedback,
            momentum,
        } => or_refused(
            QuantizedAllReduce::new(quantizer, error_feedback).and_then(|q| match momentum {
                Some(mu) => q.with_momentum(mu),
                None => Ok(q),
            }),
        ),
        StrategyConfig::OneBitAdam { beta1, freeze_step } => {
            or_refused(OneBitAdamExchange::new(beta1, freeze_step))
        }
        // The pseudo-gradient travels through the codec's strategy.
        StrategyConfig::DiLoCo(config) => for_bucket(config.codec.strategy(), len, shared),
        StrategyConfig::AdaSum { .. }
        | StrategyConfig::Custom
        | StrategyConfig::DeltaWeight { .. } => match shared {
            Some(shared) => Box::new(shared.clone()),
            None => Box::new(Refused(
                "this strategy needs a with_strategy constructor".into(),
            )),
        },
    }
}
