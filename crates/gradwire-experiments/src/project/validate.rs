//! The cost model checked against a shaped run: after `gradwire compare
//! --network`, every strategy's seconds per step is predicted from the
//! link fitted to the run's calibration, the strategy's exact collectives
//! per step on the model it trained (DistOpt's buckets as the CLI plans
//! them) and its measured compute, codec and other time, and set beside
//! the measured one. The result is the run's [`Profile`], which `gradwire
//! project --profile` scales to other models and worlds.

use super::{Profile, ProfileLink, ProfileStrategy, entry_of};
use crate::compare::{Calibration, ShapedRow};
use crate::config::TrainConfig;
use crate::error::{ExperimentError, Result};
use crate::model::Model;
use crate::train::RunReport;
use gradwire_algos::cost::{
    Algorithm, Bucketing, CollectiveCall, StepModel, StrategySpec, communication_secs,
    fit_all_reduce, predict_step_secs, step_collectives,
};
use gradwire_optim::StrategyConfig;

/// The parameter shapes of `config`'s model, in declaration order
/// (DistOpt's): what [`collectives_of`] and [`warm_up_of`] plan with.
pub fn shapes_of(config: &TrainConfig) -> Result<Vec<Vec<usize>>> {
    let model = Model::new(config)?;
    Ok(model
        .vars()
        .iter()
        .map(|(_, v)| v.dims().to_vec())
        .collect())
}

/// DistOpt's buckets as the CLI plans them: its fusion threshold, one
/// vote per step.
fn bucketing_of(config: &TrainConfig) -> Bucketing {
    Bucketing {
        fusion_threshold: config.fusion_threshold,
        capacity: config
            .fusion_threshold
            .max(gradwire_algos::DEFAULT_FUSION_CAPACITY),
        vote_per_bucket: false,
    }
}

/// What a steady step of `config`'s strategy sends (after any dense
/// warm-up: [`warm_up_of`]): DistOpt's buckets as the CLI plans them, or
/// the baseline's one fused all-reduce. `None` for a strategy the model
/// does not cover.
pub fn collectives_of(
    config: &TrainConfig,
    shapes: &[Vec<usize>],
) -> Result<Option<Vec<CollectiveCall>>> {
    if config.baseline {
        let element = if config.baseline_precision().is_some() {
            2
        } else {
            4
        };
        let bytes = element
            * shapes
                .iter()
                .map(|s| s.iter().product::<usize>())
                .sum::<usize>();
        return Ok(Some(vec![CollectiveCall::all_reduce(bytes, config.world)]));
    }
    let Ok(entry) = entry_of(config) else {
        return Ok(None);
    };
    Ok(Some(step_collectives(
        &entry.spec,
        shapes,
        config.world,
        &bucketing_of(config),
    )?))
}

/// The steps a run of `config` takes before its strategy's steady state,
/// and what each of them sends: PowerSGD's dense steps before its start
/// step, 1-bit Adam's uncompressed Adam before the freeze, DimReduce's
/// dense epochs (`steps_per_epoch` steps each). `None` when it has none.
pub fn warm_up_of(
    config: &TrainConfig,
    shapes: &[Vec<usize>],
    steps_per_epoch: usize,
) -> Result<Option<(u64, Vec<CollectiveCall>)>> {
    let (steps, spec) = match config.strategy {
        _ if config.baseline => return Ok(None),
        StrategyConfig::PowerSgd(powersgd) => (powersgd.start_step, StrategySpec::Dense),
        StrategyConfig::OneBitAdam { freeze_step, .. } => {
            (freeze_step, StrategySpec::OneBitAdam { compressed: false })
        }
        StrategyConfig::DimReduce => (
            (config.dense_epochs() * steps_per_epoch) as u64,
            StrategySpec::Dense,
        ),
        _ => return Ok(None),
    };
    if steps == 0 {
        return Ok(None);
    }
    let calls = step_collectives(&spec, shapes, config.world, &bucketing_of(config))?;
    Ok(Some((steps, calls)))
}

/// The profile of a shaped comparison: the links fitted to `calibration`
/// (gradwire's all-reduce for gradwire's strategies, the library's for the
/// baseline), and per run its measured split and the model's prediction
/// (ring algorithm, no overlap: the CLI computes every gradient first).
/// Runs of strategies the model does not cover are left out.
pub fn profile_of(
    runs: &[RunReport],
    calibration: &Calibration,
    rate_bits_per_s: u64,
) -> Result<Profile> {
    let world = calibration.world;
    let gradwire = fit_all_reduce(world, &calibration.gradwire)?;
    let library = fit_all_reduce(world, &calibration.library)?;
    let mut strategies = Vec::new();
    let mut params = 0;
    for run in runs {
        let shapes = shapes_of(&run.config)?;
        params = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
        let Some(calls) = collectives_of(&run.config, &shapes)? else {
            continue;
        };
        let steps_per_epoch = run.epochs.first().map_or(0, |e| e.steps);
        let row = ShapedRow::of(run);
        let split = row.split;
        let network = split.network.ok_or_else(|| {
            ExperimentError::Usage(format!(
                "{}: the run did not time its communication (not on MPI)",
                run.label
            ))
        })?;
        let codec = split.codec.unwrap_or(0.0);
        // Everything else the step measured: the optimizer's update, the
        // bucket copies, the evaluation's share.
        let other = (split.total - split.compute - codec - network).max(0.0);
        // Rank 0's network time includes waiting for slower ranks; the
        // model's collectives start when the last rank arrives.
        let imbalance = split.imbalance.unwrap_or(0.0);
        let link = if run.config.baseline {
            &library
        } else {
            &gradwire
        };
        let step = StepModel {
            compute_s: split.compute,
            codec_s: codec,
            other_s: other + imbalance,
            overlap: 0.0,
        };
        let mut predicted = predict_step_secs(&step, &calls, world, link, &Algorithm::Ring)?;
        // A warm-up's steps send something else: the run's mean step.
        if let Some((warm, warm_calls)) = warm_up_of(&run.config, &shapes, steps_per_epoch)? {
            let steps = run.steps() as f64;
            let warm = (warm as f64).min(steps);
            let comm = |c: &[CollectiveCall]| communication_secs(c, world, link, &Algorithm::Ring);
            if steps > 0.0 {
                predicted += warm / steps * (comm(&warm_calls)? - comm(&calls)?);
            }
        }
        strategies.push(ProfileStrategy {
            label: run.label.clone(),
            compute_s_per_step: split.compute,
            codec_s_per_step: codec,
            other_s_per_step: other,
            imbalance_s_per_step: imbalance,
            measured_s_per_step: split.total,
            predicted_s_per_step: predicted,
            steps_to_target: row.steps_to_target,
            final_accuracy: row.final_accuracy,
            final_loss: row.final_loss,
        });
    }
    Ok(Profile {
        rate_bits_per_s,
        world,
        params,
        link: ProfileLink::of(&gradwire),
        library_link: Some(ProfileLink::of(&library)),
        strategies,
    })
}

/// `profile`'s prediction for each of `runs`, in order (`None` where the
/// model does not cover the run).
pub fn predictions(profile: &Profile, runs: &[RunReport]) -> Vec<Option<f64>> {
    runs.iter()
        .map(|r| profile.strategy(&r.label).map(|s| s.predicted_s_per_step))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::configs;
    use crate::data::{Dataset, Digits};
    use crate::error::assert_usage;
    use crate::train::{Silent, train};
    use gradwire_algos::cost::{Link, bytes_sent};

    /// Small runs of each modelled family, several buckets each.
    fn runs(world: usize, data: &Dataset) -> Vec<RunReport> {
        let base = TrainConfig {
            world,
            epochs: 1,
            hidden: vec![24, 16],
            fusion_threshold: 300,
            ..TrainConfig::default()
        };
        // PowerSGD with some dense steps first: the model mixes them in.
        // DiLoCo sends once a round.
        let entries = [
            "baseline",
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
        ];
        configs(&base, &entries)
            .unwrap()
            .iter()
            .map(|c| train(c, data, &Silent, None).unwrap())
            .collect()
    }

    /// `f` of the steady collectives times the steady steps, plus `f` of
    /// the warm-up's times its steps.
    fn over_the_run(run: &RunReport, f: impl Fn(&[CollectiveCall]) -> f64) -> f64 {
        let shapes = shapes_of(&run.config).unwrap();
        let calls = collectives_of(&run.config, &shapes).unwrap().unwrap();
        let steps = run.steps() as f64;
        let warm = warm_up_of(&run.config, &shapes, run.epochs[0].steps).unwrap();
        let (warm_steps, warm_value) = warm.map_or((0.0, 0.0), |(k, c)| {
            let k = (k as f64).min(steps);
            (k, k * f(&c))
        });
        (steps - warm_steps) * f(&calls) + warm_value
    }

    /// The bytes rank 0 sends over the run, call by call: a call of the
    /// steady state every steady step, or once per completed round (one
    /// every `period` steps from the first), plus the warm-up's.
    fn bytes_over_the_run(run: &RunReport) -> u64 {
        let shapes = shapes_of(&run.config).unwrap();
        let calls = collectives_of(&run.config, &shapes).unwrap().unwrap();
        let steps = run.steps() as u64;
        let warm = warm_up_of(&run.config, &shapes, run.epochs[0].steps).unwrap();
        let (warm_steps, warm_bytes) = warm.map_or((0, 0), |(k, c)| {
            let k = k.min(steps);
            (k, k * c.iter().map(|c| c.sent).sum::<u64>())
        });
        let steady: u64 = calls
            .iter()
            .map(|c| c.sent * ((steps - warm_steps) / c.period))
            .sum();
        steady + warm_bytes
    }

    /// The collectives the model counts for a CLI run (its warm-up's and
    /// DiLoCo's rounds included) send exactly the bytes the run's Traffic
    /// recorded; per step, the model's mean is the run's over whole rounds.
    #[test]
    fn modelled_collectives_send_what_the_cli_sent() {
        let data = Dataset::Digits(Digits::load(7));
        for world in 1..=3 {
            for run in runs(world, &data) {
                assert_eq!(
                    bytes_over_the_run(&run),
                    run.bytes_per_worker(),
                    "{} on {world} ranks",
                    run.label
                );
                let shapes = shapes_of(&run.config).unwrap();
                let calls = collectives_of(&run.config, &shapes).unwrap().unwrap();
                let round = calls.iter().map(|c| c.period).max().unwrap();
                if round > 1 {
                    let per_round: u64 = calls.iter().map(|c| c.sent * (round / c.period)).sum();
                    assert!(
                        world == 1 || per_round > 0,
                        "{}: a round that sends nothing",
                        run.label
                    );
                    // The mean, up to the rounding of its f64 sum.
                    let mean = bytes_sent(&calls) * round as f64;
                    assert!(
                        (mean - per_round as f64).abs() <= 1e-12 * per_round as f64,
                        "{}: {mean} per round, not {per_round}",
                        run.label
                    );
                }
            }
        }
    }

    /// Where the network took what the fitted link says, the prediction is
    /// the measured step; a slower network shows as the model's error.
    #[test]
    fn the_profile_predicts_a_run_whose_network_matches_the_link() {
        let data = Dataset::Digits(Digits::load(7));
        let world = 3;
        let link = Link::new(50e-6, 1.25e8).unwrap();
        let ring = |bytes: usize| {
            let w = world as f64;
            2.0 * (w - 1.0) * (link.latency_s + bytes as f64 / w / link.bytes_per_s)
        };
        let samples: Vec<(usize, f64)> = [1 << 16, 1 << 20, 1 << 22]
            .iter()
            .map(|&b| (b, ring(b)))
            .collect();
        let calibration = Calibration {
            world,
            gradwire: samples.clone(),
            library: samples,
        };
        let mut runs = runs(world, &data);
        for (k, run) in runs.iter_mut().enumerate() {
            let comm = over_the_run(run, |c| {
                communication_secs(c, world, &link, &Algorithm::Ring).unwrap()
            }) / run.steps() as f64;
            // The first run's network is twice the model's.
            let factor = if k == 0 { 2.0 } else { 1.0 };
            for epoch in &mut run.epochs {
                epoch.network_secs = Some(factor * comm * epoch.steps as f64);
                epoch.combine_secs = epoch.combine_secs.max(factor * comm * epoch.steps as f64);
                epoch.wall_secs = epoch.wall_secs.max(epoch.compute_secs + epoch.combine_secs);
            }
        }
        let profile = profile_of(&runs, &calibration, 1_000_000_000).unwrap();
        assert_eq!(profile.strategies.len(), runs.len());
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
}
