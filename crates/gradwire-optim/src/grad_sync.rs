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

use crate::checkpoint::Checkpoint;
use crate::distopt::{
    DistOptConfig, Engine, ParamSpec, SharedStrategy, StepStats, Strategy, StrategyConfig,
    TrainingLoop,
};
use crate::error::{OptimError, Result};
use crate::optimizer::{Optimizer, StateBuffers};
use crate::state::{OptimizerState, ParamState};
use gradwire_algos::FaultKind;
use gradwire_algos::dimreduce::{DimReduceConfig, Pca};
use gradwire_comm::Communicator;
use gradwire_tensor::{DType, Device, Tensor, WithDType};
use std::cell::RefCell;

/// A parameter named by its declared name or its declaration index.
pub trait ParamRef {
    /// Its declaration index in `sync`, if any.
    fn index_in<C: Communicator + 'static>(&self, sync: &GradSync<C>) -> Option<usize>;
}

impl ParamRef for &str {
    fn index_in<C: Communicator + 'static>(&self, sync: &GradSync<C>) -> Option<usize> {
        sync.specs.iter().position(|s| s.name == *self)
    }
}

impl ParamRef for usize {
    fn index_in<C: Communicator + 'static>(&self, sync: &GradSync<C>) -> Option<usize> {
        (*self < sync.specs.len()).then_some(*self)
    }
}

/// Where a framework keeps its parameters, for
/// [`GradSync::step_locally`]: parameter `index` (declaration order) read
/// into and written from f32 values of its declared length.
pub trait ParamAccess {
    /// Copies parameter `index`'s values into `out`.
    fn read(&self, index: usize, out: &mut [f32]) -> Result<()>;
    /// Sets parameter `index`'s values to `values`.
    fn write(&mut self, index: usize, values: &[f32]) -> Result<()>;
}

/// Parameters as the caller's own f32 slices, in declaration order.
impl ParamAccess for [&mut [f32]] {
    fn read(&self, index: usize, out: &mut [f32]) -> Result<()> {
        match self.get(index) {
            Some(p) if p.len() == out.len() => {
                out.copy_from_slice(p);
                Ok(())
            }
            p => Err(OptimError::InvalidArgument(format!(
                "parameter {index}: {} values given, {} declared",
                p.map_or(0, |p| p.len()),
                out.len()
            ))),
        }
    }

    fn write(&mut self, index: usize, values: &[f32]) -> Result<()> {
        match self.get_mut(index) {
            Some(p) if p.len() == values.len() => {
                p.copy_from_slice(values);
                Ok(())
            }
            _ => Err(OptimError::InvalidArgument(format!(
                "parameter {index}: no buffer of {} values",
                values.len()
            ))),
        }
    }
}

/// The "optimizer" of a gradient-level DistOpt: it updates nothing (the
/// caller's optimizer does) and only counts steps (random-k draws its
/// indices from the step).
#[derive(Debug, Default)]
struct Passthrough {
    step: u64,
}

impl Optimizer for Passthrough {
    type Config = ();
    fn kind(&self) -> &'static str {
        "gradsync"
    }
    fn config(&self) -> &() {
        &()
    }
    fn register(&mut self, _: &str, (): ()) -> Result<()> {
        Ok(())
    }
    fn update(&mut self, _: &str, _: &mut Tensor, _: &Tensor) -> Result<()> {
        Err(OptimError::InvalidArgument(
            "GradSync updates no parameter".into(),
        ))
    }
    fn step(&mut self) {
        self.step += 1;
    }
    fn step_count(&self) -> u64 {
        self.step
    }
    fn param_state(&self, _: &str) -> Option<&ParamState> {
        None
    }
    fn state(&self) -> Result<OptimizerState> {
        Ok(OptimizerState {
            kind: "gradsync".into(),
            step: self.step,
            config: serde_json::Value::Null,
            overrides: Default::default(),
            params: Default::default(),
        })
    }
    fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        if state.kind != "gradsync" {
            return Err(OptimError::StateMismatch(format!(
                "a {} state cannot be loaded into GradSync",
                state.kind
            )));
        }
        self.step = state.step;
        Ok(())
    }
}

impl StateBuffers for Passthrough {
    fn buffer_names(&self) -> &'static [&'static str] {
        &[]
    }
    fn buffer_values(&self, _: &str, _: &str) -> Result<Option<Vec<f32>>> {
        Ok(None)
    }
    fn set_buffer(&mut self, name: &str, _: &[usize], buffer: &str, _: Vec<f32>) -> Result<()> {
        Err(OptimError::StateMismatch(format!(
            "{name}: GradSync keeps no buffer {buffer}"
        )))
    }
}

/// An optimizer's buffers lent to the engine between the uses of the local
/// step ([`GradSync::step_locally_with_state`]).
struct BorrowedBuffers<'c, 'o, S: ?Sized>(&'c RefCell<&'o mut S>);

impl<S: StateBuffers + ?Sized> StateBuffers for BorrowedBuffers<'_, '_, S> {
    fn buffer_names(&self) -> &'static [&'static str] {
        self.0.borrow().buffer_names()
    }

    fn buffer_values(&self, name: &str, buffer: &str) -> Result<Option<Vec<f32>>> {
        self.0.borrow().buffer_values(name, buffer)
    }

    fn set_buffer(
        &mut self,
        name: &str,
        shape: &[usize],
        buffer: &str,
        values: Vec<f32>,
    ) -> Result<()> {
        self.0.borrow_mut().set_buffer(name, shape, buffer, values)
    }
}

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

    /// A step of `Partial` or `DeltaWeight` with the caller's own local
    /// step: `step(params)` updates the caller's parameters (its optimizer,
    /// with this rank's own gradients), then GradSync averages one bucket
    /// of them across ranks (`Partial`, a bucket in turn) or combines the
    /// weight changes (`DeltaWeight`: `p = p0 - combined(p0 - p)`, the
    /// strategy's AdaSum), writing the result through `params`. Gradients
    /// pushed before ([`GradSync::push`], optional) are checked for NaN and
    /// infinities, which fail (or, with `skip_non_finite`, skip) the step
    /// on every rank before anything changes. Partial averaging with the
    /// optimizer's state takes [`GradSync::step_locally_with_state`].
    ///
    /// Completes on every rank or fails on every rank: a `step` or a
    /// `params.read` error on one rank is an error on every rank
    /// ([`OptimError::Fault`]), and `DeltaWeight` puts `p0` back. Copies:
    /// the parameters are read into GradSync's buffers before and after the
    /// step and written back once.
    pub fn step_locally<P: ParamAccess + ?Sized>(
        &mut self,
        params: &mut P,
        step: impl FnOnce(&mut P) -> Result<()>,
    ) -> Result<StepStats> {
        self.local_step(params, None, step)
    }

    /// [`GradSync::step_locally`] whose averaging, in `Partial` with
    /// `average_state` (`partial:state`), covers the buffers of the
    /// caller's optimizer too (momentum, moments: `optimizer`'s
    /// [`StateBuffers`]), one bucket's at a time, as [`crate::LocalSteps`]
    /// does with gradwire's optimizer. `step(params, optimizer)` is the
    /// local step. In the other local-step strategies the buffers are not
    /// read.
    pub fn step_locally_with_state<P, S>(
        &mut self,
        params: &mut P,
        optimizer: &mut S,
        step: impl FnOnce(&mut P, &mut S) -> Result<()>,
    ) -> Result<StepStats>
    where
        P: ParamAccess + ?Sized,
        S: StateBuffers + ?Sized,
    {
        // The local step and then the averaging use the optimizer in turn.
        let optimizer = RefCell::new(optimizer);
        let mut buffers = BorrowedBuffers(&optimizer);
        self.local_step(params, Some(&mut buffers), |p| {
            step(p, &mut **optimizer.borrow_mut())
        })
    }

    fn local_step<P: ParamAccess + ?Sized>(
        &mut self,
        params: &mut P,
        state: Option<&mut dyn StateBuffers>,
        step: impl FnOnce(&mut P) -> Result<()>,
    ) -> Result<StepStats> {
        let unreadable = self.read_values(params)?;
        let mut step = Some(step);
        let mut values = std::mem::take(&mut self.values);
        let names = self.specs.iter().map(|s| s.name.as_str());
        let result = self.dist.finish_with_caller_step(
            names.zip(values.iter_mut()),
            &mut |targets| {
                let step = step.take().ok_or_else(|| {
                    OptimError::InvalidArgument("the local step ran twice".into())
                })?;
                step(params)?;
                for (i, target) in targets.iter_mut().enumerate() {
                    if let Some(t) = target {
                        params.read(i, t.as_mut_slice::<f32>()?)?;
                    }
                }
                Ok(())
            },
            state,
        );
        // The step's outcome is agreed; the values are the combined ones
        // (or p0 put back, or the local step when the averaging failed).
        self.write_values(params, values, unreadable)?;
        result
    }

    /// Ends DimReduce's first stage (the dense steps through
    /// [`GradSync::finish`]): from now on each step is
    /// [`GradSync::step_dimreduce`], in the subspace of the components
    /// `pca` (the same on every rank: fit from the same trajectory, or
    /// broadcast) over all declared parameters flattened in declaration
    /// order. Call between steps. Another strategy, a component count that
    /// does not cover the parameters, or a call in the middle of a step is
    /// an error and changes nothing.
    pub fn start_dimreduce(&mut self, pca: &Pca, config: DimReduceConfig) -> Result<()> {
        self.dist.start_dimreduce(pca, config)
    }

    /// Whether [`GradSync::start_dimreduce`] ended DimReduce's first stage.
    pub fn dimreduce_started(&self) -> bool {
        self.dist.dimreduce_started()
    }

    /// One DimReduce step ([`crate::DimReduceOpt::finish_dimreduce`]) on
    /// the caller's parameters: from this rank's pushed gradients and
    /// `loss` (this rank's loss on its batch), both averaged across ranks
    /// within the step; the line search writes each trial point into
    /// `params` and calls `loss_at(params)`, this rank's loss there on the
    /// same batch. The parameters end at the accepted point (or where they
    /// were, after a rejected or failed step), written through `params`.
    ///
    /// Completes on every rank or fails on every rank: a `params` or
    /// `loss_at` error on one rank is an error on every rank
    /// ([`OptimError::Fault`]); before [`GradSync::start_dimreduce`] the
    /// step fails on every rank alike and changes nothing.
    pub fn step_dimreduce<P: ParamAccess + ?Sized>(
        &mut self,
        params: &mut P,
        loss: f64,
        mut loss_at: impl FnMut(&mut P) -> Result<f64>,
    ) -> Result<StepStats> {
        let unreadable = self.read_values(params)?;
        let mut values = std::mem::take(&mut self.values);
        let names = self.specs.iter().map(|s| s.name.as_str());
        let result = self
            .dist
            .finish_dimreduce(names.zip(values.iter_mut()), loss, |trial| {
                for (i, (_, t)) in trial.iter().enumerate() {
                    params.write(i, t.as_slice::<f32>()?)?;
                }
                loss_at(params)
            });
        self.write_values(params, values, unreadable)?;
        result
    }

    /// Reads the caller's parameters into GradSync's buffers (made on
    /// first use, reused). A read error is returned as this rank's fault,
    /// recorded for the step's first collective to carry.
    fn read_values<P: ParamAccess + ?Sized>(
        &mut self,
        params: &mut P,
    ) -> Result<Option<OptimError>> {
        if self.values.len() != self.specs.len() {
            self.values = self
                .specs
                .iter()
                .map(|spec| Tensor::zeros(spec.shape.clone(), DType::F32, Device::Cpu))
                .collect::<std::result::Result<_, _>>()?;
        }
        let mut unreadable = None;
        for (i, value) in self.values.iter_mut().enumerate() {
            if let Err(e) = params.read(i, value.as_mut_slice::<f32>()?) {
                unreadable.get_or_insert(e);
            }
        }
        if let Some(e) = &unreadable {
            self.dist.record(FaultKind::InvalidArgument, e);
        }
        Ok(unreadable)
    }

    /// Writes the step's outcome, `values`, into the caller's parameters
    /// (unless they could not be read: they stay as they are), and keeps
    /// the buffers for the next step.
    fn write_values<P: ParamAccess + ?Sized>(
        &mut self,
        params: &mut P,
        values: Vec<Tensor>,
        unreadable: Option<OptimError>,
    ) -> Result<()> {
        let written = if unreadable.is_none() {
            values
                .iter()
                .enumerate()
                .try_for_each(|(i, value)| params.write(i, value.as_slice::<f32>()?))
        } else {
            Ok(())
        };
        self.values = values;
        written
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

    /// Hands over the gradient of `param` (a name or a declaration index)
    /// as a slice in the declared dtype; it is copied once into this
    /// parameter's buffer, and its bucket starts as soon as it is complete.
    /// A bad call (an unknown parameter, a wrong length or dtype) is an
    /// error here and fails the step on every rank: end it with
    /// [`GradSync::finish`] as usual.
    pub fn push<T: WithDType>(&mut self, param: impl ParamRef, grad: &[T]) -> Result<()> {
        let i = self.index_of(param)?;
        let spec = &self.specs[i];
        let n: usize = spec.shape.iter().product();
        if grad.len() != n || T::DTYPE != spec.dtype || !spec.device.is_cpu() {
            let err = OptimError::InvalidArgument(format!(
                "gradient of {}: {} elements of {} given, {n} of {} on {:?} declared",
                spec.name,
                grad.len(),
                T::DTYPE,
                spec.dtype,
                spec.device
            ));
            self.dist.record(FaultKind::InvalidArgument, &err);
            return Err(err);
        }
        let mut buffer = match self.pool[i].take() {
            Some(buffer) => buffer,
            None => Tensor::zeros(spec.shape.clone(), spec.dtype, spec.device)?,
        };
        buffer.as_mut_slice::<T>()?.copy_from_slice(grad);
        // The engine applies the sample weight, in place.
        self.dist.push(&self.specs[i].name, buffer)
    }

    /// Hands over the gradient of `param` as a gradwire tensor (any device
    /// DistOpt supports), without a copy.
    pub fn push_tensor(&mut self, param: impl ParamRef, grad: Tensor) -> Result<()> {
        let i = self.index_of(param)?;
        self.dist.push(&self.specs[i].name, grad)
    }

    /// Fails this step on this rank with `detail`: for a framework's own
    /// error while it hands over the gradients (a conversion that failed),
    /// which must not end the step early on this rank alone. The step's
    /// next collective carries it, and every rank's `finish` (or
    /// `step_locally`, `step_dimreduce`) returns the fault, kind
    /// `InvalidArgument`, naming this rank. End the step as usual.
    pub fn fail_step(&mut self, detail: &dyn std::fmt::Display) {
        self.dist.record(FaultKind::InvalidArgument, detail);
    }

    /// The declaration index of `param`; an unknown one is an error, and
    /// this step's fault (every rank fails the step).
    fn index_of(&mut self, param: impl ParamRef) -> Result<usize> {
        param.index_in(self).ok_or_else(|| {
            let err = OptimError::InvalidArgument(format!(
                "unknown parameter given to GradSync ({} declared)",
                self.specs.len()
            ));
            self.dist.record(FaultKind::InvalidArgument, &err);
            err
        })
    }

    /// Weights this step's average by samples: this rank saw `samples` of
    /// the step's global batch, and the combined gradient becomes
    /// `sum_r samples_r * g_r / sum_r samples_r` (each rank's gradient being
    /// the mean over its own samples) instead of the plain mean over ranks.
    /// Call before the step's first push, on every rank (one all-reduce of
    /// two u64; the engine's push then scales each gradient in place:
    /// [`crate::DistOpt::set_samples`], one mechanism). Not for `Custom`
    /// (AdaSum is not an average).
    ///
    /// With accumulation ([`DistOptConfig::accumulate`]) call it before
    /// every micro-batch's first push (or before none): each micro-batch's
    /// gradient is weighted by its own samples, and the step's combined
    /// gradient is `sum over ranks and micro-batches of samples * g / the
    /// total`; the all-reduce runs once, at the step's last micro-batch.
    pub fn set_samples(&mut self, samples: u64) -> Result<()> {
        self.dist.set_samples(samples)
    }

    /// Out of data (uneven inputs: PyTorch DDP's `Join`, Horovod's
    /// `hvd.join()`): this rank takes its part in every step the others
    /// still take, contributing no samples, until every rank has joined;
    /// then returns how many steps it took part in
    /// ([`GradSync::join_step`], the combined gradients dropped). The
    /// others go on with [`GradSync::set_samples`] before each step (which
    /// every rank must call, each step, for ranks to join: that all-reduce
    /// is where the ranks learn who is still training), and their combined
    /// gradient is the mean over the samples actually seen, `sum_r
    /// samples_r * g_r / sum_r samples_r` over the ranks still training. A
    /// rank that joins between the micro-batches of a step contributes the
    /// micro-batches it took to that step (if another rank still takes
    /// it). Every gradient strategy that averages runs while ranks have
    /// joined (a joined rank sends zeros; its error-feedback residual still
    /// drains into the exchange, so no mass is lost); AdaSum, `Custom` and
    /// the loops of local steps are refused (typed). A step that fails on
    /// the ranks still training fails here too (the same error): call
    /// `join` again to go on taking part.
    pub fn join(&mut self) -> Result<u64> {
        let mut steps = 0;
        while self.dist.join_agreed()? {
            // The combination is not read (in any dtype): the buffers go
            // back to the pool.
            let pool = &mut self.pool;
            self.dist.finish_gradients(|i, g| {
                if let Some(slot) = pool.get_mut(i) {
                    *slot = Some(g);
                }
                Ok(())
            })?;
            steps += 1;
        }
        Ok(steps)
    }

    /// One step of a rank that has joined ([`GradSync::join`]): `None`
    /// once every rank has joined (nothing is exchanged); otherwise this
    /// rank's part in the step the others take, each combined gradient
    /// handed to `write(index, values)` as [`GradSync::finish_each`] does,
    /// so that a joined rank can go on stepping its optimizer with the
    /// others' mean and stay their replica.
    pub fn join_step<T: WithDType>(
        &mut self,
        write: impl FnMut(usize, &[T]) -> Result<()>,
    ) -> Result<Option<StepStats>> {
        if !self.dist.join_agreed()? {
            return Ok(None);
        }
        self.finish_each(write).map(Some)
    }

    /// Waits for every bucket and writes the combined gradients into
    /// `grads` (one buffer per declared parameter, in declaration order, of
    /// its declared dtype and length), in place. A gradient no rank pushed
    /// leaves its buffer as it was (see [`StepStats::skipped`]). A skipped
    /// step (a non-finite gradient with `skip_non_finite`) writes nothing.
    ///
    /// Completes on every rank or fails on every rank (DistOpt's failure
    /// model): buffers of the wrong number, length or dtype are found
    /// before the step's last collective, which carries the fault.
    pub fn finish<T: WithDType>(&mut self, grads: &mut [&mut [T]]) -> Result<StepStats> {
        let shape_error = if grads.len() != self.specs.len() {
            Some(format!(
                "{} buffers given to GradSync::finish, {} parameters declared",
                grads.len(),
                self.specs.len()
            ))
        } else {
            self.specs.iter().zip(grads.iter()).find_map(|(spec, g)| {
                let n: usize = spec.shape.iter().product();
                (g.len() != n || T::DTYPE != spec.dtype).then(|| {
                    format!(
                        "buffer of {}: {} elements of {} given, {n} of {} declared",
                        spec.name,
                        g.len(),
                        T::DTYPE,
                        spec.dtype
                    )
                })
            })
        };
        if let Some(e) = &shape_error {
            self.dist.record(FaultKind::InvalidArgument, e);
        }
        let result = self.finish_each(|i, combined: &[T]| {
            if let Some(out) = grads.get_mut(i) {
                out.copy_from_slice(combined);
            }
            Ok(())
        });
        match (result, shape_error) {
            (Err(e), _) => Err(e),
            (Ok(_), Some(e)) => Err(OptimError::InvalidArgument(e)),
            (Ok(stats), None) => Ok(stats),
        }
    }

    /// [`GradSync::finish`] handing each combined gradient some rank wrote
    /// to `write(index, values)` (declaration index, values in the declared
    /// dtype `T`) instead of copying it into a buffer: for a framework that
    /// builds its own gradient objects from them. A `write` error on one
    /// rank is an error on every rank.
    pub fn finish_each<T: WithDType>(
        &mut self,
        mut write: impl FnMut(usize, &[T]) -> Result<()>,
    ) -> Result<StepStats> {
        let pool = &mut self.pool;
        if self.dist.accumulating() {
            // The buffers come back at once: the sums are the engine's.
            return Ok(self.dist.accumulate_micro_batch(|i, g| {
                if let Some(slot) = pool.get_mut(i) {
                    *slot = Some(g);
                }
            }));
        }
        self.dist.finish_gradients(|i, g| {
            write(i, g.as_slice::<T>()?)?;
            // The buffer comes back for the next step (one that did not,
            // after a failed step, is made again on first use).
            if let Some(slot) = pool.get_mut(i) {
                *slot = Some(g);
            }
            Ok(())
        })
    }

    /// The end of a step for a front end that takes uneven inputs:
    /// [`GradSync::finish_each`] on a rank still stepping (`joined`
    /// false), [`GradSync::join_step`] on one that has joined (`None` once
    /// every rank has).
    pub fn finish_each_or_join<T: WithDType>(
        &mut self,
        joined: bool,
        write: impl FnMut(usize, &[T]) -> Result<()>,
    ) -> Result<Option<StepStats>> {
        if joined {
            self.join_step(write)
        } else {
            self.finish_each(write).map(Some)
        }
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
