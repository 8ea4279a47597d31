//! The consoles of `train` and `compare`: progress bars on a terminal, a
//! line per epoch otherwise (under mpirun, where rank 0's stderr is a pipe
//! and a bar would never show), then the rows and tables on stdout.

use gradwire_experiments::TrainConfig;
use gradwire_experiments::train::{EpochRecord, Observer};
use indicatif::{ProgressBar, ProgressStyle};
use std::sync::Mutex;

pub(crate) fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix:>14} [{bar:30}] {pos}/{len} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// `train`'s console: a progress bar per epoch on stderr, then the epoch's
/// row on stdout (or a JSON line).
pub(crate) struct Console {
    pub(crate) json: bool,
    pub(crate) bar: Mutex<Option<ProgressBar>>,
}

pub(crate) const HEADER: &str =
    "epoch  train loss  test loss  test acc %  sent/worker MB  vs dense  compute s  comm s";

impl Observer for Console {
    fn epoch_started(&self, epoch: usize, steps: usize) {
        let bar = ProgressBar::new(steps as u64)
            .with_style(bar_style())
            .with_prefix(format!("epoch {epoch}"));
        *self.bar.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar);
    }

    fn step_done(&self, _sent: u64) {
        if let Some(bar) = &*self.bar.lock().unwrap_or_else(|e| e.into_inner()) {
            bar.inc(1);
        }
    }

    fn epoch_done(&self, r: &EpochRecord) {
        if let Some(bar) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
            bar.finish_and_clear();
        }
        if self.json {
            let mut value = serde_json::to_value(r).unwrap_or_default();
            if let Some(map) = value.as_object_mut() {
                map.insert("type".into(), "epoch".into());
            }
            println!("{value}");
        } else {
            println!(
                "{:>5}  {:>10.4}  {:>9.4}  {:>10.1}  {:>14.3}  {:>7.1}x  {:>9.2}  {:>6.2}",
                r.epoch,
                r.train_loss,
                r.test_loss,
                r.test_accuracy * 100.0,
                r.bytes_sent as f64 / 1e6,
                r.compression,
                r.compute_secs,
                r.comm_secs
            );
        }
    }
}

pub(crate) fn print_train_header(config: &TrainConfig, json: bool) {
    if !json {
        println!(
            "{} on {} workers, {} epochs, global batch {}",
            config.label(),
            config.world,
            config.epochs,
            config.global_batch()
        );
        println!("{HEADER}");
    }
}

/// `compare`'s console: one bar per strategy over all its steps.
pub(crate) struct RunBar {
    pub(crate) bar: ProgressBar,
    pub(crate) epochs: usize,
    /// The run's label, for the lines printed when no bar can show.
    pub(crate) label: String,
}

impl Observer for RunBar {
    fn epoch_started(&self, epoch: usize, steps: usize) {
        self.bar.set_length((steps * self.epochs) as u64);
        self.bar.set_message(format!("epoch {epoch}"));
    }

    fn step_done(&self, _sent: u64) {
        self.bar.inc(1);
    }

    fn epoch_done(&self, r: &EpochRecord) {
        self.bar.set_message(format!(
            "epoch {}: {:.1} %, loss {:.3}",
            r.epoch,
            r.test_accuracy * 100.0,
            r.test_loss
        ));
        // A bar shows, or --json (whose bars have no label) wants no lines.
        if !self.bar.is_hidden() || self.label.is_empty() {
            return;
        }
        println!(
            "  {:<24} epoch {:>3}/{}  test acc {:>5.1} %  test loss {:>7.4}  {:>7.2} s",
            self.label,
            r.epoch,
            self.epochs,
            r.test_accuracy * 100.0,
            r.test_loss,
            r.wall_secs
        );
    }
}

impl Drop for RunBar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
