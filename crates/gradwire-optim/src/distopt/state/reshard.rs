//! A run's checkpoints, one per rank of the world that wrote them, made
//! into the checkpoint one rank of another world size resumes from.

use super::outer::OUTER_FAULT;
use crate::checkpoint::Checkpoint;
use crate::distopt::{Engine, StrategyConfig, TrainingLoop, strategies};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use crate::state::{OptimizerState, ParamState};
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// The checkpoint this rank restores to go on with the run `saved`
    /// holds (one checkpoint per rank of the world that wrote it), at this
    /// engine's world size: see the front ends' `resharded`.
    pub(crate) fn resharded(&self, saved: &[Checkpoint]) -> Result<Checkpoint> {
        let mismatch = OptimError::StateMismatch;
        let first = saved
            .first()
            .ok_or_else(|| OptimError::InvalidArgument("no checkpoints to resume from".into()))?;
        for (r, ckpt) in saved.iter().enumerate() {
            let value = |key: &str| ckpt.state.values.get(key).and_then(|v| v.as_u64());
            let (world, rank) = (value("distopt/world_size"), value("distopt/rank"));
            if world != Some(saved.len() as u64) || rank != Some(r as u64) {
                return Err(mismatch(format!(
                    "checkpoint {r} of {} was saved by rank {rank:?} of a world of {world:?}",
                    saved.len()
                )));
            }
        }
        if saved.len() == self.world_size() {
            return Ok(saved[self.rank()].clone());
        }
        let local = self.training_loop == TrainingLoop::LocalSteps;
        // Rank 0's checkpoint, in which each part that differs by rank is
        // replaced: the strategies' state by each one's rule, and in a
        // loop of local steps the optimizers' state and the parameters by
        // their mean.
        let mut out = first.clone();
        for (key, value) in self.configuration() {
            if matches!(key, "distopt/world_size" | "distopt/rank") {
                out.state.values.insert(key.into(), value);
            }
        }
        let dicts: Vec<&gradwire_algos::StateDict> = saved.iter().map(|c| &c.state).collect();
        if !self.reshard_in_saved_order(first, &dicts, &mut out)? {
            for (b, strategy) in self.strategies.iter().enumerate() {
                match strategy {
                    Some(strategy) => strategy.reshard_state(b, &dicts, &mut out.state)?,
                    None => strategies::for_bucket(
                        self.config.strategy,
                        self.bucket_lens[b].iter().sum(),
                        self.shared.as_ref(),
                    )
                    .reshard_state(b, &dicts, &mut out.state)?,
                }
            }
        }
        if first.state.tensors.contains_key("dimreduce/momentum") {
            // Each rank kept the residual momentum of its slice of the
            // parameters, the slices in rank order: the whole vector, of
            // which each new rank's restore keeps its own slice.
            let mut whole = Vec::new();
            for ckpt in saved {
                whole.extend(ckpt.state.f32s("dimreduce/momentum")?);
            }
            out.state.insert_f32s("dimreduce/momentum".into(), whole)?;
        }
        if local {
            let states: Vec<&OptimizerState> = saved.iter().map(|c| &c.optimizer).collect();
            out.optimizer = mean_optimizer_state(&states)?;
            // A framework's optimizer saved beside (gradwire-candle's).
            for prefix in first.optimizer_state_prefixes() {
                let mut nested = Vec::with_capacity(saved.len());
                for (r, ckpt) in saved.iter().enumerate() {
                    nested.push(ckpt.optimizer_state(&prefix)?.ok_or_else(|| {
                        mismatch(format!("rank {r} saved no optimizer state under {prefix}"))
                    })?);
                }
                let nested: Vec<&OptimizerState> = nested.iter().collect();
                out.insert_optimizer_state(&prefix, &mean_optimizer_state(&nested)?)?;
            }
            for (key, tensor) in &first.state.tensors {
                if key.starts_with(crate::checkpoint::PARAM_PREFIX) {
                    let mean = gradwire_algos::reshard::mean_of(&dicts, key)?.unwrap_or_default();
                    let mean = Tensor::from_vec(mean, tensor.dims().to_vec())?;
                    out.state.tensors.insert(key.clone(), mean);
                }
            }
        }
        if let StrategyConfig::DiLoCo(_) = self.config.strategy {
            // A rank's fault not yet carried fails (or skips) its round on
            // every rank of the run that saved it: the resumed round
            // carries it too, on every new rank (the lowest old rank's;
            // rank 0's checkpoint alone used to decide).
            if let Some(fault) = saved.iter().find_map(|c| c.state.values.get(OUTER_FAULT)) {
                out.state.values.insert(OUTER_FAULT.into(), fault.clone());
            }
        }
        Ok(out)
    }
}

/// The mean of the optimizer states of the ranks of a loop of local steps
/// (each rank's own): every buffer averaged in f64 in rank order, a rank
/// without state for a parameter counting as zeros (as partial averaging
/// of the state does), the update count the highest; the rest rank 0's.
fn mean_optimizer_state(saved: &[&OptimizerState]) -> Result<OptimizerState> {
    let mut mean = saved[0].clone();
    let names: std::collections::BTreeSet<&String> =
        saved.iter().flat_map(|s| s.params.keys()).collect();
    for name in names {
        let states: Vec<(usize, &ParamState)> = saved
            .iter()
            .enumerate()
            .filter_map(|(r, s)| Some((r, s.params.get(name)?)))
            .collect();
        let Some(&(_, template)) = states.first() else {
            continue;
        };
        let mut param = ParamState {
            shape: template.shape.clone(),
            updates: states.iter().map(|(_, s)| s.updates).max().unwrap_or(0),
            buffers: Default::default(),
        };
        let buffers: std::collections::BTreeSet<&String> =
            states.iter().flat_map(|(_, s)| s.buffers.keys()).collect();
        for buffer in buffers {
            let n = param.elem_count();
            for (r, state) in &states {
                if state.shape != param.shape {
                    return Err(OptimError::StateMismatch(format!(
                        "{name} has shape {:?} on one rank and {:?} on rank {r}",
                        param.shape, state.shape
                    )));
                }
                if let Some(values) = state.buffers.get(buffer)
                    && values.len() != n
                {
                    return Err(OptimError::StateMismatch(format!(
                        "{name}/{buffer} has {} entries on rank {r}, not {n}",
                        values.len()
                    )));
                }
            }
            // A rank without the buffer counts as zeros.
            let parts = saved.iter().map(|s| {
                s.params
                    .get(name)
                    .and_then(|p| p.buffers.get(buffer))
                    .map(Vec::as_slice)
            });
            let values = gradwire_algos::reshard::mean_in_rank_order(parts, n);
            param.buffers.insert(buffer.clone(), values);
        }
        mean.params.insert(name.clone(), param);
    }
    Ok(mean)
}
