//! DimReduce mode: switching to it, and its step (DimReduce's quasi-Newton
//! step in the PCA subspace, which averages the gradients itself, with a
//! line search through the caller's loss closure).

use super::local_step::recycle;
use super::{Engine, StepStats, StrategyConfig, StrategyError, TrainingLoop};
use crate::error::{OptimError, Result};
use crate::optimizer::Optimizer;
use gradwire_algos::dimreduce::{DimReduce, DimReduceConfig, Pca};
use gradwire_algos::{FaultKind, Traffic};
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_tensor::{DType, Device, Tensor};
use std::time::Instant;

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// Switches to [`StrategyConfig::DimReduce`] with the components `pca` (the same on
    /// every rank: fit from the same trajectory, or broadcast) over all
    /// declared parameters flattened in declaration order. Call between
    /// steps; the optimizer's state is kept, unused, in the checkpoints.
    pub(crate) fn start_dimreduce(&mut self, pca: &Pca, config: DimReduceConfig) -> Result<()> {
        if self.training_loop != TrainingLoop::DimReduce {
            return Err(StrategyError::WrongLoop {
                strategy: StrategyConfig::DimReduce.to_string(),
                runs_on: TrainingLoop::DimReduce.front_end(),
                given_to: self.training_loop.front_end(),
            }
            .into());
        }
        let total: usize = self.lens.iter().sum();
        if pca.components.ncols() != total {
            return Err(OptimError::InvalidArgument(format!(
                "the components cover {} parameters, the declared parameters {total}",
                pca.components.ncols()
            )));
        }
        if !self.in_flight.is_empty() || self.grads.iter().any(Option::is_some) {
            return Err(OptimError::InvalidArgument(
                "DimReduce started in the middle of a step".into(),
            ));
        }
        // The configured clipping applies to DimReduce's averaged gradient.
        let config = DimReduceConfig {
            clip_global_norm: config.clip_global_norm.or(self.config.clip_global_norm),
            ..config
        };
        self.dimreduce = Some(DimReduce::new(&self.comm, pca, config)?);
        self.config.strategy = StrategyConfig::DimReduce;
        Ok(())
    }

    /// DimReduce mode's [`Engine::finish`]: one DimReduce step on `params`
    /// (every declared parameter, f32) from this rank's pushed gradients
    /// and `loss`, both averaged across ranks within the step
    /// ([`DimReduce::step`]: P sharded by parameter columns, a reduce-scatter
    /// of the gradients and two all-gathers of the parameters' size, 1.5
    /// times a dense step's bytes; in this mode the buckets do not travel
    /// during backward). The line
    /// search calls `eval_loss` with the trial parameters (name and tensor,
    /// in declaration order) on every rank alike; it returns this rank's loss
    /// on the same batch, which the engine averages. A parameter no rank wrote
    /// has a zero gradient here: DimReduce moves all parameters together.
    ///
    /// If `eval_loss` fails on a rank, that trial counts as rejected on every
    /// rank (the rank contributes NaN to the averaged loss), the step
    /// completes alike everywhere, and then every rank returns an error
    /// ([`OptimError::Fault`] naming the rank): ranks never diverge or wait
    /// on each other. A non-finite averaged loss is treated as a non-finite
    /// gradient (skipped with `skip_non_finite`, else a fault everywhere).
    pub(crate) fn finish_dimreduce<'n, 'p>(
        &mut self,
        params: impl IntoIterator<Item = (&'n str, &'p mut Tensor)>,
        loss: f64,
        eval_loss: impl FnMut(&[(&str, &Tensor)]) -> Result<f64>,
    ) -> Result<StepStats> {
        let track = self.comm.timeline().cloned();
        let _step = gradwire_comm::timeline::span(track.as_ref(), "step", "step", None);
        let mut targets = self.take_targets(params);
        let result = self.finish_dimreduce_step(&mut targets, loss, eval_loss);
        self.local.targets = recycle(targets);
        self.end_step();
        result
    }

    fn finish_dimreduce_step(
        &mut self,
        targets: &mut [Option<&mut Tensor>],
        loss: f64,
        mut eval_loss: impl FnMut(&[(&str, &Tensor)]) -> Result<f64>,
    ) -> Result<StepStats> {
        if self.config.strategy != StrategyConfig::DimReduce || self.dimreduce.is_none() {
            self.record(
                FaultKind::InvalidArgument,
                &"finish_dimreduce needs DimReduceOpt::start first",
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
        let mut stats = StepStats {
            buckets: 0,
            ..StepStats::default()
        };
        // The flat parameters and this rank's gradient, in declaration order
        // (a gradient not pushed is zeros), in memory kept from step to step;
        // a failure here is this rank's fault like the others.
        let mut scratch = std::mem::take(&mut self.dimreduce_scratch);
        if let Err(e) = self.flatten_into(targets, &mut scratch) {
            self.record(FaultKind::InvalidArgument, &e);
        }
        // This rank's fault takes the place of the reduce-scatter the others
        // start: every rank fails there.
        if let Some(fault) = &self.fault {
            self.dimreduce_scratch = scratch;
            let err = self.comm.post_fault(fault.kind);
            return self.step_failed(err.into(), stats);
        }
        let world = self.world_size();
        let DimReduceScratch {
            w,
            g,
            offsets,
            trial,
            view,
        } = &mut scratch;
        // Trial points are evaluated on copies of the parameters, and the
        // closure sees them by name (a list whose memory is reused).
        let comm = &self.comm;
        let params = &self.params;
        let mut user_error = None;
        let mut trials = 0usize;
        let Some(dimreduce) = self.dimreduce.as_mut() else {
            // Recorded as this rank's fault above: not reached.
            return Err(OptimError::InvalidArgument(
                "finish_dimreduce needs DimReduceOpt::start first".into(),
            ));
        };
        let start = Instant::now();
        let outcome = dimreduce.step(comm, w, g, loss, |point| {
            trials += 1;
            for (t, &at) in trial.iter_mut().zip(offsets.iter()) {
                let n = t.len();
                t.as_mut_slice::<f32>()?.copy_from_slice(&point[at..at + n]);
            }
            let mut named: Vec<(&str, &Tensor)> = recycle(std::mem::take(view));
            named.extend(params.iter().map(|p| p.name.as_str()).zip(trial.iter()));
            // A failing closure on one rank must not leave its peers waiting
            // in the all-reduce: it contributes NaN, which rejects the trial
            // everywhere, and the error is returned after the step.
            let mut local = [match eval_loss(&named) {
                Ok(l) => l,
                Err(e) => {
                    user_error.get_or_insert(e);
                    f64::NAN
                }
            }];
            *view = recycle(named);
            comm.all_reduce(&mut local, ReduceOp::Avg)?;
            Ok(local[0])
        });
        stats.wait += start.elapsed();
        // Another rank's fault arrives in the step's first collective: the
        // step's agreed failure, like this rank's own.
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                self.dimreduce_scratch = scratch;
                return self.step_failed(e, stats);
            }
        };
        stats.traffic += outcome.traffic + Traffic::all_reduce(8 * trials, world);
        if outcome.non_finite {
            // The same sums on every rank: the same decision, nothing changed.
            self.dimreduce_scratch = scratch;
            return self.non_finite_everywhere(stats, "the averaged gradient or loss is");
        }
        for (param, &at) in targets.iter_mut().flatten().zip(&scratch.offsets) {
            let n = param.len();
            param
                .as_mut_slice::<f32>()?
                .copy_from_slice(&scratch.w[at..at + n]);
        }
        self.dimreduce_scratch = scratch;
        // A closure that failed on one rank: every rank learns it here, so
        // that the step's outcome is the same everywhere.
        self.agree_after(
            FaultKind::Other,
            user_error.map(|e| format!("the loss closure failed: {e}")),
            &mut stats,
        )?;
        stats.updated = self.params.len();
        stats.dimreduce = Some(outcome);
        Ok(stats)
    }
}

/// What DimReduce mode's step works in, kept from step to step: the flat
/// parameters and gradient, each parameter's offset, the trial point's
/// tensors, and the memory of the named view the loss closure gets.
#[derive(Debug, Default)]
pub(super) struct DimReduceScratch {
    w: Vec<f32>,
    g: Vec<f32>,
    offsets: Vec<usize>,
    trial: Vec<Tensor>,
    /// Always empty: its memory holds the next step's view.
    view: Vec<(&'static str, &'static Tensor)>,
}

impl<O: Optimizer, C: Communicator + 'static> Engine<O, C> {
    /// Fills `scratch` with the flat parameters (`targets`, all present and
    /// f32), this rank's gradient (zeros where none was pushed; f16 and
    /// bf16 gradients are widened, which allocates) and the offsets, and
    /// makes the trial tensors once.
    fn flatten_into(
        &self,
        targets: &[Option<&mut Tensor>],
        scratch: &mut DimReduceScratch,
    ) -> Result<()> {
        let total: usize = self.lens.iter().sum();
        scratch.w.clear();
        scratch.offsets.clear();
        for (i, param) in targets.iter().enumerate() {
            // Every parameter, of its declared length: the offsets below
            // index the flat model by them.
            let values = match param {
                Some(param) if param.len() == self.lens[i] => param.as_slice::<f32>()?,
                _ => {
                    return Err(OptimError::InvalidArgument(format!(
                        "parameter {} is not given with its {} declared elements",
                        self.params[i].name, self.lens[i]
                    )));
                }
            };
            scratch.offsets.push(scratch.w.len());
            scratch.w.extend_from_slice(values);
        }
        scratch.g.clear();
        scratch.g.resize(total, 0.0);
        for (grad, &at) in self.grads.iter().zip(&scratch.offsets) {
            match grad {
                Some(grad) if !grad.is_zeroed() && grad.dtype() == DType::F32 => {
                    scratch.g[at..at + grad.len()].copy_from_slice(grad.as_slice::<f32>()?);
                }
                Some(grad) if !grad.is_zeroed() => {
                    scratch.g[at..at + grad.len()].copy_from_slice(&grad.to_f32_vec()?);
                }
                _ => {}
            }
        }
        if scratch.trial.len() != self.params.len() {
            scratch.trial = self
                .params
                .iter()
                .map(|spec| Tensor::zeros(spec.shape.clone(), DType::F32, Device::Cpu))
                .collect::<std::result::Result<_, _>>()?;
        }
        Ok(())
    }
}
