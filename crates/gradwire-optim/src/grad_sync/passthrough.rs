//! The optimizer of a gradient-level DistOpt: it counts steps and updates
//! nothing, since the caller's own optimizer does.

use crate::error::{OptimError, Result};
use crate::optimizer::{Optimizer, StateBuffers};
use crate::state::{OptimizerState, ParamState};
use gradwire_tensor::Tensor;

/// The "optimizer" of a gradient-level DistOpt: it updates nothing (the
/// caller's optimizer does) and only counts steps (random-k draws its
/// indices from the step).
#[derive(Debug, Default)]
pub(super) struct Passthrough {
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
