//! A second optimizer's state inside a checkpoint (a framework's own
//! optimizer beside the state of the DistOpt or GradSync that wrote it):
//! its JSON among the values, its buffers among the extra tensors, in the
//! same atomically written file.

use super::{Checkpoint, ParamHeader, checked_elems, corrupt, param_header};
use crate::error::{OptimError, Result};
use crate::state::{OptimizerState, ParamState};
use gradwire_tensor::{DType, Tensor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The JSON part of a second optimizer state kept among a checkpoint's
/// values (its buffers are extra tensors `<prefix>/<parameter>/<buffer>`).
#[derive(Serialize, Deserialize)]
struct NestedState {
    kind: String,
    step: u64,
    config: Value,
    overrides: BTreeMap<String, Value>,
    params: BTreeMap<String, ParamHeader>,
}

impl Checkpoint {
    /// Stores a second optimizer's whole state under `prefix`: a framework's
    /// own optimizer (gradwire-candle's) beside the state of the DistOpt or
    /// GradSync that wrote the checkpoint. Its JSON is the value `prefix`,
    /// its buffers the tensors `<prefix>/<parameter>/<buffer>`; it travels
    /// in the same file, so it is saved and replaced atomically with the
    /// rest. Replaces a state stored under `prefix` before.
    pub fn insert_optimizer_state(&mut self, prefix: &str, state: &OptimizerState) -> Result<()> {
        // Everything checked before anything changes.
        let params = state
            .params
            .iter()
            .map(|(name, p)| Ok((name.clone(), param_header(name, p)?)))
            .collect::<Result<BTreeMap<_, _>>>()?;
        let mut buffers = Vec::new();
        for (name, p) in &state.params {
            for (buffer, values) in &p.buffers {
                buffers.push((
                    format!("{prefix}/{name}/{buffer}"),
                    Tensor::from_vec(values.clone(), p.shape.clone())?,
                ));
            }
        }
        self.remove_optimizer_state(prefix);
        self.state.tensors.extend(buffers);
        let nested = NestedState {
            kind: state.kind.clone(),
            step: state.step,
            config: state.config.clone(),
            overrides: state.overrides.clone(),
            params,
        };
        let json = serde_json::to_value(&nested).map_err(|e| {
            OptimError::InvalidArgument(format!("cannot encode the state under {prefix}: {e}"))
        })?;
        self.state.values.insert(prefix.to_string(), json);
        Ok(())
    }

    /// The prefixes under which second optimizer states are stored
    /// ([`Checkpoint::insert_optimizer_state`]): the values that hold one.
    pub fn optimizer_state_prefixes(&self) -> Vec<String> {
        self.state
            .values
            .iter()
            .filter(|(_, v)| serde_json::from_value::<NestedState>((*v).clone()).is_ok())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The optimizer state stored under `prefix` by
    /// [`Checkpoint::insert_optimizer_state`]; `None` if there is none;
    /// [`OptimError::CorruptCheckpoint`] if its JSON or a buffer is missing
    /// or malformed.
    pub fn optimizer_state(&self, prefix: &str) -> Result<Option<OptimizerState>> {
        let Some(json) = self.state.values.get(prefix) else {
            return Ok(None);
        };
        let nested: NestedState = serde_json::from_value(json.clone())
            .map_err(|e| corrupt(format!("the optimizer state under {prefix}: {e}")))?;
        let mut params = BTreeMap::new();
        for (name, header) in nested.params {
            let n = checked_elems(&header.shape)
                .ok_or_else(|| corrupt(format!("{prefix}: {name}: shape overflows")))?;
            let mut buffers = BTreeMap::new();
            for buffer in header.buffers {
                let key = format!("{prefix}/{name}/{buffer}");
                let t = self
                    .state
                    .tensors
                    .get(&key)
                    .ok_or_else(|| corrupt(format!("no tensor {key}")))?;
                if t.dtype() != DType::F32 || t.len() != n {
                    return Err(corrupt(format!(
                        "{key} is {:?} {:?}, expected f32 {:?}",
                        t.dtype(),
                        t.dims(),
                        header.shape
                    )));
                }
                buffers.insert(buffer, t.to_f32_vec()?);
            }
            params.insert(
                name,
                ParamState {
                    shape: header.shape,
                    updates: header.updates,
                    buffers,
                },
            );
        }
        Ok(Some(OptimizerState {
            kind: nested.kind,
            step: nested.step,
            config: nested.config,
            overrides: nested.overrides,
            params,
        }))
    }

    /// Removes what [`Checkpoint::insert_optimizer_state`] stored under
    /// `prefix`.
    fn remove_optimizer_state(&mut self, prefix: &str) {
        if self.state.values.remove(prefix).is_some() {
            let start = format!("{prefix}/");
            self.state.tensors.retain(|k, _| !k.starts_with(&start));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optimizer::Optimizer;
    use crate::{Adam, AdamConfig};

    fn adam_state() -> OptimizerState {
        let mut adam = Adam::new(AdamConfig::default()).unwrap();
        let mut w = Tensor::from_vec(vec![1f32, 2.0, 3.0], vec![3]).unwrap();
        let g = Tensor::from_vec(vec![0.5f32, -0.5, 0.25], vec![3]).unwrap();
        adam.update("w", &mut w, &g).unwrap();
        adam.step();
        adam.state().unwrap()
    }

    #[test]
    fn a_nested_state_round_trips_through_a_file_and_replaces_an_older_one() {
        let base = Checkpoint::new(adam_state());
        let mut ckpt = base.clone();
        assert_eq!(ckpt.optimizer_state("x").unwrap(), None);
        ckpt.insert_optimizer_state("x", &adam_state()).unwrap();
        let loaded =
            crate::checkpoint::from_bytes(&crate::checkpoint::to_bytes(&ckpt).unwrap()).unwrap();
        assert_eq!(loaded.optimizer_state("x").unwrap(), Some(adam_state()));
        // Inserting again replaces it, with nothing left of the first.
        let mut empty = adam_state();
        empty.params.clear();
        ckpt.insert_optimizer_state("x", &empty).unwrap();
        assert_eq!(ckpt.optimizer_state("x").unwrap(), Some(empty));
        assert!(!ckpt.state.tensors.keys().any(|k| k.starts_with("x/")));
        // A state whose buffer has the wrong length changes nothing.
        let mut bad = adam_state();
        if let Some(p) = bad.params.get_mut("w") {
            p.buffers.insert("m".into(), vec![0.0; 2]);
        }
        let before = ckpt.clone();
        assert!(matches!(
            ckpt.insert_optimizer_state("x", &bad),
            Err(OptimError::ShapeMismatch { .. })
        ));
        assert_eq!(ckpt, before);
    }

    #[test]
    fn a_missing_or_malformed_part_is_corrupt() {
        let mut ckpt = Checkpoint::new(adam_state());
        ckpt.insert_optimizer_state("x", &adam_state()).unwrap();
        let mut missing = ckpt.clone();
        missing.state.tensors.remove("x/w/m");
        assert!(matches!(
            missing.optimizer_state("x"),
            Err(OptimError::CorruptCheckpoint(_))
        ));
        let mut wrong = ckpt.clone();
        wrong.state.tensors.insert(
            "x/w/v".into(),
            Tensor::from_vec(vec![0f32; 2], vec![2]).unwrap(),
        );
        assert!(matches!(
            wrong.optimizer_state("x"),
            Err(OptimError::CorruptCheckpoint(_))
        ));
        ckpt.state
            .values
            .insert("x".into(), Value::String("not a state".into()));
        assert!(matches!(
            ckpt.optimizer_state("x"),
            Err(OptimError::CorruptCheckpoint(_))
        ));
    }
}
