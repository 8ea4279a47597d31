//! What a training run is: the strategy with its parameters, the model, the
//! optimizer and schedule, the world size and the seed; validated before
//! anything starts; with the flags every run shares ([`RunArgs`]) and the
//! choice of communicator ([`BackendKind`]).

use crate::error::{ExperimentError, Result};
use crate::model::GptShape;
use gradwire_algos::HalfPrecision;
use gradwire_compress::{Quantizer, SparseCodec};
use gradwire_optim::StrategyConfig;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The network trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// A multi-layer perceptron (`--hidden` widths).
    Mlp,
    /// A convolutional network (`--channels` widths).
    Cnn,
    /// A character-level transformer language model (`--layers`,
    /// `--width`, `--heads`, `--context`) on the text of `--corpus`.
    Gpt,
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

impl OptimizerKind {
    /// Buffers it keeps per parameter (what `partial:state` averages with
    /// the parameters): its update rule's.
    pub fn state_buffers(self) -> usize {
        use gradwire_optim::{AdaGradRule, AdamRule, AdamWRule, RmsPropRule, SgdRule, UpdateRule};
        match self {
            OptimizerKind::Sgd => SgdRule::BUFFERS.len(),
            OptimizerKind::Adam => AdamRule::BUFFERS.len(),
            OptimizerKind::Adamw => AdamWRule::BUFFERS.len(),
            OptimizerKind::Rmsprop => RmsPropRule::BUFFERS.len(),
            OptimizerKind::Adagrad => AdaGradRule::BUFFERS.len(),
        }
    }
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

/// Which communicator the workers use (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// Threads of this process (`--world` of them).
    Local,
    /// One rank per MPI process: run under `mpirun -np W` (build with
    /// `--features mpi`); `--world` is taken from MPI.
    Mpi,
    /// One rank per GPU over NCCL, threads of this process on devices 0 to
    /// W-1 (build with `--features nccl`; needs W GPUs and NCCL).
    Nccl,
}

/// One training run. A field missing from saved JSON (a checkpoint of an
/// older version) takes its default; a configuration of the first format
/// (the strategy's settings in flags of their own) reads as the same run.
/// The `gradwire` binary's flags are these fields (`clap::Args`: the
/// doc comments are the help, the defaults [`TrainConfig::default`]'s);
/// the strategy is set by the commands that take one (`-s`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, try_from = "legacy::TrainConfigRecord")]
pub struct TrainConfig {
    /// How workers combine their work: a strategy of the registry, in its
    /// printed form (`topk:0.01`, `powersgd:4`; see
    /// [`gradwire_optim::StrategyConfig`]).
    #[arg(skip = StrategyConfig::Dense)]
    pub strategy: StrategyConfig,
    /// The yardstick instead of a gradwire strategy (`-s baseline`):
    /// Horovod's loop on CPUs, all gradients copied into one buffer, summed
    /// by the backend library's own all-reduce (Open MPI's `MPI_Allreduce`
    /// under `--backend mpi`), averaged, and stepped by the same optimizer.
    /// `strategy` is then dense.
    #[arg(skip)]
    pub baseline: bool,
    /// Workers (threads of the in-process backend).
    #[arg(long, short = 'w', default_value_t = TrainConfig::default().world)]
    pub world: usize,
    /// Passes over the training set.
    #[arg(long, default_value_t = TrainConfig::default().epochs)]
    pub epochs: usize,
    /// Samples per worker per micro-batch (the global batch of a step is
    /// world x batch x accumulate).
    #[arg(long, default_value_t = TrainConfig::default().batch)]
    pub batch: usize,
    /// Micro-batches per step (gradient accumulation): each worker takes
    /// this many batches of --batch samples per step, and the workers
    /// exchange once, the mean of the micro-batches' gradients.
    #[arg(long, default_value_t = TrainConfig::default().accumulate)]
    pub accumulate: u32,
    /// Uneven inputs: each worker holds a contiguous shard of every epoch,
    /// worker r's in proportion to r + 1, so the workers run out of data at
    /// different steps and join (PyTorch DDP's Join): each step's mean is
    /// over the samples actually seen. Gradient strategies that average.
    #[arg(long)]
    pub uneven_shards: bool,
    /// The network, built with candle: an MLP (--hidden) or a
    /// convolutional network (--channels) on the digits, or a
    /// character-level transformer (--layers, --width, --heads, --context)
    /// on the text of --corpus.
    #[arg(long, value_enum, default_value_t = TrainConfig::default().model)]
    pub model: ModelKind,
    /// MLP hidden layer widths, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "128")]
    pub hidden: Vec<usize>,
    /// CNN channels per 3x3 convolution (one to three), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16,32")]
    pub channels: Vec<usize>,
    /// The transformer's size.
    #[command(flatten)]
    pub gpt: GptShape,
    /// GPT: the text it learns, a file or a directory of text files
    /// (Debian's fortunes package by default).
    #[arg(long, default_value = crate::data::DEFAULT_CORPUS)]
    pub corpus: PathBuf,
    /// GPT: training windows per epoch, drawn in turn from passes over the
    /// corpus (an epoch is then an interval between evaluations); all of
    /// them by default.
    #[arg(long)]
    pub epoch_windows: Option<usize>,
    /// GPT: the test loss (nats per character) that counts as trained in
    /// reports, in place of the digits' 95 % accuracy.
    #[arg(long, default_value_t = TrainConfig::default().target_loss)]
    pub target_loss: f64,
    /// Elements above which a fusion bucket is closed (small by default, so
    /// that the small model has several buckets; on a shaped network it is
    /// also the fastest measured: a large tensor is reduced in place, see
    /// README).
    #[arg(long, default_value_t = TrainConfig::default().fusion_threshold)]
    pub fusion_threshold: usize,
    /// The local optimizer.
    #[arg(long, value_enum, default_value_t = TrainConfig::default().optimizer)]
    pub optimizer: OptimizerKind,
    /// Peak learning rate.
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    pub lr: f64,
    /// SGD momentum.
    #[arg(long, default_value_t = TrainConfig::default().momentum)]
    pub momentum: f64,
    /// Learning-rate schedule.
    #[arg(long, value_enum, default_value_t = TrainConfig::default().schedule)]
    pub schedule: ScheduleKind,
    /// Seed of the initial weights and of the strategies that draw at
    /// random (random-k, QSGD, PowerSGD's fresh factors; the data split and
    /// the epoch orders have their own seeds).
    #[arg(long, default_value_t = TrainConfig::default().seed)]
    pub seed: u64,
    /// DimReduce: dense epochs recording the trajectory (default: half).
    #[arg(long)]
    pub dimreduce_dense_epochs: Option<usize>,
    /// DimReduce: principal components.
    #[arg(long, default_value_t = TrainConfig::default().components)]
    pub components: usize,
    /// DimReduce: start from this PCA file instead of a dense stage.
    #[arg(long)]
    pub pca: Option<PathBuf>,
    /// Write a timeline of the run to this file: every rank's collectives
    /// (the wait for the last rank, the agreement, the transfer), bucket
    /// jobs, codec work, optimizer steps, on one clock, as a Chrome trace
    /// (open it in Perfetto, ui.perfetto.dev, or chrome://tracing). An
    /// output of the run, not part of it: never saved in a checkpoint.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub timeline: Option<PathBuf>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            strategy: StrategyConfig::Dense,
            baseline: false,
            world: 4,
            epochs: 20,
            batch: 16,
            accumulate: 1,
            uneven_shards: false,
            model: ModelKind::Mlp,
            hidden: vec![128],
            channels: vec![16, 32],
            gpt: GptShape::default(),
            corpus: PathBuf::from(crate::data::DEFAULT_CORPUS),
            epoch_windows: None,
            target_loss: DEFAULT_TARGET_LOSS,
            // Small, so that the small model has several buckets (overlap,
            // and a cycle for partial averaging).
            fusion_threshold: 2048,
            optimizer: OptimizerKind::Sgd,
            lr: 0.05,
            momentum: 0.9,
            schedule: ScheduleKind::Constant,
            seed: 7,
            dimreduce_dense_epochs: None,
            components: 32,
            pca: None,
            timeline: None,
        }
    }
}

/// The settings every training run shares (`gradwire train`'s and
/// `compare`'s flags): the run's ([`TrainConfig`], whose fields are the
/// flags) and how it is shown.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The run.
    #[command(flatten)]
    pub run: TrainConfig,
    /// Seed of the train/test split.
    #[arg(long, default_value_t = 42)]
    pub split_seed: u64,
    /// Machine-readable JSON on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// The environment variable that sets candle's compute threads (its
/// matrix products' and its element-wise pool's, which falls back to it).
pub const COMPUTE_THREADS_VAR: &str = "RAYON_NUM_THREADS";

/// Candle's own variable for its compute threads, which it reads before
/// [`COMPUTE_THREADS_VAR`].
pub(crate) const CANDLE_THREADS_VAR: &str = "CANDLE_NUM_THREADS";

/// Every variable that sets candle's compute threads: one set is the
/// user's choice, which a run keeps.
pub(crate) const CHOSEN_THREADS_VARS: [&str; 2] = [COMPUTE_THREADS_VAR, CANDLE_THREADS_VAR];

/// The value to give [`COMPUTE_THREADS_VAR`] before a run of `ranks` ranks
/// that share this machine's `cores` cores (threads of this process, or a
/// shaped network's processes), `get` reading the environment: the cores
/// shared out among the ranks, unless the user chose (that variable or
/// `CANDLE_NUM_THREADS` set); `None` where nothing is to be set (the user's
/// choice, or `ranks` not known here: a rank of a user's own `mpirun`).
///
/// Set for one rank too: candle 0.11 reads the variable at every matrix
/// product and, when it is unset, counts the physical cores by parsing
/// `/proc/cpuinfo` each time (a quarter of the CPU time of a 4-rank
/// training on LocalComm, measured with `perf`).
pub fn compute_threads_to_set(
    ranks: Option<usize>,
    cores: usize,
    get: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<String> {
    let ranks = ranks?;
    if CHOSEN_THREADS_VARS.iter().any(|name| get(name).is_some()) {
        return None;
    }
    Some(compute_threads_per_rank(ranks, cores).to_string())
}

/// Candle's compute threads for each of `ranks` ranks that one machine of
/// `cores` cores runs at once: the cores shared out, at least one, as
/// torchrun gives each of its processes one OpenMP thread. By default
/// candle takes every core in every process, and its element-wise pool,
/// shared by the in-process ranks, runs one operation at a time while its
/// idle workers spin: with two ranks on two cores the transformer's step
/// took twice as long.
fn compute_threads_per_rank(ranks: usize, cores: usize) -> usize {
    (cores / ranks.max(1)).max(1)
}

/// Parses `-s`: a strategy of the registry (`topk:0.01`, ...) or
/// `baseline`; the result is the strategy and whether it is the baseline.
pub fn parse_strategy(text: &str) -> Result<(StrategyConfig, bool)> {
    if text == "baseline" {
        return Ok((StrategyConfig::Dense, true));
    }
    if let Some(half) = text.strip_prefix("baseline:") {
        return match half.parse() {
            Ok(strategy @ StrategyConfig::Half { clip: None, .. }) => Ok((strategy, true)),
            _ => Err(ExperimentError::Usage(format!(
                "{text}: the baseline is dense (baseline) or 16-bit (baseline:fp16, baseline:bf16)"
            ))),
        };
    }
    text.parse().map(|s| (s, false)).map_err(|e| {
        ExperimentError::Usage(match e {
            gradwire_optim::StrategyError::UnknownName { .. } => format!("{e}, or baseline"),
            other => other.to_string(),
        })
    })
}

/// The largest world size the in-process backend is run with here: every
/// worker is a thread.
pub const MAX_LOCAL_WORLD: usize = 256;

/// An error unless `world` ranks fit this process: 1 to
/// [`MAX_LOCAL_WORLD`] (`flag` names the flag that set it).
pub fn check_local_world(flag: &str, world: usize) -> Result<()> {
    if world == 0 || world > MAX_LOCAL_WORLD {
        return Err(ExperimentError::Usage(format!(
            "{flag} must be between 1 and {MAX_LOCAL_WORLD}, got {world}"
        )));
    }
    Ok(())
}

/// The GPT's default target loss (nats per character; `--target-loss`):
/// what the shaped runs in README used (two blocks of width 128 reached it
/// after about 7,000 training windows; the default four blocks were at
/// 2.58 after 7,680).
pub const DEFAULT_TARGET_LOSS: f64 = 2.5;

/// The most weights one layer of a run's model may hold (`--hidden`,
/// `--channels`): 2^26, 256 MiB of f32 per copy, of which every worker
/// keeps several.
pub const MAX_LAYER: usize = 1 << 26;

/// The most epochs a run takes (as many as a checkpoint may record; the
/// bound keeps the step count far from overflowing).
pub const MAX_EPOCHS: usize = 1 << 20;

/// The largest batch per worker a run takes (the digits have 1,797
/// samples; the bound keeps `world * batch` far from overflowing).
pub const MAX_BATCH: usize = 1 << 16;

/// The most micro-batches a step takes (`--accumulate`; with
/// [`MAX_BATCH`] and the largest world, the global batch stays far from
/// overflowing).
pub const MAX_ACCUMULATE: u32 = 1 << 10;

impl TrainConfig {
    /// Whether SGD's momentum is applied by each worker before the exchange
    /// instead of by the optimizer after it: the 1-bit strategy with SGD
    /// (dist-EF-SGDM: the sign of a momentum with error feedback keeps
    /// momentum SGD's accuracy, where momentum after a 1-bit exchange
    /// amplifies the delayed entries of error feedback: 85 % against dense
    /// 96 % on digits, measured).
    pub fn momentum_before_exchange(&self) -> bool {
        matches!(
            self.strategy,
            StrategyConfig::Quantized {
                quantizer: Quantizer::Sign,
                momentum: None,
                ..
            }
        ) && self.optimizer == OptimizerKind::Sgd
            && self.momentum > 0.0
    }

    /// The strategy the run's front end is made with: the registry's,
    /// drawing from the run's seed, with SGD's momentum moved before the
    /// 1-bit exchange ([`TrainConfig::momentum_before_exchange`]).
    pub fn distopt_strategy(&self) -> StrategyConfig {
        let strategy = match self.strategy {
            StrategyConfig::Quantized {
                quantizer,
                error_feedback,
                momentum: None,
            } if self.momentum_before_exchange() => StrategyConfig::Quantized {
                quantizer,
                error_feedback,
                momentum: Some(self.momentum as f32),
            },
            other => other,
        };
        strategy.with_seed(self.seed)
    }

    /// Checks every value; the message names the flag.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ExperimentError::Usage(m));
        check_local_world("--world", self.world)?;
        if !(1..=MAX_EPOCHS).contains(&self.epochs) {
            return bad(format!(
                "--epochs must be between 1 and {MAX_EPOCHS}, got {}",
                self.epochs
            ));
        }
        if !(1..=MAX_BATCH).contains(&self.batch) {
            return bad(format!(
                "--batch must be between 1 and {MAX_BATCH}, got {}",
                self.batch
            ));
        }
        if !(1..=MAX_ACCUMULATE).contains(&self.accumulate) {
            return bad(format!(
                "--accumulate must be between 1 and {MAX_ACCUMULATE}, got {}",
                self.accumulate
            ));
        }
        if self.accumulate > 1 && self.strategy == StrategyConfig::DimReduce {
            return bad(
                "--accumulate: DimReduce's line search evaluates one batch, so its steps take one micro-batch"
                    .into(),
            );
        }
        if self.uneven_shards
            && (self.baseline
                || self.strategy.training_loop() != gradwire_optim::TrainingLoop::Gradients
                || matches!(self.strategy, StrategyConfig::AdaSum { .. }))
        {
            return bad(format!(
                "--uneven-shards: {} does not average gradients, so workers cannot join it \
                 (a gradient strategy that averages: dense, fp16, topk, powersgd, ...)",
                self.label()
            ));
        }
        if self.hidden.contains(&0) {
            return bad("--hidden widths must be at least 1".into());
        }
        if self.channels.is_empty() || self.channels.len() > 3 || self.channels.contains(&0) {
            return bad("--channels takes one to three widths, each at least 1".into());
        }
        if self.model == ModelKind::Gpt
            && let Some(problem) = self.gpt.problem()
        {
            return bad(problem);
        }
        if self.epoch_windows == Some(0) {
            return bad("--epoch-windows must be at least 1".into());
        }
        if !(self.target_loss.is_finite() && self.target_loss > 0.0) {
            return bad(format!(
                "--target-loss must be positive and finite, got {}",
                self.target_loss
            ));
        }
        let layers = crate::model::Model::layer_weights(self);
        if layers.is_none_or(|layers| layers.iter().any(|&n| n > MAX_LAYER)) {
            let flag = match self.model {
                ModelKind::Mlp => "--hidden",
                ModelKind::Cnn => "--channels",
                ModelKind::Gpt => "--width",
            };
            return bad(format!(
                "{flag}: a layer would hold more than {MAX_LAYER} weights"
            ));
        }
        if let Err(e) = self.strategy.validate() {
            return bad(format!("--strategy: {e}"));
        }
        if self.strategy == StrategyConfig::Custom {
            return bad("--strategy: a custom strategy has no name to run".into());
        }
        if self.baseline
            && self.baseline_precision().is_none()
            && self.strategy != StrategyConfig::Dense
        {
            return bad(
                "--strategy: the baseline is dense (baseline) or 16-bit (baseline:fp16, baseline:bf16)"
                    .into(),
            );
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
        if matches!(self.strategy, StrategyConfig::OneBitAdam { .. })
            && !matches!(self.optimizer, OptimizerKind::Adam | OptimizerKind::Adamw)
        {
            return bad("-s onebit-adam is Adam's own: it takes --optimizer adam or adamw".into());
        }
        if self.fusion_threshold == 0 {
            return bad("--fusion-threshold must be at least 1".into());
        }
        if let StrategyConfig::AdaSum { group: Some(group) }
        | StrategyConfig::DeltaWeight { group: Some(group) } = self.strategy
            && !self.world.is_multiple_of(group)
        {
            return bad(format!(
                "--strategy: AdaSum's group must divide --world ({}), got {group}",
                self.world
            ));
        }
        if self.components == 0 {
            return bad("--components must be at least 1".into());
        }
        // A dense stage as long as the run is allowed: a run may stop in it
        // and be resumed with more epochs.
        if self.dimreduce_dense_epochs == Some(0) && self.strategy == StrategyConfig::DimReduce {
            return bad("--dimreduce-dense-epochs must be at least 1 (or give --pca)".into());
        }
        // Written at the end of the run: a directory that is not there
        // would throw the whole run away.
        if let Some(path) = &self.timeline {
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => std::path::Path::new("."),
            };
            if !dir.is_dir() {
                return bad(format!(
                    "--timeline: the directory {} does not exist",
                    dir.display()
                ));
            }
        }
        Ok(())
    }

    /// DimReduce's dense epochs (0 with a PCA file; by default half the
    /// run, at least one).
    pub fn dense_epochs(&self) -> usize {
        if self.strategy != StrategyConfig::DimReduce || self.pca.is_some() {
            return 0;
        }
        self.dimreduce_dense_epochs
            .unwrap_or(self.epochs / 2)
            .max(1)
    }

    /// Samples per step over all workers: world x batch x accumulate.
    pub fn global_batch(&self) -> usize {
        self.world * self.batch * self.accumulate as usize
    }

    /// The 16-bit format the baseline sends, if it is the 16-bit baseline
    /// (`baseline:fp16`, `baseline:bf16`: Horovod's fp16 compression, the
    /// gradients cast, summed by the library in 16 bits, cast back).
    pub fn baseline_precision(&self) -> Option<HalfPrecision> {
        match self.strategy {
            StrategyConfig::Half {
                precision,
                clip: None,
            } if self.baseline => Some(precision),
            _ => None,
        }
    }

    /// A short label for tables and plots: the strategy and what sets it apart.
    pub fn label(&self) -> String {
        if self.baseline {
            return match self.baseline_precision() {
                Some(_) => format!("baseline {}", self.strategy),
                None => "baseline".into(),
            };
        }
        let percent = |r: f64| {
            let p = r * 100.0;
            if p >= 1.0 {
                format!("{p:.0} %")
            } else {
                format!("{p:.1} %")
            }
        };
        let name = self.strategy.name();
        let ef = if self.strategy.error_feedback() {
            ""
        } else {
            ", no EF"
        };
        match self.strategy {
            StrategyConfig::Sparse { codec, .. } => match codec {
                SparseCodec::Threshold(t) => format!("threshold {t}{ef}"),
                SparseCodec::TopK(r)
                | SparseCodec::SampledTopK(r)
                | SparseCodec::RandomK { ratio: r, .. } => format!("{name} {}{ef}", percent(r)),
            },
            StrategyConfig::PowerSgd(config) => format!("powersgd rank {}{ef}", config.rank),
            StrategyConfig::Quantized { .. } => format!("{name}{ef}"),
            // The printed form's settings: H, the codec, the outer rule.
            StrategyConfig::DiLoCo(_) => self.strategy.to_string().replacen(':', " ", 1),
            // The printed form: its settings where they are not the
            // defaults (`partial:state`), so that no two rows share a label.
            _ => self.strategy.to_string(),
        }
    }
}

/// The first format of a saved configuration: the strategy by name, its
/// settings in fields of their own (`ratio`, `threshold`, ...). Both
/// formats read through [`TrainConfigRecord`](legacy::TrainConfigRecord).
mod legacy {
    use super::*;

    /// A saved configuration of either format.
    #[derive(Debug, Deserialize)]
    #[serde(default)]
    pub struct TrainConfigRecord {
        strategy: String,
        baseline: bool,
        world: usize,
        epochs: usize,
        batch: usize,
        accumulate: u32,
        uneven_shards: bool,
        model: ModelKind,
        hidden: Vec<usize>,
        channels: Vec<usize>,
        gpt: GptShape,
        corpus: PathBuf,
        epoch_windows: Option<usize>,
        target_loss: f64,
        fusion_threshold: usize,
        optimizer: OptimizerKind,
        lr: f64,
        momentum: f64,
        schedule: ScheduleKind,
        seed: u64,
        dimreduce_dense_epochs: Option<usize>,
        components: usize,
        pca: Option<PathBuf>,
        // The first format's strategy settings.
        ratio: Option<f64>,
        threshold: Option<f32>,
        error_feedback: Option<bool>,
        clip: Option<f32>,
        average_state: Option<bool>,
        adasum_group: Option<usize>,
        powersgd_rank: Option<usize>,
        powersgd_start_step: Option<u64>,
        freeze_step: Option<u64>,
    }

    impl Default for TrainConfigRecord {
        fn default() -> Self {
            let d = TrainConfig::default();
            TrainConfigRecord {
                strategy: d.strategy.to_string(),
                baseline: d.baseline,
                world: d.world,
                epochs: d.epochs,
                batch: d.batch,
                accumulate: d.accumulate,
                uneven_shards: d.uneven_shards,
                model: d.model,
                hidden: d.hidden,
                channels: d.channels,
                gpt: d.gpt,
                corpus: d.corpus,
                epoch_windows: d.epoch_windows,
                target_loss: d.target_loss,
                fusion_threshold: d.fusion_threshold,
                optimizer: d.optimizer,
                lr: d.lr,
                momentum: d.momentum,
                schedule: d.schedule,
                seed: d.seed,
                dimreduce_dense_epochs: d.dimreduce_dense_epochs,
                components: d.components,
                pca: d.pca,
                ratio: None,
                threshold: None,
                error_feedback: None,
                clip: None,
                average_state: None,
                adasum_group: None,
                powersgd_rank: None,
                powersgd_start_step: None,
                freeze_step: None,
            }
        }
    }

    impl TrainConfigRecord {
        /// The strategy and whether it is the baseline: the printed form, or
        /// the first format's name with its settings. An unreadable one is
        /// an error, never another run.
        fn strategy(&self) -> Result<(StrategyConfig, bool)> {
            let (mut s, baseline) = parse_strategy(&self.strategy)?;
            match &mut s {
                StrategyConfig::Half { clip, .. } => *clip = self.clip.or(*clip),
                StrategyConfig::Sparse {
                    codec,
                    error_feedback,
                } => {
                    *error_feedback = self.error_feedback.unwrap_or(*error_feedback);
                    match codec {
                        SparseCodec::Threshold(t) => *t = self.threshold.unwrap_or(*t),
                        SparseCodec::TopK(r)
                        | SparseCodec::SampledTopK(r)
                        | SparseCodec::RandomK { ratio: r, .. } => *r = self.ratio.unwrap_or(*r),
                    }
                }
                StrategyConfig::PowerSgd(config) => {
                    config.rank = self.powersgd_rank.unwrap_or(config.rank);
                    config.start_step = self.powersgd_start_step.unwrap_or(config.start_step);
                    config.error_feedback = self.error_feedback.unwrap_or(config.error_feedback);
                }
                StrategyConfig::Quantized { error_feedback, .. } => {
                    *error_feedback = self.error_feedback.unwrap_or(*error_feedback)
                }
                StrategyConfig::OneBitAdam { freeze_step, .. } => {
                    *freeze_step = self.freeze_step.unwrap_or(*freeze_step)
                }
                StrategyConfig::AdaSum { group } | StrategyConfig::DeltaWeight { group } => {
                    *group = self.adasum_group.or(*group)
                }
                StrategyConfig::Partial { average_state } => {
                    *average_state = self.average_state.unwrap_or(*average_state)
                }
                StrategyConfig::Dense
                | StrategyConfig::Custom
                | StrategyConfig::DimReduce
                | StrategyConfig::DiLoCo(_) => {}
            }
            Ok((s, baseline))
        }
    }

    impl TryFrom<TrainConfigRecord> for TrainConfig {
        type Error = ExperimentError;

        fn try_from(r: TrainConfigRecord) -> Result<TrainConfig> {
            let (strategy, baseline) = r.strategy()?;
            Ok(TrainConfig {
                strategy,
                baseline: baseline || r.baseline,
                world: r.world,
                epochs: r.epochs,
                batch: r.batch,
                accumulate: r.accumulate,
                uneven_shards: r.uneven_shards,
                model: r.model,
                hidden: r.hidden,
                channels: r.channels,
                gpt: r.gpt,
                corpus: r.corpus,
                epoch_windows: r.epoch_windows,
                target_loss: r.target_loss,
                fusion_threshold: r.fusion_threshold,
                optimizer: r.optimizer,
                lr: r.lr,
                momentum: r.momentum,
                schedule: r.schedule,
                seed: r.seed,
                dimreduce_dense_epochs: r.dimreduce_dense_epochs,
                components: r.components,
                pca: r.pca,
                timeline: None,
            })
        }
    }
}

#[cfg(test)]
mod tests;
