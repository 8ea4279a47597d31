//! The PowerSGD strategy: each bucket's matrices travel as rank-`r`
//! factors ([`gradwire_algos::powersgd`]), with error feedback and a warm
//! start that a failed or skipped step puts back as they were. On CUDA
//! tensors over a communicator that takes them, the state and the products
//! stay on the GPU (`gradwire_algos::powersgd`'s device form).

use super::{BeforeStep, BucketView, Combined, Combiner};
use crate::checkpoint::Checkpoint;
use crate::error::{OptimError, Result};
use gradwire_algos::powersgd::{PowerSgd, PowerSgdConfig, PowerSgdState, Slot};
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

/// PowerSGD over one bucket: a slot per parameter of the bucket.
#[derive(Debug)]
pub struct PowerSgdAverage {
    inner: PowerSgd,
    /// The state before this step's combination.
    before: BeforeStep<PowerSgdState>,
    /// The slots of the written parameters (their places in the bucket).
    slots: Vec<usize>,
}

impl PowerSgdAverage {
    /// PowerSGD with `config` (checked).
    pub fn new(config: PowerSgdConfig) -> gradwire_algos::Result<Self> {
        Ok(PowerSgdAverage {
            inner: PowerSgd::new(config)?,
            before: BeforeStep::default(),
            slots: Vec::new(),
        })
    }
}

impl<C: Communicator + 'static> Combiner<C> for PowerSgdAverage {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        self.slots.clear();
        self.slots.extend(
            bucket
                .written
                .iter()
                .enumerate()
                .filter(|(_, w)| **w)
                .map(|(k, _)| k),
        );
        self.before.keep(self.inner.state());
        let traffic = self
            .inner
            .all_reduce(comm, tensors, &self.slots, bucket.step)?;
        Ok(Combined {
            traffic,
            averaged: true,
        })
    }

    fn end_step(&mut self, _bucket: usize, kept: bool) {
        self.before.end(self.inner.state_mut(), kept);
        // A step on a GPU keeps its own copy of the device state.
        self.inner.end_step(kept);
    }

    /// Each slot's `Q` and residual as tensors `powersgd/<bucket>/<slot>/q`
    /// and `.../residual`, its shape as value `powersgd/<bucket>/<slot>/dims`.
    fn save_state(&self, bucket: usize, ckpt: &mut Checkpoint) -> Result<()> {
        let state = self.inner.host_state()?;
        for (k, slot) in state.slots.iter().enumerate() {
            let Some(slot) = slot else { continue };
            let key = format!("powersgd/{bucket}/{k}");
            ckpt.values
                .insert(format!("{key}/dims"), serde_json::json!(slot.dims));
            for (name, values) in [("q", &slot.q), ("residual", &slot.residual)] {
                let n = values.len();
                ckpt.tensors.insert(
                    format!("{key}/{name}"),
                    Tensor::from_vec(values.clone(), n)?,
                );
            }
        }
        Ok(())
    }

    fn load_state(&mut self, bucket: usize, ckpt: &Checkpoint, apply: bool) -> Result<()> {
        let mismatch = |what: String| OptimError::StateMismatch(format!("PowerSGD: {what}"));
        let prefix = format!("powersgd/{bucket}/");
        let mut state = PowerSgdState::default();
        for (key, dims) in &ckpt.values {
            let Some(k) = key
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix("/dims"))
            else {
                continue;
            };
            let k: usize = k
                .parse()
                .map_err(|_| mismatch(format!("a bad slot in {key}")))?;
            let dims: Vec<usize> = serde_json::from_value(dims.clone())
                .map_err(|e| mismatch(format!("{key}: {e}")))?;
            let tensor = |name: &str| -> Result<Vec<f32>> {
                let key = format!("{prefix}{k}/{name}");
                Ok(ckpt
                    .tensors
                    .get(&key)
                    .ok_or_else(|| mismatch(format!("no {key}")))?
                    .to_vec::<f32>()?)
            };
            let (q, residual) = (tensor("q")?, tensor("residual")?);
            let len: usize = dims.iter().product();
            if !(residual.is_empty() || residual.len() == len) {
                return Err(mismatch(format!(
                    "{prefix}{k}: a residual of the wrong length"
                )));
            }
            if state.slots.len() <= k {
                state.slots.resize(k + 1, None);
            }
            state.slots[k] = Some(Slot { dims, q, residual });
        }
        if apply {
            self.inner.restore(state);
            self.before.forget();
        }
        Ok(())
    }
}
