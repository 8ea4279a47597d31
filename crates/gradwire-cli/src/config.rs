//! What a training run is: the strategy with its parameters, the model, the
//! optimizer and schedule, the world size and the seed; validated before
//! anything starts.

use crate::error::{CliError, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// How the workers combine what they computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// f32 gradients summed and averaged (all-reduce).
    Dense,
    /// Gradients sent as IEEE half precision, averaged in f32.
    Fp16,
    /// Gradients sent as bfloat16, averaged in f32.
    Bf16,
    /// Only entries with |g| >= threshold are sent.
    Threshold,
    /// Only the top `ratio` fraction of magnitudes is sent.
    Topk,
    /// Top-k estimated from a sample (DGC): k to 1.3 k entries.
    SampledTopk,
    /// A seeded random `ratio` fraction of entries. With error feedback it
    /// wants `--momentum 0`: momentum on top of the residual's bursts
    /// diverges on the default settings.
    Randomk,
    /// Local steps; one bucket of parameters averaged per step, in turn.
    Partial,
    /// Gradients combined with AdaSum.
    AdasumGrad,
    /// Local steps; weight changes combined with AdaSum.
    AdasumDelta,
    /// A dense stage recording the trajectory, then DimReduce.
    Dimreduce,
    /// PowerSGD: matrices sent as rank-`--powersgd-rank` factors, with
    /// error feedback (dense for the first `--powersgd-start-step` steps).
    Powersgd,
    /// One bit per entry (scaled sign) both ways, with error feedback on
    /// both sides (EF-SignSGD; 1-bit Adam's compressed all-reduce).
    Onebit,
    /// QSGD: 8-bit levels, max-norm scaled per chunk, stochastic rounding.
    Qsgd,
    /// Min-max uint8 per chunk (Bagua's ByteGrad), deterministic.
    Uint8,
    /// 1-bit Adam (with `--optimizer adam` or `adamw`): Adam for
    /// `--freeze-step` steps, then the variance frozen and the momentum
    /// exchanged in 1 bit with error feedback.
    OnebitAdam,
    /// The yardstick, not a gradwire strategy: Horovod's loop on CPUs. All
    /// gradients copied into one buffer, summed by the backend library's
    /// own all-reduce (Open MPI's `MPI_Allreduce` under `--backend mpi`),
    /// averaged, and stepped by the same optimizer.
    Baseline,
}

impl Strategy {
    /// Every strategy, in the order of the help text.
    pub const ALL: [Strategy; 17] = [
        Strategy::Dense,
        Strategy::Fp16,
        Strategy::Bf16,
        Strategy::Threshold,
        Strategy::Topk,
        Strategy::SampledTopk,
        Strategy::Randomk,
        Strategy::Partial,
        Strategy::AdasumGrad,
        Strategy::AdasumDelta,
        Strategy::Dimreduce,
        Strategy::Powersgd,
        Strategy::Onebit,
        Strategy::Qsgd,
        Strategy::Uint8,
        Strategy::OnebitAdam,
        Strategy::Baseline,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Dense => "dense",
            Strategy::Fp16 => "fp16",
            Strategy::Bf16 => "bf16",
            Strategy::Threshold => "threshold",
            Strategy::Topk => "topk",
            Strategy::SampledTopk => "sampled-topk",
            Strategy::Randomk => "randomk",
            Strategy::Partial => "partial",
            Strategy::AdasumGrad => "adasum-grad",
            Strategy::AdasumDelta => "adasum-delta",
            Strategy::Dimreduce => "dimreduce",
            Strategy::Powersgd => "powersgd",
            Strategy::Onebit => "onebit",
            Strategy::Qsgd => "qsgd",
            Strategy::Uint8 => "uint8",
            Strategy::OnebitAdam => "onebit-adam",
            Strategy::Baseline => "baseline",
        }
    }

    /// Whether the strategy sends a sparse selection (and so takes `ratio`
    /// or `threshold` and error feedback).
    pub fn is_sparse(self) -> bool {
        matches!(
            self,
            Strategy::Threshold | Strategy::Topk | Strategy::SampledTopk | Strategy::Randomk
        )
    }
}

/// The network trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// A multi-layer perceptron (`--hidden` widths).
    Mlp,
    /// A convolutional network (`--channels` widths).
    Cnn,
}

/// The local optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// SGD with (optional) momentum.
    Sgd,
    /// Adam.
    Adam,
    /// AdamW (decoupled weight decay).
    Adamw,
    /// RMSProp.
    Rmsprop,
    /// AdaGrad.
    Adagrad,
}

/// How the learning rate changes over the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleKind {
    /// The same rate throughout.
    Constant,
    /// Linear warm-up over the first epoch, then cosine to a tenth.
    Cosine,
    /// Halved every quarter of the run.
    Step,
}

/// One training run. A field missing from saved JSON (a checkpoint of an
/// older version) takes its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainConfig {
    /// How workers combine their work.
    pub strategy: Strategy,
    /// Workers (W).
    pub world: usize,
    /// Passes over the training set.
    pub epochs: usize,
    /// Samples per worker per step; a global batch is `world * batch`.
    pub batch: usize,
    /// The network.
    pub model: ModelKind,
    /// Hidden layer widths (MLP).
    pub hidden: Vec<usize>,
    /// Channels of each 3x3 convolution (CNN; one to three).
    pub channels: Vec<usize>,
    /// Fraction sent by top-k, sampled top-k and random-k, in (0, 1].
    pub ratio: f64,
    /// Magnitude threshold of the threshold strategy (> 0).
    pub threshold: f32,
    /// Keep what sparsification did not send for later steps.
    pub error_feedback: bool,
    /// Clamp gradients to [-clip, clip] before a half-precision cast.
    pub clip: Option<f32>,
    /// Elements above which a fusion bucket is closed.
    pub fusion_threshold: usize,
    /// Partial averaging: also average the optimizer's buffers.
    pub average_state: bool,
    /// The local optimizer.
    pub optimizer: OptimizerKind,
    /// Peak learning rate.
    pub lr: f64,
    /// Momentum (SGD).
    pub momentum: f64,
    /// The learning-rate schedule.
    pub schedule: ScheduleKind,
    /// Seeds the model's initial weights and random-k (the data split and
    /// epoch orders have their own fixed seeds).
    pub seed: u64,
    /// AdaSum: average within groups of this many consecutive ranks (a node)
    /// first, then AdaSum across groups (hierarchical); must divide `world`.
    pub adasum_group: Option<usize>,
    /// DimReduce: epochs of dense training that record the trajectory
    /// (default: half the run).
    pub dimreduce_dense_epochs: Option<usize>,
    /// DimReduce: principal components kept.
    pub components: usize,
    /// DimReduce: a PCA file to start from instead of a dense stage.
    pub pca: Option<PathBuf>,
    /// PowerSGD: the rank of the approximation (at least 1).
    pub powersgd_rank: usize,
    /// PowerSGD: the steps averaged dense before compression starts.
    pub powersgd_start_step: u64,
    /// 1-bit Adam: the steps of plain Adam before the variance is frozen.
    pub freeze_step: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            strategy: Strategy::Dense,
            world: 4,
            epochs: 20,
            batch: 16,
            model: ModelKind::Mlp,
            hidden: vec![128],
            channels: vec![16, 32],
            ratio: 0.01,
            threshold: 0.01,
            error_feedback: true,
            clip: None,
            // Small, so that the small model has several buckets (overlap,
            // and a cycle for partial averaging).
            fusion_threshold: 2048,
            average_state: false,
            optimizer: OptimizerKind::Sgd,
            lr: 0.05,
            momentum: 0.9,
            schedule: ScheduleKind::Constant,
            seed: 7,
            adasum_group: None,
            dimreduce_dense_epochs: None,
            components: 32,
            pca: None,
            powersgd_rank: 2,
            powersgd_start_step: 10,
            freeze_step: 100,
        }
    }
}

/// The largest world size the in-process backend is run with here: every
/// worker is a thread.
pub const MAX_LOCAL_WORLD: usize = 256;

impl TrainConfig {
    /// Whether SGD's momentum is applied by each worker before the exchange
    /// instead of by the optimizer after it: the 1-bit strategy with SGD
    /// (dist-EF-SGDM: the sign of a momentum with error feedback keeps
    /// momentum SGD's accuracy, where momentum after a 1-bit exchange
    /// amplifies the delayed entries of error feedback: 85 % against dense
    /// 96 % on digits, measured).
    pub fn momentum_before_exchange(&self) -> bool {
        self.strategy == Strategy::Onebit
            && self.optimizer == OptimizerKind::Sgd
            && self.momentum > 0.0
    }

    /// Checks every value; the message names the flag.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(CliError::Usage(m));
        if self.world == 0 || self.world > MAX_LOCAL_WORLD {
            return bad(format!(
                "--world must be between 1 and {MAX_LOCAL_WORLD}, got {}",
                self.world
            ));
        }
        if self.epochs == 0 {
            return bad("--epochs must be at least 1".into());
        }
        if self.batch == 0 {
            return bad("--batch must be at least 1".into());
        }
        if self.hidden.contains(&0) {
            return bad("--hidden widths must be at least 1".into());
        }
        if self.channels.is_empty() || self.channels.len() > 3 || self.channels.contains(&0) {
            return bad("--channels takes one to three widths, each at least 1".into());
        }
        if !(self.ratio > 0.0 && self.ratio <= 1.0) {
            return bad(format!("--ratio must be in (0, 1], got {}", self.ratio));
        }
        if !(self.threshold.is_finite() && self.threshold > 0.0) {
            return bad(format!(
                "--threshold must be positive and finite, got {}",
                self.threshold
            ));
        }
        if let Some(clip) = self.clip
            && !(clip.is_finite() && clip > 0.0)
        {
            return bad(format!("--clip must be positive and finite, got {clip}"));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(format!("--lr must be positive and finite, got {}", self.lr));
        }
        if !(0.0..1.0).contains(&self.momentum) {
            return bad(format!(
                "--momentum must be in [0, 1), got {}",
                self.momentum
            ));
        }
        if self.strategy == Strategy::OnebitAdam
            && !matches!(self.optimizer, OptimizerKind::Adam | OptimizerKind::Adamw)
        {
            return bad("-s onebit-adam is Adam's own: it takes --optimizer adam or adamw".into());
        }
        if self.powersgd_rank == 0 {
            return bad("--powersgd-rank must be at least 1".into());
        }
        if self.fusion_threshold == 0 {
            return bad("--fusion-threshold must be at least 1".into());
        }
        if let Some(group) = self.adasum_group
            && (group == 0 || !self.world.is_multiple_of(group))
        {
            return bad(format!(
                "--adasum-group must divide --world ({}), got {group}",
                self.world
            ));
        }
        if self.components == 0 {
            return bad("--components must be at least 1".into());
        }
        // A dense stage as long as the run is allowed: a run may stop in it
        // and be resumed with more epochs.
        if self.dimreduce_dense_epochs == Some(0) && self.strategy == Strategy::Dimreduce {
            return bad("--dimreduce-dense-epochs must be at least 1 (or give --pca)".into());
        }
        Ok(())
    }

    /// DimReduce's dense epochs (0 with a PCA file; by default half the
    /// run, at least one).
    pub fn dense_epochs(&self) -> usize {
        if self.strategy != Strategy::Dimreduce || self.pca.is_some() {
            return 0;
        }
        self.dimreduce_dense_epochs
            .unwrap_or(self.epochs / 2)
            .max(1)
    }

    /// A short label for tables and plots: the strategy and what sets it apart.
    pub fn label(&self) -> String {
        let percent = |r: f64| {
            let p = r * 100.0;
            if p >= 1.0 {
                format!("{p:.0} %")
            } else {
                format!("{p:.1} %")
            }
        };
        let ef = if self.error_feedback { "" } else { ", no EF" };
        match self.strategy {
            Strategy::Topk | Strategy::SampledTopk | Strategy::Randomk => {
                format!("{} {}{ef}", self.strategy.name(), percent(self.ratio))
            }
            Strategy::Threshold => format!("threshold {}{ef}", self.threshold),
            Strategy::Powersgd => format!("powersgd rank {}{ef}", self.powersgd_rank),
            Strategy::Onebit | Strategy::Qsgd | Strategy::Uint8 => {
                format!("{}{ef}", self.strategy.name())
            }
            s => s.name().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_their_flag() {
        let cases: Vec<(TrainConfig, &str)> = vec![
            (
                TrainConfig {
                    world: 0,
                    ..TrainConfig::default()
                },
                "--world",
            ),
            (
                TrainConfig {
                    ratio: 0.0,
                    ..TrainConfig::default()
                },
                "--ratio",
            ),
            (
                TrainConfig {
                    ratio: 1.5,
                    ..TrainConfig::default()
                },
                "--ratio",
            ),
            (
                TrainConfig {
                    ratio: f64::NAN,
                    ..TrainConfig::default()
                },
                "--ratio",
            ),
            (
                TrainConfig {
                    epochs: 0,
                    ..TrainConfig::default()
                },
                "--epochs",
            ),
            (
                TrainConfig {
                    lr: -1.0,
                    ..TrainConfig::default()
                },
                "--lr",
            ),
            (
                TrainConfig {
                    clip: Some(0.0),
                    ..TrainConfig::default()
                },
                "--clip",
            ),
            (
                TrainConfig {
                    strategy: Strategy::Dimreduce,
                    dimreduce_dense_epochs: Some(0),
                    ..TrainConfig::default()
                },
                "--dimreduce-dense-epochs",
            ),
        ];
        for (config, flag) in cases {
            match config.validate() {
                Err(CliError::Usage(m)) => assert!(m.contains(flag), "{m}"),
                other => panic!("{flag}: {other:?}"),
            }
        }
        assert!(TrainConfig::default().validate().is_ok());
        assert!(
            TrainConfig {
                ratio: 1.0,
                ..TrainConfig::default()
            }
            .validate()
            .is_ok()
        );
    }

    #[test]
    fn labels_and_dense_epochs() {
        let topk = TrainConfig {
            strategy: Strategy::Topk,
            error_feedback: false,
            ..TrainConfig::default()
        };
        assert_eq!(topk.label(), "topk 1 %, no EF");
        let sampled = TrainConfig {
            strategy: Strategy::SampledTopk,
            ratio: 0.001,
            ..TrainConfig::default()
        };
        assert_eq!(sampled.label(), "sampled-topk 0.1 %");
        let powersgd = TrainConfig {
            strategy: Strategy::Powersgd,
            powersgd_rank: 4,
            ..TrainConfig::default()
        };
        assert_eq!(powersgd.label(), "powersgd rank 4");
        let dr = TrainConfig {
            strategy: Strategy::Dimreduce,
            ..TrainConfig::default()
        };
        assert_eq!(dr.dense_epochs(), 10);
        assert_eq!(TrainConfig::default().dense_epochs(), 0);
    }
}
