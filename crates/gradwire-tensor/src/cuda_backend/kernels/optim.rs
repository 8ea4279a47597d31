//! The optimizer updates of `kernels/cuda/optim.cu`: one launch updates a
//! parameter (f32, f16 or bf16) from its gradient (same dtype) and its f32
//! buffers, with the same f32 operations in the same order as
//! gradwire-optim's rules, so a GPU step is bitwise the CPU step.
//!
//! The hyper-parameters arrive as the f32 values gradwire-optim evaluates
//! for the step (schedules, and for Adam the f64 bias corrections turned
//! into `step_size` and `inv_c2`); see [`UpdateKernel`].

use cudarc::driver::PushKernelArg;
use gradwire_kernels::optim as k;

use crate::cuda_backend::CudaStorage;
use crate::cuda_backend::launch::{
    by_dtype, grid_stride, launched, len_arg, require_f32, require_len, require_like,
    require_same_device,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

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
    /// [`apply_update`] takes them (gradwire-optim's buffer names, sorted:
    /// `momentum`; `square_avg` / `sum_sq`; `m`, `v`).
    pub fn buffers(&self) -> usize {
        match self {
            UpdateKernel::Sgd { momentum, .. } => usize::from(*momentum != 0.0),
            UpdateKernel::RmsProp { .. } | UpdateKernel::AdaGrad { .. } => 1,
            UpdateKernel::Adam { .. } | UpdateKernel::AdamW { .. } => 2,
        }
    }

    fn kernel(&self, dtype: DType) -> &'static str {
        by_dtype(
            dtype,
            match self {
                UpdateKernel::Sgd { .. } => [k::SGD_F32, k::SGD_F16, k::SGD_BF16],
                UpdateKernel::RmsProp { .. } => [k::RMSPROP_F32, k::RMSPROP_F16, k::RMSPROP_BF16],
                UpdateKernel::AdaGrad { .. } => [k::ADAGRAD_F32, k::ADAGRAD_F16, k::ADAGRAD_BF16],
                UpdateKernel::Adam { .. } => [k::ADAM_F32, k::ADAM_F16, k::ADAM_BF16],
                UpdateKernel::AdamW { .. } => [k::ADAMW_F32, k::ADAMW_F16, k::ADAMW_BF16],
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
    let function = device.function(k::NAME, kernel)?;
    let n_arg = len_arg(n)?;
    let g = grad.bytes()?;
    let mut views = buffers
        .iter_mut()
        .map(|b| b.bytes_mut())
        .collect::<Result<Vec<_>>>()?;
    let mut p = param.bytes_mut()?;
    let mut args = device.stream().launch_builder(&function);
    args.arg(&mut p).arg(&g);
    // Scalars live until the launch below.
    let null: u64 = 0;
    let nesterov_flag: i32;
    let shrink_flag: i32;
    let shrink_value: f32;
    match (update, views.as_mut_slice()) {
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
            nesterov_flag = i32::from(*nesterov);
            match bufs {
                [momentum_buffer] => args.arg(momentum_buffer),
                _ => args.arg(&null),
            };
            args.arg(&n_arg)
                .arg(lr)
                .arg(momentum)
                .arg(dampening)
                .arg(weight_decay)
                .arg(&nesterov_flag);
        }
        (
            UpdateKernel::RmsProp {
                lr,
                rho,
                eps,
                weight_decay,
            },
            [square_avg],
        ) => {
            args.arg(square_avg)
                .arg(&n_arg)
                .arg(lr)
                .arg(rho)
                .arg(eps)
                .arg(weight_decay);
        }
        (
            UpdateKernel::AdaGrad {
                lr,
                eps,
                weight_decay,
            },
            [sum_sq],
        ) => {
            args.arg(sum_sq)
                .arg(&n_arg)
                .arg(lr)
                .arg(eps)
                .arg(weight_decay);
        }
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
        ) => {
            args.arg(m)
                .arg(v)
                .arg(&n_arg)
                .arg(step_size)
                .arg(inv_c2)
                .arg(beta1)
                .arg(beta2)
                .arg(eps)
                .arg(l2);
        }
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
        ) => {
            shrink_flag = i32::from(shrink.is_some());
            shrink_value = shrink.unwrap_or(1.0);
            args.arg(m)
                .arg(v)
                .arg(&n_arg)
                .arg(&shrink_flag)
                .arg(&shrink_value)
                .arg(step_size)
                .arg(inv_c2)
                .arg(beta1)
                .arg(beta2)
                .arg(eps);
        }
        // The count was checked against `update.buffers()` above.
        _ => {
            return Err(Error::InvalidArgument(format!(
                "{OP}: buffers do not fit {update:?}"
            )));
        }
    }
    #[allow(unsafe_code)]
    // SAFETY: the arguments follow the kernel's signature in optim.cu for
    // this rule (pointers to p and g of the kernel's dtype, f32 buffers or a
    // null pointer for SGD without momentum, u64 n, f32 / i32 scalars);
    // every buffer holds n elements (checked above) and they are distinct
    // allocations (each borrowed mutably once; copy on write unshares them).
    let result = unsafe { args.launch(grid_stride(n)) };
    launched(kernel, result)
}
