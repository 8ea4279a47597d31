//! PowerSGD as a bucket's [`Strategy`]: a slot per parameter of the
//! bucket, the state a failed or skipped step puts back, and the state's
//! checkpoint form.

use super::{PowerSgd, PowerSgdState, Slot};
use crate::error::{AlgoError, Result};
use crate::strategy::{BucketView, Combined, StateDict, Strategy};
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

impl<C: Communicator + 'static> Strategy<C> for PowerSgd {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> Result<Combined> {
        let mut written = std::mem::take(&mut self.written);
        written.clear();
        written.extend(
            bucket
                .written
                .iter()
                .enumerate()
                .filter(|(_, w)| **w)
                .map(|(k, _)| k),
        );
        self.before.keep(&self.state);
        let traffic = self.all_reduce(comm, tensors, &written, bucket.step);
        self.written = written;
        Ok(Combined {
            traffic: traffic?,
            averaged: true,
        })
    }

    fn end_step(&mut self, _bucket: usize, kept: bool) {
        self.before.end(&mut self.state, kept);
        // A step on a GPU keeps its own copy of the device state.
        PowerSgd::end_step(self, kept);
    }

    /// Each slot's `Q` and residual as tensors `powersgd/<bucket>/<slot>/q`
    /// and `.../residual`, its shape as value `powersgd/<bucket>/<slot>/dims`.
    fn save_state(&self, bucket: usize, dict: &mut StateDict) -> Result<()> {
        let state = self.host_state()?;
        for (k, slot) in state.slots.iter().enumerate() {
            let Some(slot) = slot else { continue };
            let key = format!("powersgd/{bucket}/{k}");
            dict.values
                .insert(format!("{key}/dims"), serde_json::json!(slot.dims));
            dict.insert_f32s(format!("{key}/q"), slot.q.clone())?;
            dict.insert_f32s(format!("{key}/residual"), slot.residual.clone())?;
        }
        Ok(())
    }

    fn load_state(&mut self, bucket: usize, dict: &StateDict, apply: bool) -> Result<()> {
        let mismatch = |what: String| AlgoError::StateMismatch(format!("PowerSGD: {what}"));
        let prefix = format!("powersgd/{bucket}/");
        let mut state = PowerSgdState::default();
        for (key, dims) in &dict.values {
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
                dict.f32s(&format!("{prefix}{k}/{name}"))
                    .map_err(|e| match e {
                        AlgoError::StateMismatch(what) => mismatch(what),
                        e => e,
                    })
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
            self.restore(state);
        }
        Ok(())
    }

    /// Each slot's warm start `q`, the same on every rank (it is an
    /// all-reduced factor), and its dimensions are rank 0's; its
    /// error-feedback residual is the old ranks' mean ([`crate::reshard`]).
    fn reshard_state(
        &self,
        bucket: usize,
        saved: &[&StateDict],
        out: &mut StateDict,
    ) -> Result<()> {
        let prefix = format!("powersgd/{bucket}/");
        let Some(first) = saved.first() else {
            return Ok(());
        };
        for key in first.values.keys() {
            let Some(slot) = key
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix("/dims"))
            else {
                continue;
            };
            let slot = format!("{prefix}{slot}");
            crate::reshard::copy_value(saved, key, out);
            crate::reshard::copy_tensor(saved, &format!("{slot}/q"), out);
            let residual = format!("{slot}/residual");
            let mean = crate::reshard::mean_of(saved, &residual)?
                .ok_or_else(|| AlgoError::StateMismatch(format!("PowerSGD: no {residual}")))?;
            out.insert_f32s(residual, mean)?;
        }
        Ok(())
    }
}
