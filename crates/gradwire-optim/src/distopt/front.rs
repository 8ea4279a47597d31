//! The front ends: one type per training loop over the one [`Engine`],
//! each with only the calls that make sense for its loop ([`DistOpt`]:
//! gradient strategies; [`LocalSteps`]: a local step, then parameters or
//! weight changes combined; [`DimReduceOpt`]: a dense first stage, then
//! DimReduce). What they share (the rank, the optimizer, checkpoints, a
//! step's `push`) is written once, in `shared_calls!`, which
//! [`super::AnyLoop`] (the loop chosen at run time) uses too.

use super::strategies::SharedStrategy;
use super::{DistOptConfig, Engine, ParamSpec, StepStats, StrategyConfig, TrainingLoop};
use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::optimizer::Optimizer;
use gradwire_algos::Strategy;
use gradwire_algos::dimreduce::{DimReduceConfig, Pca};
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;
use std::ops::Range;

/// `new` and `with_strategy` of a front end over an engine of `$loop`,
/// with their docs.
macro_rules! constructors {
    (
        $front:ident,
        $loop:expr,
        new { $(#[$new:meta])* }
        with_strategy { $(#[$with:meta])* }
    ) => {
        impl<O: Optimizer, C: Communicator + 'static> $front<O, C> {
            $(#[$new])*
            pub fn new(
                optimizer: O,
                comm: C,
                params: Vec<ParamSpec>,
                config: DistOptConfig,
            ) -> Result<Self> {
                let engine = Engine::build($loop, optimizer, comm, params, config, None);
                engine.map(|engine| $front { engine })
            }

            $(#[$with])*
            pub fn with_strategy(
                optimizer: O,
                comm: C,
                params: Vec<ParamSpec>,
                config: DistOptConfig,
                strategy: impl Strategy<C>,
            ) -> Result<Self> {
                let shared = Some(SharedStrategy::new(strategy));
                let engine = Engine::build($loop, optimizer, comm, params, config, shared);
                engine.map(|engine| $front { engine })
            }
        }
    };
}

/// The engine of a front end that holds one (`engine`, `engine_mut`,
/// `into_engine`, which `shared_calls!` forwards through).
macro_rules! engine_field {
    ($front:ident) => {
        impl<O: Optimizer, C: Communicator + 'static> $front<O, C> {
            fn engine(&self) -> &Engine<O, C> {
                &self.engine
            }

            fn engine_mut(&mut self) -> &mut Engine<O, C> {
                &mut self.engine
            }

            fn into_engine(self) -> Engine<O, C> {
                self.engine
            }
        }
    };
}

/// The calls every front end has, forwarded to its engine (each front end
/// has `engine`, `engine_mut` and `into_engine`).
macro_rules! shared_calls {
    ($front:ident) => {
        impl<O: Optimizer, C: Communicator + 'static> $front<O, C> {
            /// Number of ranks (SINGA's `world_size`).
            pub fn world_size(&self) -> usize {
                self.engine().world_size()
            }

            /// This rank (SINGA's `rank_in_global`).
            pub fn rank(&self) -> usize {
                self.engine().rank()
            }

            /// This rank within its node (SINGA's `rank_in_local`:
            /// [`DistOptConfig::ranks_per_node`]).
            pub fn local_rank(&self) -> usize {
                self.engine().local_rank()
            }

            /// The wrapped optimizer.
            pub fn optimizer(&self) -> &O {
                self.engine().optimizer()
            }

            /// The wrapped optimizer, mutably (to register per-parameter
            /// settings).
            pub fn optimizer_mut(&mut self) -> &mut O {
                self.engine_mut().optimizer_mut()
            }

            /// The communicator.
            pub fn comm(&self) -> &C {
                self.engine().comm()
            }

            /// Gives the communicator back (the optimizer and the state are
            /// dropped: take a checkpoint first to keep them).
            pub fn into_comm(self) -> C {
                self.into_engine().into_comm()
            }

            /// The current strategy.
            pub fn strategy(&self) -> StrategyConfig {
                self.engine().strategy()
            }

            /// The buckets, as ranges over the parameters in bucket order
            /// (`bucket_order`: the declared order, or, with
            /// [`crate::BucketOrder::Pushed`] in the gradient loop, the
            /// first step's push order from its `finish` on).
            pub fn buckets(&self) -> &[Range<usize>] {
                self.engine().buckets()
            }

            /// The parameters' names in the order the buckets follow.
            pub fn bucket_order(&self) -> Vec<&str> {
                self.engine().bucket_order()
            }

            /// Hands over the gradient of parameter `name` (during
            /// backward). In the gradient strategies its bucket's
            /// collective starts as soon as the bucket is complete (the
            /// last bucket's in `finish`); the other loops communicate in
            /// `finish`.
            ///
            /// A bad gradient (an unknown name, a wrong shape, dtype or
            /// device, a second push) is an error here, and the step is
            /// marked failed: end it with `finish` as usual, which then
            /// fails on every rank alike.
            pub fn push(&mut self, name: &str, grad: Tensor) -> Result<()> {
                self.engine_mut().push(name, grad)
            }

            /// Pushes every gradient, then `finish`: a step without
            /// overlap. `None` is a gradient backward did not produce. A
            /// bad gradient on one rank fails the step on every rank; this
            /// rank returns the first such error.
            pub fn step<'n, 'p>(
                &mut self,
                params: impl IntoIterator<Item = (&'n str, &'p mut Tensor, Option<Tensor>)>,
            ) -> Result<StepStats> {
                self.engine_mut().step(params)
            }

            /// The whole state: the optimizer's, each bucket's strategy's
            /// (error-feedback residuals as tensors `residual/<bucket>`),
            /// partial averaging's counter (value `partial_counter`),
            /// DimReduce's state (`dimreduce/momentum`, values
            /// `dimreduce/b`, `g_last`, `s`, `initialized`; the components
            /// go to their own file, [`crate::checkpoint::save_pca`]) and the
            /// configuration it was saved with. Call between steps.
            pub fn checkpoint(&self) -> Result<Checkpoint> {
                self.engine().checkpoint()
            }

            /// Restores a state saved by `checkpoint` from a front end with
            /// the same strategy, parameters and buckets; errors on any
            /// mismatch, leaving this one as it was.
            pub fn restore(&mut self, ckpt: &Checkpoint) -> Result<()> {
                self.engine_mut().restore(ckpt)
            }

            /// The checkpoint this rank restores to go on, at this front
            /// end's world size, with a run that `saved` holds: one
            /// checkpoint per rank of the world that wrote them
            /// (`saved[r]` by rank `r`), which may have had another size.
            /// At the same size it is this rank's own; at another, every
            /// rank gets the same, with the strategies' per-rank state
            /// averaged so that it adds to the coming steps what it would
            /// have added (`gradwire_algos::reshard`), the optimizer's state
            /// and the parameters (`param/<name>`) rank 0's in a gradient
            /// loop, where every rank holds the same, and their mean in a
            /// loop of local steps; DimReduce's residual momentum, sharded
            /// by rank, whole (each rank's restore keeps its slice); in
            /// DiLoCo, a fault any old rank had not yet carried, which
            /// then ends the resumed round on every rank as it would have
            /// ended the saved one. Changes nothing; pass the result to
            /// `restore`.
            pub fn resharded(&self, saved: &[Checkpoint]) -> Result<Checkpoint> {
                self.engine().resharded(saved)
            }
        }
    };
}

/// Data-parallel training with a gradient strategy: each bucket's
/// gradients combined across ranks during backward (dense, fp16/bf16,
/// sparse, PowerSGD, quantized, 1-bit Adam's exchange, AdaSum, or a
/// strategy of your own), then the optimizer steps with them on every rank
/// alike.
///
/// # The failure model and the engine
///
/// A step either completes on every rank or fails (or is skipped) on every
/// rank, and afterwards every rank stands at the same point of its
/// collective sequence, so the next step works. A fault found on one rank
/// (a bad [`DistOpt::push`], a parameter of the wrong shape, dtype or
/// device at `finish`, a NaN, an optimizer error) is recorded, and the
/// rank's next collective carries it to the others: every rank then
/// returns the same [`OptimError::Fault`](crate::OptimError::Fault), or,
/// for a non-finite gradient with `skip_non_finite`, skips the step alike.
/// A skipped or failed step leaves the parameters, the optimizer state,
/// the error-feedback residuals and the counters as they were; the one
/// exception is an optimizer error while the parameters are updated, after
/// which the failing rank's parameters may be partly updated (restore a
/// checkpoint). Buckets are planned alike on every rank (SINGA's fusion
/// rule) over the parameters in rank 0's first-step push order
/// ([`crate::BucketOrder::Pushed`], the default: the first step sends its
/// buckets in `finish`, later steps overlap them with backward in the order
/// it really produces the gradients) or in declared order
/// ([`crate::BucketOrder::Declared`]), so ranks whose backward passes
/// produce different gradients still issue the same collectives; a
/// gradient no rank wrote is neither sent nor updated.
#[derive(Debug)]
pub struct DistOpt<O: Optimizer, C: Communicator> {
    engine: Engine<O, C>,
}

impl<O: Optimizer, C: Communicator + 'static> DistOpt<O, C> {
    /// Sends what is left, waits for every bucket, and updates every
    /// parameter some rank wrote (SINGA's `wait` + update + `step`).
    /// `params` must hold every declared parameter, once.
    ///
    /// Completes on every rank or fails (or is skipped) on every rank
    /// alike (see the failure model above).
    pub fn finish<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
    ) -> Result<StepStats> {
        self.engine.finish(params)
    }

    /// Weights this step's average by samples: this rank saw `samples` of
    /// the step's global batch, and the combined gradient becomes `sum_r
    /// samples_r * g_r / sum_r samples_r` (each rank's gradient being the
    /// mean over its own samples) instead of the plain mean over ranks.
    /// Call before the step's first push, on every rank (one all-reduce of
    /// two u64; each push then scales its gradient in place). With
    /// accumulation, before every micro-batch's first push (or before
    /// none): the all-reduce runs once, at the step's last micro-batch.
    /// Not for AdaSum or `Custom` (not an average): an error.
    pub fn set_samples(&mut self, samples: u64) -> Result<()> {
        self.engine.set_samples(samples)
    }

    /// Out of data (uneven inputs: PyTorch DDP's `Join`, Horovod's
    /// `hvd.join()`): this rank takes its part in every step the others
    /// still take, contributing no samples, and updates `params` with each
    /// step's combined gradient as they do (so it stays their replica),
    /// until every rank has joined; returns how many steps it took part
    /// in. The others call [`DistOpt::set_samples`] before each step (that
    /// all-reduce is where the ranks learn who still trains). A step that
    /// fails on the ranks still training fails here too, with the same
    /// error: call `join` again to go on taking part.
    pub fn join(&mut self, params: &mut [(&str, &mut Tensor)]) -> Result<u64> {
        let mut steps = 0;
        while self.engine.join_agreed()? {
            self.engine
                .finish(params.iter_mut().map(|(name, param)| (*name, &mut **param)))?;
            steps += 1;
        }
        Ok(steps)
    }
}

engine_field!(DistOpt);
constructors!(
    DistOpt,
    TrainingLoop::Gradients,
    new {
        /// Wraps `optimizer` for the parameters `params` (their buckets
        /// follow the order backward pushes their gradients in:
        /// [`DistOptConfig::bucket_order`]), combining them as
        /// `config.strategy` says: a gradient strategy
        /// ([`TrainingLoop::Gradients`]; another is
        /// [`StrategyError::WrongLoop`](crate::StrategyError::WrongLoop)).
        /// AdaSum is prepared here, on every rank alike (it splits the
        /// communicator). A [`StrategyConfig::Custom`] strategy needs
        /// [`DistOpt::with_strategy`].
    }
    with_strategy {
        /// [`DistOpt::new`] combining every bucket with `strategy`
        /// (`StrategyConfig::Custom`: a strategy of your own).
    }
);
shared_calls!(DistOpt);

/// Local steps: every rank updates its parameters with its own gradients
/// first, then the ranks combine the parameters of one bucket in turn
/// (`partial`: SINGA's partial averaging, optionally with the optimizer's
/// buffers) or every bucket's weight changes (`adasum-delta`: `p = p0 -
/// combined(p0 - p)`, by AdaSum or a strategy of your own). The failure
/// model is [`DistOpt`]'s: the step opens with an agreement, so a fault on
/// one rank fails it on every rank before anything changes, and a failed
/// step puts every rank's parameters and optimizer state back.
#[derive(Debug)]
pub struct LocalSteps<O: Optimizer, C: Communicator> {
    engine: Engine<O, C>,
}

impl<O: Optimizer, C: Communicator + 'static> LocalSteps<O, C> {
    /// The local step with the pushed gradients, then the combination:
    /// one bucket's parameters averaged (`Partial`, the bucket
    /// `counter mod K`, the counter advancing only when the step
    /// completes) or every bucket's weight changes combined
    /// (`DeltaWeight`). `params` must hold every declared parameter, once.
    /// Completes on every rank or fails (or is skipped) on every rank alike.
    pub fn finish<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
    ) -> Result<StepStats> {
        self.engine.finish(params)
    }
}

engine_field!(LocalSteps);
constructors!(
    LocalSteps,
    TrainingLoop::LocalSteps,
    new {
        /// Wraps `optimizer` for `params` (declared in backward order) in the
        /// local-step strategy `config.strategy`
        /// ([`TrainingLoop::LocalSteps`]: `Partial`, `DeltaWeight` or `DiLoCo`; another
        /// is [`StrategyError::WrongLoop`](crate::StrategyError::WrongLoop)).
        /// `DeltaWeight`'s AdaSum is prepared here, on every rank alike.
    }
    with_strategy {
        /// [`LocalSteps::new`] in `DeltaWeight`, combining the weight changes
        /// with `strategy` in place of AdaSum.
    }
);
shared_calls!(LocalSteps);

/// DimReduce (MindSpore boost): a first stage of dense steps with the
/// optimizer while the caller records the trajectory, then, after
/// [`DimReduceOpt::start`] with the principal components fit from it, a
/// quasi-Newton step in the PCA subspace with a line search replaces the
/// optimizer ([`DimReduceOpt::finish_dimreduce`], which takes the loss).
/// The failure model is [`DistOpt`]'s.
#[derive(Debug)]
pub struct DimReduceOpt<O: Optimizer, C: Communicator> {
    engine: Engine<O, C>,
}

impl<O: Optimizer, C: Communicator + 'static> DimReduceOpt<O, C> {
    /// Wraps `optimizer` for `params` (declared in backward order) in
    /// DimReduce (`config.strategy` must be [`StrategyConfig::DimReduce`];
    /// another is [`StrategyError::WrongLoop`](crate::StrategyError::WrongLoop)),
    /// in its first stage: dense ([`StrategyConfig::first_stage`]).
    pub fn new(
        optimizer: O,
        comm: C,
        params: Vec<ParamSpec>,
        config: DistOptConfig,
    ) -> Result<Self> {
        let engine = Engine::build(
            TrainingLoop::DimReduce,
            optimizer,
            comm,
            params,
            config,
            None,
        )?;
        Ok(DimReduceOpt { engine })
    }

    /// A first-stage step: [`DistOpt::finish`] with dense averaging. After
    /// [`DimReduceOpt::start`] a DimReduce step needs the loss
    /// ([`DimReduceOpt::finish_dimreduce`]): this call then fails on every
    /// rank alike ([`OptimError::Fault`](crate::OptimError::Fault) of kind
    /// `InvalidArgument`) and changes nothing.
    pub fn finish<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
    ) -> Result<StepStats> {
        self.engine.finish(params)
    }

    /// Ends the first stage: DimReduce with the components `pca` (the same
    /// on every rank: fit from the same trajectory, or broadcast) over all
    /// declared parameters flattened in declaration order. Call between
    /// steps; the optimizer's state is kept, unused, in the checkpoints. A
    /// component count that does not cover the parameters, or a call in the
    /// middle of a step, is an error and changes nothing.
    pub fn start(&mut self, pca: &Pca, config: DimReduceConfig) -> Result<()> {
        self.engine.start_dimreduce(pca, config)
    }

    /// Whether [`DimReduceOpt::start`] ended the first stage.
    pub fn started(&self) -> bool {
        self.engine.dimreduce_started()
    }

    /// One DimReduce step on `params` (every declared parameter, f32 on the
    /// CPU) from this rank's pushed gradients and `loss`, both averaged
    /// across ranks within the step (P sharded by parameter columns: a
    /// reduce-scatter of the gradients and two all-gathers of the
    /// parameters' size, 1.5 times a dense step's bytes). The line search
    /// calls `eval_loss` with the trial parameters (name and tensor, in
    /// declaration order) on every rank alike; it returns this rank's loss
    /// on the same batch, which the ranks average. A parameter no rank
    /// wrote has a zero gradient here: DimReduce moves all parameters
    /// together.
    ///
    /// If `eval_loss` fails on a rank, that trial counts as rejected on
    /// every rank, the step completes alike everywhere, and then every rank
    /// returns an [`OptimError::Fault`](crate::OptimError::Fault) naming the
    /// rank. A non-finite averaged loss is a non-finite gradient (skipped
    /// with `skip_non_finite`, else a fault everywhere). Before
    /// [`DimReduceOpt::start`] the step fails on every rank alike.
    pub fn finish_dimreduce<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
        loss: f64,
        eval_loss: impl FnMut(&[(&str, &Tensor)]) -> Result<f64>,
    ) -> Result<StepStats> {
        self.engine.finish_dimreduce(params, loss, eval_loss)
    }
}

engine_field!(DimReduceOpt);
shared_calls!(DimReduceOpt);

/// A front end chosen at run time, by the training loop of its strategy:
/// for what walks the registry (the training harness, the fault matrix, a
/// test over every strategy). Each variant is the typed front end, with
/// its own calls; the calls all loops share are here too, and
/// [`AnyLoop::finish`] is the loop's own step.
#[derive(Debug)]
pub enum AnyLoop<O: Optimizer, C: Communicator> {
    /// A gradient strategy.
    Gradients(DistOpt<O, C>),
    /// A local-step strategy.
    LocalSteps(LocalSteps<O, C>),
    /// DimReduce.
    DimReduce(DimReduceOpt<O, C>),
}

impl<O: Optimizer, C: Communicator + 'static> AnyLoop<O, C> {
    /// The front end of `config.strategy`'s training loop, made as its
    /// `new` makes it.
    pub fn new(
        optimizer: O,
        comm: C,
        params: Vec<ParamSpec>,
        config: DistOptConfig,
    ) -> Result<Self> {
        Ok(match config.strategy.training_loop() {
            TrainingLoop::Gradients => {
                AnyLoop::Gradients(DistOpt::new(optimizer, comm, params, config)?)
            }
            TrainingLoop::LocalSteps => {
                AnyLoop::LocalSteps(LocalSteps::new(optimizer, comm, params, config)?)
            }
            TrainingLoop::DimReduce => {
                AnyLoop::DimReduce(DimReduceOpt::new(optimizer, comm, params, config)?)
            }
        })
    }

    /// The front end of `config.strategy`'s training loop combining with
    /// `strategy` ([`DistOpt::with_strategy`],
    /// [`LocalSteps::with_strategy`]); DimReduce takes none (an
    /// [`OptimError::InvalidArgument`](crate::OptimError::InvalidArgument)).
    pub fn with_strategy(
        optimizer: O,
        comm: C,
        params: Vec<ParamSpec>,
        config: DistOptConfig,
        strategy: impl Strategy<C>,
    ) -> Result<Self> {
        Ok(match config.strategy.training_loop() {
            TrainingLoop::Gradients => AnyLoop::Gradients(DistOpt::with_strategy(
                optimizer, comm, params, config, strategy,
            )?),
            TrainingLoop::LocalSteps => AnyLoop::LocalSteps(LocalSteps::with_strategy(
                optimizer, comm, params, config, strategy,
            )?),
            TrainingLoop::DimReduce => {
                return Err(crate::OptimError::InvalidArgument(
                    "DimReduce combines with no strategy of its own".into(),
                ));
            }
        })
    }

    fn engine(&self) -> &Engine<O, C> {
        match self {
            AnyLoop::Gradients(front) => front.engine(),
            AnyLoop::LocalSteps(front) => front.engine(),
            AnyLoop::DimReduce(front) => front.engine(),
        }
    }

    fn engine_mut(&mut self) -> &mut Engine<O, C> {
        match self {
            AnyLoop::Gradients(front) => front.engine_mut(),
            AnyLoop::LocalSteps(front) => front.engine_mut(),
            AnyLoop::DimReduce(front) => front.engine_mut(),
        }
    }

    fn into_engine(self) -> Engine<O, C> {
        match self {
            AnyLoop::Gradients(front) => front.into_engine(),
            AnyLoop::LocalSteps(front) => front.into_engine(),
            AnyLoop::DimReduce(front) => front.into_engine(),
        }
    }

    /// The training loop.
    pub fn training_loop(&self) -> TrainingLoop {
        match self {
            AnyLoop::Gradients(_) => TrainingLoop::Gradients,
            AnyLoop::LocalSteps(_) => TrainingLoop::LocalSteps,
            AnyLoop::DimReduce(_) => TrainingLoop::DimReduce,
        }
    }

    /// The loop's `finish`: [`DistOpt::finish`], [`LocalSteps::finish`] or
    /// [`DimReduceOpt::finish`] (DimReduce's first stage).
    pub fn finish<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
    ) -> Result<StepStats> {
        self.engine_mut().finish(params)
    }

    /// The DimReduce front end, if this is one (to `start` it and take its
    /// steps).
    pub fn dimreduce_mut(&mut self) -> Option<&mut DimReduceOpt<O, C>> {
        match self {
            AnyLoop::DimReduce(front) => Some(front),
            _ => None,
        }
    }
}

shared_calls!(AnyLoop);
