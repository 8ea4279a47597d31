//! Schedules: hyper-parameters that change with the step.
//!
//! Any hyper-parameter of any optimizer is a [`Schedule`]; a plain number is
//! `Schedule::Constant`. A schedule gives its value at step `t` (0-based, the
//! optimizer's global step). Optimizers decide what to do from the value at
//! the current step, never from the initial one, so a schedule that starts at
//! 0 (a warm-up, a momentum ramp) takes effect when it becomes non-zero:
//! SINGA gated momentum on the schedule's initial value and ignored such a
//! schedule forever.

use crate::error::{OptimError, Result};
use serde::{Deserialize, Serialize};
use std::f64::consts::PI;

/// A hyper-parameter as a function of the step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "schedule", rename_all = "snake_case")]
pub enum Schedule {
    /// The same value at every step.
    Constant {
        /// The value.
        value: f64,
    },
    /// `init * rate^(t / decay_steps)`, the exponent an integer division when
    /// `staircase` (SINGA's ExponentialDecay).
    ExponentialDecay {
        /// Value at step 0.
        init: f64,
        /// Steps per factor of `rate` (> 0).
        decay_steps: u64,
        /// Decay factor.
        rate: f64,
        /// Decay in steps rather than continuously.
        staircase: bool,
    },
    /// `init * gamma^floor(t / step_size)` (PyTorch's StepLR).
    StepDecay {
        /// Value at step 0.
        init: f64,
        /// Steps between decays (> 0).
        step_size: u64,
        /// Factor applied at each decay.
        gamma: f64,
    },
    /// Linear warm-up from 0 to `peak` over `warmup_steps`, then a cosine from
    /// `peak` down to `floor` at `total_steps`, then `floor`.
    CosineWarmup {
        /// The value at the end of the warm-up.
        peak: f64,
        /// The final value.
        floor: f64,
        /// Steps of linear warm-up (value `peak * t / warmup_steps`).
        warmup_steps: u64,
        /// Step at which the cosine reaches `floor` (>= `warmup_steps`).
        total_steps: u64,
    },
}

impl From<f64> for Schedule {
    fn from(value: f64) -> Self {
        Schedule::Constant { value }
    }
}

impl Schedule {
    /// A constant.
    pub fn constant(value: f64) -> Self {
        Schedule::Constant { value }
    }

    /// The value at step `t`.
    pub fn value(&self, t: u64) -> f64 {
        match *self {
            Schedule::Constant { value } => value,
            Schedule::ExponentialDecay {
                init,
                decay_steps,
                rate,
                staircase,
            } => {
                let steps = decay_steps.max(1);
                let exponent = if staircase {
                    (t / steps) as f64
                } else {
                    t as f64 / steps as f64
                };
                init * rate.powf(exponent)
            }
            Schedule::StepDecay {
                init,
                step_size,
                gamma,
            } => init * gamma.powf((t / step_size.max(1)) as f64),
            Schedule::CosineWarmup {
                peak,
                floor,
                warmup_steps,
                total_steps,
            } => {
                if t < warmup_steps {
                    peak * t as f64 / warmup_steps as f64
                } else if t >= total_steps {
                    floor
                } else {
                    let span = (total_steps - warmup_steps) as f64;
                    let progress = (t - warmup_steps) as f64 / span;
                    floor + 0.5 * (peak - floor) * (1.0 + (PI * progress).cos())
                }
            }
        }
    }

    /// Checks the schedule's own parameters (finite numbers, non-zero
    /// periods) and, when `non_negative`, that it never goes below zero.
    pub fn validate(&self, name: &str, non_negative: bool) -> Result<()> {
        let bad = |why: &str| {
            Err(OptimError::InvalidArgument(format!(
                "{name}: {why} ({self:?})"
            )))
        };
        let finite = |v: f64| v.is_finite();
        // The two decays: a start value, a period and a factor.
        let decay = |init: f64, period: u64, factor: f64| {
            if !finite(init) || !finite(factor) || factor < 0.0 {
                return bad("the start and the factor must be finite, the factor non-negative");
            }
            if period == 0 {
                return bad("the period (decay_steps, step_size) must be positive");
            }
            if non_negative && init < 0.0 {
                return bad("negative");
            }
            Ok(())
        };
        match *self {
            Schedule::Constant { value } => {
                if !finite(value) {
                    return bad("not finite");
                }
                if non_negative && value < 0.0 {
                    return bad("negative");
                }
            }
            Schedule::ExponentialDecay {
                init,
                decay_steps,
                rate,
                ..
            } => {
                return decay(init, decay_steps, rate);
            }
            Schedule::StepDecay {
                init,
                step_size,
                gamma,
            } => {
                return decay(init, step_size, gamma);
            }
            Schedule::CosineWarmup {
                peak,
                floor,
                warmup_steps,
                total_steps,
            } => {
                if !finite(peak) || !finite(floor) {
                    return bad("peak and floor must be finite");
                }
                if total_steps < warmup_steps {
                    return bad("total_steps must be at least warmup_steps");
                }
                if non_negative && (peak < 0.0 || floor < 0.0) {
                    return bad("negative");
                }
            }
        }
        Ok(())
    }
}
