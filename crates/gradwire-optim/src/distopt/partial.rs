//! Partial mode (SINGA's `backward_and_partial_update`): local SGD, then
//! the parameters of one bucket in turn (`counter mod K`) averaged across
//! ranks, and with `average_state` their optimizer buffers too.

use super::local_step::{LocalUpdate, copy_into};
use super::{Engine, StepStats};
use crate::error::Result;
use crate::optimizer::{Optimizer, StateBuffers};
use gradwire_algos::fault::fail;
use gradwire_algos::{AlgoError, FaultKind, Traffic, fused_all_reduce, fused_all_reduce_with};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_tensor::Tensor;
use std::time::Instant;

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// Partial mode's finish: the local update, then the average of one
    /// bucket's parameters across ranks (and, with `average_state`, of
    /// their optimizer buffers: `state`'s, the caller's optimizer, or the
    /// engine's when `None`). The counter advances only when the step
    /// completes.
    pub(crate) fn finish_partial(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        average_state: bool,
        local: LocalUpdate<'_>,
        state: Option<&mut dyn StateBuffers>,
    ) -> Result<StepStats> {
        let mut stats = StepStats {
            buckets: 1,
            ..StepStats::default()
        };
        let mut grads = match self.open_local_step() {
            Ok(grads) => grads,
            Err(e) => return self.step_failed(e, stats),
        };
        let failure = self.step_locally(targets, &mut grads, &mut stats, local);
        self.local.grads = grads;
        let k = self.buckets.len() as u64;
        if k == 0 {
            self.agree_after(
                FaultKind::Optimizer,
                failure.map(|e| e.to_string()),
                &mut stats,
            )?;
            self.optimizer.step();
            return Ok(stats);
        }
        if failure.is_some() {
            // Posted in place of the averaging the other ranks start.
            let err = self.comm.post_fault(FaultKind::Optimizer);
            return self.step_failed(err.into(), stats);
        }
        let b = (self.partial_counter % k) as usize;
        let range = self.buckets[b].clone();
        // The bucket's parameters, copied into tensors kept from step to step.
        let buckets = &mut self.local.buckets;
        if buckets.len() != self.buckets.len() {
            buckets.resize_with(self.buckets.len(), Vec::new);
        }
        let mut chosen = std::mem::take(&mut buckets[b]);
        // Every target is present (checked before the step opened).
        copy_into(
            &mut chosen,
            targets[range.clone()].iter().flatten().map(|t| &**t),
        );
        let start = Instant::now();
        let averaged = fused_all_reduce_with(
            &self.comm,
            &mut chosen,
            ReduceOp::Avg,
            self.config.capacity,
            &mut self.local.fusion,
        );
        match averaged {
            Ok(traffic) => stats.traffic += traffic,
            Err(e) => {
                self.local.buckets[b] = chosen;
                return self.step_failed(e, stats);
            }
        }
        stats.wait = start.elapsed();
        for (target, averaged) in targets[range].iter_mut().flatten().zip(&chosen) {
            target.copy_from(averaged)?;
        }
        self.local.buckets[b] = chosen;
        if average_state {
            match self.average_buffers(b, state) {
                Ok(traffic) => stats.traffic += traffic,
                Err(e) => return self.step_failed(e, stats),
            }
        }
        self.optimizer.step();
        self.partial_counter += 1;
        Ok(stats)
    }

    /// Averages the optimizer buffers of bucket `b`'s parameters across ranks
    /// (a rank without state for one contributes zeros and gains the
    /// average): `state`'s buffers, or the engine's optimizer's when
    /// `None`. Buffers on a device are read from there
    /// ([`StateBuffers::buffer_values`]), so the average is of the real state.
    fn average_buffers(
        &mut self,
        b: usize,
        state: Option<&mut dyn StateBuffers>,
    ) -> std::result::Result<Traffic, AlgoError> {
        let optimizer: &mut dyn StateBuffers = match state {
            Some(state) => state,
            None => &mut self.optimizer,
        };
        let names = optimizer.buffer_names();
        let (params, lens) = (&self.params, &self.lens);
        let gathered = (|| -> Result<Vec<Tensor>> {
            let mut buffers = Vec::new();
            for i in self.buckets[b].clone() {
                let (name, n) = (params[i].name.as_str(), lens[i]);
                for &buffer in names {
                    let values = optimizer
                        .buffer_values(name, buffer)?
                        .unwrap_or_else(|| vec![0.0; n]);
                    buffers.push(Tensor::from_vec(values, n)?);
                }
            }
            Ok(buffers)
        })();
        let mut buffers = match gathered {
            Ok(buffers) => buffers,
            Err(e) => {
                self.record(FaultKind::Optimizer, &e);
                return Err(fail(
                    &self.comm,
                    AlgoError::InvalidArgument(format!("optimizer state: {e}")),
                ));
            }
        };
        let traffic = fused_all_reduce(&self.comm, &mut buffers, ReduceOp::Avg, usize::MAX)?;
        let mut averaged = buffers.into_iter();
        for i in self.buckets[b].clone() {
            let spec = self.params[i].clone();
            for &buffer in names {
                if let Some(t) = averaged.next() {
                    // Same names and lengths on every rank: cannot fail on
                    // one rank alone.
                    optimizer
                        .set_buffer(&spec.name, &spec.shape, buffer, t.into_vec::<f32>()?)
                        .map_err(|e| AlgoError::InvalidArgument(e.to_string()))?;
                }
            }
        }
        Ok(traffic)
    }
}
