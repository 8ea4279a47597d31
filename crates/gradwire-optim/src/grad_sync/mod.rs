//! `GradSync`: the gradient-level API, for a framework that keeps its own
//! parameters and optimizer (candle, burn, a hand-written loop).
//!
//! During backward, hand over each gradient as a slice (`&[f32]`, `&[f16]`,
//! `&[bf16]`) or a gradwire [`Tensor`], by name or by declaration index
//! ([`GradSync::push`], [`GradSync::push_tensor`]); each is copied once
//! into a buffer `GradSync` keeps per parameter (reused from step to step)
//! and its bucket travels as soon as it is complete, overlapping the rest
//! of backward, exactly as in [`crate::DistOpt`]. [`GradSync::finish`] waits and
//! writes the combined gradients back into the caller's buffers, in place;
//! the caller's optimizer steps with them.
//!
//! Every gradient-combining mode of DistOpt works (`Dense`, `Half`,
//! `Sparse` with or without error feedback, `Custom` with a [`Strategy`]
//! such as AdaSum), with the same buckets, votes, clipping, non-finite
//! skipping and failure model, because it *is* DistOpt's step (the
//! engine's, with the parameter update left to the caller): results are
//! bitwise DistOpt's. The modes that step the
//! parameters locally first take the caller's own step as a closure
//! ([`GradSync::step_locally`]): `Partial` (local steps, one bucket of
//! parameters averaged per step) and `DeltaWeight` (the weight changes
//! combined, AdaSum's delta-weight mode); the parameters are read and
//! written through [`ParamAccess`] (plain slices, or a framework's
//! storage); partial averaging with the optimizer's state takes the
//! caller's optimizer buffers ([`GradSync::step_locally_with_state`]).
//! DimReduce, which replaces the optimizer's update with its own, runs its
//! dense first stage through [`GradSync::finish`], then
//! [`GradSync::start_dimreduce`] and [`GradSync::step_dimreduce`] (the
//! line search reads the caller's loss). Every strategy of the registry
//! runs here, in its training loop ([`GradSync::training_loop`]).
//!
//! In steady state a step allocates nothing, on any thread (every
//! gradient-combining mode over LocalComm; the buffers, the sparse
//! selections and payloads, the residuals' copies, AdaSum's scratch,
//! DistOpt's lists, the buckets' job slots and the communicator's
//! bookkeeping are all reused).
//!
//! [`GradSync::set_samples`] weights the average by each rank's number of
//! samples, and [`GradSync::join`] lets a rank out of data take part in
//! the others' steps until all are (uneven inputs); [`GradSync::broadcast`] copies a root rank's
//! initial parameters to every rank; [`GradSync::checkpoint`] saves the
//! residuals and counters on their own.
//!
//! ```
//! use gradwire_comm::local;
//! use gradwire_optim::{DistOptConfig, GradSync, ParamSpec};
//!
//! let out = local::run(2, |comm| {
//!     let specs = vec![ParamSpec::new("w", [2, 2]), ParamSpec::new("b", [2])];
//!     let mut sync = GradSync::new(comm, specs, DistOptConfig::default())?;
//!     let rank = sync.rank() as f32;
//!     // Backward produces b's gradient first, then w's.
//!     let (mut gw, mut gb) = (vec![rank; 4], vec![1.0 + rank; 2]);
//!     sync.push("b", &gb)?;
//!     sync.push("w", &gw)?;
//!     sync.finish(&mut [&mut gw[..], &mut gb[..]])?;
//!     Ok::<_, gradwire_optim::OptimError>((gw, gb))
//! })
//! .unwrap();
//! for r in out {
//!     assert_eq!(r.unwrap(), (vec![0.5; 4], vec![1.5; 2]));
//! }
//! ```
//!
//! The parameters' traits are in `params.rs`, the optimizer that updates
//! nothing in `passthrough.rs`, the gradients' hand-over and the end of a
//! step in `gradients.rs`, the steps on the caller's parameters (local
//! steps, DimReduce) in `local.rs`.

use crate::checkpoint::Checkpoint;
use crate::distopt::{
    DistOptConfig, Engine, ParamSpec, SharedStrategy, Strategy, StrategyConfig, TrainingLoop,
};
use crate::error::{OptimError, Result};
use gradwire_comm::Communicator;
use gradwire_tensor::{Tensor, WithDType};
use passthrough::Passthrough;

mod gradients;
mod local;
mod params;
mod passthrough;

pub use params::{ParamAccess, ParamRef};

/// Data-parallel gradients for a framework's own parameters and optimizer.
#[derive(Debug)]
pub struct GradSync<C: Communicator + 'static> {
    dist: Engine<Passthrough, C>,
    specs: Vec<ParamSpec>,
    /// One buffer per parameter, handed to DistOpt for a step and given
    /// back by `finish` (so no step allocates one).
    pool: Vec<Option<Tensor>>,
    /// The parameters' values during a [`GradSync::step_locally`] or
    /// [`GradSync::step_dimreduce`] (made on first use, reused).
    values: Vec<Tensor>,
}

impl<C: Communicator + 'static> GradSync<C> {
    /// Gradients of `params` (declared in the order backward produces
    /// them), combined by `config.strategy`, in its training loop: a
    /// gradient strategy (`Dense`, `Half`, `Sparse`, `PowerSgd`,
    /// `Quantized`, `AdaSum`, ...: [`GradSync::finish`]), local steps
    /// (`Partial`, `DeltaWeight`: [`GradSync::step_locally`]) or DimReduce
    /// (its dense first stage through [`GradSync::finish`], then
    /// [`GradSync::start_dimreduce`] and [`GradSync::step_dimreduce`]).
    pub fn new(comm: C, params: Vec<ParamSpec>, config: DistOptConfig) -> Result<Self> {
        if config.strategy == StrategyConfig::Custom {
            return Err(OptimError::InvalidArgument(
                "a Custom strategy is the one you give: GradSync::with_strategy".into(),
            ));
        }
        check_accumulation(&config)?;
        let dist = Engine::build(
            config.strategy.training_loop(),
            Passthrough::default(),
            comm,
            params.clone(),
            config,
            None,
        )?;
        Ok(Self::around(dist, params))
    }

    /// [`GradSync::new`] in `StrategyConfig::Custom` (or `DeltaWeight`),
    /// combined by `strategy`: a strategy of your own.
    pub fn with_strategy(
        comm: C,
        params: Vec<ParamSpec>,
        config: DistOptConfig,
        strategy: impl Strategy<C>,
    ) -> Result<Self> {
        check_accumulation(&config)?;
        let dist = Engine::build(
            config.strategy.training_loop(),
            Passthrough::default(),
            comm,
            params.clone(),
            config,
            Some(SharedStrategy::new(strategy)),
        )?;
        Ok(Self::around(dist, params))
    }

    /// The training loop of the configured strategy: which step ends each
    /// iteration ([`GradSync::finish`], [`GradSync::step_locally`], or
    /// [`GradSync::step_dimreduce`] once DimReduce has started).
    pub fn training_loop(&self) -> TrainingLoop {
        self.dist.training_loop()
    }

    /// The loop the next step takes, the same on every rank, which a front
    /// end that serves every strategy asks at each step:
    /// [`GradSync::training_loop`], but [`TrainingLoop::Gradients`] (end
    /// the step with [`GradSync::finish`]) in DimReduce's first stage and
    /// during DiLoCo's warm-up by gradients
    /// ([`crate::WarmupBy::Gradients`]).
    pub fn current_loop(&self) -> TrainingLoop {
        self.dist.current_loop()
    }

    fn around(dist: Engine<Passthrough, C>, specs: Vec<ParamSpec>) -> Self {
        let pool = specs.iter().map(|_| None).collect();
        GradSync {
            dist,
            specs,
            pool,
            values: Vec::new(),
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.dist.rank()
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.dist.world_size()
    }

    /// The declared parameters.
    pub fn params(&self) -> &[ParamSpec] {
        &self.specs
    }

    /// The communicator.
    pub fn comm(&self) -> &C {
        self.dist.comm()
    }

    /// For a front end whose loops of local steps step the framework's
    /// optimizer on the framework's gradients (gradwire-candle's and
    /// gradwire-burn's `DataParallel`): the configuration to build
    /// GradSync with, and the micro-batches per step the front end sums
    /// itself. In the loops of local steps all of `config.accumulate`
    /// (GradSync then takes one micro-batch per step: [`GradSync::new`]
    /// refuses more there); elsewhere 1 (the engine accumulates). An
    /// `accumulate` of 0 is an error.
    pub fn local_micro_batches(
        mut config: DistOptConfig,
    ) -> Result<(DistOptConfig, crate::MicroBatches)> {
        if config.strategy.training_loop() != TrainingLoop::LocalSteps {
            return Ok((config, crate::MicroBatches::new(1)));
        }
        if config.accumulate == 0 {
            return Err(OptimError::InvalidArgument(
                "accumulate: a step takes at least one micro-batch".into(),
            ));
        }
        let micro_batches = std::mem::replace(&mut config.accumulate, 1);
        Ok((config, crate::MicroBatches::new(micro_batches)))
    }

    /// Whether this step's combined gradients will be bitwise the ones
    /// pushed: one rank, the dense strategy, no clipping, no accumulation,
    /// no sample weight but 1. Ask after the step's pushes, before
    /// [`GradSync::finish_each`]: a front end may then leave the
    /// framework's own gradients in place rather than copy the same values
    /// back (gradwire-candle's and gradwire-burn's `DataParallel` do: a
    /// lone worker pays no copy it does not need). The step still runs as
    /// usual (the checks, the skip, the counters).
    pub fn combines_to_identity(&self) -> bool {
        self.dist.combines_to_identity()
    }

    /// Copies `root`'s parameters into every rank's (collective): call once
    /// at start, so that every rank trains the same model.
    pub fn broadcast<T: WithDType + gradwire_comm::Element>(
        &self,
        params: &mut [&mut [T]],
        root: usize,
    ) -> Result<()> {
        for p in params.iter_mut() {
            self.dist
                .comm()
                .broadcast(p, root)
                .map_err(gradwire_algos::AlgoError::from)?;
        }
        Ok(())
    }

    /// GradSync's own state: the error-feedback residuals, the step
    /// counter and the configuration it runs (see
    /// [`crate::DistOpt::checkpoint`]); the caller saves its parameters and
    /// optimizer beside it.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        self.dist.checkpoint()
    }

    /// Restores what [`GradSync::checkpoint`] saved (same configuration).
    pub fn restore(&mut self, ckpt: &Checkpoint) -> Result<()> {
        self.dist.restore(ckpt)
    }

    /// The checkpoint to restore to go on, at this world size, with the
    /// run that `saved` holds (one per rank of the world that wrote it,
    /// of any size; see [`crate::DistOpt::resharded`]).
    pub fn resharded(&self, saved: &[Checkpoint]) -> Result<Checkpoint> {
        self.dist.resharded(saved)
    }
}

/// GradSync's own rule on accumulation: the local-step loops step with the
/// caller's optimizer on the caller's gradients, which GradSync does not
/// hold, so they take one micro-batch per step here (gradwire's
/// [`crate::LocalSteps`] accumulates: it owns the gradients).
fn check_accumulation(config: &DistOptConfig) -> Result<()> {
    if config.accumulate > 1 && config.strategy.training_loop() == TrainingLoop::LocalSteps {
        return Err(OptimError::InvalidArgument(format!(
            "accumulate: GradSync's local steps ({}) are the caller's own, on the caller's \
             gradients; accumulate them before the step, or use LocalSteps",
            config.strategy
        )));
    }
    Ok(())
}
