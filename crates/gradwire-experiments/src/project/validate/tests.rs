//! The model against CLI runs: bytes step by step, predictions where the
//! network took what the fitted link says.

use super::*;
use crate::compare::configs;
use crate::data::{Dataset, Digits};
use crate::error::assert_usage;
use crate::train::{Observer, train};
use gradwire_algos::cost::{Link, bytes_sent, sent_at_step};
use std::sync::{Mutex, OnceLock};

/// What rank 0 sent in each step of a run, in order.
#[derive(Default)]
struct PerStep(Mutex<Vec<u64>>);

impl Observer for PerStep {
    fn step_done(&self, sent: u64) {
        self.0.lock().unwrap().push(sent);
    }
}

/// Every strategy the CLI runs, on small runs of several buckets each:
/// PowerSGD with some dense steps first (the model mixes them in), DiLoCo
/// and Streaming DiLoCo once a round (a fragment at its merge), after a
/// warm-up of one-step rounds by parameters or by gradients, partial
/// averaging one bucket a step, delta weight, the threshold and sampled
/// top-k (their selections depend on the data).
const ENTRIES: [&str; 21] = [
    "baseline",
    "baseline:bf16",
    "dense",
    "fp16",
    "topk:0.05",
    "randomk:0.05",
    "powersgd:2:start=5",
    "onebit",
    "uint8",
    "diloco:3:uint8",
    "diloco:2:topk=0.05",
    "diloco:4:powersgd=2",
    "streaming-diloco:4:2:tau=1",
    "diloco:3:uint8:warmup=2",
    "diloco:2:topk=0.05:grad-warmup=3",
    "streaming-diloco:4:2:tau=1:grad-warmup=2",
    "partial",
    "partial:state",
    "adasum-delta",
    "threshold:0.01",
    "sampled-topk:0.05",
];

/// The runs of [`ENTRIES`] on `world` ranks for `epochs`, each with what
/// rank 0 sent step by step; those of three ranks and one epoch made once
/// for every test.
fn runs(world: usize, epochs: usize) -> Vec<(RunReport, Vec<u64>)> {
    static THREE: OnceLock<Vec<(RunReport, Vec<u64>)>> = OnceLock::new();
    if (world, epochs) == (3, 1) {
        return THREE.get_or_init(|| train_all(3, 1)).clone();
    }
    train_all(world, epochs)
}

fn train_all(world: usize, epochs: usize) -> Vec<(RunReport, Vec<u64>)> {
    let data = Dataset::Digits(Digits::load(7));
    let base = TrainConfig {
        world,
        epochs,
        hidden: vec![24, 16],
        fusion_threshold: 300,
        ..TrainConfig::default()
    };
    configs(&base, &ENTRIES)
        .unwrap()
        .iter()
        .map(|c| {
            let steps = PerStep::default();
            let run = train(c, &data, &steps, None).unwrap();
            (run, steps.0.into_inner().unwrap())
        })
        .collect()
}

/// What the model says `run` sends: its steady calls (at the selection
/// the run measured) and its warm-up's steps and calls, if any.
type RunModel = (Vec<CollectiveCall>, Option<(u64, Vec<CollectiveCall>)>);

fn model_of(run: &RunReport) -> RunModel {
    let shapes = shapes_of(&run.config).unwrap();
    let measured = selection_of(run, &shapes).unwrap();
    let calls = collectives_of(&run.config, &shapes, measured)
        .unwrap()
        .unwrap();
    let warm = warm_up_of(&run.config, &shapes, run.epochs[0].steps).unwrap();
    (calls, warm)
}

/// The one-epoch runs on three ranks whose modelled steady calls `keep`
/// takes.
fn runs_where(keep: impl Fn(&[CollectiveCall]) -> bool) -> Vec<RunReport> {
    runs(3, 1)
        .into_iter()
        .map(|(r, _)| r)
        .filter(|r| keep(&model_of(r).0))
        .collect()
}

/// A calibration of three ranks whose all-reduces (gradwire's and the
/// library's) take a ring's time over `link`, at 64 KiB, 1 and 4 MiB.
fn calibration_over(link: &Link) -> Calibration {
    let world = 3;
    let ring = |bytes: usize| {
        let w = world as f64;
        2.0 * (w - 1.0) * (link.latency_s + bytes as f64 / w / link.bytes_per_s)
    };
    let samples: Vec<(usize, f64)> = [1 << 16, 1 << 20, 1 << 22]
        .iter()
        .map(|&b| (b, ring(b)))
        .collect();
    Calibration {
        world,
        gradwire: samples.clone(),
        library: samples,
        latency_after: Vec::new(),
        burst: None,
    }
}

/// `f` of the steady collectives times the steady steps, plus `f` of
/// the warm-up's times its steps.
fn over_the_run(run: &RunReport, f: impl Fn(&[CollectiveCall]) -> f64) -> f64 {
    let (calls, warm) = model_of(run);
    let steps = run.steps() as f64;
    let (warm_steps, warm_value) = warm.map_or((0.0, 0.0), |(k, c)| {
        let k = (k as f64).min(steps);
        (k, k * f(&c))
    });
    (steps - warm_steps) * f(&calls) + warm_value
}

/// What the model says rank 0 sends at each of `steps` steps of `run`:
/// the warm-up's calls first, then the steady ones (a call of a longer
/// period at the steps [`CollectiveCall::first_step`] and its period say).
fn modelled_steps(run: &RunReport, steps: usize) -> Vec<u64> {
    let (calls, warm) = model_of(run);
    (0..steps as u64)
        .map(|s| match &warm {
            Some((k, warm_calls)) if s < *k => sent_at_step(warm_calls, s),
            _ => sent_at_step(&calls, s),
        })
        .collect()
}

/// The collectives the model counts for a CLI run send exactly the bytes
/// the run's Traffic recorded, step by step, for every strategy the CLI
/// runs (warm-ups, DiLoCo's rounds, Streaming DiLoCo's fragments, partial
/// averaging's turns included), over runs of one epoch and of several
/// (counters that carry over epochs); the threshold's, whose selection
/// depends on the data, and sampled top-k's, over the run at the
/// selection measured on it.
#[test]
fn modelled_collectives_send_what_the_cli_sent_step_by_step() {
    for (world, epochs) in [(1, 1), (2, 1), (3, 1), (2, 3)] {
        for (run, sent) in runs(world, epochs) {
            let what = format!("{} on {world} ranks, {epochs} epoch(s)", run.label);
            assert_eq!(sent.len(), run.steps(), "{what}");
            assert_eq!(sent.iter().sum::<u64>(), run.bytes_per_worker(), "{what}");
            let modelled = modelled_steps(&run, sent.len());
            let shapes = shapes_of(&run.config).unwrap();
            if selection_of(&run, &shapes).unwrap().is_some() {
                let total: u64 = modelled.iter().sum();
                let error = (total as f64 - sent.iter().sum::<u64>() as f64).abs();
                assert!(
                    error <= 0.01 * total as f64,
                    "{what}: {total} modelled at the measured selection"
                );
                continue;
            }
            if let Some(step) = (0..sent.len()).find(|&s| modelled[s] != sent[s]) {
                panic!(
                    "{what}: step {step} sent {} bytes, the model says {}",
                    sent[step], modelled[step]
                );
            }
            // Per step, the model's mean is the run's over whole rounds.
            let calls = collectives_of(&run.config, &shapes, None).unwrap().unwrap();
            let round = calls.iter().map(|c| c.period).max().unwrap();
            if round > 1 {
                let per_round: u64 = calls.iter().map(|c| c.sent * (round / c.period)).sum();
                assert!(
                    world == 1 || per_round > 0,
                    "{what}: a round that sends nothing"
                );
                // The mean, up to the rounding of its f64 sum.
                let mean = bytes_sent(&calls) * round as f64;
                assert!(
                    (mean - per_round as f64).abs() <= 1e-12 * per_round as f64,
                    "{what}: {mean} per round, not {per_round}"
                );
            }
        }
    }
}

/// With gradient accumulation (3 micro-batches a step) the model's steps
/// are the exchanges: each step's bytes are still what the model says
/// (the micro-batches send nothing; warm-ups and rounds count exchanges).
#[test]
fn accumulated_steps_send_what_the_model_says() {
    let data = Dataset::Digits(Digits::load(7));
    let base = TrainConfig {
        world: 2,
        epochs: 1,
        accumulate: 3,
        hidden: vec![24, 16],
        fusion_threshold: 300,
        ..TrainConfig::default()
    };
    let entries = [
        "dense",
        "topk:0.05",
        "powersgd:2:start=5",
        "diloco:3:uint8",
        "partial",
        "adasum-delta",
    ];
    for config in configs(&base, &entries).unwrap() {
        let steps = PerStep::default();
        let run = train(&config, &data, &steps, None).unwrap();
        let sent = steps.0.into_inner().unwrap();
        assert_eq!(sent.len(), run.steps(), "{}", run.label);
        assert_eq!(modelled_steps(&run, sent.len()), sent, "{}", run.label);
    }
}

/// Where the network took what the fitted link says, the prediction is
/// the measured step; a slower network shows as the model's error.
#[test]
fn the_profile_predicts_a_run_whose_network_matches_the_link() {
    let world = 3;
    let link = Link::new(50e-6, 1.25e8).unwrap();
    let calibration = calibration_over(&link);
    // Streaming DiLoCo's exchange hides under its next inner steps: what
    // shows of it depends on the steps' time (`predict_step_secs`' own
    // test); every other run waits for all it sends.
    let mut runs = runs_where(|calls| calls.iter().all(|c| c.hidden_steps == 0));
    for (k, run) in runs.iter_mut().enumerate() {
        let comm = over_the_run(run, |c| {
            communication_secs(c, world, &link, &Algorithm::Ring).unwrap()
        }) / run.steps() as f64;
        // The first run's network is twice the model's.
        let factor = if k == 0 { 2.0 } else { 1.0 };
        for epoch in &mut run.epochs {
            epoch.network_secs = Some(factor * comm * epoch.steps as f64);
            // All of it counted inside the combining, as the model has it,
            // and waited for.
            epoch.coordination_secs = 0.0;
            epoch.combine_secs = epoch.combine_secs.max(factor * comm * epoch.steps as f64);
            epoch.comm_secs = epoch.combine_secs;
            epoch.wall_secs = epoch.wall_secs.max(epoch.compute_secs + epoch.combine_secs);
        }
    }
    let profile = profile_of(&runs, &calibration, 1_000_000_000).unwrap();
    assert_eq!(profile.strategies.len(), runs.len());
    // Not timed again after the runs: nothing to compare.
    assert_eq!(profile.latency_before_after_s, None);
    let fitted = profile.link;
    assert!((fitted.bytes_per_s / link.bytes_per_s - 1.0).abs() < 1e-9);
    assert!((fitted.latency_s / link.latency_s - 1.0).abs() < 1e-6);
    for (k, s) in profile.strategies.iter().enumerate() {
        let error = s.predicted_s_per_step / s.measured_s_per_step - 1.0;
        if k == 0 {
            assert!(error < -1e-3, "{}: {error}", s.label);
        } else {
            assert!(error.abs() < 1e-9, "{}: {error}", s.label);
        }
    }
    assert_eq!(
        predictions(&profile, &runs),
        profile
            .strategies
            .iter()
            .map(|s| Some(s.predicted_s_per_step))
            .collect::<Vec<_>>()
    );
    // Not on MPI: no network time, no profile.
    for epoch in &mut runs[0].epochs {
        epoch.network_secs = None;
    }
    assert_usage(
        profile_of(&runs, &calibration, 1_000_000_000),
        "the run did not time its communication (not on MPI)",
    );
}

/// The latency timed again after the runs joins the fit (the latency size's
/// mean over both timings) and is reported beside the calibration's; when
/// it moved by more than [`LATENCY_WARNING`] the report says so, and not
/// otherwise.
#[test]
fn a_latency_rechecked_after_the_runs_joins_the_fit_and_warns_when_it_moved() {
    use crate::compare::LATENCY_BYTES;
    let world = 3;
    let rate = 1.25e8;
    let ring = |bytes: usize, latency: f64| {
        let w = world as f64;
        2.0 * (w - 1.0) * (latency + bytes as f64 / w / rate)
    };
    let mut gradwire = vec![(LATENCY_BYTES, ring(LATENCY_BYTES, 50e-6)); 15];
    for bytes in [1 << 20, 1 << 22] {
        gradwire.extend([(bytes, ring(bytes, 50e-6)); 8]);
    }
    let mut runs: Vec<RunReport> = runs(world, 1).into_iter().map(|(r, _)| r).collect();
    runs.truncate(3);
    for run in &mut runs {
        for epoch in &mut run.epochs {
            epoch.network_secs = Some(epoch.combine_secs);
        }
    }
    let moved = |latency_after: f64| {
        let calibration = Calibration {
            world,
            gradwire: gradwire.clone(),
            library: gradwire.clone(),
            latency_after: vec![ring(LATENCY_BYTES, latency_after); 15],
            burst: None,
        };
        let profile = profile_of(&runs, &calibration, 1_000_000_000).unwrap();
        let warned = model_warnings(&profile, &runs)
            .iter()
            .any(|line| line.contains("the link's latency moved by"));
        (profile, warned)
    };
    let (steady, warned) = moved(50e-6);
    assert!(!warned);
    let (before, after) = steady.latency_before_after_s.unwrap();
    assert!((after / before - 1.0).abs() < 1e-12);
    assert!((steady.link.latency_s / 50e-6 - 1.0).abs() < 1e-6);
    // Three times the latency after the runs: the fit moves towards it,
    // and the report warns.
    let (slower, warned) = moved(150e-6);
    assert!(warned);
    let (before, after) = slower.latency_before_after_s.unwrap();
    assert!((before / ring(LATENCY_BYTES, 50e-6) - 1.0).abs() < 1e-12);
    assert!((after / ring(LATENCY_BYTES, 150e-6) - 1.0).abs() < 1e-12);
    let fitted = slower.link.latency_s;
    assert!(60e-6 < fitted && fitted < 150e-6, "{fitted}");
    // Within the bound (20 % more): no warning.
    assert!(!moved(60e-6).1);
}

/// A burst the calibration timed takes what a refilled bucket saves off
/// the prediction of every step that sends a bucket or more (dense's),
/// less off those that send less or once a round, never more; the
/// profile reports it.
#[test]
fn a_timed_burst_takes_its_saving_off_the_predictions() {
    use crate::compare::BurstTimings;
    let world = 3;
    let samples: Vec<(usize, f64)> = [1 << 16, 1 << 20, 1 << 22]
        .iter()
        .map(|&b| (b, 4.0 * (50e-6 + b as f64 / 3.0 / 1.25e8)))
        .collect();
    let mut runs: Vec<RunReport> = runs(world, 1).into_iter().map(|(r, _)| r).collect();
    for run in &mut runs {
        for epoch in &mut run.epochs {
            epoch.network_secs = Some(epoch.combine_secs);
        }
    }
    let profile = |burst: Option<BurstTimings>| {
        let calibration = Calibration {
            world,
            gradwire: samples.clone(),
            library: samples.clone(),
            latency_after: Vec::new(),
            burst,
        };
        profile_of(&runs, &calibration, 1_000_000_000).unwrap()
    };
    let plain = profile(None);
    assert_eq!(plain.burst, None);
    let shaped = profile(Some(BurstTimings {
        bucket_bytes: 1000,
        refill_s: 0.0,
        bytes: 1500,
        back_to_back: vec![300e-6, 310e-6],
        after_pause: vec![285e-6, 285e-6],
    }));
    let burst = shaped.burst.unwrap();
    assert!((burst.saved_s() - 20e-6).abs() < 1e-15, "{burst:?}");
    assert_eq!(
        burst.describe(),
        "a refilled bucket of 1 KiB saves 0.0 ms a step (an all-reduce of 1 KiB: 0.3 ms back \
         to back, 0.3 ms after a pause)"
    );
    assert_eq!(plain.strategies.len(), shaped.strategies.len());
    for (p, s) in plain.strategies.iter().zip(&shaped.strategies) {
        let saved = p.predicted_s_per_step - s.predicted_s_per_step;
        assert!(
            (-1e-15..=20e-6 + 1e-15).contains(&saved),
            "{}: {saved}",
            p.label
        );
        if p.label == "dense" {
            assert!((saved - 20e-6).abs() < 1e-12, "dense saves {saved}");
        }
    }
    assert!(plain.strategies.iter().any(|s| s.label == "dense"));
}

/// A step's other time is the training thread's outside compute and its
/// waits: where an exchange ran under the inner steps (Streaming DiLoCo's),
/// its calls' time on the communication thread is more than the steps
/// waited, and only the waits are taken off (taking the calls' off, as
/// before, read the other time as 0 and under-predicted such rows by 14 %).
#[test]
fn an_exchange_under_the_steps_leaves_their_other_time_theirs() {
    let calibration = calibration_over(&Link::new(50e-6, 1.25e8).unwrap());
    let mut runs = runs_where(|calls| calls.iter().any(|c| c.hidden_steps > 0));
    assert!(!runs.is_empty(), "the examples hold a Streaming DiLoCo");
    // Per step: 80 ms of compute, 10 waiting, 2 of the training thread's
    // own calls, 20 else; the exchange's calls took 40 on the other thread
    // and its codec 5.
    let (compute, wait, coordination, other, calls, codec) = (0.08, 0.01, 0.002, 0.02, 0.04, 0.005);
    for run in &mut runs {
        for epoch in &mut run.epochs {
            let steps = epoch.steps as f64;
            epoch.compute_secs = compute * steps;
            epoch.comm_secs = wait * steps;
            epoch.coordination_secs = coordination * steps;
            epoch.network_secs = Some((calls + coordination) * steps);
            epoch.combine_secs = (calls + codec) * steps;
            epoch.wall_secs = (compute + wait + coordination + other) * steps;
            (epoch.waiting_secs, epoch.busy_secs, epoch.slowest_busy_secs) = (None, None, None);
        }
    }
    // Every run's profile splits off this codec and other time.
    let split_as_set = |runs: &[RunReport]| {
        let profile = profile_of(runs, &calibration, 1_000_000_000).unwrap();
        for s in &profile.strategies {
            let (got, want) = ((s.codec_s_per_step, s.other_s_per_step), (codec, other));
            assert!(
                (got.0 - want.0).abs() < 1e-9 && (got.1 - want.1).abs() < 1e-9,
                "{}: codec and other {got:?}, set {want:?}",
                s.label
            );
        }
    };
    split_as_set(&runs);
    // Where the steps waited for all of the calls and the codec, those are
    // what is taken off.
    for run in &mut runs {
        for epoch in &mut run.epochs {
            let steps = epoch.steps as f64;
            epoch.comm_secs = epoch.combine_secs;
            epoch.wall_secs = (compute + calls + codec + coordination + other) * steps;
        }
    }
    split_as_set(&runs);
}
