//! The quantized all-reduce as a bucket's [`Strategy`]: 1-bit scaled sign
//! (EF-SignSGD) or 8-bit (QSGD, min-max uint8) both ways, with the
//! error-feedback residuals and the local momentum that a failed or
//! skipped step puts back, and their checkpoint form.

use super::{QuantizedAllReduce, QuantizedState};
use crate::error::{AlgoError, Result};
use crate::strategy::{BucketView, Combined, StateDict, Strategy};
use gradwire_comm::Communicator;
use gradwire_tensor::Tensor;

impl<C: Communicator + 'static> Strategy<C> for QuantizedAllReduce {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> Result<Combined> {
        self.before.keep(&self.state);
        let mut written = std::mem::take(&mut self.written);
        let full_len = bucket.written_ranges(&mut written);
        let traffic = self.all_reduce_in(comm, tensors, &written, full_len, bucket.step);
        self.written = written;
        Ok(Combined {
            traffic: traffic?,
            averaged: true,
        })
    }

    fn end_step(&mut self, _bucket: usize, kept: bool) {
        self.before.end(&mut self.state, kept);
    }

    /// The residuals and the local momentum as tensors
    /// `quantized/<bucket>/worker`, `.../server` and `.../momentum`, the
    /// ranges last sent as value `.../layout`.
    fn save_state(&self, bucket: usize, dict: &mut StateDict) -> Result<()> {
        let prefix = format!("quantized/{bucket}");
        let state = &self.state;
        for (name, values) in [
            ("worker", &state.worker),
            ("server", &state.server),
            ("momentum", &state.momentum),
        ] {
            dict.insert_f32s(format!("{prefix}/{name}"), values.clone())?;
        }
        let layout: Vec<[usize; 2]> = state.layout.iter().map(|r| [r.start, r.end]).collect();
        dict.values
            .insert(format!("{prefix}/layout"), serde_json::json!(layout));
        Ok(())
    }

    fn load_state(&mut self, bucket: usize, dict: &StateDict, apply: bool) -> Result<()> {
        let prefix = format!("quantized/{bucket}");
        let key = format!("{prefix}/layout");
        let layout: Vec<[usize; 2]> = dict
            .values
            .get(&key)
            .map(|v| serde_json::from_value(v.clone()))
            .transpose()
            .map_err(|e| AlgoError::StateMismatch(format!("{key}: {e}")))?
            .unwrap_or_default();
        let state = QuantizedState {
            momentum: dict.f32s(&format!("{prefix}/momentum"))?,
            worker: dict.f32s(&format!("{prefix}/worker"))?,
            server: dict.f32s(&format!("{prefix}/server"))?,
            layout: layout.into_iter().map(|[a, b]| a..b).collect(),
        };
        if apply {
            self.state = state;
            self.before.forget();
        }
        Ok(())
    }

    /// The momentum and the worker residual are the old ranks' means
    /// ([`crate::reshard`]); every old rank's server residual (its chunk of
    /// the layout last sent, which entered the average undivided) is
    /// gathered into one vector of the full layout and added to the new
    /// worker residual, which counts for `1 / W'` on each of `W'` ranks; the
    /// new server residual is empty. No mass is lost.
    fn reshard_state(
        &self,
        bucket: usize,
        saved: &[&StateDict],
        out: &mut StateDict,
    ) -> Result<()> {
        let prefix = format!("quantized/{bucket}");
        let mismatch = |what: String| AlgoError::StateMismatch(format!("{prefix}: {what}"));
        let world = saved.len();
        let momentum = crate::reshard::mean_of(saved, &format!("{prefix}/momentum"))?;
        let worker = crate::reshard::mean_of(saved, &format!("{prefix}/worker"))?;
        let (Some(momentum), Some(mut worker)) = (momentum, worker) else {
            // Nothing saved for this bucket: a fresh strategy.
            return Ok(());
        };
        for (rank, state) in saved.iter().enumerate() {
            let server = state.f32s(&format!("{prefix}/server"))?;
            if server.is_empty() {
                continue;
            }
            let key = format!("{prefix}/layout");
            let layout: Vec<[usize; 2]> = state
                .values
                .get(&key)
                .map(|v| serde_json::from_value(v.clone()))
                .transpose()
                .map_err(|e| mismatch(format!("{key}: {e}")))?
                .unwrap_or_default();
            let sent: usize = layout.iter().map(|[a, b]| b.saturating_sub(*a)).sum();
            let own = gradwire_comm::chunk_range(sent, world, rank);
            if own.len() != server.len() || layout.iter().any(|[a, b]| a > b || *b > worker.len()) {
                return Err(mismatch(format!(
                    "rank {rank}'s server residual does not fit its layout"
                )));
            }
            // Packed index `p` of what was sent is entry `full` of the layout.
            let full_entries = layout.iter().flat_map(|&[a, b]| a..b);
            for (p, full) in full_entries.enumerate() {
                if own.contains(&p) {
                    worker[full] += server[p - own.start];
                }
            }
        }
        out.insert_f32s(format!("{prefix}/momentum"), momentum)?;
        out.insert_f32s(format!("{prefix}/worker"), worker)?;
        out.insert_f32s(format!("{prefix}/server"), Vec::new())?;
        out.values.insert(
            format!("{prefix}/layout"),
            serde_json::json!(Vec::<[usize; 2]>::new()),
        );
        Ok(())
    }
}
