//! [`DataParallel`]: a candle optimizer made data-parallel, on
//! [`GradSync`]: its gradients combined across the workers before it steps
//! (the gradient strategies), or its local step followed by the
//! averaging of parameters (`Partial`) or the combination of the weight
//! changes (`DeltaWeight`, AdaSum).

use crate::vars::{named_vars, specs_of, with_values, write_values};
use crate::wrap;
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use candle_nn::{Optimizer, VarMap};
use gradwire_comm::Communicator;
use gradwire_optim::checkpoint::Checkpoint;
use gradwire_optim::{DistOptConfig, GradSync, OptimError, ParamAccess, StepStats, Strategy};

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
        .map_err(|e| OptimError::InvalidArgument(e.to_string()))?
    }

    fn write(&mut self, index: usize, values: &[f32]) -> gradwire_optim::Result<()> {
        let (_, var) = self
            .0
            .get(index)
            .ok_or_else(|| OptimError::InvalidArgument(format!("no variable {index}")))?;
        write_values(var, values).map_err(|e| OptimError::InvalidArgument(e.to_string()))
    }
}

/// A candle optimizer made data-parallel.
#[derive(Debug)]
pub struct DataParallel<O, C: Communicator + 'static> {
    sync: GradSync<C>,
    vars: Vec<(String, Var)>,
    optimizer: O,
    last: StepStats,
}

impl<O: Optimizer, C: Communicator + 'static> DataParallel<O, C> {
    /// Every variable of `varmap`, an optimizer `O` made from `config` over
    /// them, combined as `dist.strategy` says (a gradient strategy of the
    /// registry: `dense`, `fp16`, `topk:0.01`, `powersgd:4`, `adasum-grad`,
    /// ...; or local steps: `partial` without its state, one bucket of
    /// parameters averaged per step, or `adasum-delta`, the weight changes
    /// combined by AdaSum) over `comm`.
    pub fn new(
        varmap: &VarMap,
        config: O::Config,
        comm: C,
        dist: DistOptConfig,
    ) -> candle_core::Result<Self> {
        Self::from_vars(named_vars(varmap)?, config, comm, dist)
    }

    /// [`DataParallel::new`] over a list of named variables (the same
    /// names and order on every worker).
    pub fn from_vars(
        vars: Vec<(String, Var)>,
        config: O::Config,
        comm: C,
        dist: DistOptConfig,
    ) -> candle_core::Result<Self> {
        let sync = GradSync::new(comm, specs_of(&vars)?, dist).map_err(wrap)?;
        Self::from_sync(vars, config, sync)
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
    ) -> candle_core::Result<Self> {
        let sync = GradSync::with_strategy(comm, specs_of(&vars)?, dist, strategy).map_err(wrap)?;
        Self::from_sync(vars, config, sync)
    }

    fn from_sync(
        vars: Vec<(String, Var)>,
        config: O::Config,
        sync: GradSync<C>,
    ) -> candle_core::Result<Self> {
        let optimizer = O::new(vars.iter().map(|(_, v)| v.clone()).collect(), config)?;
        Ok(DataParallel {
            sync,
            vars,
            optimizer,
            last: StepStats::default(),
        })
    }

    /// Copies `root`'s parameter values into every worker's (collective):
    /// call once before training, so every worker starts from one model
    /// (candle's CPU initialisation is not seeded).
    pub fn broadcast_parameters(&mut self, root: usize) -> candle_core::Result<()> {
        for (_, var) in &self.vars {
            let mut values = with_values(var.as_tensor(), <[f32]>::to_vec)?;
            self.sync
                .broadcast(&mut [&mut values[..]], root)
                .map_err(wrap)?;
            write_values(var, &values)?;
        }
        Ok(())
    }

    /// Combines the gradients of `grads` across the workers and returns the
    /// store with each gradient replaced by the combined one (a gradient no
    /// worker produced stays absent). For users who step themselves; after
    /// a skipped step (a non-finite gradient with `skip_non_finite`) the
    /// store comes back without gradients, so an optimizer step changes
    /// nothing. Every worker must call it, each step.
    pub fn reduce(&mut self, mut grads: GradStore) -> candle_core::Result<GradStore> {
        self.push_all(&grads)?;
        let vars = &self.vars;
        let mut combined: Vec<(usize, Tensor)> = Vec::new();
        let stats = self.sync.finish_each(|i, values: &[f32]| {
            let var = &vars[i].1;
            let t = Tensor::from_slice(values, var.shape(), &Device::Cpu)
                .map_err(|e| gradwire_optim::OptimError::InvalidArgument(e.to_string()))?;
            combined.push((i, t));
            Ok(())
        });
        let stats = stats.map_err(wrap)?;
        for (_, var) in &self.vars {
            grads.remove(var.as_tensor());
        }
        for (i, t) in combined {
            grads.insert(self.vars[i].1.as_tensor(), t);
        }
        self.last = stats;
        Ok(grads)
    }

    /// The gradients of `grads` combined across the workers, then the
    /// optimizer's step with them (none after a skipped step). In
    /// `Partial` and `DeltaWeight` modes the optimizer steps first with
    /// this worker's own gradients, then the parameters (or their changes)
    /// are combined ([`GradSync::step_locally`]; the gradients are only
    /// checked for NaN and infinities).
    pub fn step(&mut self, grads: GradStore) -> candle_core::Result<StepStats> {
        if self.sync.steps_locally() {
            self.push_all(&grads)?;
            let optimizer = &mut self.optimizer;
            let mut vars = VarAccess(&self.vars);
            let stats = self.sync.step_locally(&mut vars, |_| {
                optimizer
                    .step(&grads)
                    .map_err(|e| OptimError::InvalidArgument(e.to_string()))
            });
            self.last = stats.map_err(wrap)?;
            return Ok(self.last);
        }
        let grads = self.reduce(grads)?;
        if !self.last.non_finite {
            self.optimizer.step(&grads)?;
        }
        Ok(self.last)
    }

    /// Backward from `loss`, the gradients combined across the workers,
    /// then the optimizer's step: the data-parallel `backward_step`.
    pub fn backward_step(&mut self, loss: &Tensor) -> candle_core::Result<()> {
        self.step(loss.backward()?).map(drop)
    }

    /// Hands every gradient of `grads` to GradSync (declaration order). A
    /// bad gradient is recorded and fails the step on every worker.
    fn push_all(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        for (i, (_, var)) in self.vars.iter().enumerate() {
            let Some(grad) = grads.get(var.as_tensor()) else {
                continue; // not written on this worker
            };
            let sync = &mut self.sync;
            // A refused gradient fails the step on every worker.
            let _ = with_values(grad, |values| sync.push(i, values))?;
        }
        Ok(())
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
    /// configuration), to save beside candle's safetensors of the weights
    /// (`VarMap::save`) with `gradwire_optim::checkpoint::save`.
    pub fn checkpoint(&self) -> candle_core::Result<Checkpoint> {
        self.sync.checkpoint().map_err(wrap)
    }

    /// Restores what [`DataParallel::checkpoint`] saved.
    pub fn restore(&mut self, ckpt: &Checkpoint) -> candle_core::Result<()> {
        self.sync.restore(ckpt).map_err(wrap)
    }
}
