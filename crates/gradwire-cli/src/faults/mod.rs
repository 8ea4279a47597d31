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

mod report;
mod run;
mod scenario;

pub use report::{Report, TerminalReport, table, terminal_table};
pub use run::{run_local, run_local_terminal, run_on};
pub use scenario::{run_scenario, run_schedule};

use gradwire_algos::{FaultKind, HalfPrecision, PowerSgdConfig};
use gradwire_compress::SparseCodec;
use gradwire_optim::{Mode, OptimError};
use std::time::Duration;

/// Steps per scenario.
pub const STEPS: usize = 5;
/// The step at which the fault is injected (three steps follow it).
pub const FAULT_STEP: usize = 1;

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
    /// PowerSGD at rank 1 (the matrix compressed from the second step on).
    PowerSgd,
    /// 1 bit per entry both ways, with error feedback and local momentum.
    OneBit,
    /// 1-bit Adam's exchange (dense until step 2, then the 1-bit moment).
    OneBitAdam,
}

impl ModeCase {
    /// Every mode.
    pub const ALL: [ModeCase; 11] = [
        ModeCase::Dense,
        ModeCase::Fp16,
        ModeCase::TopKFeedback,
        ModeCase::Threshold,
        ModeCase::Partial,
        ModeCase::AdaSumGrad,
        ModeCase::DeltaWeight,
        ModeCase::DimReduce,
        ModeCase::PowerSgd,
        ModeCase::OneBit,
        ModeCase::OneBitAdam,
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
            ModeCase::PowerSgd => "powersgd",
            ModeCase::OneBit => "onebit",
            ModeCase::OneBitAdam => "onebit-adam",
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
            // The 3 x 5 parameter is compressed only at a rate of 1.
            ModeCase::PowerSgd => Mode::PowerSgd(PowerSgdConfig {
                rank: 1,
                start_step: 1,
                min_compression_rate: 1.0,
                ..PowerSgdConfig::default()
            }),
            ModeCase::OneBit => Mode::Quantized {
                quantizer: gradwire_compress::Quantizer::Sign,
                error_feedback: true,
                momentum: Some(0.9),
            },
            ModeCase::OneBitAdam => Mode::OneBitAdam {
                beta1: 0.9,
                freeze_step: 2,
            },
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
