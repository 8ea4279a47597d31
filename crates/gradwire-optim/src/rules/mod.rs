//! The update rules: SGD, RMSProp, AdaGrad, Adam and AdamW, with SINGA's
//! formulas and defaults (on each config), AdamW's from Loshchilov & Hutter.
//!
//! Hyper-parameters are evaluated in f64 at the current step and used in f32;
//! the element loops branch on the options outside the loop, so each variant
//! is a straight, vectorisable loop. A file per rule family (`sgd.rs`,
//! `rmsprop.rs`, `adagrad.rs`, `adam.rs`); their CUDA forms, the launchers of
//! `optim.cu`, beside them in `cuda.rs` (feature `cuda`).

use crate::error::{OptimError, Result};
use crate::schedule::Schedule;

mod adagrad;
mod adam;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod rmsprop;
mod sgd;

pub use adagrad::{AdaGrad, AdaGradConfig, AdaGradRule};
pub use adam::{Adam, AdamConfig, AdamRule, AdamValues, AdamW, AdamWRule};
pub(crate) use adam::{adam_apply, adam_validate, adam_values};
pub use rmsprop::{RmsProp, RmsPropConfig, RmsPropRule};
pub use sgd::{Sgd, SgdConfig, SgdRule};

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
