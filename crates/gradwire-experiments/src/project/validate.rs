//! The cost model checked against a shaped run: after `gradwire compare
//! --network`, every strategy's seconds per step is predicted from the
//! link fitted to the run's calibration, the strategy's exact collectives
//! per step on the model it trained (DistOpt's buckets as the CLI plans
//! them) and its measured compute, codec and other time, and set beside
//! the measured one. The result is the run's [`Profile`], which `gradwire
//! project --profile` scales to other models and worlds.

use super::{Profile, ProfileBurst, ProfileLink, ProfileStrategy, Selection, entry_of};
use crate::compare::{Calibration, ShapedRow};
use crate::config::TrainConfig;
use crate::error::{ExperimentError, Result};
use crate::model::Model;
use crate::train::RunReport;
use gradwire_algos::cost::{
    Algorithm, Bucketing, CollectiveCall, StepModel, StrategySpec, communication_secs,
    fit_all_reduce, predict_step_secs, sent_over_steps, spread_of_all_reduce, step_collectives,
};
use gradwire_compress::SparseCodec;
use gradwire_compress::select::SAMPLED_TOP_K_SLACK;
use gradwire_optim::{DiLoCoConfig, StrategyConfig};

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
/// the baseline's one fused all-reduce; a selection that depends on the
/// data as a run `measured` it ([`selection_of`]). `None` for a strategy
/// the model does not cover (a threshold without a density).
pub fn collectives_of(
    config: &TrainConfig,
    shapes: &[Vec<usize>],
    measured: Option<Selection>,
) -> Result<Option<Vec<CollectiveCall>>> {
    if config.baseline {
        let bytes = fused_bytes(config, shapes);
        return Ok(Some(vec![CollectiveCall::all_reduce(bytes, config.world)]));
    }
    let Ok(entry) = entry_of(config, measured) else {
        return Ok(None);
    };
    let mut calls = step_collectives(&entry.spec, shapes, config.world, &bucketing_of(config))?;
    // DiLoCo's rounds begin after its warm-up's one-step rounds
    // ([`warm_up_of`]).
    if let StrategyConfig::DiLoCo(diloco) = config.strategy {
        let warmup = u64::from(diloco.warmup);
        for call in &mut calls {
            *call = call.first_counted_at(call.first_step + warmup);
        }
    }
    Ok(Some(calls))
}

/// The bytes of the baseline's one fused all-reduce for parameters of
/// `shapes`: 4 an entry, 2 for the 16-bit baseline.
fn fused_bytes(config: &TrainConfig, shapes: &[Vec<usize>]) -> usize {
    let element = if config.baseline_precision().is_some() {
        2
    } else {
        4
    };
    element
        * shapes
            .iter()
            .map(|s| s.iter().product::<usize>())
            .sum::<usize>()
}

/// The bytes of `config`'s baseline all-reduce (what the calibration times
/// the library at: [`crate::compare::calibrate`]).
pub fn baseline_bytes(config: &TrainConfig) -> Result<usize> {
    Ok(fused_bytes(config, &shapes_of(config)?))
}

/// A selection's kind and the range its figure lies in.
type SelectionRange = (fn(f64) -> Selection, f64, f64);

/// What `config`'s selection depends on the data for, if anything: the
/// threshold's count or sampled top-k's overshoot (DiLoCo's codecs have
/// neither), with the range a run's figure lies in.
fn selected_by_data(config: &TrainConfig) -> Option<SelectionRange> {
    match config.strategy {
        StrategyConfig::Sparse {
            codec: SparseCodec::Threshold(_),
            ..
        } => Some((Selection::Density, 1e-9, 1.0)),
        StrategyConfig::Sparse {
            codec: SparseCodec::SampledTopK(_),
            ..
        } => Some((Selection::Overshoot, 1.0, SAMPLED_TOP_K_SLACK)),
        _ => None,
    }
}

/// The selection of `run` (a threshold's density, sampled top-k's
/// overshoot; `None` for the strategies whose bytes the data does not
/// decide): the smallest figure at which the model's bytes over the run
/// reach what the run sent (they do not fall as it grows), to a part in a
/// million, or the range's end.
pub fn selection_of(run: &RunReport, shapes: &[Vec<usize>]) -> Result<Option<Selection>> {
    let Some((selection, mut low, mut high)) = selected_by_data(&run.config) else {
        return Ok(None);
    };
    let sent = run.bytes_per_worker();
    let steps = run.steps() as u64;
    let bytes_at = |x: f64| -> Result<u64> {
        let calls = collectives_of(&run.config, shapes, Some(selection(x)))?
            .ok_or_else(|| ExperimentError::Usage(format!("{}: not modelled", run.label)))?;
        Ok(sent_over_steps(&calls, steps))
    };
    if bytes_at(high)? <= sent {
        return Ok(Some(selection(high)));
    }
    while high - low > 1e-6 * high {
        let mid = 0.5 * (low + high);
        if bytes_at(mid)? >= sent {
            high = mid;
        } else {
            low = mid;
        }
    }
    Ok(Some(selection(high)))
}

/// The steps a run of `config` takes before its strategy's steady state,
/// and what each of them sends: PowerSGD's dense steps before its start
/// step, 1-bit Adam's uncompressed Adam before the freeze, DimReduce's
/// dense epochs (`steps_per_epoch` steps each), DiLoCo's warm-up (every
/// bucket through the codec each step, by parameters or by gradients
/// alike). `None` when it has none.
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
        StrategyConfig::DiLoCo(diloco) => {
            // A round of one step, every fragment at once.
            let round = DiLoCoConfig {
                sync_every: 1,
                fragments: 1,
                delay: 0,
                alpha: 0.0,
                warmup: 0,
                ..diloco
            };
            let warm = TrainConfig {
                strategy: StrategyConfig::DiLoCo(round),
                ..config.clone()
            };
            (u64::from(diloco.warmup), entry_of(&warm, None)?.spec)
        }
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
/// baseline), both behind the shaper's burst where the calibration timed
/// it, and per run its measured split and the model's prediction
/// (ring algorithm, no overlap: the CLI computes every gradient first; the
/// baseline's one all-reduce at its timing where the calibration timed the
/// library at that size; a data-dependent selection as the run measured it,
/// [`selection_of`]). Runs of strategies the model does not cover are left
/// out ([`model_warnings`] names them).
pub fn profile_of(
    runs: &[RunReport],
    calibration: &Calibration,
    rate_bits_per_s: u64,
) -> Result<Profile> {
    let world = calibration.world;
    let gradwire_timings = calibration.gradwire_timings();
    let timed_burst = calibration.burst.as_ref().and_then(ProfileBurst::of);
    let burst = timed_burst.map(|b| b.burst()).unwrap_or_default();
    let gradwire = fit_all_reduce(world, &gradwire_timings)?.with_burst(burst)?;
    let library = fit_all_reduce(world, &calibration.library)?.with_burst(burst)?;
    let gradwire_spread = spread_of_all_reduce(world, &gradwire_timings)?;
    let library_spread = spread_of_all_reduce(world, &calibration.library)?;
    let mut strategies = Vec::new();
    let mut params = 0;
    for run in runs {
        let shapes = shapes_of(&run.config)?;
        params = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
        let measured = selection_of(run, &shapes)?;
        let Some(calls) = collectives_of(&run.config, &shapes, measured)? else {
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
        // Everything else the step measured (the optimizer's update, the
        // bucket copies): the training thread's time outside compute and
        // its waits for communication. The calls' time is those waits
        // where nothing overlapped the steps; where an exchange ran under
        // them (Streaming DiLoCo's) it is more than the steps waited, and
        // only the waits were the steps'.
        let waited = (codec + network).min(split.wait + split.coordination);
        let other = (split.total - split.compute - waited).max(0.0);
        // Rank 0's network time includes waiting in each collective for
        // the last rank; the model's collectives start when it arrives.
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
        // The library's all-reduce at the very size it sends, where the
        // calibration timed it (its algorithm changes with the size).
        if run.config.baseline
            && let Some(timed) = calibration.library_at(fused_bytes(&run.config, &shapes))
        {
            predicted += timed - communication_secs(&calls, world, link, &Algorithm::Ring)?;
        }
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
        link: ProfileLink::of(&gradwire, gradwire_spread),
        library_link: Some(ProfileLink::of(&library, library_spread)),
        latency_before_after_s: calibration.latency_before_after(),
        burst: timed_burst,
        strategies,
    })
}

/// How far a prediction may be from the measured step before the shaped
/// report warns (relative to the measured step).
pub const MODEL_WARNING: f64 = 0.15;

/// How far the link's latency may move between the calibration and its
/// recheck after the runs before the shaped report warns.
pub const LATENCY_WARNING: f64 = 0.25;

/// A line for each strategy of `profile` whose prediction is off the
/// measured step by more than [`MODEL_WARNING`], naming the row, for
/// each run the model does not cover, and for a latency that moved by
/// more than [`LATENCY_WARNING`] during the runs: what `gradwire compare
/// --network` prints under its table, so that a broken model cannot hide
/// in it.
pub fn model_warnings(profile: &Profile, runs: &[RunReport]) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some((before, after)) = profile.latency_before_after_s {
        let moved = after / before.max(1e-12) - 1.0;
        if moved.abs() > LATENCY_WARNING {
            lines.push(format!(
                "warning: the link's latency moved by {:+.0} % during the runs (gradwire's \
                 all-reduce of {} B: {:.0} us before, {:.0} us after; the model fits their \
                 mean): predictions of latency-bound rows are less certain",
                moved * 100.0,
                crate::compare::LATENCY_BYTES,
                before * 1e6,
                after * 1e6
            ));
        }
    }
    for run in runs {
        let Some(s) = profile.strategy(&run.label) else {
            lines.push(format!(
                "warning: the cost model has no prediction for {}",
                run.label
            ));
            continue;
        };
        let error = s.predicted_s_per_step / s.measured_s_per_step.max(1e-12) - 1.0;
        if error.abs() > MODEL_WARNING {
            lines.push(format!(
                "warning: the cost model is off by {:+.0} % for {} (predicted {:.1} ms a step, \
                 measured {:.1} ms; more than {:.0} %)",
                error * 100.0,
                s.label,
                s.predicted_s_per_step * 1e3,
                s.measured_s_per_step * 1e3,
                MODEL_WARNING * 100.0
            ));
        }
    }
    lines
}

/// `profile`'s prediction for each of `runs`, in order (`None` where the
/// model does not cover the run).
pub fn predictions(profile: &Profile, runs: &[RunReport]) -> Vec<Option<f64>> {
    runs.iter()
        .map(|r| profile.strategy(&r.label).map(|s| s.predicted_s_per_step))
        .collect()
}

#[cfg(test)]
mod tests;
