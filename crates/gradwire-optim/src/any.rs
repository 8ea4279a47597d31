//! [`AnyOptimizer`]: an optimizer chosen at run time.
//!
//! `Box<dyn Optimizer>` cannot exist: every optimizer has its own
//! [`Optimizer::Config`]. `AnyOptimizer` erases it (the configuration
//! travels as JSON, as it does in checkpoints), so a program can pick SGD
//! or Adam from a flag and still hand one type to `DistOpt`.

use crate::error::{OptimError, Result};
use crate::optimizer::{Optimizer, StateBuffers};
use crate::state::{OptimizerState, ParamState};
use gradwire_tensor::Tensor;
use serde_json::Value;
use std::fmt::Debug;

/// The object-safe face of an [`Optimizer`] (its buffers are
/// [`StateBuffers`], object-safe already).
trait Erased: StateBuffers + Send + Debug {
    fn kind(&self) -> &'static str;
    fn register_json(&mut self, name: &str, config: &Value) -> Result<()>;
    fn update(&mut self, name: &str, param: &mut Tensor, grad: &Tensor) -> Result<()>;
    fn step(&mut self);
    fn step_count(&self) -> u64;
    fn param_state(&self, name: &str) -> Option<&ParamState>;
    fn state(&self) -> Result<OptimizerState>;
    fn load_state(&mut self, state: &OptimizerState) -> Result<()>;
    fn snapshot_into(&self, snapshot: &mut OptimizerState) -> Result<()>;
    fn restore_snapshot(&mut self, snapshot: &OptimizerState) -> Result<()>;
}

impl<O: Optimizer + Debug + 'static> Erased for O {
    fn kind(&self) -> &'static str {
        Optimizer::kind(self)
    }
    fn register_json(&mut self, name: &str, config: &Value) -> Result<()> {
        let config: O::Config = serde_json::from_value(config.clone()).map_err(|e| {
            OptimError::InvalidArgument(format!(
                "not a {} configuration: {e}",
                Optimizer::kind(self)
            ))
        })?;
        Optimizer::register(self, name, config)
    }
    fn update(&mut self, name: &str, param: &mut Tensor, grad: &Tensor) -> Result<()> {
        Optimizer::update(self, name, param, grad)
    }
    fn step(&mut self) {
        Optimizer::step(self);
    }
    fn step_count(&self) -> u64 {
        Optimizer::step_count(self)
    }
    fn param_state(&self, name: &str) -> Option<&ParamState> {
        Optimizer::param_state(self, name)
    }
    fn state(&self) -> Result<OptimizerState> {
        Optimizer::state(self)
    }
    fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        Optimizer::load_state(self, state)
    }
    fn snapshot_into(&self, snapshot: &mut OptimizerState) -> Result<()> {
        Optimizer::snapshot_into(self, snapshot)
    }
    fn restore_snapshot(&mut self, snapshot: &OptimizerState) -> Result<()> {
        Optimizer::restore_snapshot(self, snapshot)
    }
}

/// Any [`Optimizer`], its configuration as JSON: one type for optimizers
/// chosen at run time.
///
/// ```
/// use gradwire_optim::{AnyOptimizer, Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
///
/// let adam = true; // a flag
/// let opt = if adam {
///     AnyOptimizer::new(Adam::new(AdamConfig::default())?)?
/// } else {
///     AnyOptimizer::new(Sgd::new(SgdConfig::default().lr(0.1))?)?
/// };
/// assert_eq!(opt.kind(), "adam");
/// # Ok::<(), gradwire_optim::OptimError>(())
/// ```
#[derive(Debug)]
pub struct AnyOptimizer {
    inner: Box<dyn Erased>,
    /// The default configuration, as the wrapped optimizer serialises it.
    config: Value,
}

impl AnyOptimizer {
    /// Erases `optimizer`'s type. Errors if its configuration cannot be
    /// written as JSON.
    pub fn new<O: Optimizer + Debug + 'static>(optimizer: O) -> Result<Self> {
        let config = serde_json::to_value(optimizer.config()).map_err(|e| {
            OptimError::InvalidArgument(format!("cannot serialise a configuration: {e}"))
        })?;
        Ok(AnyOptimizer {
            inner: Box::new(optimizer),
            config,
        })
    }
}

impl Optimizer for AnyOptimizer {
    type Config = Value;

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn config(&self) -> &Value {
        &self.config
    }

    /// `config` must be the wrapped optimizer's configuration as JSON; any
    /// other is [`OptimError::InvalidArgument`].
    fn register(&mut self, name: &str, config: Value) -> Result<()> {
        self.inner.register_json(name, &config)
    }

    fn update(&mut self, name: &str, param: &mut Tensor, grad: &Tensor) -> Result<()> {
        self.inner.update(name, param, grad)
    }

    fn step(&mut self) {
        self.inner.step();
    }

    fn step_count(&self) -> u64 {
        self.inner.step_count()
    }

    fn param_state(&self, name: &str) -> Option<&ParamState> {
        self.inner.param_state(name)
    }

    fn state(&self) -> Result<OptimizerState> {
        self.inner.state()
    }

    fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        self.inner.load_state(state)
    }

    fn snapshot_into(&self, snapshot: &mut OptimizerState) -> Result<()> {
        self.inner.snapshot_into(snapshot)
    }

    fn restore_snapshot(&mut self, snapshot: &OptimizerState) -> Result<()> {
        self.inner.restore_snapshot(snapshot)
    }
}

impl StateBuffers for AnyOptimizer {
    fn buffer_names(&self) -> &'static [&'static str] {
        self.inner.buffer_names()
    }

    fn buffer_values(&self, name: &str, buffer: &str) -> Result<Option<Vec<f32>>> {
        self.inner.buffer_values(name, buffer)
    }

    fn set_buffer(
        &mut self,
        name: &str,
        shape: &[usize],
        buffer: &str,
        values: Vec<f32>,
    ) -> Result<()> {
        self.inner.set_buffer(name, shape, buffer, values)
    }
}
