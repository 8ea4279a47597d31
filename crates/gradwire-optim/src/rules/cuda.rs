//! The optimizer updates of `kernels/cuda/optim.cu`: one launch updates a
//! parameter (f32, f16 or bf16) from its gradient (same dtype) and its f32
//! buffers, with the same f32 operations in the same order as
//! gradwire-optim's rules, so a GPU step is bitwise the CPU step.
//!
//! The hyper-parameters arrive as the f32 values gradwire-optim evaluates
//! for the step (schedules, and for Adam the f64 bias corrections turned
//! into `step_size` and `inv_c2`); see [`UpdateKernel`].

use gradwire_kernels::{Kernel, optim as k};
use gradwire_tensor::cuda_backend::launch::{
    Blocks, Launch, by_dtype, require_f32, require_len, require_like, require_same_device,
};
use gradwire_tensor::{CudaStorage, DType, Error, Result};

/// One step's update rule and its values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UpdateKernel {
    /// SINGA's SGD: with `momentum != 0` one buffer (the momentum),
    /// `buf = momentum buf + (1 - dampening) g`, `p -= lr buf` (or
    /// `lr (g + momentum buf)` with nesterov); without, `p -= lr g`. A
    /// non-zero `weight_decay` adds `weight_decay p` to the gradient first.
    Sgd {
        /// The learning rate.
        lr: f32,
        /// The momentum (0: no buffer).
        momentum: f32,
        /// The dampening.
        dampening: f32,
        /// L2 weight decay.
        weight_decay: f32,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// RMSProp, one buffer (the running mean of squares).
    RmsProp {
        /// The learning rate.
        lr: f32,
        /// The decay of the running mean.
        rho: f32,
        /// Added under the square root.
        eps: f32,
        /// L2 weight decay.
        weight_decay: f32,
    },
    /// AdaGrad, one buffer (the sum of squares).
    AdaGrad {
        /// The learning rate.
        lr: f32,
        /// Added under the square root.
        eps: f32,
        /// L2 weight decay.
        weight_decay: f32,
    },
    /// Adam, two buffers (`m`, `v`): `p -= step_size m / (sqrt(v inv_c2) +
    /// eps)` with `step_size = lr / (1 - beta1^t)` and `inv_c2 = 1 / (1 -
    /// beta2^t)` computed in f64 and rounded to f32; `l2` is added to the
    /// gradient as `l2 p` when not 0.
    Adam {
        /// `lr / (1 - beta1^t)`, as f32.
        step_size: f32,
        /// `1 / (1 - beta2^t)`, as f32.
        inv_c2: f32,
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Added to the root.
        eps: f32,
        /// L2 weight decay on the gradient.
        l2: f32,
    },
    /// AdamW, two buffers (`m`, `v`): `p *= shrink` (with `shrink = 1 - lr
    /// wd` in f64, rounded to f32; `None` when the weight decay is 0), then
    /// Adam's step with the raw gradient; the parameter is rounded once,
    /// after both.
    AdamW {
        /// The decoupled decay factor, if any.
        shrink: Option<f32>,
        /// As for Adam.
        step_size: f32,
        /// As for Adam.
        inv_c2: f32,
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Added to the root.
        eps: f32,
    },
}

impl UpdateKernel {
    /// How many f32 buffers the update reads and writes, in the order
    /// `apply_update` takes them (gradwire-optim's buffer names, sorted:
    /// `momentum`; `square_avg` / `sum_sq`; `m`, `v`).
    pub fn buffers(&self) -> usize {
        match self {
            UpdateKernel::Sgd { momentum, .. } => usize::from(*momentum != 0.0),
            UpdateKernel::RmsProp { .. } | UpdateKernel::AdaGrad { .. } => 1,
            UpdateKernel::Adam { .. } | UpdateKernel::AdamW { .. } => 2,
        }
    }

    fn kernel(&self, dtype: DType) -> &'static Kernel {
        by_dtype(
            dtype,
            match self {
                UpdateKernel::Sgd { .. } => [&k::SGD_F32, &k::SGD_F16, &k::SGD_BF16],
                UpdateKernel::RmsProp { .. } => {
                    [&k::RMSPROP_F32, &k::RMSPROP_F16, &k::RMSPROP_BF16]
                }
                UpdateKernel::AdaGrad { .. } => {
                    [&k::ADAGRAD_F32, &k::ADAGRAD_F16, &k::ADAGRAD_BF16]
                }
                UpdateKernel::Adam { .. } => [&k::ADAM_F32, &k::ADAM_F16, &k::ADAM_BF16],
                UpdateKernel::AdamW { .. } => [&k::ADAMW_F32, &k::ADAMW_F16, &k::ADAMW_BF16],
            },
        )
    }
}

/// Updates `param` from `grad` (same dtype, length and device) and
/// `buffers` (f32, the parameter's length, [`UpdateKernel::buffers`] of
/// them), on the device's stream.
///
/// Errors, before anything is queued: a dtype, length or device mismatch,
/// or the wrong number of buffers ([`Error::InvalidArgument`]).
pub fn apply_update(
    update: &UpdateKernel,
    param: &mut CudaStorage,
    grad: &CudaStorage,
    buffers: &mut [&mut CudaStorage],
) -> Result<()> {
    const OP: &str = "apply_update";
    require_like(OP, param, grad)?;
    let n = param.len();
    if buffers.len() != update.buffers() {
        return Err(Error::InvalidArgument(format!(
            "{OP}: {update:?} takes {} buffers, got {}",
            update.buffers(),
            buffers.len()
        )));
    }
    for buffer in buffers.iter() {
        require_f32(OP, buffer)?;
        require_same_device(OP, param, buffer)?;
        require_len(OP, n, buffer.len())?;
    }
    if n == 0 {
        return Ok(());
    }
    let kernel = update.kernel(param.dtype());
    let device = std::sync::Arc::clone(param.device());
    let launch = Launch::new(&device, kernel).write(param).read(grad);
    let launch = match (update, buffers) {
        (
            UpdateKernel::Sgd {
                lr,
                momentum,
                dampening,
                weight_decay,
                nesterov,
            },
            bufs,
        ) => {
            let momentum_buffer = match bufs {
                [momentum_buffer] => Some(&mut **momentum_buffer),
                _ => None,
            };
            launch
                .write_or_null(momentum_buffer)
                .len(n)
                .value(*lr)
                .value(*momentum)
                .value(*dampening)
                .value(*weight_decay)
                .value(i32::from(*nesterov))
        }
        (
            UpdateKernel::RmsProp {
                lr,
                rho,
                eps,
                weight_decay,
            },
            [square_avg],
        ) => launch
            .write(&mut **square_avg)
            .len(n)
            .value(*lr)
            .value(*rho)
            .value(*eps)
            .value(*weight_decay),
        (
            UpdateKernel::AdaGrad {
                lr,
                eps,
                weight_decay,
            },
            [sum_sq],
        ) => launch
            .write(&mut **sum_sq)
            .len(n)
            .value(*lr)
            .value(*eps)
            .value(*weight_decay),
        (
            UpdateKernel::Adam {
                step_size,
                inv_c2,
                beta1,
                beta2,
                eps,
                l2,
            },
            [m, v],
        ) => launch
            .write(&mut **m)
            .write(&mut **v)
            .len(n)
            .value(*step_size)
            .value(*inv_c2)
            .value(*beta1)
            .value(*beta2)
            .value(*eps)
            .value(*l2),
        (
            UpdateKernel::AdamW {
                shrink,
                step_size,
                inv_c2,
                beta1,
                beta2,
                eps,
            },
            [m, v],
        ) => launch
            .write(&mut **m)
            .write(&mut **v)
            .len(n)
            .value(i32::from(shrink.is_some()))
            .value(shrink.unwrap_or(1.0))
            .value(*step_size)
            .value(*inv_c2)
            .value(*beta1)
            .value(*beta2)
            .value(*eps),
        // The count was checked against `update.buffers()` above.
        _ => {
            return Err(Error::InvalidArgument(format!(
                "{OP}: buffers do not fit {update:?}"
            )));
        }
    };
    launch.run(Blocks::Over(n))
}
