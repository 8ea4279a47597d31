//! `gradwire bench distopt`: what DistOpt adds to an optimizer's step, on
//! one device, for a model's parameter shapes. A DistOpt step pushes every
//! gradient in backward order (a fresh tensor each, as backward makes
//! them) and `finish`es (the exchange, at W = 1, and the update); the
//! optimizer alone takes the same fresh gradients in the same order. The
//! two take turns, round after round, so that both see the same machine;
//! each figure is the median over the rounds of the mean step time in a
//! round, the device waited for at the end of every step.
//!
//! On a GPU (`--device cuda`, features `cuda` and `nccl`): NcclComm on
//! device 0, parameters, gradients and optimizer state in its memory; the
//! counterpart of `torch_ddp_bench.py` in the GPU bundle, which times
//! PyTorch DDP's step against plain PyTorch on the same shapes the same
//! way. On the CPU (`--device cpu`): LocalComm with one rank, host tensors.

use crate::config::TrainConfig;
use crate::error::{ExperimentError, Result};
use gradwire_comm::Communicator;
use gradwire_optim::{
    AnyOptimizer, DistOpt, DistOptConfig, Optimizer, ParamSpec, Schedule, Sgd, SgdConfig,
    StrategyConfig, TrainingLoop,
};
use gradwire_tensor::{Device, Tensor};
use serde::Serialize;
use std::time::Instant;

use super::TableRow;
use super::strategies::compressing_from_the_first_step;

/// Gradient sets the steps rotate through, so that no step finds its
/// gradients in the last level of cache.
const ROTATION: usize = 2;

/// Where `bench distopt` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchDevice {
    /// Host tensors, LocalComm with one rank.
    Cpu,
    /// CUDA device 0, NcclComm with one rank (features `cuda`, `nccl`).
    Cuda,
}

/// One strategy's DistOpt step beside the optimizer alone.
#[derive(Debug, Clone, Serialize)]
pub struct DistOptRow {
    /// The strategy's label (as in `compare`).
    pub strategy: String,
    /// Parameters of the model.
    pub params: usize,
    /// Milliseconds per step of the optimizer alone (median over the
    /// rounds, in turns with this row's DistOpt).
    pub alone_ms: f64,
    /// Milliseconds per DistOpt step (the same).
    pub distopt_ms: f64,
    /// What DistOpt adds per step: `distopt_ms - alone_ms`.
    pub added_ms: f64,
    /// `distopt_ms / alone_ms`.
    pub vs_alone: f64,
}

impl TableRow for DistOptRow {
    const HEADER: &'static [&'static str] = &[
        "strategy",
        "params",
        "alone ms",
        "DistOpt ms",
        "added ms",
        "vs alone",
    ];

    fn cells(&self) -> Vec<String> {
        vec![
            self.strategy.clone(),
            self.params.to_string(),
            format!("{:.3}", self.alone_ms),
            format!("{:.3}", self.distopt_ms),
            format!("{:.3}", self.added_ms),
            format!("{:.3}", self.vs_alone),
        ]
    }
}

/// The optimizer of both sides: SGD with momentum 0.9 (its state a buffer
/// per parameter, as PyTorch's).
fn optimizer() -> Result<AnyOptimizer> {
    Ok(AnyOptimizer::new(Sgd::new(SgdConfig {
        lr: Schedule::constant(0.01),
        momentum: Schedule::constant(0.9),
        ..SgdConfig::default()
    })?)?)
}

/// The parameters' names.
fn names(shapes: &[Vec<usize>]) -> Vec<String> {
    (0..shapes.len()).map(|k| format!("p{k}")).collect()
}

/// Gradient-like tensors of `shapes` on `device` ([`super::gradient`]'s
/// values times `scale`).
fn tensors(shapes: &[Vec<usize>], scale: f32, device: Device) -> Result<Vec<Tensor>> {
    shapes
        .iter()
        .map(|shape| {
            let values = super::gradient(shape.iter().product())
                .into_iter()
                .map(|g| scale * g)
                .collect();
            Ok(Tensor::from_vec(values, shape.clone())?.to_device(device)?)
        })
        .collect()
}

/// The workload of both sides: shapes, names, the gradient sets, and how
/// to wait for the device.
struct Workload<'a> {
    names: Vec<String>,
    grads: Vec<Vec<Tensor>>,
    steps: usize,
    wait: &'a (dyn Fn() -> Result<()> + Sync),
}

impl<'a> Workload<'a> {
    /// `shapes`' names and [`ROTATION`] gradient sets on `device`, `steps`
    /// steps a turn, `wait` after each.
    fn new(
        shapes: &[Vec<usize>],
        device: Device,
        steps: usize,
        wait: &'a (dyn Fn() -> Result<()> + Sync),
    ) -> Result<Workload<'a>> {
        Ok(Workload {
            names: names(shapes),
            grads: (0..ROTATION)
                .map(|_| tensors(shapes, 0.01, device))
                .collect::<Result<_>>()?,
            steps,
            wait,
        })
    }

    /// Mean seconds per step over `steps` steps of `step` (given the
    /// gradient set of the step), the device waited for after each.
    fn timed(&self, mut step: impl FnMut(&[Tensor]) -> Result<()>) -> Result<f64> {
        let start = Instant::now();
        for s in 0..self.steps {
            step(&self.grads[s % self.grads.len()])?;
            (self.wait)()?;
        }
        Ok(start.elapsed().as_secs_f64() / self.steps as f64)
    }
}

/// DistOpt with `strategy` against the optimizer alone on `comm` (one rank),
/// `rounds` rounds of turns after one unmeasured round: (alone, DistOpt)
/// seconds per step, medians over the rounds; `comm` given back.
fn turns<C: Communicator + 'static>(
    comm: C,
    strategy: StrategyConfig,
    shapes: &[Vec<usize>],
    work: &Workload<'_>,
    rounds: usize,
    device: Device,
) -> Result<((f64, f64), C)> {
    let specs: Vec<ParamSpec> = work
        .names
        .iter()
        .zip(shapes)
        .map(|(name, shape)| ParamSpec::new(name.clone(), shape.clone()).on_device(device))
        .collect();
    let config = DistOptConfig {
        strategy,
        ..DistOptConfig::default()
    };
    let mut dist = DistOpt::new(optimizer()?, comm, specs, config)?;
    let mut alone = optimizer()?;
    let mut dist_params = tensors(shapes, 0.1, device)?;
    let mut alone_params = tensors(shapes, 0.1, device)?;
    let mut distopt_step = |grads: &[Tensor]| -> Result<()> {
        // Backward order: the last parameter first.
        for (name, grad) in work.names.iter().zip(grads).rev() {
            dist.push(name, grad.clone())?;
        }
        dist.finish(
            work.names
                .iter()
                .map(String::as_str)
                .zip(dist_params.iter_mut()),
        )?;
        Ok(())
    };
    let mut alone_step = |grads: &[Tensor]| -> Result<()> {
        // Every gradient made before the optimizer runs, as backward makes
        // them (and as DistOpt holds its pushed ones until `finish`): the
        // same memory live on both sides.
        let fresh: Vec<Tensor> = grads.to_vec();
        for ((name, grad), param) in work
            .names
            .iter()
            .zip(&fresh)
            .zip(alone_params.iter_mut())
            .rev()
        {
            alone.update(name, param, grad)?;
        }
        alone.step();
        Ok(())
    };
    let (mut a, mut d) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        let times = (work.timed(&mut alone_step)?, work.timed(&mut distopt_step)?);
        if round > 0 {
            a.push(times.0);
            d.push(times.1);
        }
    }
    let median = |v: Vec<f64>| gradwire_algos::cost::median(v).unwrap_or(f64::NAN);
    Ok(((median(a), median(d)), dist.into_comm()))
}

/// The rows of `entries` (dense first, as the reference) on `comm`.
fn rows_on<C: Communicator + 'static>(
    mut comm: C,
    entries: &[StrategyConfig],
    shapes: &[Vec<usize>],
    work: &Workload<'_>,
    rounds: usize,
    device: Device,
) -> Result<Vec<DistOptRow>> {
    let params = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    let mut rows = Vec::new();
    let others = entries.iter().filter(|&&e| e != StrategyConfig::Dense);
    for &strategy in std::iter::once(&StrategyConfig::Dense).chain(others) {
        let config = TrainConfig {
            strategy,
            world: 1,
            ..TrainConfig::default()
        };
        config.validate()?;
        let ((alone, distopt), back) = turns(
            comm,
            config.distopt_strategy(),
            shapes,
            work,
            rounds,
            device,
        )?;
        comm = back;
        let (alone_ms, distopt_ms) = (alone * 1e3, distopt * 1e3);
        rows.push(DistOptRow {
            strategy: config.label(),
            params,
            alone_ms,
            distopt_ms,
            added_ms: distopt_ms - alone_ms,
            vs_alone: distopt / alone,
        });
    }
    Ok(rows)
}

/// `gradwire bench distopt`: every strategy of `entries` (gradient
/// strategies only; PowerSGD compressing from the first step) on `shapes`,
/// `steps` steps a round, `rounds` measured rounds, on `device`.
pub fn distopt_steps(
    entries: &[StrategyConfig],
    shapes: &[Vec<usize>],
    device: BenchDevice,
    steps: usize,
    rounds: usize,
) -> Result<Vec<DistOptRow>> {
    if steps == 0 || rounds == 0 {
        return Err(ExperimentError::Usage(
            "--steps and --rounds must be at least 1".into(),
        ));
    }
    let entries = entries
        .iter()
        .map(|&strategy| {
            if strategy.training_loop() == TrainingLoop::Gradients {
                Ok(compressing_from_the_first_step(strategy))
            } else {
                Err(ExperimentError::Usage(format!(
                    "{} is not a gradient strategy: DistOpt steps with gradients",
                    strategy.name()
                )))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    match device {
        BenchDevice::Cpu => {
            let work = Workload::new(shapes, Device::Cpu, steps, &|| Ok(()))?;
            let results = gradwire_comm::local::run(1, |comm| {
                rows_on(comm, &entries, shapes, &work, rounds, Device::Cpu)
            })?;
            super::rank_zero(results)?
        }
        BenchDevice::Cuda => on_gpu(&entries, shapes, steps, rounds),
    }
}

/// The rows on CUDA device 0, NcclComm with one rank.
#[cfg(feature = "nccl")]
fn on_gpu(
    entries: &[StrategyConfig],
    shapes: &[Vec<usize>],
    steps: usize,
    rounds: usize,
) -> Result<Vec<DistOptRow>> {
    use gradwire_comm::nccl::{self, NcclConfig};
    let device = Device::Cuda(0);
    let cuda = gradwire_tensor::CudaDevice::get(0)?;
    let wait = || Ok(cuda.synchronize()?);
    let work = Workload::new(shapes, device, steps, &wait)?;
    let results = nccl::run(&[0], NcclConfig::default(), |comm| {
        Ok(rows_on(comm, entries, shapes, &work, rounds, device))
    })?;
    super::rank_zero(results)??
}

#[cfg(not(feature = "nccl"))]
fn on_gpu(_: &[StrategyConfig], _: &[Vec<usize>], _: usize, _: usize) -> Result<Vec<DistOptRow>> {
    Err(ExperimentError::nccl_missing())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::strategies::mlp_shapes;

    #[test]
    fn every_strategy_gets_a_row_beside_the_optimizer_alone() {
        let entries: Vec<StrategyConfig> = ["fp16", "topk:0.01", "powersgd:2"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let shapes = mlp_shapes(&[33]);
        let rows = distopt_steps(&entries, &shapes, BenchDevice::Cpu, 2, 1).unwrap();
        let labels: Vec<&str> = rows.iter().map(|r| r.strategy.as_str()).collect();
        assert_eq!(labels.len(), 4, "{labels:?}");
        assert_eq!(labels[0], "dense");
        for row in &rows {
            assert_eq!(row.params, 64 * 33 + 33 + 33 * 10 + 10);
            assert!(row.alone_ms > 0.0 && row.distopt_ms > 0.0, "{row:?}");
        }
    }

    #[test]
    fn local_steps_and_no_steps_are_usage_errors() {
        let shapes = mlp_shapes(&[4]);
        let diloco: StrategyConfig = "diloco:4".parse().unwrap();
        for (entries, steps) in [(vec![diloco], 1), (vec![], 0)] {
            let err = distopt_steps(&entries, &shapes, BenchDevice::Cpu, steps, 1).unwrap_err();
            assert!(matches!(err, ExperimentError::Usage(_)), "{err:?}");
        }
    }
}
