//! `gradwire project`'s parsing, projection, profile and plots, and the
//! analytic bytes against what DistOpt sends.

use super::*;
use crate::bench::strategies::{mlp_shapes, strategies};
use crate::error::assert_usage;
use gradwire_algos::cost::{CollectiveCall, Link};
use gradwire_optim::StrategyConfig;

fn args() -> ProjectArgs {
    ProjectArgs {
        models: vec!["resnet50".into()],
        rates: vec!["10gbit".into()],
        workers: vec![8],
        algorithm: vec!["ring".into()],
        latency_us: 5.0,
        intra_rate: "1000gbit".into(),
        intra_latency_us: 2.0,
        strategies: vec!["dense".into(), "topk:0.01".into()],
        profile: None,
        compute_ms: None,
        memcpy_gbps: 10.0,
        fusion_threshold: DEFAULT_FUSION_THRESHOLD,
        out: PathBuf::from("unused"),
    }
}

#[test]
fn rates_parse_and_bad_ones_say_why() {
    assert_eq!(parse_rate("100mbit").unwrap(), 100_000_000);
    assert_eq!(parse_rate("10gbit").unwrap(), 10_000_000_000);
    assert_eq!(parse_rate("2.5Gbit").unwrap(), 2_500_000_000);
    assert_eq!(parse_rate(" 400kbit ").unwrap(), 400_000);
    assert_eq!(parse_rate("1tbit").unwrap(), 1_000_000_000_000);
    for bad in [
        "10", "10mbps", "gbit", "-1gbit", "0gbit", "nangbit", "1e30tbit", "",
    ] {
        let e = parse_rate(bad).unwrap_err();
        assert!(matches!(e, ExperimentError::Usage(_)), "{bad}: {e}");
    }
}

#[test]
fn algorithms_and_flags_are_checked() {
    let intra = Link::new(1e-6, 1e11).unwrap();
    assert_eq!(parse_algorithm("ring", intra).unwrap().1, Algorithm::Ring);
    assert_eq!(parse_algorithm("tree", intra).unwrap().1, Algorithm::Tree);
    assert_eq!(
        parse_algorithm("hierarchical:8", intra).unwrap().1,
        Algorithm::Hierarchical {
            ranks_per_node: 8,
            intra
        }
    );
    for bad in ["hierarchical:0", "hierarchical", "hierarchical:x", "star"] {
        assert_usage(
            parse_algorithm(bad, intra),
            &format!("algorithm {bad:?}: one of ring, tree"),
        );
    }
    type Change = fn(&mut ProjectArgs);
    let cases: Vec<(Change, &str)> = vec![
        (|a| a.models = vec!["gpt".into()], "unknown model \"gpt\""),
        (|a| a.workers = vec![0], "--workers must be between 1 and"),
        (|a| a.latency_us = -1.0, "--latency-us must be at least 0"),
        (
            |a| a.strategies = vec!["threshold".into()],
            "threshold is not modelled",
        ),
        (|a| a.memcpy_gbps = 0.0, "--memcpy-gbps"),
        (|a| a.rates = vec![], "--rates"),
    ];
    for (change, what) in cases {
        let mut a = args();
        change(&mut a);
        assert_usage(Settings::from_args(&a), what);
    }
    // A profile that cannot be read: the file's I/O error.
    let mut a = args();
    a.profile = Some(PathBuf::from("/nonexistent/profile.json"));
    let result = Settings::from_args(&a);
    assert!(
        matches!(&result, Err(ExperimentError::Io { path, source })
            if path == "/nonexistent/profile.json" && source.kind() == std::io::ErrorKind::NotFound),
        "{:?}",
        result.err()
    );
    assert!(Settings::from_args(&args()).is_ok());
}

/// One tensor of 4 f32, two workers, 1 ms per message and 1000 bytes/s:
/// the vote (1 byte, and 8 per rank of arrivals) then the all-reduce of 16
/// bytes, each a ring all-reduce, 2 (W - 1) alpha + 2 (W - 1) / W n beta,
/// then the agreement on the updates, a barrier of log2(W) alpha.
#[test]
fn a_tiny_projection_matches_the_hand_computed_figures() {
    let model = ModelSpec {
        name: "tiny".into(),
        shapes: vec![vec![4]],
        compute_s: 0.1,
        compute_source: "test".into(),
    };
    let mut settings = Settings::from_args(&ProjectArgs {
        strategies: vec!["dense".into(), "fp16".into()],
        ..args()
    })
    .unwrap();
    settings.models = vec![model];
    settings.rates = vec![8000];
    settings.workers = vec![1, 2];
    settings.latency_s = 1e-3;
    settings.strategies[1].codec_fraction = 0.5;
    let p = project(&settings).unwrap();
    assert_eq!(p.rows.len(), 4);
    let dense2 = &p.rows[2];
    assert_eq!((dense2.world, dense2.strategy.as_str()), (2, "dense"));
    // Vote: 2 ms + 17 ms; data: 2 ms + 16 ms; agreement: 1 ms.
    assert!((dense2.comm_s - 0.038).abs() < 1e-12, "{}", dense2.comm_s);
    assert!((dense2.step_s - 0.138).abs() < 1e-12);
    assert_eq!(dense2.bytes_per_step, 33.0);
    assert_eq!(dense2.calls_per_step, 3);
    // fp16: 8 bytes, plus a codec of 16 bytes at half of 10 GB/s.
    let half2 = &p.rows[3];
    assert!((half2.comm_s - 0.030).abs() < 1e-12, "{}", half2.comm_s);
    let codec = 16.0 / 5e9;
    assert!((half2.step_s - (0.1 + codec + 0.030)).abs() < 1e-12);
    assert!((half2.speedup - 0.138 / (0.130 + codec)).abs() < 1e-12);
    // One worker: no communication at all.
    assert_eq!(p.rows[0].comm_s, 0.0);
    assert_eq!(p.rows[0].step_s, 0.1);
    assert!(p.rows.iter().all(|r| r.time_to_accuracy_speedup.is_none()));
}

fn profile() -> Profile {
    let s = |label: &str, codec: f64, steps: Option<u64>| ProfileStrategy {
        label: label.into(),
        compute_s_per_step: 0.01,
        codec_s_per_step: codec,
        other_s_per_step: 0.001,
        imbalance_s_per_step: 0.002,
        measured_s_per_step: 0.05,
        predicted_s_per_step: 0.045,
        steps_to_target: steps,
        final_accuracy: 0.95,
        final_loss: 0.2,
    };
    Profile {
        rate_bits_per_s: 1_000_000_000,
        world: 4,
        params: 1_000_000,
        link: ProfileLink {
            latency_s: 60e-6,
            bytes_per_s: 1.2e8,
            spread: None,
        },
        library_link: None,
        latency_before_after_s: Some((60e-6, 75e-6)),
        burst: Some(ProfileBurst {
            bucket_bytes: 98_304,
            refill_s: 0.008,
            all_reduce_bytes: 131_072,
            back_to_back_s: 0.016,
            after_pause_s: 0.009,
        }),
        strategies: vec![s("dense", 0.0, Some(400)), s("topk 1 %", 0.004, Some(500))],
    }
}

#[test]
fn profiles_round_trip_and_scale() {
    let p = profile();
    let json = serde_json::to_string_pretty(&p).unwrap();
    assert_eq!(serde_json::from_str::<Profile>(&json).unwrap(), p);
    assert_eq!(p.relative_steps("topk 1 %"), Some(1.25));
    assert_eq!(p.relative_steps("fp16"), None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.json");
    std::fs::write(&path, &json).unwrap();
    let settings = Settings::from_args(&ProjectArgs {
        profile: Some(path),
        ..args()
    })
    .unwrap();
    let projection = project(&settings).unwrap();
    let topk = projection
        .rows
        .iter()
        .find(|r| r.strategy == "topk 1 %")
        .unwrap();
    // Codec scaled by parameter count: 4 ms on 1 M, ResNet-50's 25.6 M.
    assert!((topk.codec_s - 0.004 * 25.557032).abs() < 1e-9);
    assert_eq!(topk.relative_steps, Some(1.25));
    let tta = topk.time_to_accuracy_speedup.unwrap();
    assert!((tta - topk.speedup / 1.25).abs() < 1e-12);
    assert_eq!(projection.validation.len(), 2);
    assert!((projection.validation[0].error + 0.1).abs() < 1e-12);
    let json = serde_json::to_string(&projection).unwrap();
    assert_eq!(
        serde_json::from_str::<Projection>(&json).unwrap(),
        projection
    );
}

#[test]
fn plots_and_json_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("project");
    let a = ProjectArgs {
        workers: vec![8, 16, 32],
        rates: vec!["10gbit".into(), "100gbit".into()],
        algorithm: vec!["ring".into(), "hierarchical:8".into()],
        out: out.clone(),
        ..args()
    };
    if let Err(ExperimentError::Plot { path, message }) = crate::plot::ensure_font()
        && path == "(font)"
    {
        eprintln!("SKIP plots_and_json_are_written: {message}");
        return;
    }
    run(&a).unwrap();
    let json = std::fs::read_to_string(out.join("project.json")).unwrap();
    let projection: Projection = serde_json::from_str(&json).unwrap();
    assert_eq!(projection.rows.len(), 2 * 2 * 3 * 2);
    for stem in [
        "projection_resnet50_ring",
        "projection_resnet50_hierarchical8",
    ] {
        let png = std::fs::read(out.join(format!("{stem}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let svg = std::fs::read_to_string(out.join(format!("{stem}.svg"))).unwrap();
        assert!(
            svg.contains("topk 1 %") && svg.contains("10 Gbit/s"),
            "{stem}"
        );
    }
}

#[test]
fn the_fusion_threshold_is_distopts() {
    assert_eq!(
        DEFAULT_FUSION_THRESHOLD,
        gradwire_optim::DEFAULT_FUSION_THRESHOLD
    );
}

/// The buckets of the test below: DistOpt's default threshold and capacity
/// scaled down 128 times (the model's bytes depend on the buckets, not on
/// their scale), so that its larger MLP plans like a 2.2 M-parameter one
/// in DistOpt's default buckets at a hundredth of the work.
const SCALED: Bucketing = Bucketing {
    fusion_threshold: gradwire_optim::DEFAULT_FUSION_THRESHOLD / 128,
    capacity: gradwire_algos::DEFAULT_FUSION_CAPACITY / 128,
    vote_per_bucket: true,
};

/// The analytic bytes per step against real DistOpt steps (GradSync,
/// in-process ranks), the way `gradwire bench strategies` measures them:
/// exact for every strategy whose size does not depend on the data;
/// sampled top-k within its [k, 1.3 k] bounds. The larger MLP is the
/// smallest whose hidden matrix (129 x 129) passes the threshold of
/// [`SCALED`] and so travels in a bucket of its own beside the others:
/// several buckets, one alone.
#[test]
fn analytic_bytes_equal_what_distopt_sends() {
    let labels = [
        "fp16",
        "bf16",
        "topk:0.01",
        "topk:0.01:no-ef",
        "topk:0.3",
        "randomk:0.01",
        "randomk:0.05:no-ef",
        "powersgd:1",
        "powersgd:4",
        "onebit",
        "qsgd",
        "qsgd:levels=7",
        "e3m0",
        "uint8",
        "adasum-grad",
    ];
    let entries: Vec<StrategyConfig> = labels.iter().map(|l| l.parse().unwrap()).collect();
    let sampled: [StrategyConfig; 1] = ["sampled-topk:0.01".parse().unwrap()];
    let base = TrainConfig::default();
    let model_of = |config: &TrainConfig| entry_of(config, None).unwrap().spec;
    let larger = mlp_shapes(&[129, 129]);
    let lens: Vec<usize> = larger.iter().map(|s| s.iter().product()).collect();
    let buckets =
        gradwire_algos::cost::plan_buckets(&lens, SCALED.fusion_threshold, SCALED.capacity)
            .unwrap();
    assert!(
        buckets.len() > 1
            && buckets
                .iter()
                .any(|b| b.len() == 1 && lens[b.start] == 129 * 129),
        "the larger MLP plans several buckets, its hidden matrix alone: {buckets:?}"
    );
    for shapes in [larger, mlp_shapes(&[32])] {
        for world in 1..=4 {
            let rows = strategies(&entries, &shapes, &SCALED, world, 0, 2).unwrap();
            let mut wanted = vec![StrategySpec::Dense];
            wanted.extend(configs(&base, &labels).unwrap().iter().map(model_of));
            assert_eq!(rows.len(), wanted.len());
            for (row, spec) in rows.iter().zip(&wanted) {
                let calls = step_collectives(spec, &shapes, world, &SCALED).unwrap();
                assert_eq!(
                    row.bytes_per_step,
                    bytes_sent(&calls),
                    "{} W = {world}, {} params",
                    row.strategy,
                    row.params
                );
            }
            let rows = strategies(&sampled, &shapes, &SCALED, world, 0, 2).unwrap();
            let bounds = [1.0, 1.3].map(|overshoot| {
                let spec = StrategySpec::SampledTopK {
                    ratio: 0.01,
                    overshoot,
                };
                let calls = step_collectives(&spec, &shapes, world, &SCALED).unwrap();
                bytes_sent(&calls)
            });
            let got = rows[1].bytes_per_step;
            assert!(
                bounds[0] <= got && got <= bounds[1],
                "sampled top-k W = {world}: {got} outside {bounds:?}"
            );
        }
    }
    // The vote of a step with one bucket of one tensor on two ranks.
    assert_eq!(
        CollectiveCall::all_reduce(1, 2).sent,
        gradwire_algos::Traffic::all_reduce(1, 2).sent
    );
}

/// `gradwire project`'s flags through clap: `extra` after the defaults.
fn parsed_args(extra: &[String]) -> ProjectArgs {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: ProjectArgs,
    }
    let argv = std::iter::once("gradwire-project".to_string()).chain(extra.iter().cloned());
    Cli::parse_from(argv).args
}

/// The flags' defaults.
fn default_args() -> ProjectArgs {
    parsed_args(&[])
}

#[test]
fn the_defaults_parse_and_project() {
    let a = default_args();
    assert_eq!(a.workers, vec![8, 16, 32, 64, 128, 256, 512, 1024]);
    let settings = Settings::from_args(&a).unwrap();
    assert_eq!(settings.strategies.len(), 8);
    assert_eq!(settings.strategies[2].label, "topk 1 %");
    assert_eq!(settings.strategies[4].label, "powersgd rank 4");
    let p = project(&settings).unwrap();
    assert_eq!(p.rows.len(), 2 * 2 * 3 * 8 * 8);
    assert!(
        p.rows
            .iter()
            .all(|r| r.step_s.is_finite() && r.step_s > 0.0)
    );
    assert_eq!(published_comparison(&settings).unwrap().len(), 3);
}

/// `gradwire project` printed (run with --ignored --nocapture to see the
/// report): with its defaults, or the flags in `$GRADWIRE_PROJECT_ARGS`
/// (split at white space); the files go to `$GRADWIRE_PROJECT_OUT`, or a
/// temporary directory.
#[test]
#[ignore]
fn print_the_default_projection() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::env::var_os("GRADWIRE_PROJECT_OUT")
        .map_or_else(|| dir.path().to_path_buf(), PathBuf::from);
    let extra: Vec<String> = std::env::var("GRADWIRE_PROJECT_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    run(&ProjectArgs {
        out,
        ..parsed_args(&extra)
    })
    .unwrap();
}

/// A burst's saving is the mean back to back less the mean after a pause,
/// never below 0, and the cost model's burst carries it with the bucket;
/// without timings either way there is none.
#[test]
fn a_burst_saves_the_difference_of_the_means() {
    let mut timings = crate::compare::BurstTimings {
        bucket_bytes: 98_304,
        refill_s: 0.008,
        bytes: 131_072,
        back_to_back: vec![0.016, 0.018],
        after_pause: vec![0.009, 0.011],
    };
    let burst = ProfileBurst::of(&timings).unwrap();
    assert!((burst.saved_s() - 0.007).abs() < 1e-12, "{burst:?}");
    let model = burst.burst();
    assert_eq!((model.bytes, model.refill_s), (98_304.0, 0.008));
    assert!((model.saved_s - 0.007).abs() < 1e-12);
    assert_eq!(
        burst.describe(),
        "a refilled bucket of 96 KiB saves 7.0 ms a step (an all-reduce of 128 KiB: 17.0 ms \
         back to back, 10.0 ms after a pause)"
    );
    timings.after_pause = vec![0.02];
    assert_eq!(ProfileBurst::of(&timings).unwrap().saved_s(), 0.0);
    timings.after_pause.clear();
    assert_eq!(ProfileBurst::of(&timings), None);
}
