//! The quantized strategy: 1-bit scaled sign (EF-SignSGD) or 8-bit (QSGD,
//! min-max uint8) both ways through
//! [`gradwire_algos::quantized::QuantizedAllReduce`], with error-feedback
//! residuals (worker and server) and an optional local momentum that a
//! failed or skipped step puts back.

use super::{BeforeStep, BucketView, Combined, Combiner};
use crate::checkpoint::Checkpoint;
use crate::error::{OptimError, Result};
use gradwire_algos::quantized::{QuantizedAllReduce, QuantizedState};
use gradwire_comm::Communicator;
use gradwire_compress::Quantizer;
use gradwire_tensor::Tensor;
use std::ops::Range;

/// The written parameters' ranges of `bucket`'s full layout (its
/// parameters back to back) into `ranges`; returns the full length.
pub(super) fn written_ranges(bucket: &BucketView<'_>, ranges: &mut Vec<Range<usize>>) -> usize {
    ranges.clear();
    let mut at = 0;
    for (&n, &written) in bucket.lens.iter().zip(bucket.written) {
        if written {
            ranges.push(at..at + n);
        }
        at += n;
    }
    at
}

/// A quantized all-reduce of one bucket.
#[derive(Debug)]
pub struct QuantizedAverage {
    pub(super) inner: QuantizedAllReduce,
    /// The residuals before this step's combination.
    pub(super) before: BeforeStep<QuantizedState>,
    /// The written parameters' ranges of the bucket.
    pub(super) ranges: Vec<Range<usize>>,
}

impl QuantizedAverage {
    /// Through `quantizer` (checked), with error feedback when asked, and a
    /// local momentum `mu` sent instead of the gradients when given.
    pub fn new(
        quantizer: Quantizer,
        error_feedback: bool,
        momentum: Option<f32>,
    ) -> gradwire_algos::Result<Self> {
        let mut inner = QuantizedAllReduce::new(quantizer, error_feedback)?;
        if let Some(mu) = momentum {
            inner = inner.with_momentum(mu)?;
        }
        Ok(Self::around(inner))
    }

    /// Through `inner`, however it was set up.
    pub(super) fn around(inner: QuantizedAllReduce) -> Self {
        QuantizedAverage {
            inner,
            before: BeforeStep::default(),
            ranges: Vec::new(),
        }
    }
}

impl<C: Communicator + 'static> Combiner<C> for QuantizedAverage {
    fn combine(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<Combined> {
        self.before.keep(self.inner.state());
        let full_len = written_ranges(bucket, &mut self.ranges);
        let traffic =
            self.inner
                .all_reduce_in(comm, tensors, &self.ranges, full_len, bucket.step)?;
        Ok(Combined {
            traffic,
            averaged: true,
        })
    }

    fn end_step(&mut self, _bucket: usize, kept: bool) {
        self.before.end(self.inner.state_mut(), kept);
    }

    /// The residuals and the local momentum as tensors
    /// `quantized/<bucket>/worker`, `.../server` and `.../momentum`, the
    /// ranges last sent as value `.../layout`.
    fn save_state(&self, bucket: usize, ckpt: &mut Checkpoint) -> Result<()> {
        save_quantized(self.inner.state(), &format!("quantized/{bucket}"), ckpt)
    }

    fn load_state(&mut self, bucket: usize, ckpt: &Checkpoint, apply: bool) -> Result<()> {
        let state = load_quantized(&format!("quantized/{bucket}"), ckpt)?;
        if apply {
            *self.inner.state_mut() = state;
            self.before.forget();
        }
        Ok(())
    }
}

/// A quantized all-reduce's state into `ckpt`: tensors `<prefix>/worker`,
/// `/server` and `/momentum`, the ranges last sent as value `<prefix>/layout`.
fn save_quantized(state: &QuantizedState, prefix: &str, ckpt: &mut Checkpoint) -> Result<()> {
    for (name, values) in [
        ("worker", &state.worker),
        ("server", &state.server),
        ("momentum", &state.momentum),
    ] {
        let n = values.len();
        ckpt.tensors.insert(
            format!("{prefix}/{name}"),
            Tensor::from_vec(values.clone(), n)?,
        );
    }
    let layout: Vec<[usize; 2]> = state.layout.iter().map(|r| [r.start, r.end]).collect();
    ckpt.values
        .insert(format!("{prefix}/layout"), serde_json::json!(layout));
    Ok(())
}

/// The state [`save_quantized`] wrote under `prefix`.
fn load_quantized(prefix: &str, ckpt: &Checkpoint) -> Result<QuantizedState> {
    let read = |name: &str| -> Result<Vec<f32>> {
        let key = format!("{prefix}/{name}");
        Ok(ckpt
            .tensors
            .get(&key)
            .ok_or_else(|| OptimError::StateMismatch(format!("no {key}")))?
            .to_vec::<f32>()?)
    };
    let key = format!("{prefix}/layout");
    let layout: Vec<[usize; 2]> = ckpt
        .values
        .get(&key)
        .map(|v| serde_json::from_value(v.clone()))
        .transpose()
        .map_err(|e| OptimError::StateMismatch(format!("{key}: {e}")))?
        .unwrap_or_default();
    Ok(QuantizedState {
        momentum: read("momentum")?,
        worker: read("worker")?,
        server: read("server")?,
        layout: layout.into_iter().map(|[a, b]| a..b).collect(),
    })
}
