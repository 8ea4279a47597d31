//! gradwire's experiment machinery: data-parallel training of candle models
//! (an MLP and a small convolutional network on the digits data set, a
//! character-level transformer on a text corpus) through
//! gradwire-candle, with every gradwire strategy ([`train`](mod@train)),
//! several strategies side by side with plots ([`compare`]), the fault
//! matrix ([`faults`]), shaped networks ([`network`]), the cost model's
//! projections ([`project`]), and the communication and compression
//! benchmarks ([`bench`](mod@bench)).
//!
//! The `gradwire` binary (crate gradwire-cli) only declares its commands
//! and prints; everything it runs is here, so the end-to-end tests call the
//! same code, and so are the commands' flags (clap derive:
//! [`train::TrainArgs`], [`compare::CompareArgs`], [`bench::BenchCommand`],
//! [`faults::FaultsArgs`], [`project::ProjectArgs`]), next to what they run.
//!
//! ```
//! use gradwire_experiments::{TrainConfig, data::{Dataset, Digits}, train::{Silent, train}};
//!
//! // Two workers, top-k 10 % with error feedback, two epochs.
//! let config = TrainConfig {
//!     strategy: "topk:0.1".parse()?,
//!     world: 2,
//!     epochs: 2,
//!     hidden: vec![16],
//!     ..TrainConfig::default()
//! };
//! let report = train(&config, &Dataset::Digits(Digits::load(42)), &Silent, None)?;
//! assert_eq!(report.epochs.len(), 2);
//! assert!(report.compression() > 1.0); // sent less than dense would have
//! # Ok::<(), Box<dyn std::error::Error>>(())
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

pub mod bench;
pub mod compare;
pub mod config;
pub mod data;
mod engine;
pub mod error;
pub mod faults;
pub mod model;
pub mod network;
pub mod plot;
pub mod project;
pub mod train;

pub use config::{
    COMPUTE_THREADS_VAR, ModelKind, OptimizerKind, ScheduleKind, TrainConfig,
    compute_threads_to_set, parse_strategy,
};
pub use engine::Backend;
pub use error::{ExperimentError, Result};
pub use train::{EpochRecord, RunReport, train};
