//! What a run reports: a record per epoch and the whole run's summary,
//! and the hooks that show progress.

use crate::config::TrainConfig;
use serde::{Deserialize, Serialize};

/// What one epoch did (rank 0's view; the loss is averaged over workers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// 1-based.
    pub epoch: usize,
    /// Mean training loss over the epoch's steps and the workers.
    pub train_loss: f64,
    /// Accuracy on the held-out test set.
    pub test_accuracy: f64,
    /// Bytes one worker sent during the epoch (ring model).
    pub bytes_sent: u64,
    /// Bytes one worker sent since the start of the run.
    pub bytes_total: u64,
    /// What dense f32 all-reduce would have sent so far, divided by what was
    /// sent (1 for dense, 100 for a 1 % selection...).
    pub compression: f64,
    /// Seconds computing (forward, backward, handing gradients over).
    pub compute_secs: f64,
    /// Seconds waiting for communication in `finish`.
    pub comm_secs: f64,
    /// Seconds for the whole epoch.
    pub wall_secs: f64,
    /// DimReduce: the fraction of this epoch's line searches that took a step.
    pub line_search_accepted: Option<f64>,
}

/// A whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// The strategy and what sets it apart ("topk 1 %").
    pub label: String,
    /// The configuration it ran with.
    pub config: TrainConfig,
    /// One record per epoch, resumed ones included.
    pub epochs: Vec<EpochRecord>,
    /// FNV-1a of rank 0's final parameter bits: equal checksums mean
    /// bitwise-equal models.
    pub param_checksum: String,
}

impl RunReport {
    /// Test accuracy after the last epoch.
    pub fn final_accuracy(&self) -> f64 {
        self.epochs.last().map_or(0.0, |e| e.test_accuracy)
    }

    /// The best test accuracy of any epoch.
    pub fn best_accuracy(&self) -> f64 {
        self.epochs
            .iter()
            .map(|e| e.test_accuracy)
            .fold(0.0, f64::max)
    }

    /// The first epoch whose test accuracy reached `target`.
    pub fn epochs_to(&self, target: f64) -> Option<usize> {
        self.epochs
            .iter()
            .find(|e| e.test_accuracy >= target)
            .map(|e| e.epoch)
    }

    /// Bytes one worker sent over the run.
    pub fn bytes_per_worker(&self) -> u64 {
        self.epochs.last().map_or(0, |e| e.bytes_total)
    }

    /// Dense bytes over bytes sent, for the whole run.
    pub fn compression(&self) -> f64 {
        self.epochs.last().map_or(1.0, |e| e.compression)
    }

    /// Seconds over all epochs.
    pub fn wall_secs(&self) -> f64 {
        self.epochs.iter().map(|e| e.wall_secs).sum()
    }
}

/// Hooks the run calls on rank 0, for progress bars and tables.
pub trait Observer: Sync {
    /// An epoch of `steps` steps begins.
    fn epoch_started(&self, _epoch: usize, _steps: usize) {}
    /// One step finished.
    fn step_done(&self) {}
    /// An epoch finished.
    fn epoch_done(&self, _record: &EpochRecord) {}
}

/// An observer that does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Observer for Silent {}
