//! [`DataParallel`]: a candle optimizer made data-parallel, on
//! [`GradSync`], in the training loop its strategy names: gradients
//! combined across the workers before the optimizer steps (the gradient
//! strategies); the optimizer's local step followed by the averaging of
//! parameters (`partial`, with the optimizer's state too for
//! `partial:state`) or the combination of the weight changes
//! (`adasum-delta`, DiLoCo, after a warm-up by gradients that combines
//! gradients); or DimReduce (a dense first stage, then DimReduce's own
//! update with the line search through the caller's loss).

use crate::accumulate::LocalAccumulation;
use crate::optim::DataParallelOptimizer;
use crate::vars::{named_vars, specs_of, with_values, write_tensor, write_values};
use crate::{Error, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use gradwire_algos::dimreduce::{DimReduceConfig, Pca};
use gradwire_comm::Communicator;
use gradwire_optim::checkpoint::Checkpoint;
use gradwire_optim::{
    DistOptConfig, GradSync, OptimError, ParamAccess, StateBuffers, StepStats, Strategy,
    StrategyConfig, StrategyError, TrainingLoop,
};

/// gradwire-candle's error where GradSync's callbacks need gradwire's:
/// gradwire's own as it was, any other as an invalid argument (its text).
fn into_optim(e: Error) -> OptimError {
    match e {
        Error::Gradwire(e) => e,
        e => OptimError::InvalidArgument(e.to_string()),
    }
}

/// Candle variables as GradSync reads and writes them, in place.
struct VarAccess<'v>(&'v [(String, Var)]);

impl ParamAccess for VarAccess<'_> {
    fn read(&self, index: usize, out: &mut [f32]) -> gradwire_optim::Result<()> {
        let (name, var) = self
            .0
            .get(index)
            .ok_or_else(|| OptimError::InvalidArgument(format!("no variable {index}")))?;
        with_values(var.as_tensor(), |values| {
            if values.len() == out.len() {
                out.copy_from_slice(values);
                Ok(())
            } else {
                Err(OptimError::InvalidArgument(format!(
                    "{name} has {} values, {} declared",
                    values.len(),
                    out.len()
                )))
            }
        })
        .map_err(into_optim)?
    }

    fn write(&mut self, index: usize, values: &[f32]) -> gradwire_optim::Result<()> {
        let (_, var) = self
            .0
            .get(index)
            .ok_or_else(|| OptimError::InvalidArgument(format!("no variable {index}")))?;
        write_values(var, values).map_err(into_optim)
    }
}

/// The optimizer's buffers as the engine names them (the variables'
/// names), translated to the optimizer's own keys (the variables'
/// positions, as [`candle_nn::Optimizer::new`] names them).
struct OptimizerBuffers<'o, O> {
    optimizer: &'o mut O,
    vars: &'o [(String, Var)],
}

impl<O: DataParallelOptimizer> OptimizerBuffers<'_, O> {
    fn key(&self, name: &str) -> gradwire_optim::Result<String> {
        self.vars
            .iter()
            .position(|(n, _)| n == name)
            .map(|i| i.to_string())
            .ok_or_else(|| OptimError::InvalidArgument(format!("no variable {name}")))
    }

    fn private() -> OptimError {
        OptimError::InvalidArgument("the optimizer keeps its state private".into())
    }
}

impl<O: DataParallelOptimizer> StateBuffers for OptimizerBuffers<'_, O> {
    fn buffer_names(&self) -> &'static [&'static str] {
        self.optimizer
            .state_buffers()
            .map_or(&[], |state| state.buffer_names())
    }

    fn buffer_values(&self, name: &str, buffer: &str) -> gradwire_optim::Result<Option<Vec<f32>>> {
        let key = self.key(name)?;
        let state = self.optimizer.state_buffers().ok_or_else(Self::private)?;
        state.buffer_values(&key, buffer)
    }

    fn set_buffer(
        &mut self,
        name: &str,
        shape: &[usize],
        buffer: &str,
        values: Vec<f32>,
    ) -> gradwire_optim::Result<()> {
        let key = self.key(name)?;
        let state = self
            .optimizer
            .state_buffers_mut()
            .ok_or_else(Self::private)?;
        state.set_buffer(&key, shape, buffer, values)
    }
}

/// A candle optimizer made data-parallel, in the training loop of its
/// strategy.
#[derive(Debug)]
pub struct DataParallel<O, C: Communicator + 'static> {
    sync: GradSync<C>,
    vars: Vec<(String, Var)>,
    optimizer: O,
    last: StepStats,
    /// The loops of local steps' own accumulation (gradwire's engine
    /// accumulates in the gradient strategies).
    accumulation: LocalAccumulation,
    /// Per variable, the tensor its combined gradient is written into,
    /// step after step (made on first use), and whether this step wrote it.
    combined: Vec<Option<Tensor>>,
    written: Vec<bool>,
}

impl<O: DataParallelOptimizer, C: Communicator + 'static> DataParallel<O, C> {
    /// Every variable of `varmap`, an optimizer `O` made from `config` over
    /// them, combined as `dist.strategy` says, in its training loop: a
    /// gradient strategy of the registry (`dense`, `fp16`, `topk:0.01`,
    /// `powersgd:4`, `adasum-grad`, ...: [`DataParallel::step`]); local
    /// steps (`partial`, one bucket of parameters averaged per step, with
    /// the optimizer's state too for `partial:state`; `adasum-delta`, the
    /// weight changes combined by AdaSum: [`DataParallel::step`] too); or
    /// `dimreduce` (dense steps, then [`DataParallel::start_dimreduce`] and
    /// [`DataParallel::step_dimreduce`]). Over `comm`.
    ///
    /// `partial:state` needs an optimizer whose state gradwire can see
    /// (gradwire's: [`crate::Sgd`], [`crate::Adam`], ...); candle's own
    /// optimizers keep theirs private, and are refused for it.
    pub fn new(varmap: &VarMap, config: O::Config, comm: C, dist: DistOptConfig) -> Result<Self> {
        Self::from_vars(named_vars(varmap)?, config, comm, dist)
    }

    /// [`DataParallel::new`] over a list of named variables (the same
    /// names and order on every worker).
    pub fn from_vars(
        vars: Vec<(String, Var)>,
        config: O::Config,
        comm: C,
        dist: DistOptConfig,
    ) -> Result<Self> {
        let (dist, micro_batches) = GradSync::<C>::local_micro_batches(dist)?;
        let strategy = dist.strategy;
        let sync = GradSync::new(comm, specs_of(&vars)?, dist)?;
        Self::from_sync(vars, config, sync, strategy, micro_batches)
    }

    /// [`DataParallel::from_vars`] with gradients combined by `strategy`
    /// (`StrategyConfig::Custom`: a strategy of your own), or the weight
    /// changes of local steps (`StrategyConfig::DeltaWeight`, in place of
    /// AdaSum).
    pub fn with_strategy(
        vars: Vec<(String, Var)>,
        config: O::Config,
        comm: C,
        dist: DistOptConfig,
        strategy: impl Strategy<C>,
    ) -> Result<Self> {
        let (dist, micro_batches) = GradSync::<C>::local_micro_batches(dist)?;
        let mode = dist.strategy;
        let sync = GradSync::with_strategy(comm, specs_of(&vars)?, dist, strategy)?;
        Self::from_sync(vars, config, sync, mode, micro_batches)
    }

    fn from_sync(
        vars: Vec<(String, Var)>,
        config: O::Config,
        sync: GradSync<C>,
        strategy: StrategyConfig,
        micro_batches: gradwire_optim::MicroBatches,
    ) -> Result<Self> {
        let optimizer = O::new_checked(vars.iter().map(|(_, v)| v.clone()).collect(), config)?;
        let averages_state = strategy
            == StrategyConfig::Partial {
                average_state: true,
            };
        if averages_state && optimizer.state_buffers().is_none() {
            return Err(StrategyError::PrivateState {
                strategy: strategy.to_string(),
            }
            .into());
        }
        Ok(DataParallel {
            sync,
            accumulation: LocalAccumulation::new(vars.len(), micro_batches),
            combined: vec![None; vars.len()],
            written: vec![false; vars.len()],
            vars,
            optimizer,
            last: StepStats::default(),
        })
    }

    /// Copies `root`'s parameter values into every worker's (collective):
    /// call once before training, so every worker starts from one model
    /// (candle's CPU initialisation is not seeded).
    pub fn broadcast_parameters(&mut self, root: usize) -> Result<()> {
        for (_, var) in &self.vars {
            let mut values = with_values(var.as_tensor(), <[f32]>::to_vec)?;
            self.sync.broadcast(&mut [&mut values[..]], root)?;
            write_values(var, &values)?;
        }
        Ok(())
    }

    /// Combines the gradients of `grads` across the workers and returns the
    /// store with each gradient replaced by the combined one (a gradient no
    /// worker produced stays absent). For users who step themselves, in a
    /// gradient strategy (or DimReduce's first stage); after a skipped step
    /// (a non-finite gradient with `skip_non_finite`), and after a
    /// micro-batch that only accumulated (`DistOptConfig::accumulate`: the
    /// step's last micro-batch brings the combined mean), the store comes
    /// back without gradients, so an optimizer step changes nothing. Every
    /// worker must call it, each step; in another training loop it fails on
    /// every worker alike. The combined gradients are written into tensors
    /// DataParallel keeps, the same ones every step (as PyTorch's `.grad`:
    /// no allocation per step), so a store kept from an earlier `reduce`
    /// sees the latest values; where the combination is the gradient
    /// itself (one worker, dense: [`GradSync::combines_to_identity`]) the
    /// store comes back with candle's own gradients, uncopied.
    pub fn reduce(&mut self, grads: GradStore) -> Result<GradStore> {
        self.push_all(&grads);
        self.combine(grads, false)
            .map(|store| store.unwrap_or_default())
    }

    /// The end of a step: the combined gradients written into the kept
    /// tensors and put into `grads` in place of this worker's (those no
    /// worker wrote taken out); `joined`: this worker's part of a step the
    /// others take after it joined, `None` once every worker has.
    fn combine(&mut self, mut grads: GradStore, joined: bool) -> Result<Option<GradStore>> {
        // Alone with the dense sum the combination is the gradient itself:
        // candle's own tensors stay in the store (no copy back).
        let identity = !joined && self.sync.combines_to_identity();
        let vars = &self.vars;
        let outputs = &mut self.combined;
        let written = &mut self.written;
        written.iter_mut().for_each(|w| *w = false);
        let write = |i: usize, values: &[f32]| {
            if identity {
                return Ok(());
            }
            let var = &vars[i].1;
            // The same tensor every step: no allocation, no fresh pages.
            let out = match &outputs[i] {
                Some(t) => t,
                None => outputs[i].insert(
                    Tensor::zeros(var.shape(), DType::F32, &Device::Cpu)
                        .map_err(|e| OptimError::InvalidArgument(e.to_string()))?,
                ),
            };
            write_tensor(out, values).map_err(into_optim)?;
            written[i] = true;
            Ok(())
        };
        let Some(stats) = self.sync.finish_each_or_join(joined, write)? else {
            return Ok(None);
        };
        if identity && !stats.non_finite && !stats.accumulated {
            self.last = stats;
            return Ok(Some(grads));
        }
        for ((_, var), (out, &written)) in self
            .vars
            .iter()
            .zip(self.combined.iter().zip(&self.written))
        {
            grads.remove(var.as_tensor());
            if let (Some(out), true) = (out, written) {
                grads.insert(var.as_tensor(), out.clone());
            }
        }
        self.last = stats;
        Ok(Some(grads))
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
    /// steps its optimizer with their combined gradient, so that it stays
    /// their replica, until every worker has joined ([`GradSync::join`]'s
    /// rules: gradient strategies that average). Returns how many steps
    /// that took, and what they did summed (traffic, waits, buckets).
    pub fn join(&mut self) -> Result<(u64, StepStats)> {
        let mut steps = 0;
        let mut total = StepStats::default();
        while let Some(grads) = self.combine(GradStore::default(), true)? {
            if !self.last.non_finite && !self.last.accumulated {
                self.optimizer.step_checked(&grads)?;
            }
            steps += 1;
            total.add_step(&self.last);
        }
        Ok((steps, total))
    }

    /// One step with this worker's gradients `grads`, in this step's loop
    /// ([`GradSync::current_loop`]). A gradient strategy (and DimReduce's
    /// first stage, and DiLoCo's warm-up by gradients): the gradients
    /// combined across the workers, then the optimizer's step with them
    /// (none after a skipped step). Local steps (`partial`, `adasum-delta`,
    /// DiLoCo's rounds): the optimizer steps first with this worker's own
    /// gradients, then the parameters (and with `partial:state` the
    /// optimizer's buffers), or their changes, are combined
    /// ([`GradSync::step_locally`]; the gradients are only checked for NaN
    /// and infinities). After [`DataParallel::start_dimreduce`] a step
    /// needs the loss ([`DataParallel::step_dimreduce`]): this one fails on
    /// every worker alike.
    pub fn step(&mut self, grads: GradStore) -> Result<StepStats> {
        if self.sync.current_loop() == TrainingLoop::LocalSteps {
            let Some((grads, failure)) = self.accumulation.add(&self.vars, grads) else {
                self.last = StepStats {
                    accumulated: true,
                    ..StepStats::default()
                };
                return Ok(self.last);
            };
            self.push_all(&grads);
            if let Some(failure) = failure {
                // Carried by the step's opening agreement to every worker.
                self.sync.fail_step(&failure);
            }
            let mut buffers = OptimizerBuffers {
                optimizer: &mut self.optimizer,
                vars: &self.vars,
            };
            let mut vars = VarAccess(&self.vars);
            let stats = self
                .sync
                .step_locally_with_state(&mut vars, &mut buffers, |_, buffers| {
                    buffers.optimizer.step_checked(&grads).map_err(into_optim)
                });
            self.last = stats?;
            return Ok(self.last);
        }
        let grads = self.reduce(grads)?;
        // A skipped step, or a micro-batch that only accumulated, changes
        // nothing (the optimizer's schedule does not advance either).
        if !self.last.non_finite && !self.last.accumulated {
            self.optimizer.step_checked(&grads)?;
        }
        Ok(self.last)
    }

    /// Backward from `loss`, then [`DataParallel::step`]: the
    /// data-parallel `backward_step`.
    pub fn backward_step(&mut self, loss: &Tensor) -> Result<()> {
        self.step(loss.backward()?).map(drop)
    }

    /// Ends DimReduce's first stage (strategy `dimreduce` only): from now
    /// on each step is [`DataParallel::step_dimreduce`], in the subspace of
    /// the components `pca` (the same on every worker: fit from the same
    /// trajectory, or broadcast) over all variables flattened in
    /// declaration order. Call between steps; an error changes nothing.
    pub fn start_dimreduce(&mut self, pca: &Pca, config: DimReduceConfig) -> Result<()> {
        Ok(self.sync.start_dimreduce(pca, config)?)
    }

    /// Whether [`DataParallel::start_dimreduce`] ended the first stage.
    pub fn dimreduce_started(&self) -> bool {
        self.sync.dimreduce_started()
    }

    /// A DimReduce step (after [`DataParallel::start_dimreduce`]): `grads`
    /// and `loss` are this worker's gradients and loss on its batch, and
    /// `loss_at()` computes the loss again with the variables as they are
    /// when called (the line search writes each trial point into them).
    /// The variables end at the accepted point, alike on every worker; the
    /// optimizer does not step. A failure on one worker (a `loss_at`
    /// error) fails the step on every worker.
    pub fn step_dimreduce(
        &mut self,
        grads: &GradStore,
        loss: f64,
        mut loss_at: impl FnMut() -> candle_core::Result<f64>,
    ) -> Result<StepStats> {
        self.push_all(grads);
        let mut vars = VarAccess(&self.vars);
        let stats = self.sync.step_dimreduce(&mut vars, loss, |_| {
            loss_at().map_err(|e| OptimError::InvalidArgument(e.to_string()))
        });
        self.last = stats?;
        Ok(self.last)
    }

    /// Hands every gradient of `grads` to GradSync (declaration order). A
    /// bad gradient, or one that cannot be read, is recorded and fails the
    /// step on every worker: this worker never leaves the step early.
    fn push_all(&mut self, grads: &GradStore) {
        for (i, (_, var)) in self.vars.iter().enumerate() {
            let Some(grad) = grads.get(var.as_tensor()) else {
                continue; // not written on this worker
            };
            let sync = &mut self.sync;
            // A refused gradient is recorded by GradSync itself.
            if let Err(e) = with_values(grad, |values| sync.push(i, values)) {
                self.sync.fail_step(&e);
            }
        }
    }

    /// What the last step did (traffic, waiting time, skips).
    pub fn last_step(&self) -> StepStats {
        self.last
    }

    /// The wrapped optimizer.
    pub fn optimizer(&self) -> &O {
        &self.optimizer
    }

    /// The wrapped optimizer, mutably (to change its learning rate).
    pub fn optimizer_mut(&mut self) -> &mut O {
        &mut self.optimizer
    }

    /// The variables, in declaration order.
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// The gradient strategy underneath.
    pub fn sync(&self) -> &GradSync<C> {
        &self.sync
    }

    /// gradwire's state (error-feedback residuals, counters, the
    /// configuration) and the optimizer's, where gradwire sees it
    /// ([`DataParallelOptimizer::save_into`]), to save beside candle's
    /// safetensors of the weights (`VarMap::save`) with
    /// `gradwire_optim::checkpoint::save`.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        self.accumulation.between_steps("a checkpoint")?;
        let mut ckpt = self.sync.checkpoint()?;
        self.optimizer.save_into(&mut ckpt)?;
        Ok(ckpt)
    }

    /// Restores what [`DataParallel::checkpoint`] saved (between steps:
    /// the sums of a step's micro-batches would outlive it).
    pub fn restore(&mut self, ckpt: &Checkpoint) -> Result<()> {
        self.accumulation.between_steps("a restore")?;
        self.sync.restore(ckpt)?;
        self.optimizer.restore_from(ckpt)
    }
}
