//! Optimizer state as plain data: what a checkpoint saves and loads.
//!
//! Every optimizer exports its whole state as an [`OptimizerState`]: its kind,
//! the global step (which drives the schedules), its configuration and the
//! per-parameter overrides (as JSON values, so that schedules round-trip), and
//! for each parameter that has been updated its own update count and named
//! f32 buffers (momentum, first and second moments, ...), each of the
//! parameter's shape.

use serde_json::Value;
use std::collections::BTreeMap;

/// The state of one parameter.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParamState {
    /// The parameter's shape; every buffer has this many elements.
    pub shape: Vec<usize>,
    /// How many updates this parameter received (skipped steps do not count;
    /// Adam's bias correction uses it).
    pub updates: u64,
    /// Named buffers, each of `shape`'s element count, in f32.
    pub buffers: BTreeMap<String, Vec<f32>>,
}

impl ParamState {
    /// Number of elements of the parameter.
    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The whole state of an optimizer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OptimizerState {
    /// The optimizer kind: "sgd", "rmsprop", "adagrad", "adam", "adamw".
    pub kind: String,
    /// The global step counter (advanced by `Optimizer::step`).
    pub step: u64,
    /// The default configuration, serialised.
    pub config: Value,
    /// Per-parameter configurations (SINGA's `register`), serialised.
    pub overrides: BTreeMap<String, Value>,
    /// The state of every parameter updated so far, by name.
    pub params: BTreeMap<String, ParamState>,
}
