//! The backend conformance suite: one set of test bodies, generic over the
//! [`Communicator`], that every backend must pass.
//!
//! A backend whose reductions are a library's own (NcclComm's default,
//! `NcclReduction::Native`: NCCL's order of additions and precision) runs
//! the suite with [`Reductions::Library`]: its sums are then compared with
//! the f64 reference within the rounding error of W additions in the
//! element type's own precision ([`library_bound`]), not bit for bit with
//! LocalComm's; every other check (exact operators, movement, agreement
//! between ranks, repeatability, errors) is the same.
//!
//! Each case runs on every rank of a world with that rank's communicator and
//! checks real properties against references computed independently on the
//! rank (f64 sums with size-scaled error bounds, sequential AdaSum,
//! single-process training): all collectives over lengths 0, 1, primes and
//! sizes around the reduction block, every element type and op; results
//! bitwise equal on every rank and across repeated runs; reductions bitwise
//! equal to what [`LocalComm`] computes for the same inputs (the promise
//! every backend makes); mismatches and invalid arguments reported as the
//! same error on every rank, with the communicator usable afterwards; a
//! panicking asynchronous job an error on every rank's lane, promptly;
//! DistOpt, AdaSum, sparse all-reduce and the skipping of unwritten
//! gradients end to end.
//!
//! A case never stops early on a failed check: it records the failure and
//! goes on issuing the same collectives, so one rank's failure cannot leave
//! the others waiting. [`run_case`] then gathers every rank's failures, so
//! every rank reports the same verdict. Instantiated in-process for
//! [`LocalComm`] by `tests/it/conformance_local.rs`, and for `MpiComm` by the
//! `gradwire-mpi-conformance` binary that `tests/it/conformance_mpi.rs` starts
//! under `mpirun`.
//!
//! The harness is here; the cases are in `collectives.rs` (the operations
//! themselves), `errors.rs` (mismatches, invalid arguments, faults),
//! `jobs.rs` (asynchronous jobs), `algorithms.rs` (DistOpt, AdaSum, sparse
//! all-reduce, skipping), `training.rs` (whole training runs) and
//! `timeline.rs`; the references they check against in `reference.rs`.
//!
//! [`LocalComm`]: gradwire_comm::LocalComm

mod algorithms;
mod collectives;
mod errors;
mod jobs;
mod reference;
mod timeline;
mod training;

pub use collectives::LENGTHS;
pub use reference::{Float, input, library_bound};

use algorithms::{
    adasum_matches_reference, distopt_equals_single_process, skipping_unwritten_gradients,
    sparse_all_reduce,
};
use collectives::{
    all_gather, all_reduce_floats, all_reduce_integers, async_forms, broadcast, point_to_point,
    reduce_scatter, split,
};
use errors::{fault_matrix, invalid_arguments, mismatches, posted_faults};
use gradwire_algos::AlgoError;
use gradwire_comm::{CommError, Communicator};
use gradwire_experiments::Backend;
use gradwire_optim::OptimError;
use jobs::{panicking_async_job, reused_job_slots};
use training::{candle_training, training_runs_match_local, uneven_inputs};

/// How the backend under test reduces, which decides what its sums are
/// compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reductions {
    /// In rank order, bitwise LocalComm's (LocalComm, MpiComm, NcclComm's
    /// `RankOrdered`): sums are compared bit for bit with LocalComm's.
    #[default]
    RankOrdered,
    /// In an order and precision of the library's choosing (NcclComm's
    /// `Native`): sums and averages are compared with the f64 reference
    /// within [`library_bound`]; Max, Min and integer reductions, which
    /// are exact, stay bitwise.
    Library,
}

/// What a case found wrong on one rank (empty: nothing).
#[derive(Debug, Default)]
pub struct Checks {
    failures: Vec<String>,
    reductions: Reductions,
}

impl Checks {
    /// Checks for a backend that reduces as `reductions` says.
    pub fn new(reductions: Reductions) -> Checks {
        Checks {
            failures: Vec::new(),
            reductions,
        }
    }

    /// Whether floating-point sums must be bitwise LocalComm's.
    pub fn exact_sums(&self) -> bool {
        self.reductions == Reductions::RankOrdered
    }

    /// Records `message` unless `ok`.
    pub fn check(&mut self, ok: bool, message: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(message());
        }
    }

    /// The failures recorded so far.
    pub fn failures(&self) -> &[String] {
        &self.failures
    }
}

/// Why a case could not run to its end on a rank.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    /// A collective failed where it should have succeeded.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// An algorithm failed.
    #[error(transparent)]
    Algo(#[from] AlgoError),
    /// The optimizer failed.
    #[error(transparent)]
    Optim(#[from] OptimError),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] gradwire_tensor::Error),
    /// A candle computation failed.
    #[error("candle: {0}")]
    Candle(String),
    /// A training run of gradwire-cli failed.
    #[error(transparent)]
    Cli(#[from] gradwire_experiments::ExperimentError),
}

/// The body of a case on one rank.
pub type Body<C> = fn(&C, &mut Checks) -> Result<(), CaseError>;

/// One named case of the suite.
pub struct Case<C> {
    /// The case's name (also the LocalComm test's name).
    pub name: &'static str,
    /// Its body.
    pub body: Body<C>,
}

impl<C> std::fmt::Debug for Case<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case").field("name", &self.name).finish()
    }
}

/// Every case, in the order the MPI binary runs them.
pub fn cases<C: Backend + 'static>() -> Vec<Case<C>> {
    vec![
        Case {
            name: "all_reduce_floats",
            body: all_reduce_floats::<C>,
        },
        Case {
            name: "all_reduce_integers",
            body: all_reduce_integers::<C>,
        },
        Case {
            name: "broadcast",
            body: broadcast::<C>,
        },
        Case {
            name: "all_gather",
            body: all_gather::<C>,
        },
        Case {
            name: "reduce_scatter",
            body: reduce_scatter::<C>,
        },
        Case {
            name: "point_to_point",
            body: point_to_point::<C>,
        },
        Case {
            name: "split",
            body: split::<C>,
        },
        Case {
            name: "async_forms",
            body: async_forms::<C>,
        },
        Case {
            name: "mismatches",
            body: mismatches::<C>,
        },
        Case {
            name: "invalid_arguments",
            body: invalid_arguments::<C>,
        },
        Case {
            name: "posted_faults",
            body: posted_faults::<C>,
        },
        Case {
            name: "panicking_async_job",
            body: panicking_async_job::<C>,
        },
        Case {
            name: "reused_job_slots",
            body: reused_job_slots::<C>,
        },
        Case {
            name: "distopt_equals_single_process",
            body: distopt_equals_single_process::<C>,
        },
        Case {
            name: "adasum_matches_reference",
            body: adasum_matches_reference::<C>,
        },
        Case {
            name: "sparse_all_reduce",
            body: sparse_all_reduce::<C>,
        },
        Case {
            name: "skipping_unwritten_gradients",
            body: skipping_unwritten_gradients::<C>,
        },
        Case {
            name: "fault_matrix",
            body: fault_matrix::<C>,
        },
        Case {
            name: "candle_training",
            body: candle_training::<C>,
        },
        Case {
            name: "training_runs_match_local",
            body: training_runs_match_local::<C>,
        },
        Case {
            name: "uneven_inputs",
            body: uneven_inputs::<C>,
        },
        Case {
            name: "timeline",
            body: timeline::timeline::<C>,
        },
    ]
}

/// What one case gave on every rank: `(rank, message)` for each failure.
pub type Verdict = Vec<(usize, String)>;

/// Fails the calling test unless every rank of a world passed `name`:
/// the message lists every rank's failures as that rank saw them.
pub fn assert_passed(name: &str, world: usize, verdicts: Vec<Result<Verdict, CommError>>) {
    for (rank, verdict) in verdicts.into_iter().enumerate() {
        let verdict = verdict.unwrap_or_else(|e| panic!("{name}, world {world}: {e}"));
        assert!(
            verdict.is_empty(),
            "{name}, world {world}, as seen by rank {rank}:\n{}",
            verdict
                .iter()
                .map(|(r, m)| format!("  rank {r}: {m}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// One `#[test]` per case of the suite, each calling `$conform(name)`,
/// plus a test that fails when a case was added to [`cases`] but not here.
/// Every backend's test file instantiates the suite with this macro.
#[macro_export]
macro_rules! conformance_tests {
    ($conform:ident) => {
        $crate::conformance_tests!(
            @cases $conform;
            all_reduce_floats,
            all_reduce_integers,
            broadcast,
            all_gather,
            reduce_scatter,
            point_to_point,
            split,
            async_forms,
            mismatches,
            invalid_arguments,
            posted_faults,
            panicking_async_job,
            reused_job_slots,
            distopt_equals_single_process,
            adasum_matches_reference,
            sparse_all_reduce,
            skipping_unwritten_gradients,
            fault_matrix,
            candle_training,
            training_runs_match_local,
            uneven_inputs,
            timeline,
        );
    };
    (@cases $conform:ident; $($name:ident),* $(,)?) => {
        $(#[test]
        fn $name() {
            $conform(stringify!($name));
        })*

        /// Every case of the suite has a test here.
        #[test]
        fn every_case_is_instantiated() {
            let listed = [$(stringify!($name)),*];
            for case in $crate::conformance::cases::<gradwire_comm::LocalComm>() {
                assert!(listed.contains(&case.name), "{} has no test", case.name);
            }
        }
    };
}

/// Runs `case` on this rank and gathers every rank's failures, so that every
/// rank returns the same verdict. An error a rank's body returned counts as
/// a failure of that rank.
pub fn run_case<C: Communicator>(comm: &C, case: &Case<C>) -> Result<Verdict, CommError> {
    run_case_with(comm, case, Reductions::RankOrdered)
}

/// [`run_case`] on a backend that reduces as `reductions` says.
pub fn run_case_with<C: Communicator>(
    comm: &C,
    case: &Case<C>,
    reductions: Reductions,
) -> Result<Verdict, CommError> {
    let mut checks = Checks::new(reductions);
    if let Err(e) = (case.body)(comm, &mut checks) {
        checks.failures.push(format!("stopped with an error: {e}"));
    }
    let text = checks.failures.join("\n");
    let gathered = comm.all_gather_varied(text.as_bytes())?;
    let mut verdict = Vec::new();
    for rank in 0..comm.world_size() {
        let part = String::from_utf8_lossy(gathered.part(rank)).into_owned();
        verdict.extend(
            part.lines()
                .filter(|l| !l.is_empty())
                .map(|l| (rank, l.to_string())),
        );
    }
    Ok(verdict)
}
