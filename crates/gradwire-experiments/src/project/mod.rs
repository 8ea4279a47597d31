//! `gradwire project`: seconds per training step, and the speedup over
//! dense f32, of every strategy on models and networks this machine does
//! not have (ResNet-50 and BERT-Large on 8 to 1024 workers over 10 to 100
//! Gbit/s links), from gradwire-algos' alpha-beta cost model
//! ([`gradwire_algos::cost`]): each strategy's exact collectives per step
//! (its bytes and its number of calls, DistOpt's buckets included), timed
//! on the link under a ring, tree or hierarchical algorithm, plus compute
//! and codec time.
//!
//! Compute comes from published single-GPU throughputs (cited in
//! [`models`]) or `--compute-ms`; codec time from this repository's codec
//! benchmarks (a fraction of one core's memcpy, `--memcpy-gbps`), or, with
//! `--profile`, from a shaped `gradwire compare --network` run, scaled by
//! parameter count ([`gradwire_algos::cost::scale_codec_secs`]); the
//! profile's steps to the target accuracy turn seconds per step into time
//! to accuracy. Nothing overlaps (gradwire's CLI computes every gradient
//! before the first bucket leaves).

pub mod models;
mod plot;
mod profile;
mod report;
mod validate;

pub use models::{
    ModelSpec, Selection, StrategyEntry, assumptions_of, bert_large_shapes, entry_of,
    resnet18_cifar_shapes,
};
pub use plot::write_plots;
pub use profile::{Profile, ProfileBurst, ProfileLink, ProfileSpread, ProfileStrategy};
pub use report::{print_report, published_comparison};
pub use validate::{
    LATENCY_WARNING, MODEL_WARNING, baseline_bytes, collectives_of, model_warnings, predictions,
    profile_of, selection_of, shapes_of, warm_up_of,
};

use crate::compare::configs;
use crate::config::TrainConfig;
use crate::error::{ExperimentError, Result};
use crate::network::Rate;
use gradwire_algos::cost::{
    Algorithm, Bucketing, Collective, DEFAULT_FUSION_THRESHOLD, Link, StepModel, StrategySpec,
    bytes_sent, communication_secs, peak_bytes, predict_step_secs, scale_codec_secs,
    step_collectives,
};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The most workers a projection takes (`--workers`): a million, past any
/// cluster the cost model was validated for, and within the memory of the
/// per-worker tables it builds.
pub const MAX_WORKERS: usize = 1 << 20;

/// `gradwire project`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ProjectArgs {
    /// Models: resnet50, bert-large, resnet18-cifar.
    #[arg(long, value_delimiter = ',', default_value = "resnet50,bert-large")]
    pub models: Vec<String>,
    /// Link rates (100mbit, 10gbit, 2.5gbit, ...).
    #[arg(long, value_delimiter = ',', default_value = "10gbit,25gbit,100gbit")]
    pub rates: Vec<String>,
    /// Worker counts.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "8,16,32,64,128,256,512,1024"
    )]
    pub workers: Vec<usize>,
    /// Collective algorithms: ring, tree, hierarchical:G (G ranks per node).
    #[arg(long, value_delimiter = ',', default_value = "ring,hierarchical:8")]
    pub algorithm: Vec<String>,
    /// One-way latency of the network per message, microseconds (5: a
    /// datacenter NIC and switch hop with a kernel-bypass stack; TCP
    /// through the kernel is nearer 20 to 50).
    #[arg(long, default_value_t = 5.0)]
    pub latency_us: f64,
    /// The intra-node link of hierarchical (1000gbit: about the 130 GB/s
    /// all-reduce bus bandwidth of 8 V100s over NVLink 2).
    #[arg(long, default_value = "1000gbit")]
    pub intra_rate: String,
    /// The intra-node link's latency, microseconds.
    #[arg(long, default_value_t = 2.0)]
    pub intra_latency_us: f64,
    /// Strategies, labelled as `gradwire compare` labels them
    /// (`topk:0.01`, `powersgd:4`, ...).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "dense,fp16,topk:0.01,randomk:0.01,powersgd:4,onebit,uint8,dimreduce"
    )]
    pub strategies: Vec<String>,
    /// A shaped run's profile (JSON, [`Profile`]): codec and other time per
    /// step scaled by parameter count, and steps to the target accuracy.
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Forward + backward milliseconds per step for every model, instead
    /// of the published figures.
    #[arg(long)]
    pub compute_ms: Option<f64>,
    /// One core's memcpy, GB/s: the codecs' throughputs are fractions of
    /// it (this repository's `bench compress`).
    #[arg(long, default_value_t = 10.0)]
    pub memcpy_gbps: f64,
    /// DistOpt's fusion threshold, elements.
    #[arg(long, default_value_t = DEFAULT_FUSION_THRESHOLD)]
    pub fusion_threshold: usize,
    /// Where project.json and the plots go.
    #[arg(long, default_value = "target/gradwire-project")]
    pub out: PathBuf,
}

/// Parses a link rate (`100mbit`, `10gbit`, `400kbit`, `1tbit`) into bits
/// per second: [`Rate::any`].
pub fn parse_rate(text: &str) -> Result<u64> {
    Rate::any(text).map(|r| r.bits_per_s)
}

/// Parses `ring`, `tree` or `hierarchical:<ranks per node>` (with
/// `intra`, the link inside a node).
pub fn parse_algorithm(text: &str, intra: Link) -> Result<(String, Algorithm)> {
    let bad = || {
        ExperimentError::Usage(format!(
            "algorithm {text:?}: one of ring, tree, hierarchical:<ranks per node>"
        ))
    };
    match text.trim() {
        "ring" => Ok(("ring".into(), Algorithm::Ring)),
        "tree" => Ok(("tree".into(), Algorithm::Tree)),
        other => {
            let g: usize = other
                .strip_prefix("hierarchical:")
                .ok_or_else(bad)?
                .parse()
                .map_err(|_| bad())?;
            if g == 0 {
                return Err(bad());
            }
            Ok((
                format!("hierarchical:{g}"),
                Algorithm::Hierarchical {
                    ranks_per_node: g,
                    intra,
                },
            ))
        }
    }
}

/// Everything a projection is computed from (the flags, parsed).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The models.
    pub models: Vec<ModelSpec>,
    /// Link rates, bits per second.
    pub rates: Vec<u64>,
    /// Worker counts.
    pub workers: Vec<usize>,
    /// Algorithms, with their labels.
    pub algorithms: Vec<(String, Algorithm)>,
    /// The network's latency, seconds.
    pub latency_s: f64,
    /// The strategies (dense is always computed too, as the reference).
    pub strategies: Vec<StrategyEntry>,
    /// One core's memcpy, bytes per second.
    pub memcpy_bytes_per_s: f64,
    /// DistOpt's buckets.
    pub bucketing: Bucketing,
    /// A shaped run's profile.
    pub profile: Option<Profile>,
}

impl Settings {
    /// The settings of `args`, every flag checked.
    pub fn from_args(args: &ProjectArgs) -> Result<Settings> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(ExperimentError::Usage(format!(
                    "--{name} must be at least 0, got {v}"
                )))
            }
        };
        let latency_s = positive("latency-us", args.latency_us)? * 1e-6;
        let intra = Link::from_bit_rate(
            parse_rate(&args.intra_rate)? as f64,
            positive("intra-latency-us", args.intra_latency_us)? * 1e-6,
        )?;
        let mut models = args
            .models
            .iter()
            .map(|m| ModelSpec::by_name(m.trim()))
            .collect::<Result<Vec<_>>>()?;
        if let Some(ms) = args.compute_ms {
            let s = positive("compute-ms", ms)? * 1e-3;
            for m in &mut models {
                m.compute_s = s;
                m.compute_source = "--compute-ms".into();
            }
        }
        if let Some(w) = args.workers.iter().find(|&&w| w == 0 || w > MAX_WORKERS) {
            return Err(ExperimentError::Usage(format!(
                "--workers must be between 1 and {MAX_WORKERS}, got {w}"
            )));
        }
        let strategies = configs(&TrainConfig::default(), &args.strategies)?
            .iter()
            .map(|c| entry_of(c, None))
            .collect::<Result<Vec<_>>>()?;
        let memcpy = positive("memcpy-gbps", args.memcpy_gbps)?;
        if memcpy == 0.0 || args.fusion_threshold == 0 {
            return Err(ExperimentError::Usage(
                "--memcpy-gbps and --fusion-threshold must be positive".into(),
            ));
        }
        let settings = Settings {
            models,
            rates: args
                .rates
                .iter()
                .map(|r| parse_rate(r))
                .collect::<Result<_>>()?,
            workers: args.workers.clone(),
            algorithms: args
                .algorithm
                .iter()
                .map(|a| parse_algorithm(a, intra))
                .collect::<Result<_>>()?,
            latency_s,
            strategies,
            memcpy_bytes_per_s: memcpy * 1e9,
            bucketing: Bucketing {
                fusion_threshold: args.fusion_threshold,
                // DistOpt's 4 Mi capacity refuses BERT's 31 M-entry word
                // embedding; the projection assumes it raised to fit.
                capacity: usize::MAX,
                vote_per_bucket: true,
            },
            profile: args.profile.as_deref().map(Profile::load).transpose()?,
        };
        if settings.models.is_empty()
            || settings.rates.is_empty()
            || settings.workers.is_empty()
            || settings.algorithms.is_empty()
        {
            return Err(ExperimentError::Usage(
                "--models, --rates, --workers and --algorithm need a value each".into(),
            ));
        }
        Ok(settings)
    }
}

/// One projected (model, algorithm, rate, W, strategy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProjectionRow {
    /// The model.
    pub model: String,
    /// Its parameters.
    pub params: usize,
    /// The collective algorithm.
    pub algorithm: String,
    /// The link's rate, bits per second.
    pub rate_bits_per_s: u64,
    /// Workers.
    pub world: usize,
    /// The strategy's label.
    pub strategy: String,
    /// Bytes a worker (rank 0) sends per step (the mean over a round).
    pub bytes_per_step: f64,
    /// Bytes a worker sends in its largest single exchange: a step's, a
    /// DiLoCo round's, a Streaming DiLoCo fragment's (the peak the link
    /// must carry at once, where `bytes_per_step` is the mean).
    #[serde(default)]
    pub peak_bytes: f64,
    /// Collective calls per step.
    pub calls_per_step: usize,
    /// Seconds of communication per step.
    pub comm_s: f64,
    /// Seconds of compute per step.
    pub compute_s: f64,
    /// Seconds of codec per step.
    pub codec_s: f64,
    /// Other seconds per step.
    pub other_s: f64,
    /// Predicted seconds per step.
    pub step_s: f64,
    /// Dense's seconds per step over this one's.
    pub speedup: f64,
    /// Steps to the target over dense's (from the profile).
    pub relative_steps: Option<f64>,
    /// Dense's time to the target over this one's (from the profile).
    pub time_to_accuracy_speedup: Option<f64>,
}

/// A profile's own check: what it measured against what it predicted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationRow {
    /// The strategy.
    pub strategy: String,
    /// Measured seconds per step.
    pub measured_s: f64,
    /// Predicted seconds per step.
    pub predicted_s: f64,
    /// (predicted - measured) / measured.
    pub error: f64,
}

/// A whole projection: what was assumed, the rows, the profile's check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Projection {
    /// The assumptions, one sentence each.
    pub assumptions: Vec<String>,
    /// The rows, by model, algorithm, rate, workers, strategy.
    pub rows: Vec<ProjectionRow>,
    /// The profile's measured against predicted, if one was given.
    pub validation: Vec<ValidationRow>,
}

/// Codec and other seconds per step of `entry` on `model` at `world`.
fn side_costs(
    settings: &Settings,
    model: &ModelSpec,
    entry: &StrategyEntry,
    calls: &[gradwire_algos::cost::CollectiveCall],
    world: usize,
) -> Result<(f64, f64)> {
    let params = model.params();
    if let Some(measured) = settings
        .profile
        .as_ref()
        .and_then(|p| p.strategy(&entry.label).map(|s| (p, s)))
    {
        let (profile, s) = measured;
        return Ok((
            scale_codec_secs(s.codec_s_per_step, profile.params, params)?,
            scale_codec_secs(s.other_s_per_step, profile.params, params)?,
        ));
    }
    let memcpy = settings.memcpy_bytes_per_s;
    let mut codec = if entry.codec_fraction > 0.0 {
        4.0 * params as f64 / (entry.codec_fraction * memcpy)
    } else {
        0.0
    };
    let mut other = 0.0;
    // Each rank projects its own slice of the parameters only; each trial
    // point costs a forward pass (a third of forward + backward).
    if let StrategySpec::DimReduce { trials, .. } = entry.spec {
        codec /= world as f64;
        other = trials as f64 * model.compute_s / 3.0;
    }
    // Decoding and adding every rank's payload, at memcpy speed (per step:
    // DiLoCo's once a round).
    let sparse = |spec: &StrategySpec| {
        matches!(
            spec,
            StrategySpec::TopK { .. } | StrategySpec::SampledTopK { .. }
        )
    };
    if match &entry.spec {
        StrategySpec::Outer { codec, .. } => sparse(codec),
        spec => sparse(spec),
    } {
        let gathered: f64 = calls
            .iter()
            .map(|c| match c.collective {
                Collective::AllGatherVaried { total, .. } => total as f64 / c.period as f64,
                _ => 0.0,
            })
            .sum();
        codec += gathered / memcpy;
    }
    Ok((codec, other))
}

/// One row: `entry` on `model` at `world` ranks over a link of `rate`
/// under `algorithm` (its speedup left at 1).
pub(crate) fn predict_row(
    settings: &Settings,
    model: &ModelSpec,
    (alg_label, algorithm): (&str, &Algorithm),
    rate: u64,
    world: usize,
    entry: &StrategyEntry,
) -> Result<ProjectionRow> {
    let link = Link::from_bit_rate(rate as f64, settings.latency_s)?;
    let calls = step_collectives(&entry.spec, &model.shapes, world, &settings.bucketing)?;
    let (codec_s, other_s) = side_costs(settings, model, entry, &calls, world)?;
    let step = StepModel {
        compute_s: model.compute_s,
        codec_s,
        other_s,
        overlap: 0.0,
    };
    Ok(ProjectionRow {
        model: model.name.clone(),
        params: model.params(),
        algorithm: alg_label.to_string(),
        rate_bits_per_s: rate,
        world,
        strategy: entry.label.clone(),
        bytes_per_step: bytes_sent(&calls),
        peak_bytes: peak_bytes(&calls) as f64,
        calls_per_step: calls.len(),
        comm_s: communication_secs(&calls, world, &link, algorithm)?,
        compute_s: model.compute_s,
        codec_s,
        other_s,
        step_s: predict_step_secs(&step, &calls, world, &link, algorithm)?,
        speedup: 1.0,
        relative_steps: None,
        time_to_accuracy_speedup: None,
    })
}

/// Dense f32, the reference of every speedup.
pub(crate) fn dense_entry() -> StrategyEntry {
    StrategyEntry {
        label: "dense".into(),
        spec: StrategySpec::Dense,
        codec_fraction: 0.0,
        codec_source: "none",
    }
}

/// Computes the projection of `settings`.
pub fn project(settings: &Settings) -> Result<Projection> {
    let mut rows = Vec::new();
    for model in &settings.models {
        for (alg_label, algorithm) in &settings.algorithms {
            for &rate in &settings.rates {
                for &world in &settings.workers {
                    let at = (alg_label.as_str(), algorithm);
                    let dense = predict_row(settings, model, at, rate, world, &dense_entry())?;
                    for entry in &settings.strategies {
                        let mut row = predict_row(settings, model, at, rate, world, entry)?;
                        row.speedup = dense.step_s / row.step_s;
                        if let Some(rel) = settings
                            .profile
                            .as_ref()
                            .and_then(|p| p.relative_steps(&entry.label))
                        {
                            row.relative_steps = Some(rel);
                            row.time_to_accuracy_speedup = Some(row.speedup / rel);
                        }
                        rows.push(row);
                    }
                }
            }
        }
    }
    let validation = settings
        .profile
        .iter()
        .flat_map(|p| &p.strategies)
        .filter(|s| s.measured_s_per_step > 0.0)
        .map(|s| ValidationRow {
            strategy: s.label.clone(),
            measured_s: s.measured_s_per_step,
            predicted_s: s.predicted_s_per_step,
            error: (s.predicted_s_per_step - s.measured_s_per_step) / s.measured_s_per_step,
        })
        .collect();
    Ok(Projection {
        assumptions: assumptions(settings),
        rows,
        validation,
    })
}

/// The projection's assumptions, in words.
fn assumptions(settings: &Settings) -> Vec<String> {
    let mut out = vec![
        format!(
            "network latency {:.1} us per message; every rank has its own link of the rate \
             (hierarchical: one NIC per GPU)",
            settings.latency_s * 1e6
        ),
        "no overlap: every gradient is computed before the first bucket leaves (gradwire's CLI)"
            .to_string(),
        format!(
            "DistOpt buckets of {} elements, one vote per bucket, capacity raised to fit \
             BERT's embedding",
            settings.bucketing.fusion_threshold
        ),
        format!(
            "sampled top-k keeps {} k; DimReduce accepts its first trial (one forward pass)",
            models::SAMPLED_OVERSHOOT
        ),
    ];
    for m in &settings.models {
        out.push(format!(
            "{}: {} parameters, compute {:.1} ms per step ({})",
            m.name,
            m.params(),
            m.compute_s * 1e3,
            m.compute_source
        ));
    }
    match &settings.profile {
        Some(p) => out.push(format!(
            "codec and other time from a profile of {} parameters on {} ranks at {} bit/s, \
             scaled by parameter count",
            p.params, p.world, p.rate_bits_per_s
        )),
        None => {
            out.push(format!(
                "codec time: one CPU core at a fraction of a {:.0} GB/s memcpy (gradwire's \
                 CLI codecs run on the CPU; for codecs on the GPU pass --memcpy-gbps near \
                 its memory bandwidth, e.g. 500 for a V100); no profile, so no time to \
                 accuracy (seconds per step only)",
                settings.memcpy_bytes_per_s / 1e9
            ));
            for s in &settings.strategies {
                if s.codec_fraction > 0.0 {
                    out.push(format!(
                        "{} codec: {:.0} % of memcpy ({})",
                        s.label,
                        s.codec_fraction * 100.0,
                        s.codec_source
                    ));
                }
            }
        }
    }
    out
}

/// Runs `gradwire project`: computes, prints the tables and the comparison
/// with published results, writes `project.json` and the plots.
pub fn run(args: &ProjectArgs) -> Result<()> {
    let settings = Settings::from_args(args)?;
    let projection = project(&settings)?;
    print_report(&projection, &settings);
    std::fs::create_dir_all(&args.out).map_err(|source| ExperimentError::Io {
        path: args.out.display().to_string(),
        source,
    })?;
    let json_path = args.out.join("project.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&projection)?).map_err(|source| {
        ExperimentError::Io {
            path: json_path.display().to_string(),
            source,
        }
    })?;
    println!("wrote {}", json_path.display());
    match write_plots(&projection, &args.out) {
        Ok(files) => {
            for f in files {
                println!("wrote {}", f.display());
            }
        }
        // No font: the numbers are written; say why the plots are not.
        Err(e @ ExperimentError::Plot { .. }) if matches!(&e, ExperimentError::Plot { path, .. } if path == "(font)") =>
        {
            eprintln!("no plots: {e}")
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
