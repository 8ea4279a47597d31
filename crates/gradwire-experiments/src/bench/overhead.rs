//! `gradwire bench overhead`: what going data-parallel costs a candle
//! training loop. The same MLP (784-512-256-10, ReLU, cross-entropy on a
//! fixed random batch) steps with candle's SGD alone, then through
//! `gradwire_candle::DataParallel` (dense) at W = 1 and on LocalComm at
//! W = 2; the loops take turns, round after round, so that both see the
//! same machine, and each figure is the median over the rounds of the mean
//! step time in a round. The ratio to candle alone is the overhead.

use crate::error::{ExperimentError, Result};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Linear, Optimizer, SGD, VarBuilder, VarMap, linear};
use gradwire_candle::DataParallel;
use gradwire_comm::{LocalComm, local};
use gradwire_optim::DistOptConfig;
use serde::Serialize;
use std::time::{Duration, Instant};

use super::TableRow;

/// The MLP's layer widths (the reference model: 535 k parameters).
const WIDTHS: [usize; 4] = [784, 512, 256, 10];

/// One setup's step time.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadRow {
    /// What steps: candle alone, or DataParallel at W ranks.
    pub setup: String,
    /// Ranks.
    pub world: usize,
    /// Milliseconds per step (median over the rounds; at W > 1, rank 0's).
    pub ms_per_step: f64,
    /// Of which after backward: the optimizer's step (candle alone), or
    /// DataParallel's exchange and step.
    pub step_ms: f64,
    /// 1 + what this setup's part after backward adds to candle's, over
    /// candle's whole step (at W = 1 the median of the rounds' ratios; at
    /// W = 2 the ranks also share this machine's cores for their backward
    /// passes, which the ratio leaves out).
    pub vs_candle: f64,
}

impl TableRow for OverheadRow {
    const HEADER: &'static [&'static str] = &[
        "setup",
        "W",
        "ms per step",
        "after backward ms",
        "vs candle alone",
    ];

    fn cells(&self) -> Vec<String> {
        vec![
            self.setup.clone(),
            self.world.to_string(),
            format!("{:.3}", self.ms_per_step),
            format!("{:.3}", self.step_ms),
            format!("{:.3}", self.vs_candle),
        ]
    }
}

/// The MLP and its batch on one worker.
struct Mlp {
    varmap: VarMap,
    layers: Vec<Linear>,
    inputs: Tensor,
    labels: Tensor,
}

impl Mlp {
    /// The MLP (candle's initialisation) and a batch of `batch` random
    /// inputs with labels.
    fn new(batch: usize) -> candle_core::Result<Mlp> {
        let device = Device::Cpu;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        let layers = WIDTHS
            .windows(2)
            .enumerate()
            .map(|(i, w)| linear(w[0], w[1], vb.pp(format!("fc{i}"))))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let inputs = Tensor::rand(0f32, 1.0, (batch, WIDTHS[0]), &device)?;
        let labels = Tensor::rand(0f32, WIDTHS[3] as f32, batch, &device)?
            .floor()?
            .to_dtype(DType::U32)?;
        Ok(Mlp {
            varmap,
            layers,
            inputs,
            labels,
        })
    }

    /// The loss on the batch.
    fn loss(&self) -> candle_core::Result<Tensor> {
        let mut x = self.inputs.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x)?;
            if i + 1 < self.layers.len() {
                x = x.relu()?;
            }
        }
        candle_nn::loss::cross_entropy(&x, &self.labels)
    }
}

/// Per-step means over `steps` steps: the whole step, and its part after
/// backward (`step` returns that part's duration).
fn timed(steps: usize, mut step: impl FnMut() -> Result<Duration>) -> Result<(f64, f64)> {
    let began = Instant::now();
    let mut after_backward = Duration::ZERO;
    for _ in 0..steps {
        after_backward += step()?;
    }
    let n = steps as f64;
    Ok((
        began.elapsed().as_secs_f64() / n,
        after_backward.as_secs_f64() / n,
    ))
}

/// The median of `values` (NaN if empty).
fn median(values: Vec<f64>) -> f64 {
    gradwire_algos::cost::median(values).unwrap_or(f64::NAN)
}

/// The medians over the rounds of the whole step and of its part after
/// backward.
fn medians(rounds: &[(f64, f64)]) -> (f64, f64) {
    (
        median(rounds.iter().map(|r| r.0).collect()),
        median(rounds.iter().map(|r| r.1).collect()),
    )
}

/// One step of candle alone: backward, then the optimizer's step (timed).
fn step_alone(mlp: &Mlp, sgd: &mut SGD) -> Result<Duration> {
    let grads = mlp.loss()?.backward()?;
    let began = Instant::now();
    sgd.step(&grads)?;
    Ok(began.elapsed())
}

/// One step through DataParallel: backward, then its step (timed: the
/// exchange and the optimizer's step).
fn step_parallel(mlp: &Mlp, dp: &mut DataParallel<SGD, LocalComm>) -> Result<Duration> {
    let grads = mlp.loss()?.backward()?;
    let began = Instant::now();
    dp.step(grads)?;
    Ok(began.elapsed())
}

/// candle alone, DataParallel at W = 1 and at W = 2 (LocalComm), `rounds`
/// rounds of `steps` steps each, on batches of `batch` samples per worker.
pub fn overhead(batch: usize, steps: usize, rounds: usize) -> Result<Vec<OverheadRow>> {
    if batch == 0 || steps == 0 || rounds == 0 {
        return Err(ExperimentError::Usage(
            "--batch, --steps and --rounds must be at least 1".into(),
        ));
    }
    let lr = 0.01;
    // Candle alone and DataParallel at W = 1, in turns.
    let alone = Mlp::new(batch)?;
    let mut sgd = SGD::new(alone.varmap.all_vars(), lr)?;
    let one = Mlp::new(batch)?;
    let comm = LocalComm::create(1)?
        .pop()
        .ok_or_else(|| ExperimentError::Usage("no communicator for one rank".into()))?;
    let mut dp = DataParallel::<SGD, _>::new(&one.varmap, lr, comm, DistOptConfig::default())?;
    // Warm-up: the first steps make the buffers and threads.
    timed(steps, || step_alone(&alone, &mut sgd))?;
    timed(steps, || step_parallel(&one, &mut dp))?;
    let (mut a, mut d) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(timed(steps, || step_alone(&alone, &mut sgd))?);
        d.push(timed(steps, || step_parallel(&one, &mut dp))?);
    }
    // W = 2 on LocalComm: rank 0's time per step, the same number of rounds.
    let two = local::run(2, |comm: LocalComm| -> Result<(f64, f64)> {
        let mlp = Mlp::new(batch)?;
        let mut dp = DataParallel::<SGD, _>::new(&mlp.varmap, lr, comm, DistOptConfig::default())?;
        timed(steps, || step_parallel(&mlp, &mut dp))?;
        let per_round = (0..rounds)
            .map(|_| timed(steps, || step_parallel(&mlp, &mut dp)))
            .collect::<Result<Vec<_>>>()?;
        Ok(medians(&per_round))
    })?;
    let two = two
        .into_iter()
        .next()
        .transpose()?
        .unwrap_or((f64::NAN, f64::NAN));
    // The overhead is what DataParallel's step adds to candle's optimizer
    // step, over candle's whole step: the part after backward is measured
    // on its own, so the backward passes' noise stays out of it (each
    // round's pair saw the same machine; the median of the rounds).
    let extra = median(d.iter().zip(&a).map(|(d, a)| (d.1 - a.1) / a.0).collect());
    let (alone, parallel) = (medians(&a), medians(&d));
    let row = |setup: &str, world: usize, secs: (f64, f64), ratio: f64| OverheadRow {
        setup: setup.into(),
        world,
        ms_per_step: secs.0 * 1e3,
        step_ms: secs.1 * 1e3,
        vs_candle: ratio,
    };
    Ok(vec![
        row("candle SGD alone", 1, alone, 1.0),
        row("DataParallel, dense", 1, parallel, 1.0 + extra),
        row(
            "DataParallel, dense (LocalComm)",
            2,
            two,
            1.0 + (two.1 - alone.1) / alone.0,
        ),
    ])
}
