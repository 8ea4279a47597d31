//! AdaGrad (SINGA's).

#[cfg(feature = "cuda")]
use super::cuda::UpdateKernel;
use super::{c, decayed, value_at};
use crate::error::Result;
use crate::optim::Optim;
use crate::optimizer::UpdateRule;
use crate::schedule::Schedule;
use serde::{Deserialize, Serialize};

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
