//! The `gradwire` command line as a library: data-parallel training of a
//! small MLP on smartcore's digits with every gradwire strategy
//! ([`train`]), several strategies side by side with plots ([`compare`]),
//! and the communication and compression benchmarks ([`bench`]).
//!
//! The binary (`src/main.rs`) only parses flags and prints; everything it
//! runs is here, so the end-to-end tests call the same code.

#![deny(missing_docs)]

pub mod bench;
pub mod compare;
pub mod config;
pub mod data;
pub mod error;
pub mod model;
pub mod plot;
pub mod train;

pub use config::{OptimizerKind, ScheduleKind, Strategy, TrainConfig};
pub use error::{CliError, Result};
pub use train::{EpochRecord, RunReport, train};
