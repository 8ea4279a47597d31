//! The fault matrix: DistOpt under injected faults, every strategy of the
//! registry's examples, any
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
//! steps after the fault all completed, whether the ranks ended with
//! bitwise-equal parameters, and whether each ended with bitwise the
//! parameters of a run without the fault step ([`run_without`]: the failed
//! step changed nothing; in DiLoCo, without the fault's round:
//! [`steps_lost`]). `gradwire faults` ([`FaultsArgs`]) prints it as a
//! table. [`run_schedule`] runs any schedule of faults, and
//! [`run_schedule_resumed`] the same with every rank's front end replaced
//! by one restored from its checkpoint between two steps.

mod command;
mod report;
mod run;
mod scenario;

pub use command::FaultsArgs;
pub use report::{Report, TerminalReport, table, terminal_table};
pub use run::{run_local, run_local_terminal, run_on, run_share_on};
pub use scenario::{run_scenario, run_schedule, run_schedule_resumed, run_without};

use gradwire_algos::FaultKind;
use gradwire_optim::{OptimError, StrategyConfig};
use std::time::Duration;

/// The steps a failure at `step` loses in `mode`, which a run without
/// them ([`run_without`]) must not take to end bitwise the same: that
/// step, or in DiLoCo the whole round it belongs to (one step in the
/// warm-up; a failed round puts
/// every rank back at the round's start, inner optimizer included).
pub fn steps_lost(mode: StrategyConfig, step: usize) -> std::ops::Range<usize> {
    match mode {
        StrategyConfig::DiLoCo(config) => {
            let round = config.round_of(step as u64);
            round.start as usize..round.end as usize
        }
        _ => step..step + 1,
    }
}

/// The step (counting from 0) at which every rank learns of a fault
/// injected at `step`: that step in every mode whose steps carry their
/// faults, DiLoCo's round end, or in Streaming DiLoCo the merge of the
/// next fragment to leave (`τ` steps after it leaves, every `H / F` after
/// the warm-up's rounds of one step).
pub fn reported_at(mode: StrategyConfig, step: usize) -> usize {
    match mode {
        StrategyConfig::DiLoCo(config) if config.is_streaming() => {
            let warmup = config.warmup as usize;
            if step < warmup {
                // A warm-up round: every fragment, at once.
                return step;
            }
            let stride = (config.stride() as usize).max(1);
            // The inner step count after the warm-up, from 1, after which
            // the next one leaves.
            let leaves = (step + 1 - warmup).div_ceil(stride) * stride;
            warmup + leaves + config.delay as usize - 1
        }
        StrategyConfig::DiLoCo(_) => steps_lost(mode, step).end - 1,
        _ => step,
    }
}

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
    /// The strategy (AdaSum) panics, on the communication thread in
    /// adasum-grad mode and on the rank's own thread in adasum-delta mode.
    PanickingStrategy,
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
        Fault::PanickingStrategy,
        Fault::RankPanics,
        Fault::DropsCommunicator,
    ];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Fault::PanickingStrategy => "panicking strategy",
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

    /// Whether the fault can be injected in `mode`: all but the optimizer
    /// fault in DimReduce mode, which steps without the optimizer.
    pub fn injectable_in(self, mode: StrategyConfig) -> bool {
        !(mode == StrategyConfig::DimReduce && self == Fault::OptimizerError)
    }

    /// Whether the run goes on from the fault with every rank's parameters
    /// still equal (everything but an optimizer error, after which the
    /// failing rank's update may be partial).
    pub fn passes(self) -> bool {
        !matches!(self, Fault::OptimizerError) && !Fault::TERMINAL.contains(&self)
    }

    /// Whether a run with this fault at `step` of `mode` ends bitwise as
    /// the run without [`steps_lost`]: every fault that [`Fault::passes`],
    /// except in DiLoCo a parameter of the wrong shape at a round's end.
    /// The failed round puts back every parameter the call gave; the
    /// caller's own tensor of the parameter it got wrong was not given,
    /// and keeps what the round's inner steps did to it.
    /// In Streaming DiLoCo no run without some steps is the same: a lost
    /// fragment goes back to its global values while the others keep
    /// their inner steps.
    pub fn restores(self, mode: StrategyConfig, step: usize) -> bool {
        let round_end = steps_lost(mode, step).end == step + 1;
        match mode {
            StrategyConfig::DiLoCo(config) if config.is_streaming() => false,
            StrategyConfig::DiLoCo(_) => self.passes() && !(self == Fault::WrongShape && round_end),
            _ => self.passes(),
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
            Err(OptimError::Fault(fault)) => Outcome::Fault(fault.rank, fault.kind),
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
/// lost to another rank's panicking job ([`CommError::lane_lost`]).
fn lost_rank(e: &OptimError) -> Option<usize> {
    use gradwire_algos::AlgoError;
    use gradwire_comm::CommError;
    let comm = match e {
        OptimError::Distributed(AlgoError::Comm(c)) => c,
        _ => return None,
    };
    match comm {
        CommError::PeerLost { ranks, .. } => ranks.first().copied(),
        CommError::RankPanicked { rank, .. } => Some(*rank),
        CommError::Fault(fault) if comm.is_lane_lost() => fault.rank,
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

/// The group of AdaSum (`None`: flat) when the strategy combines through
/// AdaSum, which the matrix wraps in a strategy that panics on demand.
pub(crate) fn adasum_group(strategy: StrategyConfig) -> Option<Option<usize>> {
    match strategy {
        StrategyConfig::AdaSum { group } | StrategyConfig::DeltaWeight { group } => Some(group),
        _ => None,
    }
}

/// The scenarios of the matrix: every strategy of the registry's examples
/// and every fault it takes ([`Fault::injectable_in`]; the non-finite
/// ones with and without `skip_non_finite`).
pub fn scenarios() -> Vec<(StrategyConfig, Fault, bool)> {
    let mut all = Vec::new();
    for mode in StrategyConfig::examples() {
        for fault in Fault::ALL {
            if !fault.injectable_in(mode) {
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

/// A share of the matrix's [`scenarios`]: the `index`-th of `count`
/// contiguous runs of them (a scenario's mode stays with its neighbours,
/// which share its fault-free reference run). The shares of one count
/// cover every scenario exactly once, so a machine with cores to spare runs
/// them side by side (`gpu_suite.sh` does, for the NCCL fault matrix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    index: usize,
    count: usize,
}

impl Share {
    /// Every scenario.
    pub const WHOLE: Share = Share { index: 0, count: 1 };

    /// Share `index` of `count` (`index < count`).
    pub fn new(index: usize, count: usize) -> crate::Result<Share> {
        if index >= count {
            return Err(crate::ExperimentError::Usage(format!(
                "share {index} of {count}: a share's index is below the count of shares, which is at least 1"
            )));
        }
        Ok(Share { index, count })
    }

    /// Parses `index/count` (`2/4`).
    pub fn parse(text: &str) -> crate::Result<Share> {
        let usage = || {
            crate::ExperimentError::Usage(format!(
                "`{text}` is not a share: expected index/count, as 0/4"
            ))
        };
        let (index, count) = text.split_once('/').ok_or_else(usage)?;
        let index = index.trim().parse().map_err(|_| usage())?;
        let count = count.trim().parse().map_err(|_| usage())?;
        Share::new(index, count)
    }

    /// The range of positions, in a list of `len`, that this share holds.
    pub fn range(&self, len: usize) -> std::ops::Range<usize> {
        // index < count, so neither product overflows for any list that
        // fits in memory divided among at most `count` shares.
        let bound = |i: usize| {
            let whole = len / self.count * i;
            whole + (len % self.count) * i / self.count
        };
        bound(self.index)..bound(self.index + 1)
    }
}

/// The terminal scenarios: a rank that panics or drops its communicator in
/// every mode, a panicking strategy in the modes that combine through
/// AdaSum (the matrix wraps it).
pub fn terminal_scenarios() -> Vec<(StrategyConfig, Fault)> {
    let mut all = Vec::new();
    for mode in StrategyConfig::examples() {
        for fault in Fault::TERMINAL {
            if fault != Fault::PanickingStrategy || adasum_group(mode).is_some() {
                all.push((mode, fault));
            }
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_of_a_count_cover_every_scenario_once_in_order() {
        for len in [0, 1, 2, 7, 97, scenarios().len()] {
            for count in 1..=8 {
                let mut next = 0;
                for index in 0..count {
                    let range = Share::new(index, count).expect("a share").range(len);
                    assert_eq!(range.start, next, "len {len}, share {index}/{count}");
                    assert!(
                        range.len() <= len.div_ceil(count),
                        "len {len}, {index}/{count}"
                    );
                    next = range.end;
                }
                assert_eq!(next, len, "len {len}, count {count}");
            }
        }
        assert_eq!(Share::WHOLE.range(5), 0..5);
    }

    /// Worked by hand from the rules: a DiLoCo round of H = 2 after one
    /// warm-up round of one step; Streaming DiLoCo with H = 4 in 2
    /// fragments (one leaving every 2 steps), τ = 1, after 3 warm-up steps.
    #[test]
    fn a_fault_is_lost_with_its_round_and_learnt_at_its_end() {
        let diloco = |warmup| {
            StrategyConfig::DiLoCo(gradwire_optim::DiLoCoConfig {
                sync_every: 2,
                warmup,
                ..gradwire_optim::DiLoCoConfig::DEFAULT
            })
        };
        let lost = |mode, steps: &[usize]| -> Vec<std::ops::Range<usize>> {
            steps.iter().map(|&s| steps_lost(mode, s)).collect()
        };
        let at = |mode, steps: &[usize]| -> Vec<usize> {
            steps.iter().map(|&s| reported_at(mode, s)).collect()
        };
        assert_eq!(lost(diloco(0), &[0, 1, 2]), [0..2, 0..2, 2..4]);
        assert_eq!(at(diloco(0), &[0, 1, 2]), [1, 1, 3]);
        assert_eq!(lost(diloco(1), &[0, 1, 2, 3]), [0..1, 1..3, 1..3, 3..5]);
        assert_eq!(at(diloco(1), &[0, 1, 2, 3]), [0, 2, 2, 4]);
        let streaming = |warmup| {
            StrategyConfig::DiLoCo(gradwire_optim::DiLoCoConfig {
                sync_every: 4,
                fragments: 2,
                delay: 1,
                warmup,
                ..gradwire_optim::DiLoCoConfig::DEFAULT
            })
        };
        // A fault rides the next fragment to leave, merged a step later.
        assert_eq!(at(streaming(0), &[0, 1, 2]), [2, 2, 4]);
        assert_eq!(at(streaming(3), &[0, 2, 3, 4, 5]), [0, 2, 5, 5, 7]);
        assert_eq!(steps_lost(StrategyConfig::Dense, 3), 3..4);
        assert_eq!(reported_at(StrategyConfig::Dense, 3), 3);
    }

    #[test]
    fn shares_parse_and_refuse_what_names_none() {
        assert_eq!(
            Share::parse("2/4").expect("a share"),
            Share::new(2, 4).expect("a share")
        );
        for bad in ["4/4", "0/0", "1", "a/2", "1/b", "-1/2", ""] {
            assert!(
                matches!(Share::parse(bad), Err(crate::ExperimentError::Usage(_))),
                "{bad}"
            );
        }
    }
}
