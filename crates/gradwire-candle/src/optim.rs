//! gradwire's optimizers as candle optimizers: SGD with momentum (and
//! Nesterov, weight decay), Adam, AdamW, RMSProp and AdaGrad, with
//! gradwire's learning-rate schedules, updating candle's variables in place.
//!
//! candle-nn has SGD without momentum and AdamW; these are the update rules
//! gradwire's own optimizers run ([`gradwire_optim::UpdateRule`]), bitwise,
//! through [`Optim::update_slice`]: the parameter is updated in candle's
//! storage (an in-place custom op), the state lives in gradwire's
//! [`Optim`] and goes into a gradwire checkpoint with
//! [`CandleOptim::save_into`].

use crate::vars::{check_f32_cpu, update_in_place};
use crate::{Error, Result};
use candle_core::Var;
use candle_core::backprop::GradStore;
use gradwire_optim::checkpoint::Checkpoint;
use gradwire_optim::{Optim, OptimError, Schedule, StateBuffers, UpdateRule};

/// The checkpoint prefix of a [`CandleOptim`]'s state
/// ([`Checkpoint::insert_optimizer_state`]).
pub const STATE_PREFIX: &str = "gradwire-candle/optimizer";

/// A gradwire update rule as a [`candle_nn::Optimizer`] over candle
/// variables (f32, CPU).
#[derive(Debug)]
pub struct CandleOptim<R: UpdateRule> {
    optim: Optim<R>,
    vars: Vec<(String, Var)>,
}

/// SGD with momentum, dampening, Nesterov and weight decay.
pub type Sgd = CandleOptim<gradwire_optim::SgdRule>;
/// Adam (weight decay as L2 on the gradient).
pub type Adam = CandleOptim<gradwire_optim::AdamRule>;
/// AdamW (decoupled weight decay).
pub type AdamW = CandleOptim<gradwire_optim::AdamWRule>;
/// RMSProp.
pub type RmsProp = CandleOptim<gradwire_optim::RmsPropRule>;
/// AdaGrad.
pub type AdaGrad = CandleOptim<gradwire_optim::AdaGradRule>;

impl<R: UpdateRule> CandleOptim<R> {
    /// An optimizer over named variables: the names key the state in
    /// checkpoints. Errors on a non-f32 or non-CPU variable, a repeated
    /// name, or an invalid configuration.
    pub fn with_names(vars: Vec<(String, Var)>, config: R::Config) -> Result<Self> {
        let mut names: Vec<&str> = Vec::with_capacity(vars.len());
        for (name, var) in &vars {
            check_f32_cpu(name, var.as_tensor())?;
            names.push(name);
        }
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(OptimError::InvalidArgument(format!(
                "gradwire-candle: the variable name {} is used twice",
                pair[0]
            ))
            .into());
        }
        let optim = Optim::<R>::new(config)?;
        Ok(CandleOptim { optim, vars })
    }

    /// gradwire's optimizer underneath (its state, its step count,
    /// per-parameter configurations with `register`).
    pub fn inner(&self) -> &Optim<R> {
        &self.optim
    }

    /// gradwire's optimizer underneath, mutably.
    pub fn inner_mut(&mut self) -> &mut Optim<R> {
        &mut self.optim
    }

    /// The variables, with the names their state is kept under.
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// Stores the whole state (buffers, update counts, the step that drives
    /// the schedules, configurations) in `ckpt`, under [`STATE_PREFIX`].
    pub fn save_into(&self, ckpt: &mut Checkpoint) -> Result<()> {
        use gradwire_optim::Optimizer as _;
        let state = self.optim.state()?;
        Ok(ckpt.insert_optimizer_state(STATE_PREFIX, &state)?)
    }

    /// Restores what [`CandleOptim::save_into`] stored (validated: kind,
    /// configuration, buffer names and sizes); if `ckpt` holds none,
    /// [`OptimError::StateMismatch`].
    pub fn restore_from(&mut self, ckpt: &Checkpoint) -> Result<()> {
        use gradwire_optim::Optimizer as _;
        let state = ckpt.optimizer_state(STATE_PREFIX)?.ok_or_else(|| {
            OptimError::StateMismatch("the checkpoint holds no optimizer state".into())
        })?;
        Ok(self.optim.load_state(&state)?)
    }

    /// The step of [`candle_nn::Optimizer::step`] with its errors typed:
    /// every gradient's shape is checked first
    /// ([`OptimError::ShapeMismatch`]), so an error leaves every variable
    /// as it was; then every variable `grads` holds a gradient for is
    /// updated in place, and the step advances.
    pub fn step_checked(&mut self, grads: &GradStore) -> Result<()> {
        use gradwire_optim::Optimizer as _;
        for (name, var) in &self.vars {
            if let Some(grad) = grads.get(var.as_tensor())
                && grad.dims() != var.dims()
            {
                return Err(OptimError::ShapeMismatch {
                    what: format!("gradwire-candle: the gradient of {name}"),
                    expected: var.dims().to_vec(),
                    got: grad.dims().to_vec(),
                }
                .into());
            }
        }
        for (name, var) in &self.vars {
            let Some(grad) = grads.get(var.as_tensor()) else {
                continue; // no gradient: the variable and its state stay
            };
            let optim = &mut self.optim;
            update_in_place(var, grad, |p, g| {
                Ok(optim.update_slice(name, var.dims(), p, g)?)
            })?;
        }
        self.optim.step();
        Ok(())
    }
}

/// What [`crate::DataParallel`] asks of an optimizer beyond candle's
/// [`candle_nn::Optimizer`]: its step with typed errors, and its state,
/// where gradwire can see it. The defaults take candle's step and say
/// "no state", which is right for candle's own optimizers (their
/// state is private; implemented here for `SGD` and `AdamW`) and for any
/// optimizer of your own (`impl DataParallelOptimizer for MyOpt {}`);
/// gradwire's optimizers ([`CandleOptim`]) expose theirs, so their
/// state goes into [`crate::DataParallel::checkpoint`] and partial
/// averaging can average it (`partial:state`).
pub trait DataParallelOptimizer: candle_nn::Optimizer {
    /// The optimizer over `vars` that [`crate::DataParallel`] builds:
    /// candle's [`candle_nn::Optimizer::new`] by default (its errors as
    /// [`Error::Candle`]); gradwire's optimizers refuse a bad
    /// configuration with their own typed error.
    fn new_checked(vars: Vec<Var>, config: Self::Config) -> Result<Self>
    where
        Self: Sized,
    {
        Self::new(vars, config).map_err(Error::Candle)
    }

    /// The step [`crate::DataParallel`] takes: candle's
    /// [`candle_nn::Optimizer::step`] by default (its errors as
    /// [`Error::Candle`]); gradwire's optimizers give their own errors,
    /// typed.
    fn step_checked(&mut self, grads: &GradStore) -> Result<()> {
        self.step(grads).map_err(Error::Candle)
    }

    /// The per-parameter buffers, keyed as the optimizer names its
    /// variables when built by [`candle_nn::Optimizer::new`] (by position:
    /// `"0"`, `"1"`, ..., as DataParallel builds it); `None` if private.
    fn state_buffers(&self) -> Option<&dyn StateBuffers> {
        None
    }

    /// [`DataParallelOptimizer::state_buffers`], mutably.
    fn state_buffers_mut(&mut self) -> Option<&mut dyn StateBuffers> {
        None
    }

    /// Stores the optimizer's state in `ckpt` (nothing by default).
    fn save_into(&self, ckpt: &mut Checkpoint) -> Result<()> {
        let _ = ckpt;
        Ok(())
    }

    /// Restores what [`DataParallelOptimizer::save_into`] stored (nothing
    /// by default).
    fn restore_from(&mut self, ckpt: &Checkpoint) -> Result<()> {
        let _ = ckpt;
        Ok(())
    }
}

impl DataParallelOptimizer for candle_nn::SGD {}

impl DataParallelOptimizer for candle_nn::AdamW {}

impl<R: UpdateRule> DataParallelOptimizer for CandleOptim<R> {
    fn state_buffers(&self) -> Option<&dyn StateBuffers> {
        Some(&self.optim)
    }

    fn state_buffers_mut(&mut self) -> Option<&mut dyn StateBuffers> {
        Some(&mut self.optim)
    }

    fn new_checked(vars: Vec<Var>, config: R::Config) -> Result<Self> {
        Self::with_names(positional(vars), config)
    }

    fn step_checked(&mut self, grads: &GradStore) -> Result<()> {
        CandleOptim::step_checked(self, grads)
    }

    fn save_into(&self, ckpt: &mut Checkpoint) -> Result<()> {
        CandleOptim::save_into(self, ckpt)
    }

    fn restore_from(&mut self, ckpt: &Checkpoint) -> Result<()> {
        CandleOptim::restore_from(self, ckpt)
    }
}

impl<R: UpdateRule> candle_nn::Optimizer for CandleOptim<R> {
    type Config = R::Config;

    /// Variables named by position (`"0"`, `"1"`, ...): the same on every
    /// worker that builds its optimizer from the same list.
    fn new(vars: Vec<Var>, config: R::Config) -> candle_core::Result<Self> {
        Ok(Self::with_names(positional(vars), config)?)
    }

    /// [`CandleOptim::step_checked`], its error wrapped in candle's.
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        Ok(self.step_checked(grads)?)
    }

    /// The default learning rate at the current step (of its schedule).
    fn learning_rate(&self) -> f64 {
        self.optim.learning_rate()
    }

    /// A constant learning rate from now on (the schedule is replaced; a
    /// rate gradwire refuses, one that is not finite, is ignored, as
    /// candle's interface has no error here).
    fn set_learning_rate(&mut self, lr: f64) {
        use gradwire_optim::Optimizer as _;
        let mut config = self.optim.config().clone();
        R::set_learning_rate(&mut config, Schedule::constant(lr));
        let _ = self.optim.set_config(config);
    }
}

/// Variables named by position (`"0"`, `"1"`, ...), as candle's
/// [`candle_nn::Optimizer::new`] receives them.
fn positional(vars: Vec<Var>) -> Vec<(String, Var)> {
    vars.into_iter()
        .enumerate()
        .map(|(i, v)| (i.to_string(), v))
        .collect()
}
