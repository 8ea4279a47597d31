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
use crate::wrap;
use candle_core::Var;
use candle_core::backprop::GradStore;
use gradwire_optim::checkpoint::Checkpoint;
use gradwire_optim::{Optim, Schedule, StateBuffers, UpdateRule};

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
    pub fn with_names(vars: Vec<(String, Var)>, config: R::Config) -> candle_core::Result<Self> {
        let mut names: Vec<&str> = Vec::with_capacity(vars.len());
        for (name, var) in &vars {
            check_f32_cpu(name, var.as_tensor())?;
            names.push(name);
        }
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
            candle_core::bail!(
                "gradwire-candle: the variable name {} is used twice",
                pair[0]
            );
        }
        let optim = Optim::<R>::new(config).map_err(wrap)?;
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
    pub fn save_into(&self, ckpt: &mut Checkpoint) -> candle_core::Result<()> {
        use gradwire_optim::Optimizer as _;
        let state = self.optim.state().map_err(wrap)?;
        ckpt.insert_optimizer_state(STATE_PREFIX, &state)
            .map_err(wrap)
    }

    /// Restores what [`CandleOptim::save_into`] stored (validated: kind,
    /// configuration, buffer names and sizes); an error if `ckpt` holds none.
    pub fn restore_from(&mut self, ckpt: &Checkpoint) -> candle_core::Result<()> {
        use gradwire_optim::Optimizer as _;
        let state = ckpt
            .optimizer_state(STATE_PREFIX)
            .map_err(wrap)?
            .ok_or_else(|| candle_core::Error::msg("the checkpoint holds no optimizer state"))?;
        self.optim.load_state(&state).map_err(wrap)
    }
}

/// What [`crate::DataParallel`] asks of an optimizer beyond candle's
/// [`candle_nn::Optimizer`]: its state, where gradwire can see it. The
/// defaults say "none", which is right for candle's own optimizers (their
/// state is private; implemented here for `SGD` and `AdamW`) and for any
/// optimizer of your own (`impl DataParallelOptimizer for MyOpt {}`);
/// gradwire's optimizers ([`CandleOptim`]) expose theirs, so their
/// state goes into [`crate::DataParallel::checkpoint`] and partial
/// averaging can average it (`partial:state`).
pub trait DataParallelOptimizer: candle_nn::Optimizer {
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
    fn save_into(&self, ckpt: &mut Checkpoint) -> candle_core::Result<()> {
        let _ = ckpt;
        Ok(())
    }

    /// Restores what [`DataParallelOptimizer::save_into`] stored (nothing
    /// by default).
    fn restore_from(&mut self, ckpt: &Checkpoint) -> candle_core::Result<()> {
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

    fn save_into(&self, ckpt: &mut Checkpoint) -> candle_core::Result<()> {
        CandleOptim::save_into(self, ckpt)
    }

    fn restore_from(&mut self, ckpt: &Checkpoint) -> candle_core::Result<()> {
        CandleOptim::restore_from(self, ckpt)
    }
}

impl<R: UpdateRule> candle_nn::Optimizer for CandleOptim<R> {
    type Config = R::Config;

    /// Variables named by position (`"0"`, `"1"`, ...): the same on every
    /// worker that builds its optimizer from the same list.
    fn new(vars: Vec<Var>, config: R::Config) -> candle_core::Result<Self> {
        let named = vars
            .into_iter()
            .enumerate()
            .map(|(i, v)| (i.to_string(), v))
            .collect();
        Self::with_names(named, config)
    }

    /// Updates every variable `grads` holds a gradient for, in place, then
    /// advances the step. Every gradient's shape is checked first, so an
    /// error leaves every variable as it was.
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        use gradwire_optim::Optimizer as _;
        for (name, var) in &self.vars {
            if let Some(grad) = grads.get(var.as_tensor())
                && grad.dims() != var.dims()
            {
                candle_core::bail!(
                    "gradwire-candle: the gradient of {name} is {:?}, the variable {:?}",
                    grad.dims(),
                    var.dims()
                );
            }
        }
        for (name, var) in &self.vars {
            let Some(grad) = grads.get(var.as_tensor()) else {
                continue; // no gradient: the variable and its state stay
            };
            let optim = &mut self.optim;
            update_in_place(var, grad, |p, g| {
                optim.update_slice(name, var.dims(), p, g).map_err(wrap)
            })?;
        }
        self.optim.step();
        Ok(())
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
