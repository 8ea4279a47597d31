//! SGD with momentum, dampening, weight decay and Nesterov (SINGA's).

#[cfg(feature = "cuda")]
use super::cuda::UpdateKernel;
use super::{c, decayed, invalid, value_at};
use crate::error::Result;
use crate::optim::Optim;
use crate::optimizer::UpdateRule;
use crate::schedule::Schedule;
use serde::{Deserialize, Serialize};

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
