//! gradwire-optim: optimizers, schedules and checkpoints.
//!
//! SINGA's optimizers (SGD, RMSProp, AdaGrad, Adam) with its formulas and
//! defaults, plus AdamW, over gradwire-tensor; any hyper-parameter may be a
//! [`Schedule`]; the whole state goes to a versioned, atomically written
//! checkpoint that DistOpt extends with its own state.
//!
//! [`DistOpt`] wraps any optimizer and any communicator for data-parallel
//! training: fused buckets overlapped with backward, dense or half-precision
//! combination, skipping of gradients no rank wrote (decided by a vote).
//!
//! ```
//! use gradwire_optim::{Optimizer, Sgd, SgdConfig};
//! use gradwire_tensor::Tensor;
//!
//! let mut sgd = Sgd::new(SgdConfig::default().lr(0.5).momentum(0.9))?;
//! let mut w = Tensor::from_vec(vec![1.0f32, 2.0], 2)?;
//! let g = Tensor::from_vec(vec![0.2f32, -0.4], 2)?;
//! sgd.update("w", &mut w, &g)?;
//! sgd.step();
//! // SINGA's first momentum step: buf = (1 - 0) g, p -= lr buf.
//! assert_eq!(w.to_vec::<f32>()?, vec![0.9, 2.2]);
//! # Ok::<(), gradwire_optim::OptimError>(())
//! ```

#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable
    )
)]
#![forbid(unsafe_code)]

mod any;
pub mod checkpoint;
mod distopt;
mod error;
pub mod grad_sync;
mod micro_batches;
mod onebit_adam;
mod optim;
mod optimizer;
mod rules;
mod schedule;
mod state;

pub use any::AnyOptimizer;
pub use distopt::{
    AnyLoop, BucketOrder, BucketView, Combined, CostAssumptions, DEFAULT_FUSION_THRESHOLD,
    DILOCO_LR, DILOCO_MOMENTUM, DiLoCoConfig, DimReduceOpt, DistOpt, DistOptConfig, LocalSteps,
    ONEBIT_ADAM_BETA1, ONEBIT_ADAM_FREEZE_STEP, OUTER_ADAM_LR, OuterCodec, OuterOptimizer,
    ParamSpec, QSGD_LEVELS, REGISTRY, SkipVote, StateDict, StepStats, StepStraggler, Strategy,
    StrategyConfig, StrategyError, TrainingLoop, WarmupBy,
};
pub use error::{OptimError, Result};
pub use grad_sync::{GradSync, ParamAccess, ParamRef};
pub use micro_batches::MicroBatches;
pub use onebit_adam::{OneBitAdam, OneBitAdamConfig, OneBitAdamRule, OneBitAdamValues};
pub use optim::Optim;
pub use optimizer::{Optimizer, StateBuffers, UpdateRule};
#[cfg(feature = "cuda")]
pub use rules::cuda::UpdateKernel;
pub use rules::{
    AdaGrad, AdaGradConfig, AdaGradRule, Adam, AdamConfig, AdamRule, AdamValues, AdamW, AdamWRule,
    RmsProp, RmsPropConfig, RmsPropRule, Sgd, SgdConfig, SgdRule,
};
pub use schedule::Schedule;
pub use state::{OptimizerState, ParamState};
