//! DiLoCo's and Streaming DiLoCo's state in a checkpoint: the global
//! parameters, the outer optimizer, the counters, the round's start and the
//! fragment exchanged but not yet merged.

use crate::checkpoint::Checkpoint;
use crate::distopt::{Engine, StrategyConfig};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

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
pub(super) const OUTER_FAULT: &str = "outer/fault";
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
    pub(super) fn save_outer(
        &self,
        ckpt: &mut Checkpoint,
        exchange: &crate::distopt::streaming::Exchange<C>,
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
                Err(crate::distopt::outer::Lost::NonFinite) => serde_json::json!("non-finite"),
                Err(crate::distopt::outer::Lost::Failed(e)) => {
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
    pub(super) fn read_outer(
        &self,
        ckpt: &Checkpoint,
    ) -> Result<Option<(crate::distopt::outer::OuterState, PendingDeltas)>> {
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
                let mut optimizer = crate::distopt::outer::outer_optimizer(config.outer)?;
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
                Some(crate::distopt::LocalFault {
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
                        Err(crate::distopt::outer::Lost::NonFinite)
                    }
                    lost => {
                        let kind = lost["kind"].as_u64().and_then(|k| u32::try_from(k).ok());
                        let (Some(kind), Some(detail)) = (kind, lost["detail"].as_str()) else {
                            return Err(not_one());
                        };
                        Err(crate::distopt::outer::Lost::Failed(
                            gradwire_algos::AlgoError::Fault(gradwire_algos::Fault {
                                rank: lost["rank"].as_u64().map(|r| r as usize),
                                kind: gradwire_algos::FaultKind::from_code(kind),
                                detail: detail.to_string(),
                            }),
                        ))
                    }
                };
                Some(crate::distopt::streaming::PendingMerge {
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
        let outer = crate::distopt::outer::OuterState {
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
