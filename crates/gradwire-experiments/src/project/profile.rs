//! The profile of a shaped `gradwire compare --network` run, which
//! `gradwire project --profile` reads: measured seconds per step by part
//! (compute, codec, other), what the cost model predicted for the run, and
//! the steps each strategy took to the target accuracy.

use crate::error::{ExperimentError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A fitted link as the profile stores it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProfileLink {
    /// Alpha, seconds.
    pub latency_s: f64,
    /// 1 / beta, bytes per second.
    pub bytes_per_s: f64,
    /// The least and the most latency and rate fitted to single
    /// repetitions of the calibration (its spread); `None` for a
    /// calibration of one timing per size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<ProfileSpread>,
}

/// The spread of a fitted link ([`gradwire_algos::cost::LinkSpread`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProfileSpread {
    /// The least and the most latency, seconds.
    pub latency_s: (f64, f64),
    /// The least and the most rate, bytes per second.
    pub bytes_per_s: (f64, f64),
    /// Repetitions fitted one by one.
    pub repetitions: usize,
}

impl ProfileLink {
    /// The stored form of `link` and its `spread`.
    pub fn of(
        link: &gradwire_algos::cost::Link,
        spread: Option<gradwire_algos::cost::LinkSpread>,
    ) -> ProfileLink {
        ProfileLink {
            latency_s: link.latency_s,
            bytes_per_s: link.bytes_per_s,
            spread: spread.map(|s| ProfileSpread {
                latency_s: s.latency_s,
                bytes_per_s: s.bytes_per_s,
                repetitions: s.repetitions,
            }),
        }
    }

    /// `120 us + bytes / 9.0 MB/s`, with the spread when there is one:
    /// `(latency 110-130 us, rate 8.9-9.1 MB/s over 5 repetitions)`.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "{:.0} us + bytes / {:.2} MB/s",
            self.latency_s * 1e6,
            self.bytes_per_s / 1e6
        );
        if let Some(s) = &self.spread {
            text += &format!(
                " (latency {:.0}-{:.0} us, rate {:.2}-{:.2} MB/s over {} repetitions)",
                s.latency_s.0 * 1e6,
                s.latency_s.1 * 1e6,
                s.bytes_per_s.0 / 1e6,
                s.bytes_per_s.1 / 1e6,
                s.repetitions
            );
        }
        text
    }
}

/// A shaper's burst as the calibration timed it
/// ([`crate::compare::BurstTimings`]), by the means of its timings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProfileBurst {
    /// The bucket, bytes.
    pub bucket_bytes: usize,
    /// Seconds of idle link that refill it.
    pub refill_s: f64,
    /// The all-reduce timed, bytes of f32.
    pub all_reduce_bytes: usize,
    /// Mean seconds of the all-reduce timed back to back.
    pub back_to_back_s: f64,
    /// Mean seconds of the same after a pause that refills the bucket.
    pub after_pause_s: f64,
}

impl ProfileBurst {
    /// The means of `timings` (`None` where either way has no timing).
    pub fn of(timings: &crate::compare::BurstTimings) -> Option<ProfileBurst> {
        use gradwire_algos::cost::mean;
        Some(ProfileBurst {
            bucket_bytes: timings.bucket_bytes,
            refill_s: timings.refill_s,
            all_reduce_bytes: timings.bytes,
            back_to_back_s: mean(timings.back_to_back.iter().copied())?,
            after_pause_s: mean(timings.after_pause.iter().copied())?,
        })
    }

    /// What a refilled bucket saves a step: the mean back to back less the
    /// mean after a pause, at least 0.
    pub fn saved_s(&self) -> f64 {
        (self.back_to_back_s - self.after_pause_s).max(0.0)
    }

    /// The cost model's form of it.
    pub fn burst(&self) -> gradwire_algos::cost::Burst {
        gradwire_algos::cost::Burst {
            bytes: self.bucket_bytes as f64,
            saved_s: self.saved_s(),
            refill_s: self.refill_s,
        }
    }

    /// `a refilled bucket of 96 KiB saves 7.1 ms a step (an all-reduce of
    /// 128 KiB: 16.1 ms back to back, 9.0 ms after a pause)`.
    pub fn describe(&self) -> String {
        format!(
            "a refilled bucket of {:.0} KiB saves {:.1} ms a step (an all-reduce of {:.0} KiB: \
             {:.1} ms back to back, {:.1} ms after a pause)",
            self.bucket_bytes as f64 / 1024.0,
            self.saved_s() * 1e3,
            self.all_reduce_bytes as f64 / 1024.0,
            self.back_to_back_s * 1e3,
            self.after_pause_s * 1e3
        )
    }
}

/// One strategy of a shaped run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileStrategy {
    /// Its label, as `gradwire compare` prints it.
    pub label: String,
    /// Forward and backward, seconds per step.
    pub compute_s_per_step: f64,
    /// Encoding and decoding, seconds per step.
    pub codec_s_per_step: f64,
    /// The rest of the step outside communication, seconds.
    pub other_s_per_step: f64,
    /// Rank 0's wait in its collectives for the last rank to arrive,
    /// seconds per step (the run's load imbalance, collective by
    /// collective: part of the prediction of the run, not projected, where
    /// every rank has a device of its own).
    #[serde(default)]
    pub imbalance_s_per_step: f64,
    /// What a step took, seconds.
    pub measured_s_per_step: f64,
    /// What the cost model predicted, seconds.
    pub predicted_s_per_step: f64,
    /// Steps to the target (accuracy, or the GPT's loss), if reached.
    pub steps_to_target: Option<u64>,
    /// Test accuracy at the end, in [0, 1].
    pub final_accuracy: f64,
    /// Test loss at the end (nats per prediction).
    #[serde(default)]
    pub final_loss: f64,
}

/// What a shaped `gradwire compare --network` run measured (written by it,
/// read by `gradwire project --profile`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// The shaped link's rate, bits per second.
    pub rate_bits_per_s: u64,
    /// Ranks of the run.
    pub world: usize,
    /// Parameters of the model trained.
    pub params: usize,
    /// The link fitted from the run's calibration of gradwire's all-reduce
    /// (as a ring: [`gradwire_algos::cost::fit_all_reduce`]).
    pub link: ProfileLink,
    /// The same fitted from the library's own all-reduce (the baseline's).
    #[serde(default)]
    pub library_link: Option<ProfileLink>,
    /// Gradwire's all-reduce at the latency size, mean seconds, timed
    /// before the runs and again after them; `None` where it was not timed
    /// after (a profile written before, or no calibration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_before_after_s: Option<(f64, f64)>,
    /// The shaper's burst, which every prediction of the run counts
    /// (`gradwire_algos::cost::Burst`); `None` where the calibration did
    /// not time it (a profile written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<ProfileBurst>,
    /// One entry per strategy.
    pub strategies: Vec<ProfileStrategy>,
}

/// What `gradwire compare` writes to `compare.json`.
#[derive(Debug, Deserialize)]
struct CompareRecord {
    runs: Vec<crate::train::RunReport>,
    calibration: Option<crate::compare::Calibration>,
    rate_bits_per_s: Option<u64>,
}

impl Profile {
    /// Reads and checks a profile: a `profile.json`, or the
    /// `compare.json` of a shaped run (its runs and calibration, from which
    /// [`super::profile_of`] computes the profile again, with this
    /// version's model).
    pub fn load(path: &Path) -> Result<Profile> {
        let text = std::fs::read_to_string(path).map_err(|source| ExperimentError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let value: serde_json::Value = serde_json::from_str(&text)?;
        let profile = if value.get("type").and_then(|t| t.as_str()) == Some("compare") {
            let record: CompareRecord = serde_json::from_value(value)?;
            match (record.calibration, record.rate_bits_per_s) {
                (Some(calibration), Some(rate)) => {
                    super::profile_of(&record.runs, &calibration, rate)?
                }
                _ => {
                    return Err(ExperimentError::Usage(format!(
                        "{}: a comparison on no shaped network (run compare with --network)",
                        path.display()
                    )));
                }
            }
        } else {
            serde_json::from_value(value)?
        };
        if profile.params == 0 {
            return Err(ExperimentError::Usage(format!(
                "{}: a profile of 0 parameters",
                path.display()
            )));
        }
        Ok(profile)
    }

    /// The entry labelled `label`.
    pub fn strategy(&self, label: &str) -> Option<&ProfileStrategy> {
        self.strategies.iter().find(|s| s.label == label)
    }

    /// `label`'s steps to the target over dense's, when both reached it.
    pub fn relative_steps(&self, label: &str) -> Option<f64> {
        let dense = self.strategy("dense")?.steps_to_target?;
        let own = self.strategy(label)?.steps_to_target?;
        (dense > 0).then(|| own as f64 / dense as f64)
    }
}
