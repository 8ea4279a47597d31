//! The engine's checkpoints: the optimizer's state, the strategies' state
//! (error-feedback residuals), the partial counter and DimReduce's state in
//! one [`Checkpoint`]; and a run's checkpoints resharded for another world
//! size.

use super::order::UNDECIDED_ORDER;
use super::{Engine, StrategyConfig, TrainingLoop, strategies};
use crate::checkpoint::Checkpoint;
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use crate::state::{OptimizerState, ParamState};
use gradwire_algos::StateDict;
use gradwire_algos::dimreduce::DimReduceState;
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// The engine's whole state: the optimizer's, each bucket's strategy's
    /// ([`super::Strategy::save_state`]: sparse mode's residuals as tensors
    /// `residual/<bucket>`), partial mode's counter (value
    /// `partial_counter`) and DimReduce's state (`dimreduce/momentum`, and
    /// values `dimreduce/b`, `g_last`, `s`, `initialized`; the components
    /// themselves go to their own file, [`crate::checkpoint::save_pca`]).
    /// Call between steps.
    pub(crate) fn checkpoint(&self) -> Result<Checkpoint> {
        self.between_steps("a checkpoint")?;
        let mut ckpt = Checkpoint::new(self.optimizer.state()?);
        // A fragment's exchange in flight is waited for: its buckets'
        // strategies and its mean are in it until the merge.
        let mut exchange = self.fragment_exchange.lock();
        if exchange.is_open() {
            exchange.settle(self.world_size());
        }
        for (b, strategy) in self.strategies.iter().enumerate() {
            let in_exchange = exchange.finished(b).and_then(|f| f.strategy.as_ref());
            // A bucket with no strategy yet (or since its job was lost)
            // has the state a fresh one has: a fresh one saves it.
            match strategy.as_ref().or(in_exchange) {
                Some(strategy) => strategy.save_state(b, &mut ckpt.state)?,
                None => strategies::for_bucket(
                    self.config.strategy,
                    self.bucket_lens[b].iter().sum(),
                    self.shared.as_ref(),
                )
                .save_state(b, &mut ckpt.state)?,
            }
        }
        self.save_outer(&mut ckpt, &exchange)?;
        drop(exchange);
        let dict = &mut ckpt.state;
        dict.values
            .insert("partial_counter".into(), self.partial_counter.into());
        for (key, value) in self.configuration() {
            dict.values.insert(key.into(), value);
        }
        dict.values
            .insert("buckets".into(), (self.buckets.len() as u64).into());
        if !self.in_declared_order() {
            dict.values
                .insert("bucket_order".into(), self.order_names().into());
        }
        if !self.order.decided {
            // No step has decided the order (none ran, or every one failed
            // on rank 0): an engine that resumes from here decides at its
            // next step, as this one would.
            dict.values.insert(UNDECIDED_ORDER.into(), true.into());
        }
        if let Some(dimreduce) = &self.dimreduce {
            let state = dimreduce.state();
            dict.insert_f32s("dimreduce/momentum".into(), state.momentum)?;
            // f64 values, exact through JSON (serde_json's float_roundtrip).
            let values = [
                ("dimreduce/b", state.b.into()),
                ("dimreduce/g_last", state.g_last.into()),
                ("dimreduce/s", state.s.into()),
                ("dimreduce/initialized", state.initialized.into()),
            ];
            for (key, value) in values {
                dict.values.insert(key.into(), value);
            }
        }
        Ok(ckpt)
    }

    /// What a checkpoint records of this engine's configuration, and
    /// `restore` compares: the strategy (with its codec), the world size, the
    /// rank and the parameter declarations.
    fn configuration(&self) -> Vec<(&'static str, serde_json::Value)> {
        // In declared order, whatever order the buckets follow.
        let mut declared: Vec<&super::ParamSpec> = self.params.iter().collect();
        for (k, p) in self.params.iter().enumerate() {
            if let Some(slot) = declared.get_mut(self.order.declared[k]) {
                *slot = p;
            }
        }
        let params: Vec<serde_json::Value> = declared
            .iter()
            .map(|p| {
                serde_json::json!([
                    p.name,
                    p.shape,
                    p.dtype.to_string(),
                    format!("{:?}", p.device)
                ])
            })
            .collect();
        vec![
            (
                "distopt/mode",
                self.config.strategy.checkpoint_label().into(),
            ),
            ("distopt/world_size", (self.world_size() as u64).into()),
            ("distopt/rank", (self.rank() as u64).into()),
            ("distopt/params", params.into()),
        ]
    }

    /// Restores a state saved by [`Engine::checkpoint`] from an engine with
    /// the same parameters and buckets (and, for DimReduce state, after
    /// [`Engine::start_dimreduce`] with the same components); errors on any
    /// mismatch, leaving this engine as it was.
    pub(crate) fn restore(&mut self, ckpt: &Checkpoint) -> Result<()> {
        self.between_steps("a restore")?;
        let mismatch = |what: String| OptimError::StateMismatch(what);
        // The configuration it was saved with (absent in checkpoints of
        // earlier versions, which are checked by their contents alone).
        for (key, value) in self.configuration() {
            if let Some(saved) = ckpt.state.values.get(key)
                && *saved != value
            {
                return Err(mismatch(format!(
                    "the checkpoint was saved with {key} = {saved}, this one has {value}"
                )));
            }
        }
        self.in_order_of(ckpt, |engine| engine.restore_in_order(ckpt))
    }

    /// [`Engine::restore`] once the buckets follow the checkpoint's order.
    fn restore_in_order(&mut self, ckpt: &Checkpoint) -> Result<()> {
        let mismatch = |what: String| OptimError::StateMismatch(what);
        let buckets = ckpt.state.values.get("buckets").and_then(|v| v.as_u64());
        if buckets != Some(self.buckets.len() as u64) {
            return Err(mismatch(format!(
                "the checkpoint has {buckets:?} buckets, this one {}",
                self.buckets.len()
            )));
        }
        let counter = ckpt
            .state
            .values
            .get("partial_counter")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| mismatch("no partial_counter".into()))?;
        // Checked, every bucket, before anything changes.
        for b in 0..self.buckets.len() {
            self.strategy_mut(b).load_state(b, &ckpt.state, false)?;
        }
        let dimreduce = match (&self.dimreduce, ckpt.state.values.get("dimreduce/b")) {
            (None, None) => None,
            (Some(_), Some(_)) => Some(dimreduce_state(&ckpt.state)?),
            (None, Some(_)) => {
                return Err(mismatch(
                    "the checkpoint holds DimReduce state: start DimReduce first".into(),
                ));
            }
            (Some(_), None) => {
                return Err(mismatch("the checkpoint holds no DimReduce state".into()));
            }
        };
        // Checked against the components' dimensions before anything changes.
        let dimreduce = match (&self.dimreduce, dimreduce) {
            (Some(current), Some(state)) => {
                let mut restored = current.clone();
                restored
                    .restore(state)
                    .map_err(|e| mismatch(format!("DimReduce: {e}")))?;
                Some(restored)
            }
            _ => None,
        };
        let outer = self.read_outer(ckpt)?;
        // An exchange in flight is waited for (every rank restores at the
        // same point, so its collectives still pair up), then replaced.
        if self.fragment_exchange.lock().is_open() {
            let _ = self.take_exchange(&mut super::StepStats::default());
        }
        self.optimizer.load_state(&ckpt.optimizer)?;
        if let Some((outer, pending_deltas)) = outer {
            // A pending fragment's mean pseudo-gradients, where the merge
            // looks for them.
            if self.local.buckets.len() != self.buckets.len() {
                self.local.buckets.resize_with(self.buckets.len(), Vec::new);
            }
            for (b, deltas) in pending_deltas {
                self.local.buckets[b] = deltas;
            }
            self.outer = outer;
        }
        if dimreduce.is_some() {
            self.dimreduce = dimreduce;
        }
        for b in 0..self.buckets.len() {
            self.strategy_mut(b).load_state(b, &ckpt.state, true)?;
        }
        self.partial_counter = counter;
        Ok(())
    }
}

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

/// Where a checkpoint keeps DiLoCo's state: the global parameters as
/// tensors `outer/global/<name>`, the outer optimizer's state under
/// `outer/optimizer` ([`Checkpoint::insert_optimizer_state`]), the counters
/// as values `outer/inner` and `outer/rounds`; in the middle of a round,
/// the inner optimizer's state at its start under `outer/round_start`;
/// this rank's fault not yet carried, if any, as `outer/fault` (`{"kind":
/// code, "detail": text}`).
const OUTER_GLOBAL: &str = "outer/global/";
const OUTER_OPTIMIZER: &str = "outer/optimizer";
const OUTER_INNER: &str = "outer/inner";
const OUTER_ROUNDS: &str = "outer/rounds";
const OUTER_ROUND_START: &str = "outer/round_start";
const OUTER_FAULT: &str = "outer/fault";
/// Streaming DiLoCo: the inner steps taken (`outer/steps`), and the
/// fragment exchanged but not yet merged (`outer/pending`: `{"fragment",
/// "merge_at", "lost", "sent", "received"}`, `lost` null or the agreed
/// failure, the bytes its exchange moved), with its mean pseudo-gradients
/// as tensors `outer/pending/delta/<name>`.
const OUTER_STEPS: &str = "outer/steps";
/// A pending fragment's mean pseudo-gradients, by bucket.
type PendingDeltas = Vec<(usize, Vec<Tensor>)>;
const OUTER_PENDING: &str = "outer/pending";
const OUTER_PENDING_DELTA: &str = "outer/pending/delta/";

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// Writes DiLoCo's state into `ckpt` (nothing in other loops).
    fn save_outer(
        &self,
        ckpt: &mut Checkpoint,
        exchange: &super::streaming::Exchange<C>,
    ) -> Result<()> {
        let StrategyConfig::DiLoCo(_) = self.config.strategy else {
            return Ok(());
        };
        let outer = &self.outer;
        let values = &mut ckpt.state.values;
        values.insert(OUTER_INNER.into(), outer.inner.into());
        values.insert(OUTER_ROUNDS.into(), outer.rounds.into());
        for (spec, global) in self.params.iter().zip(&outer.global) {
            ckpt.state
                .tensors
                .insert(format!("{OUTER_GLOBAL}{}", spec.name), global.clone());
        }
        if let Some(optimizer) = &outer.optimizer {
            ckpt.insert_optimizer_state(OUTER_OPTIMIZER, &optimizer.state()?)?;
        }
        ckpt.state
            .values
            .insert(OUTER_STEPS.into(), outer.steps.into());
        if let Some(pending) = &outer.pending {
            // Settled above if it was in flight.
            let outcome = pending
                .outcome
                .as_ref()
                .or(exchange.outcome())
                .unwrap_or(&Ok(()));
            let lost = match outcome {
                Ok(()) => serde_json::Value::Null,
                Err(super::outer::Lost::NonFinite) => serde_json::json!("non-finite"),
                Err(super::outer::Lost::Failed(e)) => {
                    let rank = match e {
                        gradwire_algos::AlgoError::Fault(fault) => fault.rank,
                        _ => None,
                    };
                    serde_json::json!({
                        "kind": e.fault_kind().code(),
                        "rank": rank,
                        "detail": e.to_string(),
                    })
                }
            };
            let traffic = match pending.outcome {
                Some(_) => pending.traffic,
                None => exchange.traffic(),
            };
            ckpt.state.values.insert(
                OUTER_PENDING.into(),
                serde_json::json!({
                    "fragment": pending.fragment,
                    "merge_at": pending.merge_at,
                    "lost": lost,
                    "sent": traffic.sent,
                    "received": traffic.received,
                }),
            );
            if outcome.is_ok() {
                for b in self.fragment_buckets(pending.fragment as usize) {
                    let deltas = match exchange.finished(b).and_then(|f| f.deltas.as_ref()) {
                        Some(deltas) => deltas,
                        None => &self.local.buckets[b],
                    };
                    for (k, i) in self.buckets[b].clone().enumerate() {
                        let delta = deltas.get(k).ok_or_else(|| {
                            OptimError::StateMismatch(format!(
                                "no pending pseudo-gradient of {}",
                                self.params[i].name
                            ))
                        })?;
                        ckpt.state.tensors.insert(
                            format!("{OUTER_PENDING_DELTA}{}", self.params[i].name),
                            delta.clone(),
                        );
                    }
                }
            }
        }
        if outer.inner > 0
            && let Some(snapshot) = &outer.round_start
        {
            ckpt.insert_optimizer_state(OUTER_ROUND_START, snapshot)?;
        }
        if let Some(fault) = &outer.fault {
            ckpt.state.values.insert(
                OUTER_FAULT.into(),
                serde_json::json!({ "kind": fault.kind.code(), "detail": fault.detail }),
            );
        }
        Ok(())
    }

    /// DiLoCo's state as `ckpt` holds it, checked against this engine's
    /// parameters (`None` in other loops), with a pending fragment's mean
    /// pseudo-gradients by bucket; changes nothing.
    fn read_outer(
        &self,
        ckpt: &Checkpoint,
    ) -> Result<Option<(super::outer::OuterState, PendingDeltas)>> {
        let StrategyConfig::DiLoCo(config) = self.config.strategy else {
            return Ok(None);
        };
        let mismatch = |what: String| OptimError::StateMismatch(format!("DiLoCo: {what}"));
        let counter = |key: &str| {
            ckpt.state
                .values
                .get(key)
                .and_then(|v| v.as_u64())
                .ok_or_else(|| mismatch(format!("no {key}")))
        };
        let (inner, rounds) = (counter(OUTER_INNER)?, counter(OUTER_ROUNDS)?);
        let mut global = Vec::new();
        for (i, spec) in self.params.iter().enumerate() {
            match ckpt
                .state
                .tensors
                .get(&format!("{OUTER_GLOBAL}{}", spec.name))
            {
                Some(t) => {
                    spec.check("DiLoCo's global parameter", t)?;
                    global.push(t.clone());
                }
                None if i == 0 => break,
                None => return Err(mismatch(format!("no global value of {}", spec.name))),
            }
        }
        let optimizer = match ckpt.optimizer_state(OUTER_OPTIMIZER)? {
            Some(state) => {
                let mut optimizer = super::outer::outer_optimizer(config.outer)?;
                optimizer.load_state(&state)?;
                Some(optimizer)
            }
            None => None,
        };
        let fault = match ckpt.state.values.get(OUTER_FAULT) {
            None => None,
            Some(v) => {
                let kind = v["kind"].as_u64().and_then(|k| u32::try_from(k).ok());
                let (Some(kind), Some(detail)) = (kind, v["detail"].as_str()) else {
                    return Err(mismatch(format!("{OUTER_FAULT} is not a fault: {v}")));
                };
                Some(super::LocalFault {
                    kind: gradwire_algos::FaultKind::from_code(kind),
                    detail: detail.to_string(),
                })
            }
        };
        let steps = ckpt
            .state
            .values
            .get(OUTER_STEPS)
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        let mut deltas = Vec::new();
        let pending = match ckpt.state.values.get(OUTER_PENDING) {
            None => None,
            Some(v) => {
                let not_one = || mismatch(format!("{OUTER_PENDING} is not a pending merge: {v}"));
                let fragment = v["fragment"].as_u64().and_then(|f| u32::try_from(f).ok());
                let merge_at = v["merge_at"].as_u64();
                let (Some(fragment), Some(merge_at)) = (fragment, merge_at) else {
                    return Err(not_one());
                };
                if fragment >= config.fragments {
                    return Err(not_one());
                }
                let outcome = match &v["lost"] {
                    serde_json::Value::Null => {
                        for b in self.fragment_buckets(fragment as usize) {
                            let mut bucket = Vec::new();
                            for i in self.buckets[b].clone() {
                                let spec = &self.params[i];
                                let key = format!("{OUTER_PENDING_DELTA}{}", spec.name);
                                let t = ckpt.state.tensors.get(&key).ok_or_else(|| {
                                    mismatch(format!("no pending pseudo-gradient of {}", spec.name))
                                })?;
                                spec.check("a pending pseudo-gradient", t)?;
                                bucket.push(t.clone());
                            }
                            deltas.push((b, bucket));
                        }
                        Ok(())
                    }
                    serde_json::Value::String(s) if s == "non-finite" => {
                        Err(super::outer::Lost::NonFinite)
                    }
                    lost => {
                        let kind = lost["kind"].as_u64().and_then(|k| u32::try_from(k).ok());
                        let (Some(kind), Some(detail)) = (kind, lost["detail"].as_str()) else {
                            return Err(not_one());
                        };
                        Err(super::outer::Lost::Failed(
                            gradwire_algos::AlgoError::Fault(gradwire_algos::Fault {
                                rank: lost["rank"].as_u64().map(|r| r as usize),
                                kind: gradwire_algos::FaultKind::from_code(kind),
                                detail: detail.to_string(),
                            }),
                        ))
                    }
                };
                Some(super::streaming::PendingMerge {
                    fragment,
                    merge_at,
                    outcome: Some(outcome),
                    // Checkpoints written before it was kept: none.
                    traffic: gradwire_algos::Traffic {
                        sent: v["sent"].as_u64().unwrap_or(0),
                        received: v["received"].as_u64().unwrap_or(0),
                    },
                })
            }
        };
        let outer = super::outer::OuterState {
            global,
            optimizer,
            inner,
            rounds,
            fault,
            round_start: ckpt.optimizer_state(OUTER_ROUND_START)?,
            steps,
            pending,
        };
        Ok(Some((outer, deltas)))
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

/// DimReduce's state as [`Engine::checkpoint`] stores it.
fn dimreduce_state(dict: &StateDict) -> Result<DimReduceState> {
    let mismatch = |what: &str| OptimError::StateMismatch(format!("DimReduce: {what}"));
    let floats = |key: &str| -> Result<Vec<f64>> {
        dict.values
            .get(key)
            .and_then(|v| v.as_array())
            .ok_or_else(|| mismatch(&format!("no {key}")))?
            .iter()
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| mismatch(&format!("{key} holds a non-number")))
            })
            .collect()
    };
    Ok(DimReduceState {
        b: floats("dimreduce/b")?,
        g_last: floats("dimreduce/g_last")?,
        s: floats("dimreduce/s")?,
        initialized: dict
            .values
            .get("dimreduce/initialized")
            .and_then(|v| v.as_bool())
            .ok_or_else(|| mismatch("no dimreduce/initialized"))?,
        momentum: dict.f32s("dimreduce/momentum")?,
    })
}
