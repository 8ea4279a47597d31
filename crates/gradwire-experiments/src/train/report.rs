//! What a run reports: a record per epoch and the whole run's summary,
//! and the hooks that show progress.

use crate::config::{ModelKind, TrainConfig};
use serde::{Deserialize, Serialize};

/// Test accuracy that counts as "trained" on the digits.
pub const TARGET_ACCURACY: f64 = 0.95;

/// What counts as "trained" in reports: the digits models' test accuracy,
/// or the language model's test loss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// Test accuracy at least this (a fraction).
    Accuracy(f64),
    /// Test loss (nats per prediction) at most this.
    Loss(f64),
}

impl Target {
    /// The target of `config`'s model: [`TARGET_ACCURACY`] on the digits,
    /// `--target-loss` for the GPT.
    pub fn of(config: &TrainConfig) -> Target {
        match config.model {
            ModelKind::Mlp | ModelKind::Cnn => Target::Accuracy(TARGET_ACCURACY),
            ModelKind::Gpt => Target::Loss(config.target_loss),
        }
    }

    /// The measure it is about, as tables show it, of a test accuracy
    /// (a fraction) and loss: the accuracy in percent, or the loss.
    pub fn pick(&self, accuracy: f64, loss: f64) -> f64 {
        match self {
            Target::Accuracy(_) => accuracy * 100.0,
            Target::Loss(_) => loss,
        }
    }

    /// [`Target::pick`] of `epoch`'s test accuracy and loss.
    pub fn measure(&self, epoch: &EpochRecord) -> f64 {
        self.pick(epoch.test_accuracy, epoch.test_loss)
    }

    /// A value of the measure as tables print it (`96.1`, `2.455`).
    pub fn show(&self, measure: f64) -> String {
        match self {
            Target::Accuracy(_) => format!("{measure:.1}"),
            Target::Loss(_) => format!("{measure:.3}"),
        }
    }

    /// The name of [`Target::measure`] for table headers (`acc %`, `loss`).
    pub fn measure_name(&self) -> &'static str {
        match self {
            Target::Accuracy(_) => "acc %",
            Target::Loss(_) => "loss",
        }
    }

    /// The better of two values of [`Target::measure`].
    pub fn better(&self, a: f64, b: f64) -> f64 {
        match self {
            Target::Accuracy(_) => a.max(b),
            Target::Loss(_) => a.min(b),
        }
    }

    /// Whether `epoch` reached it.
    pub fn reached(&self, epoch: &EpochRecord) -> bool {
        match *self {
            Target::Accuracy(a) => epoch.test_accuracy >= a,
            Target::Loss(l) => epoch.test_loss <= l,
        }
    }
}

impl Default for Target {
    /// The digits' [`TARGET_ACCURACY`] (also what rows saved before there
    /// were other targets read as).
    fn default() -> Target {
        Target::Accuracy(TARGET_ACCURACY)
    }
}

impl std::fmt::Display for Target {
    /// `95 %` or `loss 2.50`, for headers.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Accuracy(a) => write!(f, "{:.0} %", a * 100.0),
            Target::Loss(l) => write!(f, "loss {l:.2}"),
        }
    }
}

/// What one epoch did (rank 0's view; the loss is averaged over workers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// 1-based.
    pub epoch: usize,
    /// Mean training loss over the epoch's steps and the workers.
    pub train_loss: f64,
    /// Accuracy on the held-out test set (the language model: of its
    /// next-character predictions).
    pub test_accuracy: f64,
    /// Mean cross-entropy on the held-out test set, nats per prediction
    /// (the language model's perplexity is its exponential).
    #[serde(default)]
    pub test_loss: f64,
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
    /// Seconds the epoch's training took: its steps and its closing
    /// collectives, not the evaluation after it (`eval_secs`), which every
    /// rank waits out before the next epoch starts.
    pub wall_secs: f64,
    /// Seconds of the evaluation after the epoch (rank 0's, every rank
    /// waiting); 0 in a record written before it was counted apart (its
    /// `wall_secs` then include it).
    #[serde(default)]
    pub eval_secs: f64,
    /// Steps taken (by the job: with `--uneven-shards`, a rank's own and
    /// those it took part in after joining).
    #[serde(default)]
    pub steps: usize,
    /// Seconds the strategies spent combining buckets (their codecs and
    /// collectives, on the communication thread: it may overlap other work).
    #[serde(default)]
    pub combine_secs: f64,
    /// Of `network_secs`, the seconds in calls outside the combining: the
    /// steps' votes and agreements (`StepStats::coordination`) and the
    /// epoch's closing collectives, waits included. 0 in a record written
    /// before it was counted.
    #[serde(default)]
    pub coordination_secs: f64,
    /// Seconds in the communicator's calls, on both threads (MPI: the
    /// network's share); `None` where the backend keeps no count.
    #[serde(default)]
    pub network_secs: Option<f64>,
    /// Of `network_secs`, the time this rank waited in the collectives
    /// for the last rank to arrive (each collective's, from the times away
    /// every rank sends in its header: load imbalance, a descheduled
    /// process), not the network's; `None` where the backend
    /// keeps no count. Point-to-point messages (AdaSum's) exchange no
    /// header: a wait for the sender in them is not in it.
    #[serde(default)]
    pub waiting_secs: Option<f64>,
    /// Seconds of this rank's steps outside the communicator's calls
    /// (compute, codecs, the update); `None` where the backend keeps no
    /// count.
    #[serde(default)]
    pub busy_secs: Option<f64>,
    /// The same, the slowest rank's between two synchronisations (every
    /// step, or DiLoCo's exchanges): the excess over `busy_secs` is what
    /// rank 0 waited for the others at the step's scale, waits in
    /// point-to-point messages included, those between a step's
    /// collectives not.
    #[serde(default)]
    pub slowest_busy_secs: Option<f64>,
    /// The rank the others waited for most often this epoch, how often and
    /// by how much (from every rank's waits); `None` at W = 1, with uneven
    /// shards, or when no step exchanged.
    #[serde(default)]
    pub straggler: Option<super::Straggler>,
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
    /// With `--timeline`: what the written timeline shows.
    #[serde(default)]
    pub timeline: Option<super::TimelineSummary>,
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

    /// Test loss after the last epoch (`f64::INFINITY` before any).
    pub fn final_loss(&self) -> f64 {
        self.epochs.last().map_or(f64::INFINITY, |e| e.test_loss)
    }

    /// The target's measure after the last epoch (accuracy in percent, or
    /// loss; `None` before any epoch).
    pub fn final_measure(&self) -> Option<f64> {
        let target = self.target();
        self.epochs.last().map(|e| target.measure(e))
    }

    /// The best value of the target's measure over the epochs.
    pub fn best_measure(&self) -> Option<f64> {
        let target = self.target();
        self.epochs
            .iter()
            .map(|e| target.measure(e))
            .reduce(|a, b| target.better(a, b))
    }

    /// What counts as trained for this run's model.
    pub fn target(&self) -> Target {
        Target::of(&self.config)
    }

    /// The records up to and including the first that reached the run's
    /// [`Target`] (`None` if none did).
    fn until_target(&self) -> Option<&[EpochRecord]> {
        let target = self.target();
        let at = self.epochs.iter().position(|e| target.reached(e))?;
        Some(&self.epochs[..=at])
    }

    /// The first epoch that reached the run's [`Target`].
    pub fn epochs_to_target(&self) -> Option<usize> {
        self.until_target()?.last().map(|e| e.epoch)
    }

    /// Steps from the start to the end of the first epoch that reached
    /// the run's [`Target`].
    pub fn steps_to_target(&self) -> Option<u64> {
        Some(self.until_target()?.iter().map(|e| e.steps as u64).sum())
    }

    /// Bytes one worker sent over the run.
    pub fn bytes_per_worker(&self) -> u64 {
        self.epochs.last().map_or(0, |e| e.bytes_total)
    }

    /// Dense bytes over bytes sent, for the whole run.
    pub fn compression(&self) -> f64 {
        self.epochs.last().map_or(1.0, |e| e.compression)
    }

    /// Seconds of training over all epochs (the evaluations after them
    /// not counted).
    pub fn wall_secs(&self) -> f64 {
        self.epochs.iter().map(|e| e.wall_secs).sum()
    }

    /// Wall-clock seconds of training from the start until the end of the
    /// first epoch that reached the run's [`Target`] (time to accuracy, or
    /// to loss; the evaluations that tell are not counted).
    pub fn seconds_to_target(&self) -> Option<f64> {
        Some(self.until_target()?.iter().map(|e| e.wall_secs).sum())
    }

    /// Steps over all epochs.
    pub fn steps(&self) -> usize {
        self.epochs.iter().map(|e| e.steps).sum()
    }

    /// Where a step's time went, on average over the run.
    pub fn per_step(&self) -> StepSplit {
        let steps = self.steps().max(1) as f64;
        let sum = |f: fn(&EpochRecord) -> f64| self.epochs.iter().map(f).sum::<f64>() / steps;
        let network = self
            .epochs
            .iter()
            .map(|e| e.network_secs)
            .sum::<Option<f64>>()
            .map(|n| n / steps);
        let combine = sum(|e| e.combine_secs);
        let coordination = sum(|e| e.coordination_secs);
        // Two measures of the waits, each short of some: the larger.
        let imbalance = self
            .epochs
            .iter()
            .map(|e| {
                let per_step = e.slowest_busy_secs.zip(e.busy_secs).map(|(s, b)| s - b);
                [e.waiting_secs, per_step]
                    .into_iter()
                    .flatten()
                    .reduce(f64::max)
            })
            .sum::<Option<f64>>()
            .map(|i| (i / steps).max(0.0));
        StepSplit {
            total: sum(|e| e.wall_secs),
            compute: sum(|e| e.compute_secs),
            wait: sum(|e| e.comm_secs),
            coordination,
            // The combining time outside the communicator's calls: the
            // codecs. The calls outside the combining (the votes, the
            // agreements, their waits for the last rank) are not the
            // combining's: with 4 ranks on 2 cores their waits outweighed
            // the codecs, which read 0.
            codec: network.map(|n| (combine - (n - coordination)).max(0.0)),
            network,
            imbalance,
            bytes: self.bytes_per_worker() as f64 / steps,
        }
    }
}

/// A step's time, split (seconds, averaged over a run's steps).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepSplit {
    /// The whole step, wall-clock (the evaluations between epochs not
    /// counted).
    pub total: f64,
    /// Forward and backward.
    pub compute: f64,
    /// Blocked waiting for communication (what the overlap did not hide).
    pub wait: f64,
    /// The training thread's own calls outside the combining: the steps'
    /// votes and agreements and the epochs' closing collectives
    /// ([`EpochRecord::coordination_secs`]).
    #[serde(default)]
    pub coordination: f64,
    /// Compression and decompression (combining outside network calls);
    /// `None` where the backend does not count its calls' time.
    pub codec: Option<f64>,
    /// In the communicator's calls (the network, with MPI).
    pub network: Option<f64>,
    /// Of `network`, what rank 0 waited for the other ranks to arrive:
    /// per epoch the larger of the waits collective by collective
    /// ([`EpochRecord::waiting_secs`]: the codecs between a step's
    /// collectives, a descheduled process) and the slowest rank's time
    /// outside calls less rank 0's ([`EpochRecord::slowest_busy_secs`]:
    /// waits in point-to-point messages), each a lower bound of the
    /// whole (counted from the collective that last synchronised the
    /// ranks, so what a rank does between epochs delays it as its steps
    /// do).
    #[serde(default)]
    pub imbalance: Option<f64>,
    /// Bytes one worker sent per step.
    pub bytes: f64,
}

/// Hooks the run calls on rank 0, for progress bars and tables.
pub trait Observer: Sync {
    /// An epoch of `steps` steps begins.
    fn epoch_started(&self, _epoch: usize, _steps: usize) {}
    /// One step finished, in which rank 0 sent `sent` bytes (its
    /// `StepStats::traffic.sent`).
    fn step_done(&self, _sent: u64) {}
    /// An epoch finished.
    fn epoch_done(&self, _record: &EpochRecord) {}
}

/// An observer that does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Observer for Silent {}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(waiting: Option<f64>, busy: Option<(f64, f64)>) -> EpochRecord {
        let mut record: EpochRecord = serde_json::from_value(serde_json::json!({
            "epoch": 1, "train_loss": 1.0, "test_accuracy": 0.5, "bytes_sent": 0,
            "bytes_total": 0, "compression": 1.0, "compute_secs": 1.0,
            "comm_secs": 1.0, "wall_secs": 3.0, "steps": 10,
            "network_secs": 1.5, "combine_secs": 1.5
        }))
        .unwrap();
        record.waiting_secs = waiting;
        (record.busy_secs, record.slowest_busy_secs) = busy.unzip();
        record
    }

    /// Each epoch's imbalance is the larger of its two lower bounds (the
    /// waits collective by collective, the step-level busy difference);
    /// either alone where the other is missing; none without both.
    #[test]
    fn the_imbalance_is_the_larger_of_the_two_measures_per_epoch() {
        let run = |epochs| RunReport {
            label: "dense".into(),
            config: TrainConfig::default(),
            epochs,
            param_checksum: String::new(),
            timeline: None,
        };
        let split = run(vec![
            epoch(Some(0.3), Some((2.0, 2.5))),
            epoch(Some(0.4), Some((2.0, 2.1))),
            epoch(None, Some((2.0, 2.2))),
            epoch(Some(0.1), None),
        ])
        .per_step();
        let wanted = (0.5 + 0.4 + 0.2 + 0.1) / 40.0;
        assert!((split.imbalance.unwrap() - wanted).abs() < 1e-12);
        assert_eq!(run(vec![epoch(None, None)]).per_step().imbalance, None);
    }

    /// The codecs' time is the combining's less its calls: the calls
    /// outside it (votes, agreements, the epoch's closing collectives) are
    /// not taken from it. A record without the count reads as before.
    #[test]
    fn the_codec_time_leaves_out_the_calls_outside_the_combining() {
        let run = |coordination: f64| {
            let mut record = epoch(None, None);
            record.network_secs = Some(1.5);
            record.combine_secs = 1.5;
            record.coordination_secs = coordination;
            RunReport {
                label: "topk".into(),
                config: TrainConfig::default(),
                epochs: vec![record.clone(), record],
                param_checksum: String::new(),
                timeline: None,
            }
            .per_step()
        };
        // 2 epochs of 10 steps: 1.5 s combining, 1.5 s in calls of which
        // 0.6 s outside the combining, so 0.6 s of codecs an epoch.
        let split = run(0.6);
        assert!((split.codec.unwrap() - 0.06).abs() < 1e-12, "{split:?}");
        assert!((split.network.unwrap() - 0.15).abs() < 1e-12);
        assert_eq!(run(0.0).codec, Some(0.0));
        assert_eq!(epoch(None, None).coordination_secs, 0.0);
    }
}
