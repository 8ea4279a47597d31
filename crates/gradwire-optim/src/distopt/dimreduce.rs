//! DimReduce mode: switching to it, and its step (the gradients averaged
//! as in `Dense`, then DimReduce's quasi-Newton step in the PCA subspace
//! with a line search through the caller's loss closure).

use super::gradient::Reduction;
use super::{DistOpt, Mode, StepStats};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_algos::dimreduce::{DimReduce, DimReduceConfig, Pca};
use gradwire_algos::{AlgoError, FaultKind, Traffic};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_tensor::{DType, Device, Tensor};
use std::time::Instant;

impl<O: Optimizer, C: Communicator + 'static> DistOpt<O, C> {
    /// Switches to [`Mode::DimReduce`] with the components `pca` (the same on
    /// every rank: fit from the same trajectory, or broadcast) over all
    /// declared parameters flattened in declaration order. Call between
    /// steps; the optimizer's state is kept, unused, in the checkpoints.
    pub fn start_dimreduce(&mut self, pca: &Pca, config: DimReduceConfig) -> Result<()> {
        let total: usize = self.lens.iter().sum();
        if pca.components.ncols() != total {
            return Err(OptimError::InvalidArgument(format!(
                "the components cover {} parameters, DistOpt has {total}",
                pca.components.ncols()
            )));
        }
        if !self.in_flight.is_empty() || self.grads.iter().any(Option::is_some) {
            return Err(OptimError::InvalidArgument(
                "start_dimreduce in the middle of a step".into(),
            ));
        }
        self.dimreduce = Some(DimReduce::new(&self.comm, pca, config)?);
        self.config.mode = Mode::DimReduce;
        Ok(())
    }

    /// DimReduce mode's [`DistOpt::finish`]: waits for the averaged
    /// gradients, averages this rank's `loss` across ranks, and takes one
    /// DimReduce step on `params` (every declared parameter, f32). The line
    /// search calls `eval_loss` with the trial parameters (name and tensor,
    /// in declaration order) on every rank alike; it returns this rank's loss
    /// on the same batch, which DistOpt averages. A parameter no rank wrote
    /// has a zero gradient here: DimReduce moves all parameters together.
    ///
    /// If `eval_loss` fails on a rank, that trial counts as rejected on every
    /// rank (the rank contributes NaN to the averaged loss), the step
    /// completes alike everywhere, and then every rank returns an error
    /// ([`OptimError::Fault`] naming the rank): ranks never diverge or wait
    /// on each other. A non-finite averaged loss is treated as a non-finite
    /// gradient (skipped with `skip_non_finite`, else a fault everywhere).
    pub fn finish_dimreduce<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
        loss: f64,
        eval_loss: impl FnMut(&[(&str, &Tensor)]) -> Result<f64>,
    ) -> Result<StepStats> {
        let result = self.finish_dimreduce_step(params, loss, eval_loss);
        self.end_step();
        result
    }

    fn finish_dimreduce_step<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
        loss: f64,
        mut eval_loss: impl FnMut(&[(&str, &Tensor)]) -> Result<f64>,
    ) -> Result<StepStats> {
        let mut targets = self.take_targets(params);
        if self.config.mode != Mode::DimReduce || self.dimreduce.is_none() {
            self.record(
                FaultKind::InvalidArgument,
                &"finish_dimreduce needs start_dimreduce first",
            );
        }
        // DimReduce moves f32 parameters in host memory.
        if let Some(bad) = targets
            .iter()
            .flatten()
            .find(|t| t.dtype() != DType::F32 || !t.device().is_cpu())
        {
            let err = format!(
                "DimReduce needs f32 parameters on the CPU, got {} on {:?}",
                bad.dtype(),
                bad.device()
            );
            self.record(FaultKind::InvalidArgument, &err);
        }
        let mut stats = match self.reduce_gradients()? {
            Reduction::Skipped(stats) => return Ok(stats),
            Reduction::Reduced(stats) => stats,
        };
        let reduced = std::mem::take(&mut self.scratch.reduced);
        // The flat parameters and averaged gradient, in declaration order
        // (every target is present and f32: checked before the last vote).
        let total: usize = self.lens.iter().sum();
        let mut w = Vec::with_capacity(total);
        let mut g = vec![0f32; total];
        let mut offsets = Vec::with_capacity(self.params.len());
        for param in targets.iter().flatten() {
            offsets.push(w.len());
            w.extend(param.to_vec::<f32>()?);
        }
        for (i, grad, _) in &reduced {
            let at = offsets[*i];
            g[at..at + grad.len()].copy_from_slice(&grad.to_vec::<f32>()?);
        }
        let world = self.world_size();
        let mut avg_loss = [loss];
        self.comm
            .all_reduce(&mut avg_loss, ReduceOp::Avg)
            .map_err(AlgoError::from)?;
        if !avg_loss[0].is_finite() {
            // The same averaged value on every rank: the same decision.
            return self.non_finite_everywhere(stats, "the averaged loss is");
        }
        // Trial points are evaluated on scratch copies of the parameters.
        let mut scratch: Vec<Tensor> = self
            .params
            .iter()
            .map(|spec| Tensor::zeros(spec.shape.clone(), DType::F32, Device::Cpu))
            .collect::<std::result::Result<_, _>>()?;
        let names: Vec<&str> = self.params.iter().map(|p| p.name.as_str()).collect();
        let comm = &self.comm;
        let mut user_error = None;
        let mut trials = 0usize;
        let dimreduce = self.dimreduce.as_mut().ok_or_else(|| {
            OptimError::InvalidArgument("finish_dimreduce needs start_dimreduce first".into())
        })?;
        let start = Instant::now();
        let outcome = dimreduce.step(comm, &mut w, &g, avg_loss[0], |trial| {
            trials += 1;
            for (t, &at) in scratch.iter_mut().zip(&offsets) {
                let n = t.len();
                t.as_mut_slice::<f32>()?.copy_from_slice(&trial[at..at + n]);
            }
            let view: Vec<(&str, &Tensor)> = names.iter().copied().zip(scratch.iter()).collect();
            // A failing closure on one rank must not leave its peers waiting
            // in the all-reduce: it contributes NaN, which rejects the trial
            // everywhere, and the error is returned after the step.
            let mut local = [match eval_loss(&view) {
                Ok(l) => l,
                Err(e) => {
                    user_error.get_or_insert(e);
                    f64::NAN
                }
            }];
            comm.all_reduce(&mut local, ReduceOp::Avg)?;
            Ok(local[0])
        });
        stats.wait += start.elapsed();
        let outcome = outcome?;
        for (param, &at) in targets.iter_mut().flatten().zip(&offsets) {
            let n = param.len();
            param.as_mut_slice::<f32>()?.copy_from_slice(&w[at..at + n]);
        }
        let n = dimreduce.b().nrows();
        // A closure that failed on one rank: every rank learns it here, so
        // that the step's outcome is the same everywhere.
        self.agree_after(
            FaultKind::Other,
            user_error.map(|e| format!("the loss closure failed: {e}")),
        )?;
        // The loss, the projection's all-gather, the back-projection's
        // all-reduce (2 x f64 per parameter) and one loss per trial.
        stats.traffic += Traffic::all_reduce(8 * (1 + trials), world)
            + Traffic::all_gather(8 * n.div_ceil(world), 8 * n, world)
            + Traffic::all_reduce(16 * total, world);
        stats.updated = self.params.len();
        stats.dimreduce = Some(outcome);
        Ok(stats)
    }
}
