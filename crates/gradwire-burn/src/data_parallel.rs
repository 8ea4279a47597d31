//! [`DataParallel`]: a burn optimizer made data-parallel, on
//! [`GradSync`], in the training loop its strategy names: gradients
//! combined across the workers before the optimizer steps (the gradient
//! strategies); the optimizer's local step followed by the averaging of
//! the parameters (`partial`) or the combination of the weight changes
//! (`adasum-delta`, DiLoCo, after a warm-up by gradients that combines
//! gradients); or DimReduce (a dense first stage, then DimReduce's own
//! update with the line search through the caller's loss).
//!
//! The module is passed as `&mut M` and replaced by its next state only
//! when a step completes: a step that fails (on this worker or any other)
//! leaves it as it was, in the gradient strategies, and the worker can go
//! on with it.

use crate::Result;
use crate::access::ModuleAccess;
use crate::accumulate::LocalAccumulation;
use crate::error::into_optim;
use crate::params::{
    ParamEntry, each_gradient, gradients_from, parameters_of, read_parameters, specs_of,
    write_parameters,
};
use burn::module::Module;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLearningRate;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::Tensor;
use gradwire_algos::dimreduce::{DimReduceConfig, Pca};
use gradwire_comm::Communicator;
use gradwire_optim::checkpoint::Checkpoint;
use gradwire_optim::{
    DistOptConfig, GradSync, OptimError, StepStats, Strategy, StrategyConfig, StrategyError,
    TrainingLoop,
};

/// A burn optimizer made data-parallel, in the training loop of its
/// strategy.
pub struct DataParallel<C: Communicator + 'static> {
    sync: GradSync<C>,
    params: Vec<ParamEntry>,
    optimizer: ModuleOptimizer,
    last: StepStats,
    /// The loops of local steps' own accumulation (gradwire's engine
    /// accumulates in the gradient strategies).
    accumulation: LocalAccumulation,
    /// Per parameter, the combined gradient of the step being finished.
    combined: Vec<Option<Vec<f32>>>,
}

impl<C: Communicator + 'static> std::fmt::Debug for DataParallel<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataParallel")
            .field("rank", &self.sync.rank())
            .field("world_size", &self.sync.world_size())
            .field("params", &self.params)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl<C: Communicator + 'static> DataParallel<C> {
    /// The float parameters of `module` (the same model on every worker),
    /// stepped by `optimizer` (any burn optimizer: `SgdConfig::new().init()`,
    /// `AdamConfig::new().init()`, a `ModuleOptimizer` of your own rule),
    /// combined as `dist.strategy` says, in its training loop: a gradient
    /// strategy of the registry (`dense`, `fp16`, `topk:0.01`,
    /// `powersgd:4`, `adasum-grad`, ...: [`DataParallel::step`]); local
    /// steps (`partial`, one bucket of parameters averaged per step;
    /// `adasum-delta`, the weight changes combined by AdaSum; DiLoCo's
    /// outer step: [`DataParallel::step`] too); or `dimreduce` (dense
    /// steps, then [`DataParallel::start_dimreduce`] and
    /// [`DataParallel::step_dimreduce`]). Over `comm`.
    ///
    /// `partial:state` averages the optimizer's buffers too, which burn's
    /// optimizers keep to themselves: it is refused
    /// ([`StrategyError::PrivateState`]).
    pub fn new<M: Module>(
        module: &M,
        optimizer: ModuleOptimizer,
        comm: C,
        dist: DistOptConfig,
    ) -> Result<Self> {
        let params = parameters_of(module)?;
        let (dist, micro_batches) = GradSync::<C>::local_micro_batches(dist)?;
        let strategy = dist.strategy;
        let sync = GradSync::new(comm, specs_of(&params), dist)?;
        Self::from_sync(params, optimizer, sync, strategy, micro_batches)
    }

    /// [`DataParallel::new`] with gradients combined by `strategy`
    /// (`StrategyConfig::Custom`: a strategy of your own), or the weight
    /// changes of local steps (`StrategyConfig::DeltaWeight`, in place of
    /// AdaSum).
    pub fn with_strategy<M: Module>(
        module: &M,
        optimizer: ModuleOptimizer,
        comm: C,
        dist: DistOptConfig,
        strategy: impl Strategy<C>,
    ) -> Result<Self> {
        let params = parameters_of(module)?;
        let (dist, micro_batches) = GradSync::<C>::local_micro_batches(dist)?;
        let mode = dist.strategy;
        let sync = GradSync::with_strategy(comm, specs_of(&params), dist, strategy)?;
        Self::from_sync(params, optimizer, sync, mode, micro_batches)
    }

    fn from_sync(
        params: Vec<ParamEntry>,
        optimizer: ModuleOptimizer,
        sync: GradSync<C>,
        strategy: StrategyConfig,
        micro_batches: gradwire_optim::MicroBatches,
    ) -> Result<Self> {
        if strategy
            == (StrategyConfig::Partial {
                average_state: true,
            })
        {
            return Err(StrategyError::PrivateState {
                strategy: strategy.to_string(),
            }
            .into());
        }
        Ok(DataParallel {
            sync,
            accumulation: LocalAccumulation::new(micro_batches),
            combined: vec![None; params.len()],
            params,
            optimizer,
            last: StepStats::default(),
        })
    }

    /// Copies `root`'s parameter values into every worker's `module`
    /// (collective): call once before training, so every worker starts
    /// from one model. On an error `module` is left as it was.
    pub fn broadcast_parameters<M: Module>(&mut self, module: &mut M, root: usize) -> Result<()> {
        let mut values = read_parameters(module, &self.params)?;
        let mut views: Vec<&mut [f32]> = values.iter_mut().map(Vec::as_mut_slice).collect();
        self.sync.broadcast(&mut views, root)?;
        let mut values: Vec<Option<Vec<f32>>> = values.into_iter().map(Some).collect();
        *module = write_parameters(module.clone(), &self.params, &mut values)?;
        Ok(())
    }

    /// Combines the gradients of `grads` (this worker's, for `module`)
    /// across the workers and returns them combined, for users who step
    /// themselves (in a gradient strategy, or DimReduce's first stage). A
    /// gradient no worker produced stays absent; after a skipped step (a
    /// non-finite gradient with `skip_non_finite`) and after a micro-batch
    /// that only accumulated (`DistOptConfig::accumulate`), none is
    /// returned, so an optimizer step changes nothing. Every worker must
    /// call it, each step; in another training loop it fails on every
    /// worker alike. Where the combination is the gradient itself (one
    /// worker, dense: [`GradSync::combines_to_identity`]) `grads` comes
    /// back as it was.
    pub fn reduce<M: Module>(
        &mut self,
        module: &M,
        grads: GradientsParams,
    ) -> Result<GradientsParams> {
        self.push_all(module, &grads);
        // Alone with the dense sum the combination is the gradient itself:
        // burn's own tensors are handed back (no new ones).
        if self.sync.combines_to_identity() {
            let stats = self.sync.finish_each(|_, _: &[f32]| Ok(()))?;
            self.last = stats;
            let usable = !stats.non_finite && !stats.accumulated;
            return Ok(if usable {
                grads
            } else {
                GradientsParams::new()
            });
        }
        self.combine(module, false).map(Option::unwrap_or_default)
    }

    /// The end of a step: the combined gradients as burn's; `joined`:
    /// this worker's part of a step the others take after it joined,
    /// `None` once every worker has.
    fn combine<M: Module>(&mut self, module: &M, joined: bool) -> Result<Option<GradientsParams>> {
        let combined = &mut self.combined;
        combined.iter_mut().for_each(|c| *c = None);
        let write = |i: usize, values: &[f32]| {
            if let Some(slot) = combined.get_mut(i) {
                *slot = Some(values.to_vec());
            }
            Ok(())
        };
        let Some(stats) = self.sync.finish_each_or_join(joined, write)? else {
            return Ok(None);
        };
        self.last = stats;
        gradients_from(module, &self.params, &mut self.combined).map(Some)
    }

    /// Weights this step's mean by samples: this worker's batch held
    /// `samples` ([`GradSync::set_samples`]; every worker calls it before
    /// every step for the workers to [`DataParallel::join`]). Gradient
    /// strategies that average only.
    pub fn set_samples(&mut self, samples: u64) -> Result<()> {
        Ok(self.sync.set_samples(samples)?)
    }

    /// Out of data (uneven inputs: DDP's `Join`): takes this worker's part
    /// in every step the others still take, contributing no samples, and
    /// steps its optimizer (at `lr`) with their combined gradient, so that
    /// `module` stays their replica, until every worker has joined
    /// ([`GradSync::join`]'s rules: gradient strategies that average).
    /// Returns how many steps that took, and what they did summed.
    pub fn join<M: Module>(
        &mut self,
        lr: impl Into<ModuleLearningRate>,
        module: &mut M,
    ) -> Result<(u64, StepStats)> {
        let lr = lr.into();
        let mut steps = 0;
        let mut total = StepStats::default();
        while let Some(grads) = self.combine(module, true)? {
            if !self.last.non_finite && !self.last.accumulated {
                *module = self.optimizer.step(lr.clone(), module.clone(), grads);
            }
            steps += 1;
            total.add_step(&self.last);
        }
        Ok((steps, total))
    }

    /// One step of `module` with this worker's gradients `grads`, in this
    /// step's loop ([`GradSync::current_loop`]), at learning rate `lr`. A
    /// gradient strategy (and DimReduce's first stage, and DiLoCo's
    /// warm-up by gradients): the gradients combined across the workers,
    /// then the optimizer's step with them (none after a skipped step); a
    /// failure leaves `module` and the optimizer as they were. Local steps
    /// (`partial`, `adasum-delta`, DiLoCo's rounds): the optimizer steps first
    /// with this worker's own gradients, then the parameters, or their
    /// changes, are combined ([`GradSync::step_locally`]; the gradients
    /// are only checked for NaN and infinities). After
    /// [`DataParallel::start_dimreduce`] a step needs the loss
    /// ([`DataParallel::step_dimreduce`]): this one fails on every worker
    /// alike.
    pub fn step<M: Module>(
        &mut self,
        lr: impl Into<ModuleLearningRate>,
        module: &mut M,
        grads: GradientsParams,
    ) -> Result<StepStats> {
        if self.sync.current_loop() == TrainingLoop::LocalSteps {
            return self.step_locally(lr.into(), module, grads);
        }
        let combined = self.reduce(module, grads)?;
        // A skipped step, or a micro-batch that only accumulated, changes
        // nothing.
        if !self.last.non_finite && !self.last.accumulated {
            *module = self.optimizer.step(lr, module.clone(), combined);
        }
        Ok(self.last)
    }

    fn step_locally<M: Module>(
        &mut self,
        lr: ModuleLearningRate,
        module: &mut M,
        grads: GradientsParams,
    ) -> Result<StepStats> {
        let Some(grads) = self.accumulation.add(module, grads) else {
            self.last = StepStats {
                accumulated: true,
                ..StepStats::default()
            };
            return Ok(self.last);
        };
        self.push_all(module, &grads);
        let mut access = ModuleAccess::new(module.clone(), &self.params);
        if let Err(e) = access.load() {
            // Carried by the step's opening agreement to every worker.
            self.sync.fail_step(&e);
        }
        let optimizer = &mut self.optimizer;
        let stats = self.sync.step_locally(&mut access, |access| {
            access
                .replace(|m| optimizer.step(lr, m, grads))
                .and_then(|()| access.load())
                .map_err(into_optim)
        });
        let stepped = access.into_module();
        self.last = stats?;
        *module = stepped?;
        Ok(self.last)
    }

    /// Backward from `loss` (on `module`'s autodiff device), then
    /// [`DataParallel::step`]: the data-parallel `backward_step`.
    pub fn backward_step<M: Module>(
        &mut self,
        lr: impl Into<ModuleLearningRate>,
        module: &mut M,
        loss: &Tensor<1>,
    ) -> Result<StepStats> {
        let grads = GradientsParams::from_grads(loss.backward(), module);
        self.step(lr, module, grads)
    }

    /// Ends DimReduce's first stage (strategy `dimreduce` only): from now
    /// on each step is [`DataParallel::step_dimreduce`], in the subspace of
    /// the components `pca` (the same on every worker) over all parameters
    /// flattened in declared order. Call between steps; an error changes
    /// nothing.
    pub fn start_dimreduce(&mut self, pca: &Pca, config: DimReduceConfig) -> Result<()> {
        Ok(self.sync.start_dimreduce(pca, config)?)
    }

    /// Whether [`DataParallel::start_dimreduce`] ended the first stage.
    pub fn dimreduce_started(&self) -> bool {
        self.sync.dimreduce_started()
    }

    /// A DimReduce step (after [`DataParallel::start_dimreduce`]): `grads`
    /// and `loss` are this worker's gradients and loss on its batch, and
    /// `loss_at(module)` computes the loss again on the same batch with
    /// the module as given (the line search's trial points). `module` ends
    /// at the accepted point, alike on every worker; the optimizer does
    /// not step. A failure on one worker (a `loss_at` error) fails the
    /// step on every worker.
    pub fn step_dimreduce<M: Module, E: std::fmt::Display>(
        &mut self,
        module: &mut M,
        grads: &GradientsParams,
        loss: f64,
        mut loss_at: impl FnMut(&M) -> std::result::Result<f64, E>,
    ) -> Result<StepStats> {
        self.push_all(module, grads);
        let mut access = ModuleAccess::new(module.clone(), &self.params);
        if let Err(e) = access.load() {
            self.sync.fail_step(&e);
        }
        let stats = self.sync.step_dimreduce(&mut access, loss, |access| {
            let module = access.module().map_err(into_optim)?;
            loss_at(module).map_err(|e| OptimError::InvalidArgument(e.to_string()))
        });
        let stepped = access.into_module();
        self.last = stats?;
        *module = stepped?;
        Ok(self.last)
    }

    /// Hands every gradient of `grads` to GradSync (declared order). A bad
    /// gradient, or one burn cannot read, is recorded and fails the step
    /// on every worker: this worker never leaves the step early.
    fn push_all<M: Module>(&mut self, module: &M, grads: &GradientsParams) {
        let sync = &mut self.sync;
        let read = each_gradient(module, &self.params, grads, |i, values| {
            // A refused gradient is recorded by GradSync itself, for the
            // step to carry.
            let _ = sync.push(i, values);
        });
        if let Err(e) = read {
            self.sync.fail_step(&e);
        }
    }

    /// What the last step did (traffic, waiting time, skips).
    pub fn last_step(&self) -> StepStats {
        self.last
    }

    /// The wrapped optimizer (its record: `optimizer().save(path)`, beside
    /// [`DataParallel::checkpoint`]).
    pub fn optimizer(&self) -> &ModuleOptimizer {
        &self.optimizer
    }

    /// The wrapped optimizer, mutably (to load its record).
    pub fn optimizer_mut(&mut self) -> &mut ModuleOptimizer {
        &mut self.optimizer
    }

    /// The parameters, in declared order.
    pub fn params(&self) -> &[ParamEntry] {
        &self.params
    }

    /// The gradient strategy underneath.
    pub fn sync(&self) -> &GradSync<C> {
        &self.sync
    }

    /// gradwire's state (error-feedback residuals, counters, the
    /// configuration, the bucket order), to save with
    /// `gradwire_optim::checkpoint::save` beside burn's records of the
    /// module and of the optimizer ([`DataParallel::optimizer`]'s
    /// `save`). Between steps only.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        self.accumulation.between_steps("a checkpoint")?;
        Ok(self.sync.checkpoint()?)
    }

    /// Restores what [`DataParallel::checkpoint`] saved (same
    /// configuration and parameters; between steps, as
    /// [`DataParallel::checkpoint`]).
    pub fn restore(&mut self, ckpt: &Checkpoint) -> Result<()> {
        self.accumulation.between_steps("a restore")?;
        Ok(self.sync.restore(ckpt)?)
    }
}
