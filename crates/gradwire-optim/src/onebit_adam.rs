//! 1-bit Adam (Tang et al., ICML 2021; DeepSpeed's `OnebitAdam`): Adam
//! whose momentum, not its gradient, crosses the wire in 1 bit per entry.
//!
//! Adam's variance stabilises early in training; 1-bit Adam runs plain
//! Adam (with dense gradient averaging) for `freeze_step` steps, then
//! freezes the variance and from then on exchanges the first moment `m`
//! compressed to its signs with error feedback on both sides: each rank
//! folds its own gradient into `m`, the ranks' `m`s are averaged through
//! the 1-bit all-reduce, and every rank continues from that average.
//!
//! The two halves go together: [`OneBitAdamRule`] is the optimizer (Adam
//! until `freeze_step`; after it, the combined "gradient" it receives *is*
//! the averaged momentum, and the variance stays as it was), and
//! [`OneBitAdamConfig::strategy`] is the DistOpt strategy
//! ([`crate::StrategyConfig::OneBitAdam`]) whose strategy folds and exchanges the
//! momentum. Weight decay is decoupled (AdamW's), since after the freeze
//! there is no gradient to add an L2 term to.

use crate::distopt::StrategyConfig;
use crate::error::{OptimError, Result};
use crate::optim::Optim;
use crate::optimizer::UpdateRule;
use crate::rules::{AdamConfig, AdamValues, adam_apply, adam_validate, adam_values};
use crate::schedule::Schedule;
use serde::{Deserialize, Serialize};

/// 1-bit Adam's settings: Adam's, and the step from which the variance is
/// frozen and the momentum exchanged in 1 bit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OneBitAdamConfig {
    /// Adam's hyper-parameters (`beta1` must be constant: every rank's
    /// strategy folds gradients into the momentum with it).
    pub adam: AdamConfig,
    /// Steps of plain Adam before the freeze (DeepSpeed's `freeze_step`;
    /// its papers freeze after 15 to 25 % of training).
    pub freeze_step: u64,
}

impl OneBitAdamConfig {
    /// Adam's `adam`, frozen at `freeze_step`.
    pub fn new(adam: AdamConfig, freeze_step: u64) -> Self {
        OneBitAdamConfig { adam, freeze_step }
    }

    /// The DistOpt strategy that goes with this optimizer.
    pub fn strategy(&self) -> Result<StrategyConfig> {
        Ok(StrategyConfig::OneBitAdam {
            beta1: constant_beta1(&self.adam.beta1)?,
            freeze_step: self.freeze_step,
        })
    }
}

fn constant_beta1(beta1: &Schedule) -> Result<f32> {
    match beta1 {
        Schedule::Constant { value } if (0.0..1.0).contains(value) => Ok(*value as f32),
        other => Err(OptimError::InvalidArgument(format!(
            "1-bit Adam needs a constant beta1 in [0, 1), got {other:?}"
        ))),
    }
}

/// 1-bit Adam's values at one step.
#[derive(Debug, Clone, Copy)]
pub struct OneBitAdamValues {
    adam: AdamValues,
    /// Whether the variance is frozen (the step is at or after the freeze).
    frozen: bool,
    freeze_step: u64,
}

/// The update: AdamW's until the freeze; after it, `m` is the averaged
/// momentum received, the variance is left as it was, and
/// `p -= lr m̂ / (sqrt(v̂) + eps)`, except where the variance is zero (no
/// gradient was ever seen there), which stays.
///
/// Bias correction after the freeze, exactly: at step `t >= T =
/// freeze_step`, `m̂ = m / (1 - beta1^t)` (the momentum keeps being folded,
/// `m = beta1 m + (1 - beta1) g` on every rank before the exchange, so it
/// carries `t` steps of Adam's bias) and `v̂ = v / (1 - beta2^T)` (the
/// variance stopped at step `T`, so its bias is that of `T` updates, and
/// correcting it with `t` would inflate every step as `t` grows). Both are
/// computed in f64 and used in f32, as Adam's. Why keep a correction the
/// paper's Algorithm 1 (Tang et al., 2021: `x -= lr m / sqrt(v_T)`) does
/// not have: with it the step at the freeze is Adam's own step continued,
/// with no jump in its size, and for `t` well past `1 / (1 - beta1)` the
/// update is the paper's scaled by the constant `1 / sqrt(1 - beta2^T)`
/// (about 1.26 for `beta2 = 0.999`, `T = 1000`), which a learning rate
/// tuned for Adam already absorbs.
#[derive(Debug, Clone, Copy)]
pub struct OneBitAdamRule;

/// 1-bit Adam (use with [`OneBitAdamConfig::strategy`]).
pub type OneBitAdam = Optim<OneBitAdamRule>;

impl UpdateRule for OneBitAdamRule {
    type Config = OneBitAdamConfig;
    type Values = OneBitAdamValues;
    const KIND: &'static str = "onebit-adam";
    const BUFFERS: &'static [&'static str] = &["m", "v"];

    fn learning_rate(config: &OneBitAdamConfig) -> &Schedule {
        &config.adam.lr
    }

    fn set_learning_rate(config: &mut OneBitAdamConfig, lr: Schedule) {
        config.adam.lr = lr;
    }

    fn validate(config: &OneBitAdamConfig) -> Result<()> {
        adam_validate(&config.adam)?;
        constant_beta1(&config.adam.beta1).map(|_| ())
    }

    fn values(config: &OneBitAdamConfig, step: u64) -> Result<OneBitAdamValues> {
        Ok(OneBitAdamValues {
            adam: adam_values(&config.adam, step)?,
            frozen: step >= config.freeze_step,
            freeze_step: config.freeze_step,
        })
    }

    fn apply(v: &OneBitAdamValues, t: u64, buffers: &mut [&mut [f32]], p: &mut [f32], g: &[f32]) {
        if let Some(shrink) = v.adam.decay_factor() {
            p.iter_mut().for_each(|p| *p *= shrink);
        }
        if !v.frozen {
            adam_apply(&v.adam, t, buffers, p, g, 0.0);
            return;
        }
        let [m, s] = buffers else { return };
        let (step_size, _) = v.adam.step_scalars(t);
        // The variance's bias correction as at the freeze (a parameter
        // updated at every step had t = freeze_step then).
        let (_, inv_c2) = v.adam.step_scalars(t.min(v.freeze_step.max(1)));
        let eps = v.adam.eps;
        p.iter_mut()
            .zip(g)
            .zip(m.iter_mut().zip(s.iter()))
            .for_each(|((p, &g), (m, &s))| {
                // An entry whose gradient was zero throughout the warm-up
                // (an input pixel that is always blank, an unused embedding
                // row) has no variance: the 1-bit momentum, a chunk's mean
                // magnitude there, would move it by lr / eps. It stays
                // (DeepSpeed's `exp_avg_mask`, found from the variance).
                let live = s > 0.0;
                *m = if live { g } else { 0.0 };
                if live {
                    *p -= step_size * g / ((s * inv_c2).sqrt() + eps);
                }
            });
    }
}
