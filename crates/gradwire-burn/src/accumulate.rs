//! Gradient accumulation in [`crate::DataParallel`]'s loops of local steps
//! (`partial`, `adasum-delta`, DiLoCo). There the burn optimizer steps
//! first, on this worker's own gradients, which gradwire never holds; so
//! DataParallel sums them itself, micro-batch by micro-batch, and hands
//! the optimizer their mean (sum / k, summed in micro-batch order) at the
//! step's last micro-batch. (In the gradient strategies gradwire's engine
//! accumulates: `DistOptConfig::accumulate`.)

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use gradwire_optim::{MicroBatches, OptimError};

/// The sums of the micro-batches of the local step in progress.
#[derive(Debug)]
pub(crate) struct LocalAccumulation {
    micro: MicroBatches,
    /// The sums so far, per parameter id.
    sums: GradientsParams,
}

impl LocalAccumulation {
    /// For `micro` micro-batches per step (1: no accumulation).
    pub(crate) fn new(micro: MicroBatches) -> LocalAccumulation {
        LocalAccumulation {
            micro,
            sums: GradientsParams::new(),
        }
    }

    /// An error if a step is between its micro-batches (`what`, a
    /// checkpoint or a restore, must come between steps).
    pub(crate) fn between_steps(&self, what: &str) -> Result<(), OptimError> {
        self.micro.between_steps(what)
    }

    /// Adds this micro-batch's gradients of `module`'s parameters from
    /// `grads`. `None` while the step only accumulates; at its last
    /// micro-batch, the gradients to step with (their mean; the sums are
    /// then forgotten).
    pub(crate) fn add<M: Module>(
        &mut self,
        module: &M,
        mut grads: GradientsParams,
    ) -> Option<GradientsParams> {
        if self.micro.per_step() == 1 {
            return Some(grads);
        }
        /// Adds each gradient into its sum and, at the step's last
        /// micro-batch, makes every sum (a parameter this micro-batch left
        /// without a gradient included) its mean.
        struct Add<'g> {
            grads: &'g mut GradientsParams,
            sums: &'g mut GradientsParams,
            mean: Option<f64>,
        }
        impl ModuleVisitor for Add<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                let grad = self.grads.remove::<D>(param.id);
                let sum = match (self.sums.remove::<D>(param.id), grad) {
                    (Some(sum), Some(grad)) => sum + grad,
                    (sum, grad) => match sum.or(grad) {
                        Some(only) => only,
                        None => return,
                    },
                };
                let sum = match self.mean {
                    Some(factor) => sum.mul_scalar(factor),
                    None => sum,
                };
                self.sums.register(param.id, sum);
            }
        }
        let last = self.micro.count();
        let mut add = Add {
            grads: &mut grads,
            sums: &mut self.sums,
            mean: last.then(|| 1.0 / f64::from(self.micro.per_step())),
        };
        module.visit(&mut add);
        last.then(|| std::mem::take(&mut self.sums))
    }
}

#[cfg(test)]
mod tests {
    use super::LocalAccumulation;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::GradientsParams;
    use burn::tensor::{Device, Tensor, TensorData};

    /// `grads` of `value` for `model`'s weight, and its bias too if `bias`.
    fn grads(model: &Linear, value: f32, bias: bool) -> GradientsParams {
        let device = Device::flex();
        let mut grads = GradientsParams::new();
        let full = |n: usize, shape: Vec<usize>| TensorData::new(vec![value; n], shape);
        grads.register(
            model.weight.id,
            Tensor::<2>::from_data(full(6, vec![3, 2]), &device),
        );
        if bias {
            let id = model.bias.as_ref().unwrap().id;
            grads.register(id, Tensor::<1>::from_data(full(2, vec![2]), &device));
        }
        grads
    }

    fn values<const D: usize>(grads: &GradientsParams, id: burn::module::ParamId) -> Vec<f32> {
        let t: Tensor<D> = grads.get(id).expect("a mean");
        t.into_data().try_to_vec::<f32>().unwrap()
    }

    /// The mean of a step's micro-batches divides every sum by their
    /// count, a parameter the last micro-batch left without a gradient
    /// included.
    #[test]
    fn every_sum_becomes_its_mean() {
        let model: Linear = LinearConfig::new(3, 2).init(&Device::flex());
        let mut accumulation = LocalAccumulation::new(gradwire_optim::MicroBatches::new(2));
        assert!(accumulation.add(&model, grads(&model, 1.0, true)).is_none());
        assert!(matches!(
            accumulation.between_steps("a checkpoint"),
            Err(gradwire_optim::OptimError::InvalidArgument(_))
        ));
        let mean = accumulation
            .add(&model, grads(&model, 3.0, false))
            .expect("the step's last micro-batch");
        accumulation.between_steps("a checkpoint").unwrap();
        assert_eq!(values::<2>(&mean, model.weight.id), vec![2.0; 6]);
        let bias = model.bias.as_ref().unwrap().id;
        assert_eq!(values::<1>(&mean, bias), vec![0.5; 2]);
    }
}
