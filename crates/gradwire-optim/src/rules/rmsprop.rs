//! RMSProp (SINGA's).

#[cfg(feature = "cuda")]
use super::cuda::UpdateKernel;
use super::{c, coefficient, decayed, value_at};
use crate::error::Result;
use crate::optim::Optim;
use crate::optimizer::UpdateRule;
use crate::schedule::Schedule;
use serde::{Deserialize, Serialize};

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
