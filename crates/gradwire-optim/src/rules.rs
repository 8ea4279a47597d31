//! The update rules: SGD, RMSProp, AdaGrad, Adam and AdamW, with SINGA's
//! formulas and defaults (on each config), AdamW's from Loshchilov & Hutter.
//!
//! Hyper-parameters are evaluated in f64 at the current step and used in f32;
//! the element loops branch on the options outside the loop, so each variant
//! is a straight, vectorisable loop. Their CUDA forms, the launchers of
//! `optim.cu`, are beside them in `cuda` (feature `cuda`).

use crate::error::{OptimError, Result};
use crate::optimizer::{Optim, UpdateRule};
use crate::schedule::Schedule;
#[cfg(feature = "cuda")]
use cuda::UpdateKernel;
use serde::{Deserialize, Serialize};

#[cfg(feature = "cuda")]
pub(crate) mod cuda;

fn c(value: f64) -> Schedule {
    Schedule::constant(value)
}

fn invalid(why: String) -> OptimError {
    OptimError::InvalidArgument(why)
}

/// The value of `s` at `step`, checked finite (and non-negative if asked).
fn value_at(s: &Schedule, name: &str, step: u64, non_negative: bool) -> Result<f32> {
    let v = s.value(step);
    if !v.is_finite() || (non_negative && v < 0.0) {
        return Err(invalid(format!("{name} is {v} at step {step}")));
    }
    Ok(v as f32)
}

/// A probability-like coefficient in [0, 1) (betas, rho).
fn coefficient(s: &Schedule, name: &str, step: u64, inclusive_one: bool) -> Result<f32> {
    let v = value_at(s, name, step, true)?;
    if v > 1.0 || (!inclusive_one && v == 1.0) {
        return Err(invalid(format!(
            "{name} is {v} at step {step}, outside [0, 1)"
        )));
    }
    Ok(v)
}

/// `g + wd * p` into a scratch-free form: the decayed gradient of one element.
#[inline(always)]
fn decayed(g: f32, p: f32, wd: f32) -> f32 {
    g + wd * p
}

// ---------------------------------------------------------------- SGD

/// SGD's hyper-parameters (SINGA's defaults: lr 0.1, the rest 0, no nesterov).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SgdConfig {
    /// Learning rate.
    pub lr: Schedule,
    /// Momentum (>= 0).
    pub momentum: Schedule,
    /// Dampening of the momentum update.
    pub dampening: Schedule,
    /// L2 weight decay, added to the gradient (>= 0).
    pub weight_decay: Schedule,
    /// Nesterov momentum (needs momentum > 0 and dampening 0).
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            lr: c(0.1),
            momentum: c(0.0),
            dampening: c(0.0),
            weight_decay: c(0.0),
            nesterov: false,
        }
    }
}

impl SgdConfig {
    /// With this learning rate.
    pub fn lr(mut self, lr: impl Into<Schedule>) -> Self {
        self.lr = lr.into();
        self
    }
    /// With this momentum.
    pub fn momentum(mut self, momentum: impl Into<Schedule>) -> Self {
        self.momentum = momentum.into();
        self
    }
    /// With this dampening.
    pub fn dampening(mut self, dampening: impl Into<Schedule>) -> Self {
        self.dampening = dampening.into();
        self
    }
    /// With this weight decay.
    pub fn weight_decay(mut self, weight_decay: impl Into<Schedule>) -> Self {
        self.weight_decay = weight_decay.into();
        self
    }
    /// With or without nesterov momentum.
    pub fn nesterov(mut self, nesterov: bool) -> Self {
        self.nesterov = nesterov;
        self
    }
}

/// SGD's values at one step.
#[derive(Debug, Clone, Copy)]
pub struct SgdValues {
    lr: f32,
    momentum: f32,
    dampening: f32,
    weight_decay: f32,
    nesterov: bool,
}

/// SINGA's SGD: `g += wd p`; with momentum `buf = mu buf + (1 - d) g` (the
/// buffer starts at zero, so the first step gives `(1 - d) g`, where PyTorch
/// gives `g`), then `g = g + mu buf` (nesterov) or `g = buf`; `p -= lr g`.
#[derive(Debug, Clone, Copy)]
pub struct SgdRule;

/// Stochastic gradient descent.
pub type Sgd = Optim<SgdRule>;

impl UpdateRule for SgdRule {
    type Config = SgdConfig;
    type Values = SgdValues;
    const KIND: &'static str = "sgd";
    const BUFFERS: &'static [&'static str] = &["momentum"];

    fn learning_rate(config: &SgdConfig) -> &Schedule {
        &config.lr
    }

    fn set_learning_rate(config: &mut SgdConfig, lr: Schedule) {
        config.lr = lr;
    }

    fn validate(config: &SgdConfig) -> Result<()> {
        config.lr.validate("lr", false)?;
        config.momentum.validate("momentum", true)?;
        config.dampening.validate("dampening", false)?;
        config.weight_decay.validate("weight_decay", true)?;
        Ok(())
    }

    fn values(config: &SgdConfig, step: u64) -> Result<SgdValues> {
        let v = SgdValues {
            lr: value_at(&config.lr, "lr", step, false)?,
            momentum: value_at(&config.momentum, "momentum", step, true)?,
            dampening: value_at(&config.dampening, "dampening", step, false)?,
            weight_decay: value_at(&config.weight_decay, "weight_decay", step, true)?,
            nesterov: config.nesterov,
        };
        if v.nesterov && (v.momentum <= 0.0 || v.dampening != 0.0) {
            return Err(invalid(format!(
                "nesterov needs momentum > 0 and dampening 0, got {} and {} at step {step}",
                v.momentum, v.dampening
            )));
        }
        Ok(v)
    }

    fn needs_buffers(values: &SgdValues) -> bool {
        values.momentum != 0.0
    }

    #[cfg(feature = "cuda")]
    fn cuda_kernel(v: &SgdValues, _t: u64) -> Option<UpdateKernel> {
        Some(UpdateKernel::Sgd {
            lr: v.lr,
            momentum: v.momentum,
            dampening: v.dampening,
            weight_decay: v.weight_decay,
            nesterov: v.nesterov,
        })
    }

    fn apply(v: &SgdValues, _t: u64, buffers: &mut [&mut [f32]], p: &mut [f32], g: &[f32]) {
        let (lr, mu, wd) = (v.lr, v.momentum, v.weight_decay);
        let keep = 1.0 - v.dampening;
        match buffers.first_mut() {
            Some(buf) if mu != 0.0 => {
                let it = p.iter_mut().zip(g).zip(buf.iter_mut());
                match (v.nesterov, wd != 0.0) {
                    (false, false) => it.for_each(|((p, &g), b)| {
                        *b = mu * *b + keep * g;
                        *p -= lr * *b;
                    }),
                    (false, true) => it.for_each(|((p, &g), b)| {
                        *b = mu * *b + keep * decayed(g, *p, wd);
                        *p -= lr * *b;
                    }),
                    (true, false) => it.for_each(|((p, &g), b)| {
                        *b = mu * *b + keep * g;
                        *p -= lr * (g + mu * *b);
                    }),
                    (true, true) => it.for_each(|((p, &g), b)| {
                        let g = decayed(g, *p, wd);
                        *b = mu * *b + keep * g;
                        *p -= lr * (g + mu * *b);
                    }),
                }
            }
            _ => {
                if wd != 0.0 {
                    p.iter_mut()
                        .zip(g)
                        .for_each(|(p, &g)| *p -= lr * decayed(g, *p, wd));
                } else {
                    p.iter_mut().zip(g).for_each(|(p, &g)| *p -= lr * g);
                }
            }
        }
    }
}

// ---------------------------------------------------------------- RMSProp

/// RMSProp's hyper-parameters (SINGA's defaults: lr 0.1, rho 0.9, eps 1e-8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RmsPropConfig {
    /// Learning rate.
    pub lr: Schedule,
    /// Decay of the running average of squared gradients, in [0, 1].
    pub rho: Schedule,
    /// Added inside the square root (>= 0).
    pub eps: Schedule,
    /// L2 weight decay, added to the gradient (>= 0).
    pub weight_decay: Schedule,
}

impl Default for RmsPropConfig {
    fn default() -> Self {
        RmsPropConfig {
            lr: c(0.1),
            rho: c(0.9),
            eps: c(1e-8),
            weight_decay: c(0.0),
        }
    }
}

/// RMSProp's values at one step.
#[derive(Debug, Clone, Copy)]
pub struct RmsPropValues {
    lr: f32,
    rho: f32,
    eps: f32,
    weight_decay: f32,
}

/// SINGA's RMSProp: `r = rho r + (1 - rho) g^2; p -= lr g / sqrt(r + eps)`
/// (eps inside the root).
#[derive(Debug, Clone, Copy)]
pub struct RmsPropRule;

/// RMSProp.
pub type RmsProp = Optim<RmsPropRule>;

impl UpdateRule for RmsPropRule {
    type Config = RmsPropConfig;
    type Values = RmsPropValues;
    const KIND: &'static str = "rmsprop";
    const BUFFERS: &'static [&'static str] = &["square_avg"];

    fn learning_rate(config: &RmsPropConfig) -> &Schedule {
        &config.lr
    }

    fn set_learning_rate(config: &mut RmsPropConfig, lr: Schedule) {
        config.lr = lr;
    }

    fn validate(config: &RmsPropConfig) -> Result<()> {
        config.lr.validate("lr", false)?;
        config.rho.validate("rho", true)?;
        // SINGA tested the wrong field for this schedule; this is eps's own check.
        config.eps.validate("eps", true)?;
        config.weight_decay.validate("weight_decay", true)
    }

    fn values(config: &RmsPropConfig, step: u64) -> Result<RmsPropValues> {
        Ok(RmsPropValues {
            lr: value_at(&config.lr, "lr", step, false)?,
            rho: coefficient(&config.rho, "rho", step, true)?,
            eps: value_at(&config.eps, "eps", step, true)?,
            weight_decay: value_at(&config.weight_decay, "weight_decay", step, true)?,
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_kernel(v: &RmsPropValues, _t: u64) -> Option<UpdateKernel> {
        Some(UpdateKernel::RmsProp {
            lr: v.lr,
            rho: v.rho,
            eps: v.eps,
            weight_decay: v.weight_decay,
        })
    }

    fn apply(v: &RmsPropValues, _t: u64, buffers: &mut [&mut [f32]], p: &mut [f32], g: &[f32]) {
        let Some(r) = buffers.first_mut() else { return };
        let (lr, rho, eps, wd) = (v.lr, v.rho, v.eps, v.weight_decay);
        let fresh = 1.0 - rho;
        p.iter_mut()
            .zip(g)
            .zip(r.iter_mut())
            .for_each(|((p, &g), r)| {
                let g = if wd != 0.0 { decayed(g, *p, wd) } else { g };
                *r = rho * *r + fresh * g * g;
                *p -= lr * g / (*r + eps).sqrt();
            });
    }
}

// ---------------------------------------------------------------- AdaGrad

/// AdaGrad's hyper-parameters (SINGA's defaults: lr 0.1, eps 1e-8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdaGradConfig {
    /// Learning rate.
    pub lr: Schedule,
    /// Added inside the square root (>= 0).
    pub eps: Schedule,
    /// L2 weight decay, added to the gradient (>= 0).
    pub weight_decay: Schedule,
}

impl Default for AdaGradConfig {
    fn default() -> Self {
        AdaGradConfig {
            lr: c(0.1),
            eps: c(1e-8),
            weight_decay: c(0.0),
        }
    }
}

/// AdaGrad's values at one step.
#[derive(Debug, Clone, Copy)]
pub struct AdaGradValues {
    lr: f32,
    eps: f32,
    weight_decay: f32,
}

/// SINGA's AdaGrad: `h += g^2; p -= lr g / sqrt(h + eps)`.
#[derive(Debug, Clone, Copy)]
pub struct AdaGradRule;

/// AdaGrad.
pub type AdaGrad = Optim<AdaGradRule>;

impl UpdateRule for AdaGradRule {
    type Config = AdaGradConfig;
    type Values = AdaGradValues;
    const KIND: &'static str = "adagrad";
    const BUFFERS: &'static [&'static str] = &["sum_sq"];

    fn learning_rate(config: &AdaGradConfig) -> &Schedule {
        &config.lr
    }

    fn set_learning_rate(config: &mut AdaGradConfig, lr: Schedule) {
        config.lr = lr;
    }

    fn validate(config: &AdaGradConfig) -> Result<()> {
        config.lr.validate("lr", false)?;
        config.eps.validate("eps", true)?;
        config.weight_decay.validate("weight_decay", true)
    }

    fn values(config: &AdaGradConfig, step: u64) -> Result<AdaGradValues> {
        Ok(AdaGradValues {
            lr: value_at(&config.lr, "lr", step, false)?,
            eps: value_at(&config.eps, "eps", step, true)?,
            weight_decay: value_at(&config.weight_decay, "weight_decay", step, true)?,
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_kernel(v: &AdaGradValues, _t: u64) -> Option<UpdateKernel> {
        Some(UpdateKernel::AdaGrad {
            lr: v.lr,
            eps: v.eps,
            weight_decay: v.weight_decay,
        })
    }

    fn apply(v: &AdaGradValues, _t: u64, buffers: &mut [&mut [f32]], p: &mut [f32], g: &[f32]) {
        let Some(h) = buffers.first_mut() else { return };
        let (lr, eps, wd) = (v.lr, v.eps, v.weight_decay);
        p.iter_mut()
            .zip(g)
            .zip(h.iter_mut())
            .for_each(|((p, &g), h)| {
                let g = if wd != 0.0 { decayed(g, *p, wd) } else { g };
                *h += g * g;
                *p -= lr * g / (*h + eps).sqrt();
            });
    }
}

// ---------------------------------------------------------------- Adam, AdamW

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
