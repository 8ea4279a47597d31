//! Adam (SINGA's, L2 weight decay in the gradient) and AdamW (decoupled
//! weight decay, Loshchilov & Hutter); their shared step, which 1-bit Adam
//! reuses.

#[cfg(feature = "cuda")]
use super::cuda::UpdateKernel;
use super::{c, coefficient, decayed, value_at};
use crate::error::Result;
use crate::optim::Optim;
use crate::optimizer::UpdateRule;
use crate::schedule::Schedule;
use serde::{Deserialize, Serialize};

/// Adam's hyper-parameters (SINGA's defaults: lr 0.1, betas 0.9 / 0.999,
/// eps 1e-8, no weight decay).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdamConfig {
    /// Learning rate.
    pub lr: Schedule,
    /// Decay of the first moment, in [0, 1).
    pub beta1: Schedule,
    /// Decay of the second moment, in [0, 1).
    pub beta2: Schedule,
    /// Added to the root of the second moment (>= 0).
    pub eps: Schedule,
    /// Weight decay (>= 0): L2, added to the gradient, for Adam; decoupled
    /// (`p *= 1 - lr wd` before the step) for AdamW.
    pub weight_decay: Schedule,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            lr: c(0.1),
            beta1: c(0.9),
            beta2: c(0.999),
            eps: c(1e-8),
            weight_decay: c(0.0),
        }
    }
}

impl AdamConfig {
    /// AdamW's usual defaults (PyTorch's): lr 1e-3, weight decay 1e-2.
    pub fn adamw() -> Self {
        AdamConfig {
            lr: c(1e-3),
            weight_decay: c(1e-2),
            ..AdamConfig::default()
        }
    }

    /// With this learning rate.
    pub fn lr(mut self, lr: impl Into<Schedule>) -> Self {
        self.lr = lr.into();
        self
    }

    /// With this weight decay.
    pub fn weight_decay(mut self, weight_decay: impl Into<Schedule>) -> Self {
        self.weight_decay = weight_decay.into();
        self
    }
}

/// Adam's values at one step.
#[derive(Debug, Clone, Copy)]
pub struct AdamValues {
    pub(crate) lr: f64,
    pub(crate) beta1: f32,
    pub(crate) beta2: f32,
    pub(crate) eps: f32,
    pub(crate) weight_decay: f32,
}

impl AdamValues {
    /// Adam's bias-corrected scalars for the parameter's own `t` (1-based):
    /// `step_size = lr / (1 - beta1^t)` and `inv_c2 = 1 / (1 - beta2^t)`, in
    /// f64 then rounded to f32, so that `lr (m / c1) / (sqrt(v / c2) + eps)`
    /// runs with the divisions hoisted (the CPU loop and the CUDA kernel
    /// take the same two values).
    pub fn step_scalars(&self, t: u64) -> (f32, f32) {
        let t = i32::try_from(t).unwrap_or(i32::MAX);
        let c1 = 1.0 - f64::from(self.beta1).powi(t);
        let c2 = 1.0 - f64::from(self.beta2).powi(t);
        ((self.lr / c1) as f32, (1.0 / c2) as f32)
    }

    /// AdamW's decoupled decay factor `1 - lr wd` (f64, rounded to f32), or
    /// `None` without weight decay, as the CPU loop and the CUDA kernel
    /// both take it.
    pub fn decay_factor(&self) -> Option<f32> {
        (self.weight_decay != 0.0).then(|| (1.0 - self.lr * f64::from(self.weight_decay)) as f32)
    }
}

pub(crate) fn adam_values(config: &AdamConfig, step: u64) -> Result<AdamValues> {
    Ok(AdamValues {
        lr: f64::from(value_at(&config.lr, "lr", step, false)?),
        beta1: coefficient(&config.beta1, "beta1", step, false)?,
        beta2: coefficient(&config.beta2, "beta2", step, false)?,
        eps: value_at(&config.eps, "eps", step, true)?,
        weight_decay: value_at(&config.weight_decay, "weight_decay", step, true)?,
    })
}

pub(crate) fn adam_validate(config: &AdamConfig) -> Result<()> {
    config.lr.validate("lr", false)?;
    config.beta1.validate("beta1", true)?;
    config.beta2.validate("beta2", true)?;
    config.eps.validate("eps", true)?;
    config.weight_decay.validate("weight_decay", true)
}

/// The Adam step proper, with L2 decay `l2` added to the gradient (0 for AdamW).
pub(crate) fn adam_apply(
    v: &AdamValues,
    t: u64,
    buffers: &mut [&mut [f32]],
    p: &mut [f32],
    g: &[f32],
    l2: f32,
) {
    let [m, s] = buffers else { return };
    let (b1, b2, eps) = (v.beta1, v.beta2, v.eps);
    let (step_size, inv_c2) = v.step_scalars(t);
    let (f1, f2) = (1.0 - b1, 1.0 - b2);
    p.iter_mut()
        .zip(g)
        .zip(m.iter_mut().zip(s.iter_mut()))
        .for_each(|((p, &g), (m, s))| {
            let g = if l2 != 0.0 { decayed(g, *p, l2) } else { g };
            *m = b1 * *m + f1 * g;
            *s = b2 * *s + f2 * g * g;
            *p -= step_size * *m / ((*s * inv_c2).sqrt() + eps);
        });
}

/// SINGA's Adam: `m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
/// p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)`, with `t` the
/// parameter's own update count (SINGA's step + 1 when nothing is skipped).
#[derive(Debug, Clone, Copy)]
pub struct AdamRule;

/// Adam (weight decay as L2 on the gradient).
pub type Adam = Optim<AdamRule>;

impl UpdateRule for AdamRule {
    type Config = AdamConfig;
    type Values = AdamValues;
    const KIND: &'static str = "adam";
    const BUFFERS: &'static [&'static str] = &["m", "v"];

    fn learning_rate(config: &AdamConfig) -> &Schedule {
        &config.lr
    }

    fn set_learning_rate(config: &mut AdamConfig, lr: Schedule) {
        config.lr = lr;
    }

    fn validate(config: &AdamConfig) -> Result<()> {
        adam_validate(config)
    }

    fn values(config: &AdamConfig, step: u64) -> Result<AdamValues> {
        adam_values(config, step)
    }

    fn apply(v: &AdamValues, t: u64, buffers: &mut [&mut [f32]], p: &mut [f32], g: &[f32]) {
        adam_apply(v, t, buffers, p, g, v.weight_decay);
    }

    #[cfg(feature = "cuda")]
    fn cuda_kernel(v: &AdamValues, t: u64) -> Option<UpdateKernel> {
        let (step_size, inv_c2) = v.step_scalars(t);
        Some(UpdateKernel::Adam {
            step_size,
            inv_c2,
            beta1: v.beta1,
            beta2: v.beta2,
            eps: v.eps,
            l2: v.weight_decay,
        })
    }
}

/// AdamW: decoupled weight decay, `p *= 1 - lr wd`, then Adam's step with the
/// raw gradient.
#[derive(Debug, Clone, Copy)]
pub struct AdamWRule;

/// AdamW.
pub type AdamW = Optim<AdamWRule>;

impl UpdateRule for AdamWRule {
    type Config = AdamConfig;
    type Values = AdamValues;
    const KIND: &'static str = "adamw";
    const BUFFERS: &'static [&'static str] = &["m", "v"];

    fn learning_rate(config: &AdamConfig) -> &Schedule {
        &config.lr
    }

    fn set_learning_rate(config: &mut AdamConfig, lr: Schedule) {
        config.lr = lr;
    }

    fn validate(config: &AdamConfig) -> Result<()> {
        adam_validate(config)
    }

    fn values(config: &AdamConfig, step: u64) -> Result<AdamValues> {
        adam_values(config, step)
    }

    fn apply(v: &AdamValues, t: u64, buffers: &mut [&mut [f32]], p: &mut [f32], g: &[f32]) {
        if let Some(shrink) = v.decay_factor() {
            p.iter_mut().for_each(|p| *p *= shrink);
        }
        adam_apply(v, t, buffers, p, g, 0.0);
    }

    #[cfg(feature = "cuda")]
    fn cuda_kernel(v: &AdamValues, t: u64) -> Option<UpdateKernel> {
        let (step_size, inv_c2) = v.step_scalars(t);
        Some(UpdateKernel::AdamW {
            shrink: v.decay_factor(),
            step_size,
            inv_c2,
            beta1: v.beta1,
            beta2: v.beta2,
            eps: v.eps,
        })
    }
}
