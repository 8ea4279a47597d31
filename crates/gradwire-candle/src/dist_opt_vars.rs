//! [`DistOptVars`]: gradwire's front ends (the one of the strategy's
//! training loop, [`AnyLoop`]) over candle variables, for the loops that
//! step the parameters themselves (partial averaging with the optimizer's
//! state, AdaSum by delta weight, DimReduce) and for gradwire's optimizers
//! in every strategy.
//!
//! The front ends update gradwire tensors, so this type keeps one gradwire copy
//! of each variable (the parameters' memory once more) and writes the
//! updated values back into candle's storage, in place, after every step;
//! each gradient is copied once into a gradwire tensor when it is handed
//! over. [`crate::DataParallel`] keeps no copy of the parameters and is
//! the lighter choice for the gradient-combining modes.

use crate::vars::{parameters_in, parameters_of, specs_of, with_values, write_values};
use crate::wrap;
use candle_core::Var;
use candle_core::backprop::GradStore;
use gradwire_comm::Communicator;
use gradwire_optim::checkpoint::Checkpoint;
use gradwire_optim::{AnyLoop, DistOptConfig, OptimError, Optimizer, StepStats, Strategy};
use gradwire_tensor::Tensor as GwTensor;

/// A gradwire front end (any strategy, a gradwire optimizer) training
/// candle variables.
#[derive(Debug)]
pub struct DistOptVars<O: Optimizer, C: Communicator + 'static> {
    dist: AnyLoop<O, C>,
    vars: Vec<(String, Var)>,
    /// gradwire's copy of each variable, in declaration order.
    params: Vec<GwTensor>,
    last: StepStats,
}

impl<O: Optimizer + 'static, C: Communicator + 'static> DistOptVars<O, C> {
    /// The front end of `config.strategy` with `optimizer` over `vars` (f32, CPU; the
    /// same names and order on every worker: [`crate::named_vars`]).
    pub fn new(
        vars: Vec<(String, Var)>,
        optimizer: O,
        comm: C,
        config: DistOptConfig,
    ) -> candle_core::Result<Self> {
        let dist = AnyLoop::new(optimizer, comm, specs_of(&vars)?, config).map_err(wrap)?;
        Self::from_dist(vars, dist)
    }

    /// [`DistOptVars::new`] combining with `strategy` (`StrategyConfig::Custom` or
    /// `StrategyConfig::DeltaWeight`: AdaSum).
    pub fn with_strategy(
        vars: Vec<(String, Var)>,
        optimizer: O,
        comm: C,
        config: DistOptConfig,
        strategy: impl Strategy<C>,
    ) -> candle_core::Result<Self> {
        let dist = AnyLoop::with_strategy(optimizer, comm, specs_of(&vars)?, config, strategy)
            .map_err(wrap)?;
        Self::from_dist(vars, dist)
    }

    fn from_dist(vars: Vec<(String, Var)>, dist: AnyLoop<O, C>) -> candle_core::Result<Self> {
        Ok(DistOptVars {
            params: parameters_of(&vars)?,
            dist,
            vars,
            last: StepStats::default(),
        })
    }

    /// Copies `root`'s variables to every worker (collective; once before
    /// training).
    pub fn broadcast_parameters(&mut self, root: usize) -> candle_core::Result<()> {
        for (param, (_, var)) in self.params.iter_mut().zip(&self.vars) {
            self.dist
                .comm()
                .broadcast(param.as_mut_slice::<f32>().map_err(wrap)?, root)
                .map_err(wrap)?;
            write_values(var, param.as_slice::<f32>().map_err(wrap)?)?;
        }
        Ok(())
    }

    /// Takes the variables' current values as the parameters (after the
    /// caller changed them: loaded weights).
    pub fn sync_from_vars(&mut self) -> candle_core::Result<()> {
        self.params = parameters_of(&self.vars)?;
        Ok(())
    }

    /// Hands over every gradient of `grads` (declaration order; a variable
    /// without one counts as a zero gradient). A bad gradient is recorded
    /// and fails the step on every worker.
    fn push_grads(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        for (name, var) in &self.vars {
            let Some(grad) = grads.get(var.as_tensor()) else {
                continue;
            };
            let values = with_values(grad, <[f32]>::to_vec)?;
            let tensor = GwTensor::from_vec(values, grad.dims().to_vec()).map_err(wrap)?;
            // A refused gradient is recorded by the front end and fails the step
            // on every worker at finish.
            let _ = self.dist.push(name, tensor);
        }
        Ok(())
    }

    /// Writes the parameters into the variables.
    fn write_back(&self) -> candle_core::Result<()> {
        for (param, (_, var)) in self.params.iter().zip(&self.vars) {
            write_values(var, param.as_slice::<f32>().map_err(wrap)?)?;
        }
        Ok(())
    }

    /// One step of any mode but DimReduce with the gradients of `grads`:
    /// combined (or stepped locally and averaged, in the parameter modes)
    /// as the strategy says, alike on every worker.
    pub fn step(&mut self, grads: &GradStore) -> candle_core::Result<StepStats> {
        self.push_grads(grads)?;
        let named = self
            .vars
            .iter()
            .map(|(n, _)| n.as_str())
            .zip(self.params.iter_mut());
        let result = self.dist.finish(named);
        // Every mode puts the parameters back when a step fails: the
        // variables get what the parameters hold either way.
        self.write_back()?;
        self.last = result.map_err(wrap)?;
        Ok(self.last)
    }

    /// A DimReduce step (after [`DimReduceOpt::start`](gradwire_optim::DimReduceOpt::start)
    /// through [`DistOptVars::dist_mut`]): `loss` is this worker's loss on its
    /// batch, and `loss_at()` computes it again with the variables as they
    /// are when called (the line search writes each trial point into them).
    pub fn step_dimreduce(
        &mut self,
        grads: &GradStore,
        loss: f64,
        mut loss_at: impl FnMut() -> candle_core::Result<f64>,
    ) -> candle_core::Result<StepStats> {
        self.push_grads(grads)?;
        let vars = &self.vars;
        let named = vars
            .iter()
            .map(|(n, _)| n.as_str())
            .zip(self.params.iter_mut());
        let Some(dimreduce) = self.dist.dimreduce_mut() else {
            return Err(wrap(OptimError::InvalidArgument(format!(
                "a DimReduce step in strategy {}",
                self.dist.strategy()
            ))));
        };
        let result = dimreduce.finish_dimreduce(named, loss, |trial| {
            let mut write = || -> candle_core::Result<f64> {
                for ((_, t), (_, var)) in trial.iter().zip(vars) {
                    write_values(var, t.as_slice::<f32>().map_err(wrap)?)?;
                }
                loss_at()
            };
            write().map_err(|e| OptimError::InvalidArgument(e.to_string()))
        });
        self.write_back()?;
        self.last = result.map_err(wrap)?;
        Ok(self.last)
    }

    /// What the last step did.
    pub fn last_step(&self) -> StepStats {
        self.last
    }

    /// The variables, in declaration order.
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// gradwire's copies of the parameters (equal to the variables between
    /// steps), in declaration order.
    pub fn params(&self) -> &[GwTensor] {
        &self.params
    }

    /// The front end underneath, of the strategy's training loop.
    pub fn dist(&self) -> &AnyLoop<O, C> {
        &self.dist
    }

    /// The front end underneath, mutably (DimReduce's `start`, the
    /// optimizer).
    pub fn dist_mut(&mut self) -> &mut AnyLoop<O, C> {
        &mut self.dist
    }

    /// The front end's checkpoint (optimizer, residuals, counters) with the
    /// parameters (`param/<name>`).
    pub fn checkpoint(&self) -> candle_core::Result<Checkpoint> {
        let mut ckpt = self.dist.checkpoint().map_err(wrap)?;
        ckpt.set_parameters(
            self.vars
                .iter()
                .map(|(n, _)| n.as_str())
                .zip(self.params.iter()),
        );
        Ok(ckpt)
    }

    /// Restores a [`DistOptVars::checkpoint`]: the front end's state and the
    /// parameters, written into the variables.
    pub fn restore(&mut self, ckpt: &Checkpoint) -> candle_core::Result<()> {
        let params = parameters_in(ckpt, &self.vars)?;
        self.dist.restore(ckpt).map_err(wrap)?;
        self.params = params;
        self.write_back()
    }
}
