//! What a training run is: the strategy with its parameters, the model, the
//! optimizer and schedule, the world size and the seed; validated before
//! anything starts; with the flags every run shares ([`RunArgs`]) and the
//! choice of communicator ([`BackendKind`]).
//!
//! The bounds and the checks are `validate`; what the settings make (the
//! strategy given to DistOpt, labels) is `strategy`; candle's compute
//! threads are `threads`; the first saved format is `legacy`.

use crate::model::GptShape;
use gradwire_optim::StrategyConfig;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

mod legacy;
mod strategy;
mod threads;
mod validate;

pub use strategy::parse_strategy;
pub(crate) use threads::CHOSEN_THREADS_VARS;
// Only `network::launch`'s tests name candle's variable outside `threads`.
#[cfg(test)]
pub(crate) use threads::CANDLE_THREADS_VAR;
pub use threads::{COMPUTE_THREADS_VAR, compute_threads_to_set};
pub use validate::{
    MAX_ACCUMULATE, MAX_BATCH, MAX_EPOCHS, MAX_LAYER, MAX_LOCAL_WORLD, check_local_world,
};

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

/// The GPT's default target loss (nats per character; `--target-loss`):
/// what the shaped runs in README used (two blocks of width 128 reached it
/// after about 7,000 training windows; the default four blocks were at
/// 2.58 after 7,680).
pub const DEFAULT_TARGET_LOSS: f64 = 2.5;

#[cfg(test)]
mod tests;
