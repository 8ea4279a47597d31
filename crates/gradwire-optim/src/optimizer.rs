//! The traits every optimizer implements: [`Optimizer`] (what the front
//! ends wrap), [`StateBuffers`] (its per-parameter buffers by name) and
//! [`UpdateRule`] (the part that differs from one optimizer to the next).
//!
//! An optimizer is an [`UpdateRule`] (its hyper-parameters and the
//! element-wise update) inside [`crate::Optim`] (`optim.rs`), which keeps
//! what every optimizer keeps. DistOpt wraps any [`Optimizer`]; to skip a
//! parameter it simply does not call `update` (and a gradient whose lazy
//! zeroed flag is set is skipped too), so the parameter's state does not
//! advance.

use crate::error::Result;
#[cfg(feature = "cuda")]
use crate::rules::cuda::UpdateKernel;
use crate::schedule::Schedule;
use crate::state::{OptimizerState, ParamState};
use gradwire_tensor::Tensor;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// An optimizer: updates named parameters from their gradients; its
/// per-parameter buffers are read and replaced through [`StateBuffers`].
pub trait Optimizer: StateBuffers + Send {
    /// The hyper-parameters (each a [`crate::Schedule`] where it makes sense).
    type Config: Clone + Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync;

    /// The kind name ("sgd", "adam", ...), as saved in checkpoints.
    fn kind(&self) -> &'static str;

    /// The default configuration.
    fn config(&self) -> &Self::Config;

    /// Gives parameter `name` its own configuration (SINGA's `register`);
    /// the others keep the default.
    fn register(&mut self, name: &str, config: Self::Config) -> Result<()>;

    /// Updates `param` from `grad` with the hyper-parameters of the current
    /// step. A gradient that is lazily zeroed (nobody wrote it) is skipped:
    /// nothing changes, not even the parameter's state.
    fn update(&mut self, name: &str, param: &mut Tensor, grad: &Tensor) -> Result<()>;

    /// Advances the global step (after every parameter of the step is updated).
    fn step(&mut self);

    /// The global step.
    fn step_count(&self) -> u64;

    /// The state of parameter `name`, if it was updated. The buffers of a
    /// parameter updated on a CUDA device stay there and are not in it (its
    /// `buffers` map is empty); [`Optimizer::state`] copies them out.
    fn param_state(&self, name: &str) -> Option<&ParamState>;

    /// The whole state, for a checkpoint.
    fn state(&self) -> Result<OptimizerState>;

    /// Restores a state saved by [`Optimizer::state`] (of the same kind),
    /// validating configurations, buffer names and sizes.
    fn load_state(&mut self, state: &OptimizerState) -> Result<()>;

    /// Copies what updates change (the global step, and each parameter's
    /// update count and buffers) into `snapshot`, for
    /// [`Optimizer::restore_snapshot`] to put back: a DiLoCo round that
    /// every rank skips leaves the inner optimizer as the round found it.
    /// The default copies [`Optimizer::state`]; gradwire's optimizers copy
    /// into the snapshot's own memory, so taking one every round allocates
    /// nothing once the first is made.
    fn snapshot_into(&self, snapshot: &mut OptimizerState) -> Result<()> {
        *snapshot = self.state()?;
        Ok(())
    }

    /// Puts back what [`Optimizer::snapshot_into`] copied: the global step
    /// and every parameter's state (a parameter with no state in the
    /// snapshot loses its own); the configurations stay as they are, since
    /// no update changes them. The default is [`Optimizer::load_state`].
    fn restore_snapshot(&mut self, snapshot: &OptimizerState) -> Result<()> {
        self.load_state(snapshot)
    }
}

/// An optimizer's per-parameter buffers, read and replaced by name: what
/// partial averaging with its state (`partial:state`) averages across
/// ranks. Every [`Optimizer`] has them; the trait is object-safe, so a
/// framework's optimizer that keeps gradwire's buffers (gradwire-candle's)
/// hands itself to [`crate::GradSync::step_locally_with_state`].
pub trait StateBuffers {
    /// The names of the per-parameter buffers this optimizer keeps.
    fn buffer_names(&self) -> &'static [&'static str];

    /// A copy of buffer `buffer` of parameter `name`, wherever it lives
    /// (host or device); `None` if the parameter has no state yet.
    fn buffer_values(&self, name: &str, buffer: &str) -> Result<Option<Vec<f32>>>;

    /// Replaces buffer `buffer` of parameter `name` (of `shape`) with
    /// `values`, creating the parameter's state if it has none (partial
    /// averaging of the state averages it across ranks this way): a buffer
    /// the optimizer does not keep is [`crate::OptimError::StateMismatch`], values
    /// of another element count [`crate::OptimError::ShapeMismatch`].
    fn set_buffer(
        &mut self,
        name: &str,
        shape: &[usize],
        buffer: &str,
        values: Vec<f32>,
    ) -> Result<()>;
}

/// The part of an optimizer that differs from one to the next.
pub trait UpdateRule: Send + Sync + 'static {
    /// The configuration.
    type Config: Clone + Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync;
    /// The hyper-parameter values at one step.
    type Values: Copy;
    /// The kind name.
    const KIND: &'static str;
    /// The names of the per-parameter buffers, in sorted order (at most
    /// four: an update holds them on the stack).
    const BUFFERS: &'static [&'static str];

    /// Checks a configuration (schedules' own parameters, flag combinations).
    fn validate(config: &Self::Config) -> Result<()>;

    /// The learning rate of `config` (every rule has one; a framework's
    /// optimizer interface reads and sets it).
    fn learning_rate(config: &Self::Config) -> &Schedule;

    /// `config` with its learning rate replaced by `lr`.
    fn set_learning_rate(config: &mut Self::Config, lr: Schedule);

    /// The values at global step `step`, checked (SINGA's argument checks
    /// apply to the values in force at each step).
    fn values(config: &Self::Config, step: u64) -> Result<Self::Values>;

    /// Whether the buffers are needed at these values (plain SGD has none).
    fn needs_buffers(_values: &Self::Values) -> bool {
        true
    }

    /// The update of one parameter: `t` is this parameter's update count,
    /// 1-based; `buffers` are [`UpdateRule::BUFFERS`] in order (empty when
    /// not needed and never allocated).
    fn apply(values: &Self::Values, t: u64, buffers: &mut [&mut [f32]], p: &mut [f32], g: &[f32]);

    /// The CUDA kernel doing [`UpdateRule::apply`]'s update, bitwise, on a
    /// parameter in device memory (feature `cuda`); `None` (the default)
    /// when the rule has none, and then a CUDA parameter is refused with
    /// [`crate::OptimError::InvalidArgument`].
    #[cfg(feature = "cuda")]
    fn cuda_kernel(_values: &Self::Values, _t: u64) -> Option<UpdateKernel> {
        None
    }
}
