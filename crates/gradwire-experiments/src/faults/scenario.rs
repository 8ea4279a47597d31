//! One scenario on one rank: the model, the injected faults (a faulty
//! optimizer, a panicking strategy, bad pushes and parameters, panics and
//! early returns) and the record of every step.

use super::*;
use gradwire_algos::adasum::AdaSum;
use gradwire_algos::dimreduce::{DimReduceConfig, Pca};
use gradwire_comm::Communicator;
use gradwire_optim::{
    AnyLoop, DistOptConfig, Optimizer, OptimizerState, ParamSpec, ParamState, Sgd, SgdConfig,
};
use gradwire_tensor::Tensor;
use std::time::Instant;

/// The parameters: two buckets under the fusion threshold of 16.
const PARAMS: [(&str, &[usize]); 3] = [("a", &[3, 5]), ("b", &[7]), ("c", &[11])];
const FUSION_THRESHOLD: usize = 16;

/// An SGD whose next update of parameter `b` fails once when armed (the
/// scenario arms it on the injecting rank at the fault's step).
#[derive(Debug)]
struct FaultyOptimizer {
    inner: Sgd,
    armed: bool,
}

impl Optimizer for FaultyOptimizer {
    type Config = SgdConfig;
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn config(&self) -> &SgdConfig {
        self.inner.config()
    }
    fn register(&mut self, name: &str, config: SgdConfig) -> gradwire_optim::Result<()> {
        self.inner.register(name, config)
    }
    fn update(
        &mut self,
        name: &str,
        param: &mut Tensor,
        grad: &Tensor,
    ) -> gradwire_optim::Result<()> {
        if self.armed && name == "b" {
            self.armed = false;
            return Err(OptimError::InvalidArgument(
                "injected optimizer failure".into(),
            ));
        }
        self.inner.update(name, param, grad)
    }
    fn step(&mut self) {
        self.inner.step();
    }
    fn step_count(&self) -> u64 {
        self.inner.step_count()
    }
    fn param_state(&self, name: &str) -> Option<&ParamState> {
        self.inner.param_state(name)
    }
    fn state(&self) -> gradwire_optim::Result<OptimizerState> {
        self.inner.state()
    }
    fn load_state(&mut self, state: &OptimizerState) -> gradwire_optim::Result<()> {
        self.inner.load_state(state)
    }
    fn snapshot_into(&self, snapshot: &mut OptimizerState) -> gradwire_optim::Result<()> {
        self.inner.snapshot_into(snapshot)
    }
    fn restore_snapshot(&mut self, snapshot: &OptimizerState) -> gradwire_optim::Result<()> {
        self.inner.restore_snapshot(snapshot)
    }
}

// Every buffer call goes to the wrapped SGD (device buffers included).
impl gradwire_optim::StateBuffers for FaultyOptimizer {
    fn buffer_names(&self) -> &'static [&'static str] {
        self.inner.buffer_names()
    }
    fn buffer_values(&self, name: &str, buffer: &str) -> gradwire_optim::Result<Option<Vec<f32>>> {
        self.inner.buffer_values(name, buffer)
    }
    fn set_buffer(
        &mut self,
        name: &str,
        shape: &[usize],
        buffer: &str,
        values: Vec<f32>,
    ) -> gradwire_optim::Result<()> {
        self.inner.set_buffer(name, shape, buffer, values)
    }
}

/// AdaSum, or a panic when armed (the scenario arms it on the injecting
/// rank at the fault's step).
struct PanickingStrategy<C: Communicator> {
    inner: AdaSum<C>,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<C: Communicator + 'static> gradwire_optim::Strategy<C> for PanickingStrategy<C> {
    // The fault the matrix injects: a strategy that panics.
    #[allow(clippy::panic)]
    fn combine(
        &mut self,
        comm: &C,
        bucket: &gradwire_optim::BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<gradwire_optim::Combined> {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            panic!("injected panic in the strategy of rank {}", comm.rank());
        }
        gradwire_optim::Strategy::combine(&mut self.inner, comm, bucket, tensors)
    }
}

/// This rank's gradient of parameter `k` at `step` (deterministic).
fn gradient(rank: usize, step: usize, k: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((rank * 31 + step * 7 + k * 3 + i) as f32) * 0.37).sin() * 0.1)
        .collect()
}

/// Runs one scenario on this rank: [`STEPS`] steps, the last rank
/// injecting `fault` at [`FAULT_STEP`].
pub fn run_scenario<C: Communicator + 'static>(
    comm: C,
    mode: StrategyConfig,
    fault: Fault,
    skip_non_finite: bool,
) -> gradwire_optim::Result<RankRecord> {
    let faulty = comm.world_size() - 1;
    run_schedule(
        comm,
        mode,
        &[(FAULT_STEP, faulty, fault)],
        skip_non_finite,
        STEPS,
    )
}

/// Runs `steps` steps on this rank, injecting each `(step, rank, fault)` of
/// `schedule` (at most one fault per rank and step: the first listed).
pub fn run_schedule<C: Communicator + 'static>(
    comm: C,
    mode: StrategyConfig,
    schedule: &[(usize, usize, Fault)],
    skip_non_finite: bool,
    steps: usize,
) -> gradwire_optim::Result<RankRecord> {
    run_steps(comm, mode, schedule, skip_non_finite, steps, &[], None)
}

/// [`run_schedule`] with the front end replaced before step `resume_at`
/// by a new one restored from its checkpoint's bytes (every rank at once): a run
/// that must end bitwise as the one without the restore, whatever the
/// schedule left pending (a fault kept for a round's end, a fragment in
/// flight, an undecided bucket order).
pub fn run_schedule_resumed<C: Communicator + 'static>(
    comm: C,
    mode: StrategyConfig,
    schedule: &[(usize, usize, Fault)],
    skip_non_finite: bool,
    steps: usize,
    resume_at: usize,
) -> gradwire_optim::Result<RankRecord> {
    run_steps(
        comm,
        mode,
        schedule,
        skip_non_finite,
        steps,
        &[],
        Some(resume_at),
    )
}

/// The same run without faults and with the steps `omitted` not taken at
/// all, on any rank (nothing pushed, no `finish`; recorded as skipped):
/// what a run whose steps failed or were skipped there must end with, bit
/// for bit, since a failed step changes nothing.
pub fn run_without<C: Communicator + 'static>(
    comm: C,
    mode: StrategyConfig,
    skip_non_finite: bool,
    omitted: &[usize],
    steps: usize,
) -> gradwire_optim::Result<RankRecord> {
    run_steps(comm, mode, &[], skip_non_finite, steps, omitted, None)
}

fn run_steps<C: Communicator + 'static>(
    comm: C,
    mode: StrategyConfig,
    schedule: &[(usize, usize, Fault)],
    skip_non_finite: bool,
    steps: usize,
    omitted: &[usize],
    resume_at: Option<usize>,
) -> gradwire_optim::Result<RankRecord> {
    let rank = comm.rank();
    let fault_at = |step: usize| {
        schedule
            .iter()
            .find(|(s, r, _)| *s == step && *r == rank)
            .map_or(Fault::None, |(_, _, f)| *f)
    };
    let specs: Vec<ParamSpec> = PARAMS.iter().map(|(n, s)| ParamSpec::new(*n, *s)).collect();
    let strategy_armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let config = DistOptConfig {
        // DimReduce starts dense and is entered below.
        strategy: mode,
        fusion_threshold: FUSION_THRESHOLD,
        skip_non_finite,
        ..DistOptConfig::default()
    };
    let mut params: Vec<Tensor> = specs
        .iter()
        .enumerate()
        .map(|(k, s)| {
            Tensor::from_vec(
                gradient(99, 0, k, s.shape.iter().product()),
                s.shape.clone(),
            )
        })
        .collect::<Result<_, _>>()?;
    let total: usize = params.iter().map(Tensor::len).sum();
    let front_end = |comm: C| -> gradwire_optim::Result<AnyLoop<FaultyOptimizer, C>> {
        let optimizer = FaultyOptimizer {
            inner: Sgd::new(SgdConfig {
                lr: gradwire_optim::Schedule::Constant { value: 0.1 },
                momentum: gradwire_optim::Schedule::Constant { value: 0.9 },
                ..SgdConfig::default()
            })?,
            armed: false,
        };
        let mut dist = match adasum_group(mode) {
            // AdaSum as the engine prepares it, wrapped so that it panics on demand.
            Some(group) => {
                let inner = AdaSum::grouped(&comm, group).map_err(OptimError::from)?;
                let strategy = PanickingStrategy {
                    inner,
                    armed: std::sync::Arc::clone(&strategy_armed),
                };
                AnyLoop::with_strategy(optimizer, comm, specs.clone(), config.clone(), strategy)?
            }
            None => AnyLoop::new(optimizer, comm, specs.clone(), config.clone())?,
        };
        if let Some(dimreduce) = dist.dimreduce_mut() {
            // Two components over the whole model, the same on every rank.
            let snapshots: Vec<Vec<f32>> = (0..4).map(|s| gradient(7, s, 0, total)).collect();
            let pca = Pca::fit(&snapshots, 2).map_err(OptimError::from)?;
            dimreduce.start(&pca, DimReduceConfig::default())?;
        }
        Ok(dist)
    };
    let mut dist = front_end(comm)?;
    let mut record = RankRecord {
        outcomes: Vec::new(),
        times: Vec::new(),
        params: Vec::new(),
    };
    for step in 0..steps {
        if omitted.contains(&step) {
            record.times.push(Duration::ZERO);
            record.outcomes.push(Outcome::Skipped);
            continue;
        }
        if resume_at == Some(step) {
            // A new front end on the same communicator, from the old one's
            // checkpoint read back from the bytes a file holds.
            let bytes = gradwire_optim::checkpoint::to_bytes(&dist.checkpoint()?)?;
            dist = front_end(dist.into_comm())?;
            dist.restore(&gradwire_optim::checkpoint::from_bytes(&bytes)?)?;
        }
        let fault = fault_at(step);
        let inject = fault != Fault::None;
        dist.optimizer_mut().armed = fault == Fault::OptimizerError;
        strategy_armed.store(
            fault == Fault::PanickingStrategy,
            std::sync::atomic::Ordering::SeqCst,
        );
        let start = Instant::now();
        // Backward order: the last parameter first.
        for (k, spec) in specs.iter().enumerate().rev() {
            let n: usize = spec.shape.iter().product();
            let mut g = gradient(rank, step, k, n);
            let mut name = spec.name.as_str();
            if inject {
                match (fault, k) {
                    (Fault::Nan, 0) => g[3] = f32::NAN,
                    (Fault::Inf, 2) => g[0] = f32::INFINITY,
                    (Fault::WrongLength, 1) => g.push(0.5),
                    (Fault::UnknownName, 1) => name = "nope",
                    _ => {}
                }
            }
            let shape = if g.len() == n {
                spec.shape.clone()
            } else {
                vec![g.len()]
            };
            // A push error is this rank's to report; the step still ends
            // with finish, where every rank learns of it.
            let _ = dist.push(name, Tensor::from_vec(g, shape)?);
        }
        match fault {
            // The fault the matrix injects: a rank that panics.
            #[allow(clippy::panic)]
            Fault::RankPanics => panic!("injected panic on rank {rank}"),
            // The early return drops the front end, and with it the communicator.
            Fault::DropsCommunicator => return Ok(record),
            _ => {}
        }
        let mut wrong = Tensor::from_vec(vec![0f32; 15], 15)?;
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        let mut targets: Vec<(&str, &mut Tensor)> =
            names.iter().copied().zip(params.iter_mut()).collect();
        if inject && fault == Fault::WrongShape {
            targets[0].1 = &mut wrong;
        }
        let result = match dist.dimreduce_mut() {
            Some(dimreduce) => {
                let loss = 1.0 + step as f64;
                dimreduce.finish_dimreduce(targets, loss, |_| Ok(0.5))
            }
            None => dist.finish(targets),
        };
        record.times.push(start.elapsed());
        record.outcomes.push(Outcome::of(&result));
        if matches!(record.outcomes.last(), Some(Outcome::Lost(_))) {
            break; // a rank is gone: the run cannot go on
        }
    }
    for p in &params {
        record
            .params
            .extend(p.to_vec::<f32>()?.into_iter().map(f32::to_bits));
    }
    Ok(record)
}
