//! Gradient accumulation in [`crate::DataParallel`]'s loops of local steps
//! (`partial`, `adasum-delta`, DiLoCo). There the optimizer steps first, on
//! this worker's own candle gradients, which gradwire never holds; so
//! DataParallel sums them itself, micro-batch by micro-batch, and hands the
//! optimizer their mean (sum / k, summed in micro-batch order as gradwire's
//! engine does) at the step's last micro-batch. (In the gradient
//! strategies gradwire's engine accumulates: `DistOptConfig::accumulate`.)

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use gradwire_optim::{MicroBatches, OptimError};

/// The sums of the micro-batches of the local step in progress.
#[derive(Debug)]
pub(crate) struct LocalAccumulation {
    micro: MicroBatches,
    /// Per variable, the sum of its gradients so far.
    sums: Vec<Option<Tensor>>,
    /// The first failure of this step's sums, for the step to carry to
    /// every worker.
    failure: Option<String>,
}

impl LocalAccumulation {
    /// For `vars` variables and `micro` micro-batches per step (1: no
    /// accumulation).
    pub(crate) fn new(vars: usize, micro: MicroBatches) -> LocalAccumulation {
        LocalAccumulation {
            micro,
            sums: vec![None; vars],
            failure: None,
        }
    }

    /// An error if a step is between its micro-batches (`what`, a
    /// checkpoint or a restore, must come between steps).
    pub(crate) fn between_steps(&self, what: &str) -> Result<(), OptimError> {
        self.micro.between_steps(what)
    }

    /// Adds this micro-batch's gradients of `vars` from `grads`. `None`
    /// while the step only accumulates; at its last micro-batch, the
    /// gradients to step with (their mean) and the failure of any
    /// micro-batch's sum, for the step to carry (the sums are then
    /// forgotten).
    pub(crate) fn add(
        &mut self,
        vars: &[(String, Var)],
        grads: GradStore,
    ) -> Option<(GradStore, Option<String>)> {
        if self.micro.per_step() == 1 {
            return Some((grads, None));
        }
        for ((name, var), sum) in vars.iter().zip(&mut self.sums) {
            let Some(grad) = grads.get(var.as_tensor()) else {
                continue;
            };
            let added = match sum.take() {
                Some(s) => s.add(grad),
                None => Ok(grad.clone()),
            };
            match added {
                Ok(t) => *sum = Some(t),
                Err(e) => {
                    self.failure
                        .get_or_insert_with(|| format!("accumulating the gradient of {name}: {e}"));
                }
            }
        }
        if !self.micro.count() {
            return None;
        }
        let factor = 1.0 / f64::from(self.micro.per_step());
        let mut mean = GradStore::default();
        for ((name, var), sum) in vars.iter().zip(&mut self.sums) {
            if let Some(s) = sum.take() {
                match s.affine(factor, 0.0) {
                    Ok(t) => {
                        mean.insert(var.as_tensor(), t);
                    }
                    Err(e) => {
                        self.failure
                            .get_or_insert_with(|| format!("the mean gradient of {name}: {e}"));
                    }
                }
            }
        }
        Some((mean, self.failure.take()))
    }
}
