//! `gradwire bench strategies`: what every gradient strategy puts on the
//! wire per step, for a model's real parameter shapes (ResNet-50's 25.6 M
//! parameters in 161 tensors, or the digits MLP), beside dense f32 in the
//! same run. Each strategy runs a few GradSync steps (DiLoCo's: local
//! steps) on W in-process ranks
//! with DistOpt's default buckets (2 Mi elements; the library call takes
//! any [`Bucketing`]) and gradient-like data;
//! the bytes are what a rank sends per step (ring model, the strategies'
//! own `Traffic`), which depend on the shapes, the buckets and the
//! settings, not on the machine.

use crate::config::TrainConfig;
use crate::error::{ExperimentError, Result};
use gradwire_algos::cost::Bucketing;
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::{DistOptConfig, GradSync, ParamSpec, SkipVote, StrategyConfig, TrainingLoop};
use serde::Serialize;
use std::time::Instant;

/// The parameter shapes of `bench strategies`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ShapeModel {
    /// torchvision's ResNet-50 (161 tensors, 25.6 M parameters).
    Resnet50,
    /// The digits MLP (one hidden layer of 128).
    Mlp,
}

impl ShapeModel {
    /// The model's parameter shapes.
    pub fn shapes(self) -> Vec<Vec<usize>> {
        match self {
            ShapeModel::Resnet50 => resnet50_shapes(),
            ShapeModel::Mlp => mlp_shapes(&[128]),
        }
    }
}

/// The parameter shapes of torchvision's ResNet-50 (conv weights
/// `[out, in, k, k]`, batch-norm weight and bias, the classifier), in
/// declaration order: 25 557 032 parameters.
pub fn resnet50_shapes() -> Vec<Vec<usize>> {
    let mut shapes = Vec::new();
    let conv_bn = |shapes: &mut Vec<Vec<usize>>, out: usize, inp: usize, k: usize| {
        shapes.push(vec![out, inp, k, k]);
        shapes.push(vec![out]);
        shapes.push(vec![out]);
    };
    conv_bn(&mut shapes, 64, 3, 7);
    let mut inp = 64;
    for (blocks, width) in [(3, 64), (4, 128), (6, 256), (3, 512)] {
        for b in 0..blocks {
            conv_bn(&mut shapes, width, inp, 1);
            conv_bn(&mut shapes, width, width, 3);
            conv_bn(&mut shapes, width * 4, width, 1);
            if b == 0 {
                // The projection shortcut.
                conv_bn(&mut shapes, width * 4, inp, 1);
            }
            inp = width * 4;
        }
    }
    shapes.push(vec![1000, 2048]);
    shapes.push(vec![1000]);
    shapes
}

/// The digits MLP's shapes (64 inputs, `hidden` layers, 10 classes).
pub fn mlp_shapes(hidden: &[usize]) -> Vec<Vec<usize>> {
    let mut shapes = Vec::new();
    let mut inp = 64;
    for &h in hidden.iter().chain(&[10]) {
        shapes.push(vec![h, inp]);
        shapes.push(vec![h]);
        inp = h;
    }
    shapes
}

/// `strategy`, PowerSGD compressing from the first step (a bench's few
/// steps would otherwise all be its dense warm-up).
pub(crate) fn compressing_from_the_first_step(strategy: StrategyConfig) -> StrategyConfig {
    match strategy {
        StrategyConfig::PowerSgd(config) => {
            StrategyConfig::PowerSgd(gradwire_algos::PowerSgdConfig {
                start_step: 0,
                ..config
            })
        }
        other => other,
    }
}

/// One strategy's bytes and time per step.
#[derive(Debug, Clone, Serialize)]
pub struct StrategyRow {
    /// The strategy's label (as in `compare`).
    pub strategy: String,
    /// Parameters of the model.
    pub params: usize,
    /// Ranks.
    pub world: usize,
    /// Bytes a rank sends per step (mean over the measured steps).
    pub bytes_per_step: f64,
    /// Dense f32's bytes per step divided by this strategy's.
    pub vs_dense: f64,
    /// Seconds per step, all W ranks on this machine's cores (selection,
    /// quantization and in-process exchange together).
    pub step_secs: f64,
}

/// Gradient-like values for parameter `k` of rank `rank` at `step`: a
/// shared direction plus each rank's own part, scaled per tensor.
fn fill(grad: &mut [f32], rank: usize, step: usize, k: usize) {
    let mut s = (k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (step as u64 + 1) << 20;
    let scale = 0.01 / (1.0 + (k % 7) as f32);
    for (i, g) in grad.iter_mut().enumerate() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let own = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        let shared = (((i % 97) as f32) - 48.0) / 48.0;
        *g = scale * (shared + own * (1.0 + rank as f32 * 0.1));
    }
}

/// Runs `steps` GradSync steps of `mode` on `world` ranks over `shapes`
/// (the first `warm` not measured); returns (bytes sent per step, seconds
/// per step).
fn run(
    mode: StrategyConfig,
    shapes: &[Vec<usize>],
    bucketing: &Bucketing,
    world: usize,
    warm: usize,
    steps: usize,
) -> Result<(f64, f64)> {
    let specs: Vec<ParamSpec> = shapes
        .iter()
        .enumerate()
        .map(|(k, s)| ParamSpec::new(format!("p{k}"), s.clone()))
        .collect();
    let config = DistOptConfig {
        strategy: mode,
        fusion_threshold: bucketing.fusion_threshold,
        capacity: bucketing.capacity,
        vote: if bucketing.vote_per_bucket {
            SkipVote::PerBucket
        } else {
            SkipVote::PerStep
        },
        ..DistOptConfig::default()
    };
    let results = local::run(world, |comm: LocalComm| -> Result<(u64, f64)> {
        let rank = comm.rank();
        let mut sync = GradSync::new(comm, specs.clone(), config.clone())?;
        let mut grads: Vec<Vec<f32>> = shapes
            .iter()
            .map(|s| vec![0f32; s.iter().product()])
            .collect();
        // DiLoCo's parameters, stepped by a plain SGD of the caller's.
        let mut params: Vec<Vec<f32>> = grads.clone();
        let (mut bytes, mut secs) = (0u64, 0f64);
        for step in 0..warm + steps {
            for (k, g) in grads.iter_mut().enumerate() {
                fill(g, rank, step, k);
            }
            sync.comm().barrier()?;
            let start = Instant::now();
            // DiLoCo's warm-up by gradients combines gradients.
            let stats = if sync.current_loop() == TrainingLoop::LocalSteps {
                let mut views: Vec<&mut [f32]> =
                    params.iter_mut().map(|p| p.as_mut_slice()).collect();
                sync.step_locally(&mut views[..], |targets| {
                    for (p, g) in targets.iter_mut().zip(&grads) {
                        for (p, g) in p.iter_mut().zip(g) {
                            *p -= 0.1 * g;
                        }
                    }
                    Ok(())
                })?
            } else {
                // Backward order: the last parameter first.
                for k in (0..grads.len()).rev() {
                    sync.push(k, &grads[k])?;
                }
                let mut views: Vec<&mut [f32]> =
                    grads.iter_mut().map(|g| g.as_mut_slice()).collect();
                let stats = sync.finish(&mut views)?;
                if sync.training_loop() == TrainingLoop::LocalSteps {
                    for (p, g) in params.iter_mut().zip(&grads) {
                        for (p, g) in p.iter_mut().zip(g) {
                            *p -= 0.1 * g;
                        }
                    }
                }
                stats
            };
            if step >= warm {
                secs += start.elapsed().as_secs_f64();
                bytes += stats.traffic.sent;
            }
        }
        Ok((bytes, secs))
    })?;
    let (bytes, secs) = super::rank_zero(results)??;
    Ok((bytes as f64 / steps as f64, secs / steps as f64))
}

/// Every gradient strategy of `entries` (dense is run first, as the
/// reference) on `shapes` in DistOpt's buckets as `bucketing` plans them
/// (`Bucketing::default()`: DistOpt's defaults, the CLI's) with `world`
/// ranks: `steps` measured steps after
/// `warm` unmeasured ones, PowerSGD compressing from the first. DiLoCo and
/// Streaming DiLoCo run too (inner steps of a plain SGD; their
/// pseudo-gradients leave once every H steps, so the bytes per step are the
/// mean over the measured steps: make them whole rounds). The other
/// local-step strategies (partial, adasum-delta) and DimReduce are
/// refused: they send parameters, not gradients.
pub fn strategies(
    entries: &[StrategyConfig],
    shapes: &[Vec<usize>],
    bucketing: &Bucketing,
    world: usize,
    warm: usize,
    steps: usize,
) -> Result<Vec<StrategyRow>> {
    if steps == 0 || world == 0 {
        return Err(ExperimentError::Usage(
            "--steps and --world must be at least 1".into(),
        ));
    }
    let params = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    let base = TrainConfig {
        world,
        ..TrainConfig::default()
    };
    let mut rows: Vec<StrategyRow> = Vec::new();
    let others = entries.iter().filter(|&&e| e != StrategyConfig::Dense);
    for &strategy in std::iter::once(&StrategyConfig::Dense).chain(others) {
        if strategy.training_loop() != TrainingLoop::Gradients
            && !matches!(strategy, StrategyConfig::DiLoCo(_))
        {
            return Err(ExperimentError::Usage(format!(
                "{} steps locally and sends parameters: not a gradient strategy",
                strategy.name()
            )));
        }
        let strategy = compressing_from_the_first_step(strategy);
        let config = TrainConfig {
            strategy,
            ..base.clone()
        };
        config.validate()?;
        let (bytes, secs) = run(
            config.distopt_strategy(),
            shapes,
            bucketing,
            world,
            warm,
            steps,
        )?;
        let dense_bytes = rows.first().map_or(bytes, |dense| dense.bytes_per_step);
        rows.push(StrategyRow {
            strategy: config.label(),
            params,
            world,
            bytes_per_step: bytes,
            vs_dense: dense_bytes / bytes.max(1.0),
            step_secs: secs,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> StrategyConfig {
        text.parse().unwrap()
    }

    #[test]
    fn resnet50_has_its_published_parameter_count() {
        let shapes = resnet50_shapes();
        assert_eq!(shapes.len(), 161);
        assert_eq!(
            shapes
                .iter()
                .map(|s| s.iter().product::<usize>())
                .sum::<usize>(),
            25_557_032
        );
    }

    #[test]
    fn compressed_strategies_send_less_than_dense_on_the_mlp() {
        let entries: Vec<StrategyConfig> = ["fp16", "topk:0.01", "powersgd:2", "onebit", "uint8"]
            .into_iter()
            .map(parse)
            .collect();
        let rows = strategies(
            &entries,
            &mlp_shapes(&[256]),
            &Bucketing::default(),
            2,
            1,
            2,
        )
        .unwrap();
        assert_eq!(rows.len(), 6);
        assert_eq!(rows[0].strategy, "dense");
        for r in &rows[1..] {
            assert!(r.vs_dense > 1.5, "{}: {}", r.strategy, r.vs_dense);
        }
        // f16 is half of dense (the votes aside).
        assert!((rows[1].vs_dense - 2.0).abs() < 0.1, "{}", rows[1].vs_dense);
        assert!(matches!(
            strategies(
                &[parse("partial")],
                &mlp_shapes(&[8]),
                &Bucketing::default(),
                2,
                0,
                1
            ),
            Err(ExperimentError::Usage(m)) if m.contains("not a gradient strategy")
        ));
    }

    /// Over whole rounds DiLoCo sends, per step, the cost model's mean:
    /// its codec's calls once every H steps. Streaming DiLoCo plans a
    /// bucket per fragment where the model plans one for the MLP, so each
    /// exchange's ring may round a byte differently.
    #[test]
    fn diloco_sends_its_rounds_once_every_h_steps() {
        use gradwire_algos::cost::{Bucketing, bytes_sent, step_collectives};
        let shapes = mlp_shapes(&[256]);
        for (text, slack) in [
            ("diloco:4", 0.0),
            ("diloco:4:uint8", 0.0),
            ("streaming-diloco:4:2", 2.0),
        ] {
            let strategy = parse(text);
            let spec = strategy
                .cost_spec(&gradwire_optim::CostAssumptions {
                    sampled_overshoot: 1.0,
                    dimreduce_components: 1,
                    dimreduce_trials: 1,
                    state_buffers: 0,
                    selected_density: None,
                })
                .unwrap();
            for world in 1..=3 {
                let rows =
                    strategies(&[strategy], &shapes, &Bucketing::default(), world, 0, 8).unwrap();
                let calls = step_collectives(&spec, &shapes, world, &Bucketing::default()).unwrap();
                let model = bytes_sent(&calls);
                let got = rows[1].bytes_per_step;
                assert!(
                    (got - model).abs() <= slack + 1e-9 * model,
                    "{text} W = {world}: {got} bytes per step, the model {model}"
                );
                if world > 1 {
                    assert!(
                        rows[1].vs_dense > 3.5,
                        "{text} W = {world}: {}",
                        rows[1].vs_dense
                    );
                }
            }
        }
    }
}
