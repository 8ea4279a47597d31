//! The fault matrix: DistOpt under injected faults, every mode, any
//! communicator (the failure model of ARCHITECTURE.md, measured).
//!
//! A scenario trains a three-parameter model (two fusion buckets) for
//! [`STEPS`] steps on every rank; at step [`FAULT_STEP`] one rank (the last)
//! injects a fault: a NaN or an infinity in one gradient, a gradient pushed
//! under an unknown name or with a wrong length, a parameter of the wrong
//! shape at `finish`, or an optimizer that fails. The rank does what a
//! training loop does: it reports `push`'s error and still ends the step
//! with `finish`. Each rank records every step's outcome (done, skipped,
//! or the error's kind) and how long the step took; [`Report`] then says
//! whether every rank saw the same outcome at every step, whether the
//! steps after the fault all completed, and whether the ranks ended with
//! bitwise-equal parameters. `gradwire faults` prints it as a table.

use gradwire_algos::adasum::AdaSum;
use gradwire_algos::dimreduce::{DimReduceConfig, Pca};
use gradwire_algos::{FaultKind, HalfPrecision};
use gradwire_comm::Communicator;
use gradwire_compress::SparseCodec;
use gradwire_optim::{
    DistOpt, DistOptConfig, Mode, OptimError, Optimizer, OptimizerState, ParamSpec, ParamState,
    Sgd, SgdConfig,
};
use gradwire_tensor::Tensor;
use std::time::{Duration, Instant};

/// Steps per scenario.
pub const STEPS: usize = 5;
/// The step at which the fault is injected (three steps follow it).
pub const FAULT_STEP: usize = 1;

/// The parameters: two buckets under the fusion threshold of 16.
const PARAMS: [(&str, &[usize]); 3] = [("a", &[3, 5]), ("b", &[7]), ("c", &[11])];
const FUSION_THRESHOLD: usize = 16;

/// A fault one rank injects at [`FAULT_STEP`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// No fault (the control row).
    None,
    /// One gradient entry is NaN.
    Nan,
    /// One gradient entry is +infinity.
    Inf,
    /// A gradient pushed under a name DistOpt does not know.
    UnknownName,
    /// A gradient of the wrong length.
    WrongLength,
    /// A parameter of the wrong shape given to `finish`.
    WrongShape,
    /// The optimizer's update fails.
    OptimizerError,
    /// The combiner (AdaSum) panics, on the communication thread in
    /// adasum-grad mode and on the rank's own thread in adasum-delta mode.
    PanickingCombiner,
    /// The rank's thread panics between its pushes and `finish`.
    RankPanics,
    /// The rank returns early and drops its DistOpt and communicator.
    DropsCommunicator,
}

impl Fault {
    /// Every fault, the control first.
    pub const ALL: [Fault; 7] = [
        Fault::None,
        Fault::Nan,
        Fault::Inf,
        Fault::UnknownName,
        Fault::WrongLength,
        Fault::WrongShape,
        Fault::OptimizerError,
    ];

    /// The faults that end the run: the faulty rank is gone, and every
    /// other rank must learn it promptly, at the same step.
    pub const TERMINAL: [Fault; 3] = [
        Fault::PanickingCombiner,
        Fault::RankPanics,
        Fault::DropsCommunicator,
    ];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Fault::PanickingCombiner => "panicking combiner",
            Fault::RankPanics => "rank panics",
            Fault::DropsCommunicator => "rank drops its comm",
            Fault::None => "none",
            Fault::Nan => "NaN",
            Fault::Inf => "inf",
            Fault::UnknownName => "unknown name",
            Fault::WrongLength => "wrong length",
            Fault::WrongShape => "wrong shape",
            Fault::OptimizerError => "optimizer error",
        }
    }

    /// Whether the run goes on from the fault with every rank's parameters
    /// still equal (everything but an optimizer error, after which the
    /// failing rank's update may be partial).
    pub fn passes(self) -> bool {
        !matches!(self, Fault::OptimizerError) && !Fault::TERMINAL.contains(&self)
    }
}

/// The DistOpt modes of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeCase {
    /// f32 all-reduce.
    Dense,
    /// f16 on the wire.
    Fp16,
    /// Top-k 30 % with error feedback.
    TopKFeedback,
    /// Threshold without error feedback.
    Threshold,
    /// Partial averaging with the optimizer state.
    Partial,
    /// AdaSum of the gradients (a combiner).
    AdaSumGrad,
    /// AdaSum of the weight changes.
    DeltaWeight,
    /// DimReduce after one dense step.
    DimReduce,
}

impl ModeCase {
    /// Every mode.
    pub const ALL: [ModeCase; 8] = [
        ModeCase::Dense,
        ModeCase::Fp16,
        ModeCase::TopKFeedback,
        ModeCase::Threshold,
        ModeCase::Partial,
        ModeCase::AdaSumGrad,
        ModeCase::DeltaWeight,
        ModeCase::DimReduce,
    ];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            ModeCase::Dense => "dense",
            ModeCase::Fp16 => "fp16",
            ModeCase::TopKFeedback => "topk+EF",
            ModeCase::Threshold => "threshold",
            ModeCase::Partial => "partial",
            ModeCase::AdaSumGrad => "adasum-grad",
            ModeCase::DeltaWeight => "adasum-delta",
            ModeCase::DimReduce => "dimreduce",
        }
    }

    fn mode(self) -> Mode {
        match self {
            ModeCase::Dense | ModeCase::DimReduce => Mode::Dense,
            ModeCase::Fp16 => Mode::Half {
                precision: HalfPrecision::F16,
                clip: None,
            },
            ModeCase::TopKFeedback => Mode::Sparse {
                codec: SparseCodec::TopK(0.3),
                error_feedback: true,
            },
            ModeCase::Threshold => Mode::Sparse {
                codec: SparseCodec::Threshold(0.05),
                error_feedback: false,
            },
            ModeCase::Partial => Mode::Partial {
                average_state: true,
            },
            ModeCase::AdaSumGrad => Mode::Custom,
            ModeCase::DeltaWeight => Mode::DeltaWeight,
        }
    }
}

/// What one step gave on one rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The step completed.
    Done,
    /// The step was skipped (a non-finite gradient, `skip_non_finite`).
    Skipped,
    /// The step failed with a fault of this kind, naming this rank.
    Fault(Option<usize>, FaultKind),
    /// The step failed because a rank is gone (its thread panicked, it
    /// dropped its communicator, or its asynchronous lane was lost to a
    /// panicking job): the run cannot go on.
    Lost(usize),
    /// Another error (its text).
    Error(String),
}

impl Outcome {
    fn of(result: &Result<gradwire_optim::StepStats, OptimError>) -> Outcome {
        match result {
            Ok(stats) if stats.non_finite => Outcome::Skipped,
            Ok(_) => Outcome::Done,
            Err(OptimError::Fault { rank, kind, .. }) => Outcome::Fault(*rank, *kind),
            Err(e) => match lost_rank(e) {
                Some(rank) => Outcome::Lost(rank),
                None => Outcome::Error(e.to_string()),
            },
        }
    }

    /// A short text for the table.
    pub fn label(&self) -> String {
        match self {
            Outcome::Done => "done".into(),
            Outcome::Skipped => "skipped".into(),
            Outcome::Fault(Some(r), kind) => format!("{kind} (rank {r})"),
            Outcome::Fault(None, kind) => kind.to_string(),
            Outcome::Lost(r) => format!("rank {r} lost"),
            Outcome::Error(e) => format!("error: {e}"),
        }
    }
}

/// The rank a "lost rank" error names: a peer gone ([`CommError::PeerLost`]),
/// this rank's own panicking job ([`CommError::RankPanicked`]), or a lane
/// lost to another rank's panicking job ([`gradwire_comm::LANE_LOST`]).
fn lost_rank(e: &OptimError) -> Option<usize> {
    use gradwire_algos::AlgoError;
    use gradwire_comm::{CommError, LANE_LOST};
    let comm = match e {
        OptimError::Distributed(AlgoError::Comm(c)) => c,
        _ => return None,
    };
    match comm {
        CommError::PeerLost { ranks, .. } => ranks.first().copied(),
        CommError::RankPanicked { rank, .. } => Some(*rank),
        CommError::Fault { rank, code } if *code == LANE_LOST => Some(*rank),
        _ => None,
    }
}

/// One rank's record of a scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct RankRecord {
    /// Each step's outcome.
    pub outcomes: Vec<Outcome>,
    /// Each step's duration (push to the end of finish).
    pub times: Vec<Duration>,
    /// The parameters at the end, as bits.
    pub params: Vec<u32>,
}

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
    fn buffer_names(&self) -> &'static [&'static str] {
        self.inner.buffer_names()
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
    fn state(&self) -> gradwire_optim::Result<OptimizerState> {
        self.inner.state()
    }
    fn load_state(&mut self, state: &OptimizerState) -> gradwire_optim::Result<()> {
        self.inner.load_state(state)
    }
}

/// AdaSum, or a panic when armed (the scenario arms it on the injecting
/// rank at the fault's step).
struct PanickingCombiner<C: Communicator> {
    inner: AdaSum<C>,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<C: Communicator + 'static> gradwire_optim::Combiner<C> for PanickingCombiner<C> {
    fn combine(
        &mut self,
        comm: &C,
        bucket: usize,
        tensors: &mut [Tensor],
    ) -> gradwire_algos::Result<gradwire_optim::Combined> {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            panic!("injected panic in the combiner of rank {}", comm.rank());
        }
        gradwire_optim::Combiner::combine(&mut self.inner, comm, bucket, tensors)
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
    mode: ModeCase,
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
    mode: ModeCase,
    schedule: &[(usize, usize, Fault)],
    skip_non_finite: bool,
    steps: usize,
) -> gradwire_optim::Result<RankRecord> {
    let rank = comm.rank();
    let fault_at = |step: usize| {
        schedule
            .iter()
            .find(|(s, r, _)| *s == step && *r == rank)
            .map_or(Fault::None, |(_, _, f)| *f)
    };
    let specs: Vec<ParamSpec> = PARAMS.iter().map(|(n, s)| ParamSpec::new(*n, *s)).collect();
    let optimizer = FaultyOptimizer {
        inner: Sgd::new(SgdConfig {
            lr: gradwire_optim::Schedule::Constant { value: 0.1 },
            momentum: gradwire_optim::Schedule::Constant { value: 0.9 },
            ..SgdConfig::default()
        })?,
        armed: false,
    };
    let combiner_armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let config = DistOptConfig {
        mode: mode.mode(),
        fusion_threshold: FUSION_THRESHOLD,
        skip_non_finite,
        ..DistOptConfig::default()
    };
    let mut dist = match mode {
        ModeCase::AdaSumGrad | ModeCase::DeltaWeight => {
            let inner = AdaSum::new(&comm).map_err(OptimError::from)?;
            let combiner = PanickingCombiner {
                inner,
                armed: std::sync::Arc::clone(&combiner_armed),
            };
            DistOpt::with_combiner(optimizer, comm, specs.clone(), config, combiner)?
        }
        _ => DistOpt::new(optimizer, comm, specs.clone(), config)?,
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
    if mode == ModeCase::DimReduce {
        // Two components over the whole model, the same on every rank.
        let total: usize = params.iter().map(Tensor::len).sum();
        let snapshots: Vec<Vec<f32>> = (0..4).map(|s| gradient(7, s, 0, total)).collect();
        let pca = Pca::fit(&snapshots, 2).map_err(OptimError::from)?;
        dist.start_dimreduce(&pca, DimReduceConfig::default())?;
    }
    let mut record = RankRecord {
        outcomes: Vec::new(),
        times: Vec::new(),
        params: Vec::new(),
    };
    for step in 0..steps {
        let fault = fault_at(step);
        let inject = fault != Fault::None;
        dist.optimizer_mut().armed = fault == Fault::OptimizerError;
        combiner_armed.store(
            fault == Fault::PanickingCombiner,
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
            Fault::RankPanics => panic!("injected panic on rank {rank}"),
            // The early return drops DistOpt, and with it the communicator.
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
        let result = if mode == ModeCase::DimReduce {
            let loss = 1.0 + step as f64;
            dist.finish_dimreduce(targets, loss, |_| Ok(0.5))
        } else {
            dist.finish(targets)
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

/// Every rank's record of one scenario, judged.
#[derive(Debug, Clone)]
pub struct Report {
    /// The mode.
    pub mode: ModeCase,
    /// The fault.
    pub fault: Fault,
    /// Whether DistOpt skipped non-finite steps.
    pub skip_non_finite: bool,
    /// Rank 0's outcome at the fault step.
    pub at_fault: Outcome,
    /// Whether every rank saw the same outcome at every step.
    pub agreed: bool,
    /// Whether every step after the fault completed on every rank.
    pub recovered: bool,
    /// Whether the ranks ended with bitwise-equal parameters (`None` in
    /// partial mode, local SGD, where ranks differ by design).
    pub equal: Option<bool>,
    /// The slowest rank's time for the fault step.
    pub time_to_outcome: Duration,
}

impl Report {
    /// Judges the records of every rank (rank order).
    pub fn judge(mode: ModeCase, fault: Fault, skip: bool, records: &[RankRecord]) -> Report {
        let first = &records[0];
        // A fault's rank may differ between ranks only where every rank
        // computed it alike (None); compare kinds and ranks as they are.
        let agreed = records.iter().all(|r| r.outcomes == first.outcomes);
        let recovered = records.iter().all(|r| {
            r.outcomes[FAULT_STEP + 1..]
                .iter()
                .all(|o| *o == Outcome::Done)
        });
        let equal =
            (mode != ModeCase::Partial).then(|| records.iter().all(|r| r.params == first.params));
        let time_to_outcome = records
            .iter()
            .map(|r| r.times[FAULT_STEP])
            .max()
            .unwrap_or_default();
        Report {
            mode,
            fault,
            skip_non_finite: skip,
            at_fault: first.outcomes[FAULT_STEP].clone(),
            agreed,
            recovered,
            equal,
            time_to_outcome,
        }
    }

    /// What the failure model promises for this row: the same outcome
    /// everywhere, the next steps done, and (for faults that pass) equal
    /// parameters; the fault step's outcome is the expected one.
    pub fn holds(&self) -> bool {
        let expected = match self.fault {
            Fault::None => matches!(self.at_fault, Outcome::Done),
            Fault::Nan | Fault::Inf if self.skip_non_finite => self.at_fault == Outcome::Skipped,
            Fault::Nan | Fault::Inf => {
                matches!(self.at_fault, Outcome::Fault(_, FaultKind::NonFinite))
            }
            Fault::UnknownName | Fault::WrongLength | Fault::WrongShape => {
                matches!(
                    self.at_fault,
                    Outcome::Fault(Some(_), FaultKind::InvalidArgument)
                )
            }
            Fault::OptimizerError => {
                matches!(self.at_fault, Outcome::Fault(Some(_), FaultKind::Optimizer))
            }
            // Judged by [`TerminalReport`]: the run does not go on.
            Fault::PanickingCombiner | Fault::RankPanics | Fault::DropsCommunicator => false,
        };
        let equal = self.equal.unwrap_or(true) || !self.fault.passes();
        expected && self.agreed && self.recovered && equal
    }
}

/// The scenarios of the matrix: every mode and fault (the non-finite ones
/// with and without `skip_non_finite`), less the optimizer fault in
/// DimReduce mode, which steps without the optimizer.
pub fn scenarios() -> Vec<(ModeCase, Fault, bool)> {
    let mut all = Vec::new();
    for mode in ModeCase::ALL {
        for fault in Fault::ALL {
            if mode == ModeCase::DimReduce && fault == Fault::OptimizerError {
                continue;
            }
            all.push((mode, fault, true));
            if matches!(fault, Fault::Nan | Fault::Inf) {
                all.push((mode, fault, false));
            }
        }
    }
    all
}

/// The faults that end a run, judged: every surviving rank's run ends with
/// a step that fails naming the lost rank, promptly.
///
/// The failing step is [`FAULT_STEP`], or the step before it on a rank that
/// was still finishing that step when the faulty rank, done with it,
/// left: a group that lost a rank fails every later call on it (LocalComm's
/// rule), so a survivor's last exchanges with the other survivors fail too.
#[derive(Debug, Clone)]
pub struct TerminalReport {
    /// The mode.
    pub mode: ModeCase,
    /// The fault.
    pub fault: Fault,
    /// Each rank's last step and its outcome (`None`: the rank is gone).
    pub outcomes: Vec<Option<(usize, Outcome)>>,
    /// Whether every step before a rank's last one completed.
    pub done_before: bool,
    /// The slowest surviving rank's time for its last step.
    pub time_to_outcome: Duration,
}

impl TerminalReport {
    /// Judges every rank's record (`None` for the rank that panicked).
    pub fn judge(mode: ModeCase, fault: Fault, records: &[Option<RankRecord>]) -> TerminalReport {
        let last = |r: &RankRecord| r.outcomes.last().map(|o| (r.outcomes.len() - 1, o.clone()));
        let outcomes = records.iter().map(|r| r.as_ref().and_then(last)).collect();
        let done_before = records.iter().flatten().all(|r| {
            let n = r.outcomes.len().saturating_sub(1);
            r.outcomes[..n].iter().all(|o| *o == Outcome::Done)
        });
        let time_to_outcome = records
            .iter()
            .flatten()
            .filter_map(|r| r.times.last())
            .max()
            .copied()
            .unwrap_or_default();
        TerminalReport {
            mode,
            fault,
            outcomes,
            done_before,
            time_to_outcome,
        }
    }

    /// Whether every rank still there ended with a step that failed naming
    /// the lost rank (the last one), at the fault step or the one before,
    /// every earlier step done. The faulty rank itself may be gone, may have
    /// returned after its last completed step, or (a panicking combiner on
    /// its communication thread) fail naming itself.
    pub fn holds(&self) -> bool {
        let lost = self.outcomes.len() - 1;
        let ends_lost = self.outcomes.iter().enumerate().all(|(rank, o)| match o {
            // The faulty rank: gone, left after its last completed step, or
            // failed naming itself (its own job panicked).
            _ if rank == lost => true,
            Some((step, o)) => {
                *o == Outcome::Lost(lost) && (FAULT_STEP - 1..=FAULT_STEP).contains(step)
            }
            None => false,
        });
        // A world of one has nobody to tell.
        self.done_before && (ends_lost || lost == 0)
    }
}

/// The terminal scenarios: a rank that panics or drops its communicator in
/// every mode, a panicking combiner in the modes that have one.
pub fn terminal_scenarios() -> Vec<(ModeCase, Fault)> {
    let mut all = Vec::new();
    for mode in ModeCase::ALL {
        for fault in Fault::TERMINAL {
            let has_combiner = matches!(mode, ModeCase::AdaSumGrad | ModeCase::DeltaWeight);
            if fault != Fault::PanickingCombiner || has_combiner {
                all.push((mode, fault));
            }
        }
    }
    all
}

/// Runs every terminal scenario on `world` in-process ranks.
pub fn run_local_terminal(world: usize, deadline: Duration) -> crate::Result<Vec<TerminalReport>> {
    use gradwire_comm::{LocalConfig, local};
    if world == 0 {
        return Err(crate::CliError::Usage("--world must be at least 1".into()));
    }
    let config = LocalConfig::with_timeout(Some(deadline));
    let _quiet = QuietInjectedPanics::install();
    let mut reports = Vec::new();
    for (mode, fault) in terminal_scenarios() {
        let results = local::run_with(world, &config, |comm| {
            run_scenario(comm, mode, fault, false)
        })?;
        // A panicked rank has no record; any other failure is a real error.
        let records = results
            .into_iter()
            .map(|r| match r {
                Ok(record) => record.map(Some).map_err(crate::CliError::from),
                Err(gradwire_comm::CommError::RankPanicked { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            })
            .collect::<crate::Result<Vec<_>>>()?;
        reports.push(TerminalReport::judge(mode, fault, &records));
    }
    Ok(reports)
}

/// Silences the panic hook for this module's injected panics (their
/// messages start with "injected") while it lives; every other panic is
/// reported by the hook that was there before.
struct QuietInjectedPanics;

type PanicHook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static>;

static PREVIOUS_HOOK: std::sync::Mutex<Option<std::sync::Arc<PanicHook>>> =
    std::sync::Mutex::new(None);

impl QuietInjectedPanics {
    fn install() -> QuietInjectedPanics {
        let previous: std::sync::Arc<PanicHook> = std::sync::Arc::new(std::panic::take_hook());
        if let Ok(mut slot) = PREVIOUS_HOOK.lock() {
            *slot = Some(std::sync::Arc::clone(&previous));
        }
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            if !message.starts_with("injected") {
                previous(info);
            }
        }));
        QuietInjectedPanics
    }
}

impl Drop for QuietInjectedPanics {
    fn drop(&mut self) {
        let previous = PREVIOUS_HOOK.lock().ok().and_then(|mut slot| slot.take());
        if let Some(previous) = previous {
            std::panic::set_hook(Box::new(move |info| previous(info)));
        }
    }
}

/// The terminal scenarios as a table.
pub fn terminal_table(reports: &[TerminalReport], backend: &str, world: usize) -> String {
    use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "mode".to_string(),
        "fault (last rank)".to_string(),
        format!("last step per rank: outcome, {backend} W={world}"),
        "ms".to_string(),
        "holds".to_string(),
    ]);
    for r in reports {
        let outcomes: Vec<String> = r
            .outcomes
            .iter()
            .map(|o| {
                o.as_ref().map_or_else(
                    || "gone".to_string(),
                    |(step, o)| format!("{step}: {}", o.label()),
                )
            })
            .collect();
        table.add_row(vec![
            r.mode.name().to_string(),
            r.fault.name().to_string(),
            outcomes.join(" | "),
            format!("{:.1}", r.time_to_outcome.as_secs_f64() * 1e3),
            if r.holds() { "yes" } else { "NO" }.to_string(),
        ]);
    }
    table.to_string()
}

impl RankRecord {
    /// The record as words for an all-gather: per step its outcome code
    /// and its time in microseconds, then a 64-bit FNV-1a digest of the
    /// parameters (an error's text does not travel).
    fn encode(&self) -> Vec<u64> {
        let mut words = vec![self.outcomes.len() as u64];
        for (o, t) in self.outcomes.iter().zip(&self.times) {
            words.push(match o {
                Outcome::Done => 1,
                Outcome::Skipped => 2,
                Outcome::Fault(rank, kind) => {
                    3 | u64::from(kind.code()) << 8 | rank.map_or(0xFFFF, |r| r as u64) << 16
                }
                Outcome::Lost(r) => 5 | (*r as u64) << 16,
                Outcome::Error(_) => 4,
            });
            words.push(t.as_micros() as u64);
        }
        let digest = self.params.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        words.push(digest);
        words
    }

    /// What [`RankRecord::encode`] wrote (parameters as their digest).
    fn decode(words: &[u64]) -> Option<RankRecord> {
        let (&n, rest) = words.split_first()?;
        let n = usize::try_from(n).ok()?;
        let mut record = RankRecord {
            outcomes: Vec::with_capacity(n),
            times: Vec::with_capacity(n),
            params: Vec::new(),
        };
        for pair in rest.get(..2 * n)?.chunks(2) {
            let code = pair[0];
            let rank = (code >> 16) as usize;
            record.outcomes.push(match code & 0xFF {
                1 => Outcome::Done,
                2 => Outcome::Skipped,
                3 => Outcome::Fault(
                    (rank != 0xFFFF).then_some(rank),
                    FaultKind::from_code(((code >> 8) & 0xFF) as u32)?,
                ),
                5 => Outcome::Lost(rank),
                _ => Outcome::Error("(on another rank)".into()),
            });
            record.times.push(Duration::from_micros(pair[1]));
        }
        let digest = *rest.get(2 * n)?;
        record.params = vec![digest as u32, (digest >> 32) as u32];
        Some(record)
    }
}

/// Runs every scenario on the ranks of `comm` (each on its own duplicate,
/// so a scenario's faults stay in it), gathers every rank's record over
/// `comm` and judges each; every rank gets the same reports.
pub fn run_on<C: Communicator + 'static>(comm: &C) -> crate::Result<Vec<Report>> {
    let w = comm.world_size();
    let mut reports = Vec::new();
    for (mode, fault, skip) in scenarios() {
        let own = comm
            .split(Some(0), comm.rank() as i64)?
            .ok_or_else(|| crate::CliError::Usage("a split left this rank out".into()))?;
        let record = run_scenario(own, mode, fault, skip)?;
        // Records have one length on every rank that completed the run.
        let gathered = comm.all_gather_varied(&record.encode())?;
        let records = (0..w)
            .map(|r| {
                RankRecord::decode(gathered.part(r)).ok_or_else(|| {
                    crate::CliError::Usage(format!("rank {r} sent a record this rank cannot read"))
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        reports.push(Report::judge(mode, fault, skip, &records));
    }
    Ok(reports)
}

/// Runs every scenario on `world` in-process ranks (LocalComm, with a
/// deadline of `deadline`) and judges each.
pub fn run_local(world: usize, deadline: Duration) -> crate::Result<Vec<Report>> {
    use gradwire_comm::{LocalConfig, local};
    if world == 0 {
        return Err(crate::CliError::Usage("--world must be at least 1".into()));
    }
    let config = LocalConfig::with_timeout(Some(deadline));
    let mut reports = Vec::new();
    for (mode, fault, skip) in scenarios() {
        let results =
            local::run_with(world, &config, |comm| run_scenario(comm, mode, fault, skip))?;
        let records = results
            .into_iter()
            .map(|r| {
                r.map_err(crate::CliError::from)?
                    .map_err(crate::CliError::from)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        reports.push(Report::judge(mode, fault, skip, &records));
    }
    Ok(reports)
}

/// The matrix as a table: mode, fault, `skip_non_finite`, the outcome at
/// the fault step (every rank's, when they agree), the steps after it,
/// equal parameters, the slowest rank's time to the outcome, and whether
/// the row keeps the failure model.
pub fn table(reports: &[Report], backend: &str, world: usize) -> String {
    use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "mode",
        "fault (last rank)",
        "skip",
        &format!("outcome, {backend} W={world}"),
        "next 3 steps",
        "ranks equal",
        "ms",
        "holds",
    ]);
    for r in reports {
        table.add_row(vec![
            r.mode.name().to_string(),
            r.fault.name().to_string(),
            if r.skip_non_finite { "yes" } else { "no" }.to_string(),
            if r.agreed {
                format!("{} on every rank", r.at_fault.label())
            } else {
                "DIFFERS between ranks".to_string()
            },
            if r.recovered { "done" } else { "FAILED" }.to_string(),
            match r.equal {
                None => "n/a (local SGD)",
                Some(true) => "bitwise",
                Some(false) if r.fault.passes() => "NO",
                Some(false) => "differ (partial update)",
            }
            .to_string(),
            format!("{:.1}", r.time_to_outcome.as_secs_f64() * 1e3),
            if r.holds() { "yes" } else { "NO" }.to_string(),
        ]);
    }
    table.to_string()
}
