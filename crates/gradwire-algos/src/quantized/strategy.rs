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
}
