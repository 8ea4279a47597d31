//! The engine's checkpoints: the optimizer's state, the strategies' state
//! (error-feedback residuals), the partial counter and DimReduce's state in
//! one [`Checkpoint`]; and a run's checkpoints resharded for another world
//! size.
//!
//! `reshard.rs` averages a run's per-rank checkpoints into one for another
//! world size; `outer.rs` keeps DiLoCo's and Streaming DiLoCo's state.

use super::order::UNDECIDED_ORDER;
use super::{Engine, strategies};
use crate::checkpoint::Checkpoint;
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_algos::StateDict;
use gradwire_algos::dimreduce::DimReduceState;
use gradwire_comm::Communicator;

mod outer;
mod reshard;

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
