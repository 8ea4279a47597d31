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

mod timeline;

use gradwire_algos::AlgoError;
use gradwire_algos::adasum::{self, AdaSum};
use gradwire_comm::{
    AsyncJob, CommError, Communicator, Element, Fault, FaultKind, JobSlot, LocalComm, Pending,
    ReduceOp, chunk_range, local,
};
use gradwire_compress::SparseCodec;
use gradwire_experiments::Backend;
use gradwire_optim::{
    Adam, AdamConfig, DistOpt, DistOptConfig, GradSync, OptimError, Optimizer, ParamSpec, Sgd,
    SgdConfig, SkipVote,
};
use gradwire_tensor::Tensor;
use half::{bf16, f16};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Lengths every collective is tried with: empty, one, primes (never a
/// multiple of the world size), and sizes around the reduction block (2048).
pub const LENGTHS: &[usize] = &[0, 1, 2, 3, 5, 7, 13, 31, 127, 1031, 2053, 4099];

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

/// Rank r's input: deterministic per (seed, rank), magnitudes spread over
/// six decades so that rounding matters.
pub fn input(seed: u64, rank: usize, len: usize) -> Vec<f64> {
    let mut state = seed ^ ((rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 11) as f64 / (1u64 << 53) as f64;
            let scale = [1e-3, 1.0, 1e3][(state % 3) as usize];
            (unit * 2.0 - 1.0) * scale
        })
        .collect()
}

/// A floating-point element type: conversions to and from f64, the unit
/// roundoff of its storage and of its accumulator, and its smallest normal.
pub trait Float: Element {
    /// The nearest value to `v`.
    fn from_f64(v: f64) -> Self;
    /// The value, exactly.
    fn to_f64(self) -> f64;
    /// The unit roundoff of the type.
    const U_OUT: f64;
    /// The unit roundoff of gradwire's accumulator for it (f32 for halves).
    const U_ACC: f64;
    /// The smallest normal (f16: its smallest subnormal).
    const TINY: f64;
}

macro_rules! float {
    ($t:ty, $from:expr, $u_out:expr, $u_acc:expr, $tiny:expr) => {
        impl Float for $t {
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
            const U_OUT: f64 = $u_out;
            const U_ACC: f64 = $u_acc;
            const TINY: f64 = $tiny;
        }
    };
}
const U32: f64 = f32::EPSILON as f64 / 2.0;
float!(f32, |v| v as f32, U32, U32, f32::MIN_POSITIVE as f64);
float!(
    f64,
    |v| v,
    f64::EPSILON / 2.0,
    f64::EPSILON / 2.0,
    f64::MIN_POSITIVE
);
// Half types accumulate in f32 and round once; f16's subnormals reach 2^-24.
float!(f16, f16::from_f64, 1.0 / 2048.0, U32, 1.0 / 16_777_216.0);
float!(
    bf16,
    bf16::from_f64,
    1.0 / 256.0,
    U32,
    f32::MIN_POSITIVE as f64
);

fn reference(inputs: &[Vec<f64>], i: usize, op: ReduceOp) -> f64 {
    let column = inputs.iter().map(|x| x[i]);
    match op {
        ReduceOp::Sum => column.sum(),
        ReduceOp::Avg => column.sum::<f64>() / inputs.len() as f64,
        ReduceOp::Max => column.fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Min => column.fold(f64::INFINITY, f64::min),
    }
}

/// Higham's bound for a recursive sum of W terms in the accumulator's
/// precision, rounded once to the storage precision (plus the smallest
/// normal, for results in the subnormal range). Max and Min are exact.
fn bound<T: Float>(inputs: &[Vec<f64>], i: usize, magnitude: f64, op: ReduceOp) -> f64 {
    if matches!(op, ReduceOp::Max | ReduceOp::Min) {
        return 0.0;
    }
    let steps = inputs.len() as f64 - 1.0;
    let abs_sum: f64 = inputs.iter().map(|x| x[i].abs()).sum();
    let gamma = steps * T::U_ACC / (1.0 - steps * T::U_ACC);
    gamma * abs_sum + T::U_OUT * magnitude + T::TINY
}

/// The bound of a library's reduction ([`Reductions::Library`], NCCL's):
/// W roundings in the element type's own precision (W - 1 additions in any
/// order, and for `Avg` the scaling of each input by 1/W), so a relative
/// error of gamma_W times the sum of magnitudes, plus the final rounding
/// and W times the smallest normal (scaled inputs in the subnormal range).
/// It grows with the world size; per element it does not depend on the
/// buffer's length, whatever the algorithm (ring, tree) cuts it into.
pub fn library_bound<T: Float>(inputs: &[Vec<f64>], i: usize, magnitude: f64, op: ReduceOp) -> f64 {
    if matches!(op, ReduceOp::Max | ReduceOp::Min) {
        return 0.0;
    }
    let steps = inputs.len() as f64;
    if steps * T::U_OUT >= 0.5 {
        return f64::INFINITY;
    }
    let abs_sum: f64 = inputs.iter().map(|x| x[i].abs()).sum();
    let gamma = steps * T::U_OUT / (1.0 - steps * T::U_OUT);
    gamma * abs_sum + T::U_OUT * magnitude + steps * T::TINY
}

/// Checks `got` (this rank's result for `range` of the inputs) against the
/// f64 reference of `exact` (every rank's inputs as held) within
/// [`library_bound`].
fn check_within_library_bound<T: Float>(
    checks: &mut Checks,
    what: &str,
    got: &[T],
    exact: &[Vec<f64>],
    range: Range<usize>,
    op: ReduceOp,
) {
    checks.check(got.len() == range.len(), || {
        format!("{what}: {} elements, want {}", got.len(), range.len())
    });
    for (&value, i) in got.iter().zip(range) {
        let want = reference(exact, i, op);
        let got = value.to_f64();
        let allowed = library_bound::<T>(exact, i, want.abs().max(got.abs()), op);
        checks.check((got - want).abs() <= allowed, || {
            format!("{what} at {i}: got {got}, want {want} within {allowed}")
        });
    }
}

fn bytes_of<T: Element>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice::<T, u8>(v).to_vec()
}

/// Checks that `mine` is bitwise the same on every rank (one all-gather of
/// its bytes; the same collective on every rank whatever `mine` holds).
fn same_on_every_rank<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
    mine: &[u8],
    what: &str,
) -> Result<(), CaseError> {
    let all = comm.all_gather_varied(mine)?;
    for r in 0..comm.world_size() {
        checks.check(all.part(r) == mine, || {
            format!("{what}: rank {r}'s result differs from this rank's")
        });
    }
    Ok(())
}

/// What LocalComm's all-reduce gives for `inputs` (one rank per input).
fn local_all_reduce<T: Element>(inputs: &[Vec<T>], op: ReduceOp) -> Result<Vec<T>, CommError> {
    let results = local::run(inputs.len(), |comm: LocalComm| {
        let mut buf = inputs[comm.rank()].clone();
        comm.all_reduce(&mut buf, op).map(|()| buf)
    })?;
    results.into_iter().next().unwrap_or_else(|| Ok(Vec::new()))
}

fn all_reduce_float<C: Communicator, T: Float>(
    comm: &C,
    checks: &mut Checks,
    seed: u64,
    lengths: &[usize],
    ops: &[ReduceOp],
) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    // Every rank checks that it holds the same bytes as every other; the
    // first checks them against the reference, and so for all.
    let checker = rank == 0;
    let held_by = |r: usize, len: usize| -> Vec<T> {
        input(seed ^ len as u64, r, len)
            .into_iter()
            .map(T::from_f64)
            .collect()
    };
    for &len in lengths {
        let mine = held_by(rank, len);
        // The reference sees the inputs as the ranks hold them (rounded to T).
        let held: Vec<Vec<T>> = if checker {
            (0..w).map(|r| held_by(r, len)).collect()
        } else {
            Vec::new()
        };
        let exact: Vec<Vec<f64>> = held
            .iter()
            .map(|x| x.iter().map(|&v| v.to_f64()).collect())
            .collect();
        for &op in ops {
            let what = format!("{op} of {len} {}", T::TYPE);
            // Max and Min are exact on every backend.
            let bitwise = checks.exact_sums() || matches!(op, ReduceOp::Max | ReduceOp::Min);
            let mut buf = mine.clone();
            comm.all_reduce(&mut buf, op)?;
            checks.check(buf.len() == len, || format!("{what}: length {}", buf.len()));
            if checker {
                for (i, &value) in buf.iter().enumerate().take(len) {
                    let want = reference(&exact, i, op);
                    let got = value.to_f64();
                    let magnitude = want.abs().max(got.abs());
                    let allowed = if bitwise {
                        bound::<T>(&exact, i, magnitude, op)
                    } else {
                        library_bound::<T>(&exact, i, magnitude, op)
                    };
                    checks.check((got - want).abs() <= allowed, || {
                        format!("{what} at {i}: got {got}, want {want} within {allowed}")
                    });
                }
            }
            same_on_every_rank(comm, checks, &bytes_of(&buf), &what)?;
            let mut again = mine.clone();
            comm.all_reduce(&mut again, op)?;
            checks.check(bytes_of(&again) == bytes_of(&buf), || {
                format!("{what}: a second run gave other bits")
            });
            if bitwise && checker {
                let local = local_all_reduce(&held, op)?;
                checks.check(bytes_of(&local) == bytes_of(&buf), || {
                    format!("{what}: not bitwise equal to LocalComm's result")
                });
            }
        }
    }
    Ok(())
}

fn all_reduce_floats<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let all = &ReduceOp::ALL;
    all_reduce_float::<C, f32>(comm, checks, 1, LENGTHS, all)?;
    all_reduce_float::<C, f64>(comm, checks, 2, LENGTHS, all)?;
    all_reduce_float::<C, f16>(comm, checks, 3, LENGTHS, all)?;
    all_reduce_float::<C, bf16>(comm, checks, 4, LENGTHS, all)?;
    // Buffers of several megabytes, which a backend may cut into segments
    // (a prime length: no segment or chunk boundary falls evenly).
    let sums = &[ReduceOp::Sum, ReduceOp::Avg];
    all_reduce_float::<C, f32>(comm, checks, 5, &[1_100_009], sums)?;
    all_reduce_float::<C, bf16>(comm, checks, 6, &[1_100_009], sums)?;
    // NaN propagates through Max and Min from any rank; a sum overflows to inf.
    let w = comm.world_size();
    let nan_rank = w - 1;
    let mut v = [1f32, 2.0, f32::MAX];
    if comm.rank() == nan_rank {
        v[0] = f32::NAN;
    }
    let mut max = v;
    let mut min = v;
    let mut sum = v;
    comm.all_reduce(&mut max, ReduceOp::Max)?;
    comm.all_reduce(&mut min, ReduceOp::Min)?;
    comm.all_reduce(&mut sum, ReduceOp::Sum)?;
    checks.check(max[0].is_nan() && min[0].is_nan(), || {
        format!("NaN did not propagate: max {max:?}, min {min:?}")
    });
    checks.check(max[1] == 2.0 && min[1] == 2.0, || {
        format!("max/min of equal values: {max:?} {min:?}")
    });
    let want_inf = w > 1;
    checks.check(sum[2].is_infinite() == want_inf, || {
        format!("{w} x f32::MAX summed to {}", sum[2])
    });
    Ok(())
}

fn all_reduce_integers<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let w = comm.world_size();
    for &len in LENGTHS {
        let ints = |r: usize| -> Vec<i64> {
            input(len as u64, r, len)
                .iter()
                .map(|v| (v * 1e6) as i64)
                .collect()
        };
        let all: Vec<Vec<i64>> = (0..w).map(ints).collect();
        let mine = &all[comm.rank()];
        let mut sum = mine.clone();
        let mut max = mine.clone();
        let mut min: Vec<i32> = mine.iter().map(|&v| v as i32).collect();
        let mut bytes: Vec<u8> = mine.iter().map(|&v| v as u8).collect();
        let mut words: Vec<u64> = mine.iter().map(|&v| v as u64).collect();
        let mut small: Vec<u32> = mine.iter().map(|&v| v as u32).collect();
        comm.all_reduce(&mut sum, ReduceOp::Sum)?;
        comm.all_reduce(&mut max, ReduceOp::Max)?;
        comm.all_reduce(&mut min, ReduceOp::Min)?;
        comm.all_reduce(&mut bytes, ReduceOp::Sum)?;
        comm.all_reduce(&mut words, ReduceOp::Sum)?;
        comm.all_reduce(&mut small, ReduceOp::Max)?;
        for i in 0..len {
            let col = || all.iter().map(|x| x[i]);
            let ok = sum[i] == col().sum::<i64>()
                && Some(max[i]) == col().max()
                && Some(min[i]) == col().map(|v| v as i32).min()
                && bytes[i] == col().fold(0u8, |a, v| a.wrapping_add(v as u8))
                && words[i] == col().fold(0u64, |a, v| a.wrapping_add(v as u64))
                && Some(small[i]) == col().map(|v| v as u32).max();
            checks.check(ok, || format!("integer reductions of {len} wrong at {i}"));
        }
    }
    Ok(())
}

fn broadcast<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    for root in 0..comm.world_size() {
        for &len in LENGTHS {
            let mut buf: Vec<f32> = input(7, comm.rank(), len)
                .iter()
                .map(|&v| v as f32)
                .collect();
            comm.broadcast(&mut buf, root)?;
            let want: Vec<f32> = input(7, root, len).iter().map(|&v| v as f32).collect();
            checks.check(bytes_of(&buf) == bytes_of(&want), || {
                format!("broadcast of {len} from {root}")
            });
            let mut halves: Vec<bf16> = want.iter().map(|&v| bf16::from_f32(v + 1.0)).collect();
            if comm.rank() != root {
                halves.iter_mut().for_each(|h| *h = bf16::ZERO);
            }
            comm.broadcast(&mut halves, root)?;
            checks.check(
                halves
                    .iter()
                    .zip(&want)
                    .all(|(h, &v)| *h == bf16::from_f32(v + 1.0)),
                || format!("bf16 broadcast of {len} from {root}"),
            );
        }
    }
    Ok(())
}

fn all_gather<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let w = comm.world_size();
    for &len in LENGTHS {
        let send = input(11, comm.rank(), len);
        let mut recv = vec![0.0; len * w];
        comm.all_gather(&send, &mut recv)?;
        let want: Vec<f64> = (0..w).flat_map(|r| input(11, r, len)).collect();
        checks.check(bytes_of(&recv) == bytes_of(&want), || {
            format!("all_gather of {len}")
        });
    }
    // Varied lengths, zero included, differing per rank and per round.
    for round in 0..LENGTHS.len() {
        let len_of = |r: usize| LENGTHS[(r * 5 + round) % LENGTHS.len()];
        let to_u32 = |r: usize| -> Vec<u32> {
            input(13, r, len_of(r))
                .iter()
                .map(|v| v.to_bits() as u32)
                .collect()
        };
        let gathered = comm.all_gather_varied(&to_u32(comm.rank()))?;
        let counts: Vec<usize> = (0..w).map(len_of).collect();
        checks.check(gathered.counts() == counts, || {
            format!(
                "all_gather_varied counts {:?}, want {counts:?}",
                gathered.counts()
            )
        });
        for r in 0..w {
            checks.check(gathered.part(r) == &to_u32(r)[..], || {
                format!("all_gather_varied round {round}: rank {r}'s part")
            });
        }
    }
    Ok(())
}

fn reduce_scatter<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    for &len in LENGTHS {
        // Every rank's inputs as held, for a library's sums.
        let singles: Vec<Vec<f32>> = (0..w)
            .map(|r| input(17, r, len).iter().map(|&v| v as f32).collect())
            .collect();
        let exact_singles: Vec<Vec<f64>> = singles
            .iter()
            .map(|x| x.iter().map(|&v| f64::from(v)).collect())
            .collect();
        let exact_halves: Vec<Vec<f64>> = singles
            .iter()
            .map(|x| x.iter().map(|&v| f16::from_f32(v).to_f64()).collect())
            .collect();
        let mine_range = chunk_range(len, w, rank);
        for op in ReduceOp::ALL {
            let bitwise = checks.exact_sums() || matches!(op, ReduceOp::Max | ReduceOp::Min);
            let send = singles[rank].clone();
            let mut full = send.clone();
            comm.all_reduce(&mut full, op)?;
            let mut mine = vec![0f32; mine_range.len()];
            comm.reduce_scatter(&send, &mut mine, op)?;
            if bitwise {
                checks.check(
                    bytes_of(&mine) == bytes_of(&full[mine_range.clone()]),
                    || format!("reduce_scatter {op} of {len} is not the all_reduce's chunk"),
                );
            } else {
                let what = format!("reduce_scatter {op} of {len}");
                check_within_library_bound(
                    checks,
                    &what,
                    &mine,
                    &exact_singles,
                    mine_range.clone(),
                    op,
                );
            }
            let halves: Vec<f16> = send.iter().map(|&v| f16::from_f32(v)).collect();
            let mut full = halves.clone();
            comm.all_reduce(&mut full, op)?;
            let mut mine = vec![f16::ZERO; mine_range.len()];
            comm.reduce_scatter(&halves, &mut mine, op)?;
            if bitwise {
                checks.check(
                    bytes_of(&mine) == bytes_of(&full[mine_range.clone()]),
                    || format!("f16 reduce_scatter {op} of {len}"),
                );
            } else {
                let what = format!("f16 reduce_scatter {op} of {len}");
                check_within_library_bound(
                    checks,
                    &what,
                    &mine,
                    &exact_halves,
                    mine_range.clone(),
                    op,
                );
            }
        }
    }
    Ok(())
}

fn point_to_point<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    let next = (rank + 1) % w;
    let prev = (rank + w - 1) % w;
    // 1 Mi elements is far past any eager limit: on a backend with eager
    // messages, every rank sends both before it receives (sends must not
    // block); on NCCL's (a send waits for its receive) even ranks send
    // first and odd ranks receive first, which no cycle can block.
    for &len in LENGTHS.iter().chain(&[1 << 20]) {
        let first: Vec<f32> = input(19, rank, len).iter().map(|&v| v as f32).collect();
        let second: Vec<f32> = first.iter().map(|v| v * 2.0).collect();
        let mut a = vec![0f32; len];
        let mut b = vec![0f32; len];
        let send_first = comm.eager_messages() || rank % 2 == 0 || w == 1;
        if send_first {
            comm.send(&first, next)?;
            comm.send(&second, next)?;
        }
        comm.recv(&mut a, prev)?;
        comm.recv(&mut b, prev)?;
        if !send_first {
            comm.send(&first, next)?;
            comm.send(&second, next)?;
        }
        let mut c = vec![0f32; len];
        comm.sendrecv(&first, prev, &mut c, next)?;
        let from_prev: Vec<f32> = input(19, prev, len).iter().map(|&v| v as f32).collect();
        let from_next: Vec<f32> = input(19, next, len).iter().map(|&v| v as f32).collect();
        let doubled: Vec<f32> = from_prev.iter().map(|v| v * 2.0).collect();
        checks.check(a == from_prev && b == doubled, || {
            format!("ring of {len}: messages from {prev} wrong or out of order")
        });
        checks.check(c == from_next, || format!("sendrecv of {len} from {next}"));
    }
    // To itself, and of another element type.
    comm.send(&[rank as u64, 42], rank)?;
    let mut own = [0u64; 2];
    comm.recv(&mut own, rank)?;
    checks.check(own == [rank as u64, 42], || {
        format!("self-send gave {own:?}")
    });
    Ok(())
}

fn split<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    for colors in 1..=3u32 {
        // Ranks 3, 7, ... take no part; keys reverse the order and reach the
        // ends of i64; a color at u32::MAX is as good as any other.
        let color_of = |r: usize| (r % 4 != 3).then(|| [0, u32::MAX, 5][r % colors as usize]);
        let key_of = |r: usize| if r == 0 { i64::MIN } else { -(r as i64) };
        let sub = comm.split(color_of(rank), key_of(rank))?;
        let value = input(23, rank, 1)[0];
        match (sub, color_of(rank)) {
            (Some(sub), Some(color)) => {
                let mut members: Vec<usize> =
                    (0..w).filter(|&q| color_of(q) == Some(color)).collect();
                members.sort_by_key(|&q| (key_of(q), q));
                checks.check(
                    sub.world_size() == members.len() && members[sub.rank()] == rank,
                    || {
                        format!(
                            "split: rank {} of {} in {members:?}",
                            sub.rank(),
                            sub.world_size()
                        )
                    },
                );
                let mut v = [value];
                sub.all_reduce(&mut v, ReduceOp::Sum)?;
                // Summed in the new ranks' order, like any reduction.
                let want = members
                    .iter()
                    .skip(1)
                    .fold(input(23, members[0], 1)[0], |a, &q| a + input(23, q, 1)[0]);
                if checks.exact_sums() {
                    checks.check(v[0].to_bits() == want.to_bits(), || {
                        format!("sub-group sum {} != {want}", v[0])
                    });
                } else {
                    let held: Vec<Vec<f64>> =
                        members.iter().map(|&q| vec![input(23, q, 1)[0]]).collect();
                    check_within_library_bound(
                        checks,
                        "sub-group sum",
                        &v,
                        &held,
                        0..1,
                        ReduceOp::Sum,
                    );
                }
                // Sub-groups work asynchronously too.
                let pending = sub.all_reduce_async(vec![1u32], ReduceOp::Sum)?;
                let count = pending.wait()?;
                checks.check(count == [members.len() as u32], || {
                    format!("async count in sub-group: {count:?}")
                });
            }
            (None, None) => {}
            (got, want) => checks.check(false, || {
                format!("split gave {} for color {want:?}", got.is_some())
            }),
        }
        // The parent still works after the split.
        comm.barrier()?;
        let mut one = [1u64];
        comm.all_reduce(&mut one, ReduceOp::Sum)?;
        checks.check(one == [w as u64], || format!("parent after split: {one:?}"));
    }
    Ok(())
}

fn async_forms<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    for &len in LENGTHS {
        let mine: Vec<f32> = input(29, rank, len).iter().map(|&v| v as f32).collect();
        // Several in flight at once, overlapping blocking calls.
        let sum = comm.all_reduce_async(mine.clone(), ReduceOp::Sum)?;
        let gathered = comm.all_gather_async(mine.clone())?;
        let varied = comm.all_gather_varied_async(mine[..rank.min(len)].to_vec())?;
        // A job of several collectives, run in order on the communication thread.
        let job = comm.run_async(move |c| {
            let mut avg = vec![c.rank() as f64; 3];
            c.all_reduce(&mut avg, ReduceOp::Avg)?;
            c.barrier()?;
            Ok(avg)
        })?;
        let mut blocking_sum = mine.clone();
        comm.all_reduce(&mut blocking_sum, ReduceOp::Sum)?;
        let mut blocking_gather = vec![0f32; len * w];
        comm.all_gather(&mine, &mut blocking_gather)?;
        let blocking_varied = comm.all_gather_varied(&mine[..rank.min(len)])?;
        let sum = sum.wait()?;
        checks.check(bytes_of(&sum) == bytes_of(&blocking_sum), || {
            format!("async all_reduce of {len}")
        });
        checks.check(gathered.wait()? == blocking_gather, || {
            format!("async all_gather of {len}")
        });
        checks.check(varied.wait()? == blocking_varied, || {
            format!("async all_gather_varied of {len}")
        });
        let avg = job.wait()?;
        let want = (0..w).map(|r| r as f64).sum::<f64>() / w as f64;
        let right = if checks.exact_sums() {
            avg == vec![want; 3]
        } else {
            let ranks: Vec<Vec<f64>> = (0..w).map(|r| vec![r as f64; 3]).collect();
            avg.len() == 3
                && (0..3).all(|i| {
                    let allowed = library_bound::<f64>(&ranks, i, want, ReduceOp::Avg);
                    (avg[i] - want).abs() <= allowed
                })
        };
        checks.check(right, || format!("async job: {avg:?}"));
    }
    // Tensors of every dtype, blocking and asynchronous.
    for dtype in [
        gradwire_tensor::DType::F32,
        gradwire_tensor::DType::F16,
        gradwire_tensor::DType::BF16,
    ] {
        let values: Vec<f32> = (0..7).map(|i| (i + rank) as f32).collect();
        let mut t = Tensor::from_f32(&values, [7], dtype)?;
        comm.all_reduce_tensor(&mut t, ReduceOp::Sum)?;
        let max = comm
            .all_reduce_tensor_async(t.clone(), ReduceOp::Max)?
            .wait()?;
        let want: Vec<f32> = (0..7)
            .map(|i| (0..w).map(|r| (i + r) as f32).sum())
            .collect();
        checks.check(t.to_f32_vec()? == want && max.to_f32_vec()? == want, || {
            format!("{dtype} tensor all_reduce")
        });
    }
    Ok(())
}

/// Whether `result` is a mismatch on this rank; records a failure otherwise.
fn expect_mismatch(checks: &mut Checks, what: &str, result: Result<(), CommError>) {
    checks.check(matches!(result, Err(CommError::Mismatch { .. })), || {
        format!("{what}: expected Mismatch, got {result:?}")
    });
}

fn expect_invalid(checks: &mut Checks, what: &str, result: Result<(), CommError>) {
    checks.check(
        matches!(
            result,
            Err(CommError::InvalidArgument(_) | CommError::InvalidRank { .. })
        ),
        || format!("{what}: expected an invalid-argument error, got {result:?}"),
    );
}

/// Checks that the communicator still works: an all-reduce and a
/// point-to-point exchange give the right answers.
fn still_works<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
    after: &str,
) -> Result<(), CaseError> {
    let w = comm.world_size();
    let mut v = [comm.rank() as f32; 3];
    comm.all_reduce(&mut v, ReduceOp::Sum)?;
    let want = (0..w).map(|r| r as f32).sum::<f32>();
    checks.check(v == [want; 3], || {
        format!("after {after}: all_reduce gave {v:?}")
    });
    Ok(())
}

fn mismatches<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    if w == 1 {
        // One rank cannot disagree with itself; the group must simply work.
        return still_works(comm, checks, "nothing");
    }
    let odd = rank == w - 1;
    // Length: every rank learns which rank differed and how.
    let len = if odd { 5 } else { 4 };
    let result = comm.all_reduce(&mut vec![1f32; len], ReduceOp::Sum);
    checks.check(
        matches!(&result, Err(CommError::Mismatch { detail })
            if detail.contains(&format!("rank {}", w - 1)) && detail.contains('5')),
        || format!("length mismatch: {result:?}"),
    );
    still_works(comm, checks, "a length mismatch")?;
    let kind = if odd {
        comm.barrier()
    } else {
        comm.all_reduce(&mut [0f32; 2], ReduceOp::Sum)
    };
    expect_mismatch(checks, "kind", kind);
    still_works(comm, checks, "a kind mismatch")?;
    let dtype = if odd {
        comm.all_reduce(&mut [0f64; 2], ReduceOp::Sum)
    } else {
        comm.all_reduce(&mut [0f32; 2], ReduceOp::Sum)
    };
    expect_mismatch(checks, "dtype", dtype);
    let op = comm.all_reduce(
        &mut [0f32; 2],
        if odd { ReduceOp::Max } else { ReduceOp::Sum },
    );
    expect_mismatch(checks, "op", op);
    let root = comm.broadcast(&mut [0f32; 2], usize::from(odd));
    expect_mismatch(checks, "root", root);
    let gather = if odd {
        comm.all_gather(&[0u8; 3], &mut vec![0u8; 3 * w])
    } else {
        comm.all_gather(&[0u8; 2], &mut vec![0u8; 2 * w])
    };
    expect_mismatch(checks, "all_gather length", gather);
    let scatter = comm.reduce_scatter(
        &vec![1i32; if odd { 9 } else { 8 }],
        &mut [0i32; 0],
        ReduceOp::Sum,
    );
    expect_mismatch(checks, "reduce_scatter length", scatter);
    // Asynchronous collectives are checked the same way.
    let pending = comm.all_reduce_async(vec![0f32; len], ReduceOp::Sum)?;
    expect_mismatch(checks, "async length", pending.wait().map(|_| ()));
    still_works(comm, checks, "the mismatches")?;
    // A message of the wrong type or length is a mismatch for its receiver,
    // and is consumed: the next message is received normally.
    let next = (rank + 1) % w;
    let prev = (rank + w - 1) % w;
    // Sends before receives only where messages are eager (see
    // `point_to_point`).
    let send_first = comm.eager_messages() || rank % 2 == 0;
    let send_all = || -> Result<(), CommError> {
        comm.send(&[1f64, 2.0], next)?;
        comm.send(&[3f32; 4], next)?;
        comm.send(&[5f32; 2], next)
    };
    if send_first {
        send_all()?;
    }
    let wrong_type = comm.recv(&mut [0f32; 2], prev);
    expect_mismatch(checks, "recv of another type", wrong_type);
    let wrong_len = comm.recv(&mut [0f32; 3], prev);
    expect_mismatch(checks, "recv of another length", wrong_len);
    let mut right = [0f32; 2];
    comm.recv(&mut right, prev)?;
    if !send_first {
        send_all()?;
    }
    checks.check(right == [5.0; 2], || {
        format!("recv after mismatches: {right:?}")
    });
    still_works(comm, checks, "point-to-point mismatches")
}

/// A rank that posts a fault in place of its next collective ends that
/// collective on every rank, whatever the others called, with the same
/// `Fault` (the lowest faulting rank and its code); the group stays usable,
/// every rank at the same point of its sequence.
fn posted_faults<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    let expect = |checks: &mut Checks, what: &str, got: Result<(), CommError>, want: CommError| {
        checks.check(got.as_ref().err() == Some(&want), || {
            format!("{what}: expected {want:?}, got {got:?}")
        });
    };
    // The last rank faults while the others all-reduce, gather or wait.
    let faulty = w - 1;
    let want = CommError::Fault(Fault::posted(faulty, FaultKind::Code(7)));
    let calls: [&dyn Fn() -> Result<(), CommError>; 3] = [
        &|| comm.all_reduce(&mut [1f32; 5], ReduceOp::Sum),
        &|| comm.all_gather_varied(&vec![2u8; rank + 1]).map(|_| ()),
        &|| comm.barrier(),
    ];
    for (i, call) in calls.iter().enumerate() {
        let got = if rank == faulty {
            Err(comm.post_fault(FaultKind::Code(7)))
        } else {
            call()
        };
        expect(checks, &format!("fault during call {i}"), got, want.clone());
        still_works(comm, checks, "a posted fault")?;
    }
    // Several ranks fault at once: the lowest one is named, with its code.
    let got = if rank % 2 == 1 || w == 1 {
        Err(comm.post_fault(FaultKind::Code(100 + rank as u32)))
    } else {
        comm.all_reduce(&mut [0f64; 3], ReduceOp::Max)
    };
    let first = if w == 1 { 0 } else { 1 };
    expect(
        checks,
        "faults on several ranks",
        got,
        CommError::Fault(Fault::posted(first, FaultKind::Code(100 + first as u32))),
    );
    // On the asynchronous lane too.
    let got = if rank == faulty {
        comm.run_async(move |comm| Err::<(), _>(comm.post_fault(FaultKind::Code(300))))?
            .wait()
    } else {
        comm.all_reduce_async(vec![1f32; 4], ReduceOp::Sum)?
            .wait()
            .map(|_| ())
    };
    expect(
        checks,
        "an asynchronous fault",
        got,
        CommError::Fault(Fault::posted(faulty, FaultKind::Code(300))),
    );
    let pending = comm.all_reduce_async(vec![1f32; 2], ReduceOp::Sum)?;
    let sum = pending.wait()?;
    checks.check(sum == vec![w as f32; 2], || {
        format!("the asynchronous lane after a fault: {sum:?}")
    });
    still_works(comm, checks, "the posted faults")
}

/// The fault matrix of `gradwire_experiments::faults` on this backend: for every
/// mode and fault, every rank sees the same outcome at every step, the
/// steps after the fault complete, and the ranks end bitwise equal (each
/// scenario on its own duplicate; the records compared after an
/// all-gather, `faults::run_share_on`). `GRADWIRE_FAULT_SHARE=i/n` runs
/// the i-th of n shares of the scenarios only (`gpu_suite.sh` runs the
/// shares side by side on a GPU machine, where each scenario's fresh
/// communicators take half a second).
fn fault_matrix<C: Communicator + 'static>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    use gradwire_experiments::faults::{Share, run_share_on};
    let share = match std::env::var("GRADWIRE_FAULT_SHARE") {
        Ok(text) => Share::parse(&text)?,
        Err(_) => Share::WHOLE,
    };
    for report in run_share_on(comm, share)? {
        checks.check(report.holds(), || {
            format!(
                "{} / {} / skip {}: at the fault step {:?}, agreed {}, recovered {}, equal {:?}",
                report.mode.name(),
                report.fault.name(),
                report.skip_non_finite,
                report.at_fault,
                report.agreed,
                report.recovered,
                report.equal
            )
        });
    }
    Ok(())
}

/// A job that panics on one rank loses the asynchronous lane of every rank,
/// promptly (the backends' deadlines are minutes): its own handle is
/// `RankPanicked`; a peer's job waiting in (or later reaching) a collective
/// of the lane fails with `Fault` of kind `LaneLost`; every later job
/// fails at once without running; the blocking lane goes on. Every rank in
/// turn panics before, between and after the job's two collectives, each
/// time on a fresh lane (a split of the whole group has its own); then a
/// peer waiting to receive from a rank whose job panicked fails the same
/// way. (The one implementation of this scenario: it runs on LocalComm,
/// on MpiComm under mpirun and on NcclComm.)
/// The job of `reused_job_slots`: an all-reduce of `value` on every rank,
/// panicking first on rank `panicker` if one is named.
struct SumJob {
    value: f32,
    panicker: Option<usize>,
}

impl<C: Communicator> AsyncJob<C> for SumJob {
    type Output = f32;

    fn run(self, comm: &C) -> gradwire_comm::Result<f32> {
        if self.panicker == Some(comm.rank()) {
            panic!("the slot's job of rank {} fails", comm.rank());
        }
        let mut sum = [self.value];
        comm.all_reduce(&mut sum, ReduceOp::Sum)?;
        Ok(sum[0])
    }
}

/// `run_job` through one slot, reused: every result right (waited, polled,
/// or after a handle dropped unwaited, which leaves the slot to a new
/// cell); a job that panics on one rank fails as `run_async`'s does (its
/// own handle `RankPanicked`, the others a `LaneLost` fault) and later jobs fail
/// at once.
fn reused_job_slots<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let w = comm.world_size();
    let lane = comm
        .split(Some(0), 0)?
        .ok_or_else(|| CommError::InvalidArgument("split left a rank out".into()))?;
    let rank = lane.rank();
    let mut slot = JobSlot::default();
    let expected = |step: usize| (0..w).map(|r| (r + step) as f32).sum::<f32>();
    for step in 0..6 {
        let job = SumJob {
            value: (rank + step) as f32,
            panicker: None,
        };
        let mut pending = lane.run_job(&mut slot, job)?;
        let got = if step % 2 == 0 {
            pending.wait()
        } else {
            while !pending.is_ready() {
                std::thread::yield_now();
            }
            pending.wait()
        };
        checks.check(got == Ok(expected(step)), || {
            format!("step {step}: the slot's job gave {got:?}")
        });
        if step == 3 {
            // A handle dropped unwaited: the job still runs with the peers.
            let dropped = lane.run_job(
                &mut slot,
                SumJob {
                    value: 1.0,
                    panicker: None,
                },
            )?;
            drop(dropped);
            let after = lane.all_gather_async(vec![rank as u32])?.wait()?;
            checks.check(after.len() == w, || "a job after a dropped handle".into());
        }
    }
    // A panicking job on the last rank. A rank that submits after the loss
    // reached its lane is refused at once, with the same error.
    let panicker = w - 1;
    let failed = lane
        .run_job(
            &mut slot,
            SumJob {
                value: 1.0,
                panicker: Some(panicker),
            },
        )
        .and_then(Pending::wait);
    let lost = CommError::lane_lost(panicker);
    if rank == panicker {
        checks.check(
            matches!(&failed, Err(CommError::RankPanicked { rank: r, .. }) if *r == rank),
            || format!("the panicking slot's job gave {failed:?}"),
        );
    } else {
        checks.check(failed.as_ref().err() == Some(&lost), || {
            format!("the job the panicking rank left gave {failed:?}")
        });
    }
    let later = lane
        .run_job(
            &mut slot,
            SumJob {
                value: 1.0,
                panicker: None,
            },
        )
        .and_then(Pending::wait);
    checks.check(later.as_ref().err() == Some(&lost), || {
        format!("a later slot job gave {later:?}")
    });
    // The parent communicator is untouched.
    let mut one = [1u32];
    comm.all_reduce(&mut one, ReduceOp::Sum)?;
    checks.check(one == [w as u32], || {
        format!("the parent after the loss: {one:?}")
    });
    Ok(())
}

fn panicking_async_job<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    const PROMPT: Duration = Duration::from_secs(5);
    const AT_ONCE: Duration = Duration::from_millis(500);
    let w = comm.world_size();
    let fresh_lane = || -> Result<C, CaseError> {
        Ok(comm
            .split(Some(0), 0)?
            .ok_or_else(|| CommError::InvalidArgument("split left a rank out".into()))?)
    };
    let points = ["before", "between", "after"];
    for (panicker, at) in (0..w).flat_map(|p| points.map(|at| (p, at))) {
        let lane = fresh_lane()?;
        let rank = lane.rank();
        let case = format!("rank {panicker} panics {at} its job's collectives");
        let start = Instant::now();
        let first = lane.run_async(move |c| {
            let fail_at = |here: &str| {
                if rank == panicker && at == here {
                    panic!("the job of rank {rank} fails {here}");
                }
            };
            fail_at("before");
            let mut sum = vec![1f32; 17];
            c.all_reduce(&mut sum, ReduceOp::Sum)?;
            fail_at("between");
            c.barrier()?;
            fail_at("after");
            Ok(sum[0])
        })?;
        let second = lane.all_gather_async(vec![rank as u32]);
        let first = first.wait();
        let second = second.and_then(Pending::wait);
        let took = start.elapsed();
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        let asked = Instant::now();
        let third = lane
            .run_async(move |_| {
                flag.store(true, Ordering::SeqCst);
                Ok(())
            })
            .and_then(Pending::wait);
        let third_took = asked.elapsed();
        let lost = CommError::lane_lost(panicker);
        if rank == panicker {
            checks.check(
                matches!(&first, Err(CommError::RankPanicked { rank: r, message })
                    if *r == rank && message.contains("fails")),
                || format!("{case}: the panicking job gave {first:?}"),
            );
        } else if at == "after" {
            checks.check(first == Ok(w as f32), || {
                format!("{case}: a job done before the panic gave {first:?}")
            });
        } else {
            checks.check(first.as_ref().err() == Some(&lost), || {
                format!("{case}: the job the panicking rank left gave {first:?}")
            });
        }
        checks.check(second.as_ref().err() == Some(&lost), || {
            format!("{case}: the job queued behind gave {second:?}")
        });
        checks.check(took < PROMPT, || format!("{case}: the jobs took {took:?}"));
        checks.check(
            third.as_ref().err() == Some(&lost) && !ran.load(Ordering::SeqCst),
            || format!("{case}: a later job gave {third:?}"),
        );
        checks.check(third_took < AT_ONCE, || {
            format!("{case}: a later job took {third_took:?} to fail")
        });
        // The lane's blocking calls, and the parent, are untouched.
        let mut one = [1u32];
        lane.all_reduce(&mut one, ReduceOp::Sum)?;
        checks.check(one == [w as u32], || {
            format!("{case}: blocking calls: {one:?}")
        });
        still_works(comm, checks, &case)?;
    }
    // A receive hears of the sender's lost lane only where messages are
    // eager: on NCCL it waits for its deadline (`Communicator::eager_messages`).
    if w >= 2 && comm.eager_messages() {
        let lane = fresh_lane()?;
        let start = Instant::now();
        let got = lane
            .run_async(|lane| {
                if lane.rank() == 0 {
                    panic!("rank 0 fails before it sends");
                }
                lane.recv(&mut [0f32; 4], 0)
            })
            .and_then(Pending::wait);
        let took = start.elapsed();
        let ok = if lane.rank() == 0 {
            matches!(got, Err(CommError::RankPanicked { rank: 0, .. }))
        } else {
            got == Err(CommError::lane_lost(0))
        };
        checks.check(ok && took < PROMPT, || {
            format!("recv from a rank whose job panicked, after {took:?}: {got:?}")
        });
    }
    Ok(())
}

/// A communicator of every rank of `comm`, in its order (a split in which
/// nobody is left out): a case's own, so that what it leaves behind (a
/// lost lane, a poisoned group) stays there.
fn whole_copy<C: Communicator>(comm: &C) -> Result<C, CaseError> {
    comm.split(Some(0), comm.rank() as i64)?
        .ok_or_else(|| CaseError::Candle("a split left this rank out".into()))
}

/// A candle MLP trained through gradwire-candle on this backend equals one
/// process on the global batch, and every rank ends bitwise equal (dense,
/// SGD; the model and data of [`crate::candle_model`]).
fn candle_training<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    use crate::candle_model::{first_far, single, worker};
    let own = whole_copy(comm)?;
    let run = |r: candle_core::Result<_>| r.map_err(|e| CaseError::Candle(e.to_string()));
    // candle-nn's SGD, and gradwire's SGD with momentum and AdamW in place
    // on candle's variables (gradwire-candle's optimizers).
    let momentum = gradwire_optim::SgdConfig::default().lr(0.2).momentum(0.9);
    let adamw = gradwire_optim::AdamConfig::adamw().lr(0.01);
    let runs = [
        (
            "candle SGD",
            run(worker::<candle_nn::SGD, _>(
                whole_copy(&own)?,
                0.5,
                DistOptConfig::default(),
            ))?
            .0,
            run(single::<candle_nn::SGD>(0.5))?.0,
        ),
        (
            "gradwire SGD with momentum",
            run(worker::<gradwire_candle::Sgd, _>(
                whole_copy(&own)?,
                momentum.clone(),
                DistOptConfig::default(),
            ))?
            .0,
            run(single::<gradwire_candle::Sgd>(momentum))?.0,
        ),
        (
            "gradwire AdamW",
            run(worker::<gradwire_candle::AdamW, _>(
                own,
                adamw.clone(),
                DistOptConfig::default(),
            ))?
            .0,
            run(single::<gradwire_candle::AdamW>(adamw))?.0,
        ),
    ];
    for (name, got, want) in runs {
        checks.check(first_far(&got, &want).is_none(), || {
            format!("{name}: far from one process: {:?}", first_far(&got, &want))
        });
        let bits: Vec<u32> = got.iter().flatten().map(|x| x.to_bits()).collect();
        let mut all = vec![0u32; bits.len() * comm.world_size()];
        comm.all_gather(&bits, &mut all)?;
        checks.check(all.chunks(bits.len()).all(|c| c == bits.as_slice()), || {
            format!("{name}: ranks differ after candle training")
        });
    }
    Ok(())
}

/// Uneven inputs (`GradSync::join`): rank r has 1 + r steps of data,
/// weights each step by its samples and joins when out; every step's
/// combined gradient is the mean over the samples of the ranks still
/// training (against f64), and `join` takes part in the steps left.
fn uneven_inputs<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let own = whole_copy(comm)?;
    let (rank, world) = (comm.rank(), comm.world_size());
    // Lengths 1, a prime and a matrix's.
    let lens = [1usize, 13, 28];
    let specs = lens
        .iter()
        .enumerate()
        .map(|(k, &n)| ParamSpec::new(format!("p{k}"), [n]))
        .collect();
    let mut sync = GradSync::new(own, specs, DistOptConfig::default())?;
    let samples = |r: usize, step: usize| ((r * 3 + step * 5) % 4) as u64 + 1;
    let value = |r: usize, step: usize, k: usize, i: usize| {
        (((r * 131 + step * 17 + k * 5 + i) as f32) * 0.37).sin() * 0.5
    };
    let mut combined: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.0; n]).collect();
    for step in 0..=rank {
        sync.set_samples(samples(rank, step))?;
        for (k, &n) in lens.iter().enumerate() {
            let grad: Vec<f32> = (0..n).map(|i| value(rank, step, k, i)).collect();
            sync.push(k, &grad)?;
        }
        let mut buffers: Vec<&mut [f32]> = combined.iter_mut().map(Vec::as_mut_slice).collect();
        sync.finish(&mut buffers)?;
        let active: Vec<usize> = (step..world).collect();
        let total: u64 = active.iter().map(|&r| samples(r, step)).sum();
        for (k, got) in combined.iter().enumerate() {
            for (i, &g) in got.iter().enumerate() {
                let want = active
                    .iter()
                    .map(|&r| samples(r, step) as f64 * f64::from(value(r, step, k, i)))
                    .sum::<f64>()
                    / total as f64;
                let bound = 1e-5 * world as f64 * (1.0 + want.abs());
                checks.check((f64::from(g) - want).abs() <= bound, || {
                    format!("step {step}, p{k}[{i}]: {g} against the samples' mean {want}")
                });
            }
        }
    }
    let joined = sync.join()?;
    checks.check(joined as usize == world - 1 - rank, || {
        format!(
            "join took part in {joined} steps, {} left",
            world - 1 - rank
        )
    });
    Ok(())
}

fn invalid_arguments<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    expect_invalid(
        checks,
        "root out of range",
        comm.broadcast(&mut [0f32; 2], w),
    );
    expect_invalid(
        checks,
        "Avg of integers",
        comm.all_reduce(&mut [1i32; 2], ReduceOp::Avg),
    );
    // One rank's receive buffer is wrong: every rank fails.
    let recv_len = if rank == 0 { 2 * w + 1 } else { 2 * w };
    expect_invalid(
        checks,
        "all_gather receive length",
        comm.all_gather(&[0f32; 2], &mut vec![0f32; recv_len]),
    );
    let chunk = chunk_range(10, w, rank).len() + usize::from(rank == w - 1);
    expect_invalid(
        checks,
        "reduce_scatter receive length",
        comm.reduce_scatter(&[1f32; 10], &mut vec![0f32; chunk], ReduceOp::Sum),
    );
    // Local checks, no collective involved.
    expect_invalid(checks, "send to a rank out of range", comm.send(&[0u8], w));
    expect_invalid(
        checks,
        "recv from a rank out of range",
        comm.recv(&mut [0u8], w + 3),
    );
    still_works(comm, checks, "invalid arguments")
}

/// A linear model y = sum_k X_k w_k whose weight blocks have these sizes.
const BLOCKS: &[usize] = &[5, 1, 13, 2, 31, 3];
/// Divisible by every world size 1..=4.
const BATCH: usize = 120;

fn sample(i: usize) -> (Vec<f64>, f64) {
    let d: usize = BLOCKS.iter().sum();
    let x: Vec<f64> = (0..d)
        .map(|j| (((i * 31 + j * 17) % 23) as f64 - 11.0) / 11.0)
        .collect();
    let y = x
        .iter()
        .enumerate()
        .map(|(j, v)| v * ((j % 5) as f64 - 2.0))
        .sum::<f64>()
        + 0.1;
    (x, y)
}

/// The mean-squared-error gradient over samples `range`, per block, in f64.
fn gradient(w: &[Vec<f32>], range: Range<usize>) -> Vec<Vec<f32>> {
    let n = range.len() as f64;
    let mut g: Vec<Vec<f64>> = BLOCKS.iter().map(|&b| vec![0.0; b]).collect();
    let flat: Vec<f64> = w.iter().flatten().map(|&v| f64::from(v)).collect();
    for i in range {
        let (x, y) = sample(i);
        let err = x.iter().zip(&flat).map(|(a, b)| a * b).sum::<f64>() - y;
        let mut j = 0;
        for block in g.iter_mut() {
            for gj in block.iter_mut() {
                *gj += err * x[j] / n;
                j += 1;
            }
        }
    }
    g.iter()
        .map(|b| b.iter().map(|&v| v as f32).collect())
        .collect()
}

fn initial() -> Vec<Vec<f32>> {
    BLOCKS
        .iter()
        .enumerate()
        .map(|(k, &b)| (0..b).map(|j| ((k + j) % 3) as f32 * 0.1).collect())
        .collect()
}

fn tensors(values: &[Vec<f32>]) -> Result<Vec<Tensor>, CaseError> {
    Ok(values
        .iter()
        .map(|v| Tensor::from_vec(v.clone(), v.len()))
        .collect::<Result<_, _>>()?)
}

fn values(tensors: &[Tensor]) -> Result<Vec<Vec<f32>>, CaseError> {
    Ok(tensors
        .iter()
        .map(|t| t.to_vec::<f32>())
        .collect::<Result<_, _>>()?)
}

/// `steps` data-parallel steps of DistOpt over an owned copy of `comm` (a
/// split with one color: the same ranks, in the same order).
fn train_distributed<C: Communicator + 'static, O: Optimizer + 'static>(
    comm: &C,
    optimizer: O,
    steps: usize,
) -> Result<Vec<Vec<f32>>, CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    let owned = comm
        .split(Some(0), rank as i64)?
        .ok_or_else(|| CommError::InvalidArgument("split left this rank out".into()))?;
    let specs = (0..BLOCKS.len())
        .rev()
        .map(|k| ParamSpec::new(format!("w{k}"), vec![BLOCKS[k]]))
        .collect();
    let config = DistOptConfig {
        fusion_threshold: 16,
        ..DistOptConfig::default()
    };
    let mut dist = DistOpt::new(optimizer, owned, specs, config)?;
    let mut w_t = tensors(&initial())?;
    let shard = BATCH / w;
    let names: Vec<String> = (0..BLOCKS.len()).map(|k| format!("w{k}")).collect();
    for _ in 0..steps {
        let g = gradient(&values(&w_t)?, rank * shard..(rank + 1) * shard);
        // Backward order, pushed one by one: buckets start as they fill.
        for k in (0..BLOCKS.len()).rev() {
            dist.push(&names[k], Tensor::from_vec(g[k].clone(), BLOCKS[k])?)?;
        }
        dist.finish(names.iter().map(String::as_str).zip(w_t.iter_mut()))?;
    }
    values(&w_t)
}

/// The same steps in one process on the whole batch.
fn train_single<O: Optimizer>(mut opt: O, steps: usize) -> Result<Vec<Vec<f32>>, CaseError> {
    let mut w_t = tensors(&initial())?;
    for _ in 0..steps {
        let g = gradient(&values(&w_t)?, 0..BATCH);
        for (k, t) in w_t.iter_mut().enumerate() {
            opt.update(
                &format!("w{k}"),
                t,
                &Tensor::from_vec(g[k].clone(), BLOCKS[k])?,
            )?;
        }
        opt.step();
    }
    values(&w_t)
}

fn distopt_equals_single_process<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let w = comm.world_size();
    let sgd = || Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9));
    let adam = || Adam::new(AdamConfig::default().lr(0.01));
    // The shard means, averaged, are the batch mean up to the f32 rounding
    // of W partial gradients; Adam normalises the step, which amplifies the
    // relative error of tiny gradients.
    for (name, got, want, scale) in [
        (
            "sgd",
            train_distributed(comm, sgd()?, 5)?,
            train_single(sgd()?, 5)?,
            1.0,
        ),
        (
            "adam",
            train_distributed(comm, adam()?, 5)?,
            train_single(adam()?, 5)?,
            20.0,
        ),
    ] {
        let tol = 2e-6 * w as f32 * scale;
        let diff = got
            .iter()
            .flatten()
            .zip(want.iter().flatten())
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        checks.check(diff <= tol, || format!("DistOpt {name}: {diff} > {tol}"));
        let flat: Vec<f32> = got.into_iter().flatten().collect();
        same_on_every_rank(comm, checks, &bytes_of(&flat), name)?;
    }
    Ok(())
}

fn adasum_matches_reference<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let w = comm.world_size();
    let sizes = [17usize, 1, 31, 4];
    let mut tensor_ranges = Vec::new();
    let mut start = 0;
    for s in sizes {
        tensor_ranges.push(start..start + s);
        start += s;
    }
    let n = start;
    let vector =
        |r: usize| -> Vec<f32> { input(31, r, n).iter().map(|&v| (v / 1e3) as f32).collect() };
    let ada = AdaSum::new(comm)?;
    let mut v = vector(comm.rank());
    ada.combine_flat(comm, &mut v, &tensor_ranges)?;
    let want = adasum::reference((0..w).map(vector).collect(), &tensor_ranges)?;
    // The same tree; only the order of f64 partial sums and the f32
    // rounding at each level differ: a few ulps per level.
    let levels = (usize::BITS - w.leading_zeros()) as f32 + 1.0;
    for (i, (g, x)) in v.iter().zip(&want).enumerate() {
        let bound = 4.0 * levels * f32::EPSILON * (1.0 + x.abs());
        checks.check((g - x).abs() <= bound, || {
            format!("AdaSum at {i}: {g} vs the sequential {x}")
        });
    }
    same_on_every_rank(comm, checks, &bytes_of(&v), "AdaSum")?;
    Ok(())
}

fn sparse_all_reduce<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
    let w = comm.world_size();
    let sizes = [1031usize, 7];
    let n: usize = sizes.iter().sum();
    let mine = |r: usize| -> Vec<f32> { input(37, r, n).iter().map(|&v| v as f32).collect() };
    // A threshold that keeps about a sixth (sent sparse), then one that
    // keeps everything (the consistent dense fallback).
    for (threshold, dense) in [(500f32, false), (0.0, true)] {
        let own = mine(comm.rank());
        let mut ts = vec![
            Tensor::from_vec(own[..sizes[0]].to_vec(), sizes[0])?,
            Tensor::from_vec(own[sizes[0]..].to_vec(), sizes[1])?,
        ];
        gradwire_algos::sparse_all_reduce(comm, &mut ts, &SparseCodec::Threshold(threshold), None)?;
        let got: Vec<f32> = values(&ts)?.into_iter().flatten().collect();
        // The reference, in rank order: dense is a plain sum from rank 0's
        // value; sparse adds the selected entries into zeros.
        let inputs: Vec<Vec<f32>> = (0..w).map(mine).collect();
        let want: Vec<f32> = (0..n)
            .map(|i| {
                if dense {
                    inputs.iter().skip(1).fold(inputs[0][i], |a, x| a + x[i])
                } else {
                    inputs
                        .iter()
                        .filter(|x| x[i].abs() >= threshold)
                        .fold(0f32, |a, x| a + x[i])
                }
            })
            .collect();
        if dense && !checks.exact_sums() {
            // The dense fallback is the library's all-reduce.
            let exact: Vec<Vec<f64>> = inputs
                .iter()
                .map(|x| x.iter().map(|&v| f64::from(v)).collect())
                .collect();
            let what = format!("sparse all-reduce (threshold {threshold})");
            check_within_library_bound(checks, &what, &got, &exact, 0..n, ReduceOp::Sum);
            continue;
        }
        checks.check(bytes_of(&got) == bytes_of(&want), || {
            format!(
                "sparse all-reduce (threshold {threshold}) differs from its rank-order reference"
            )
        });
    }
    Ok(())
}

fn skipping_unwritten_gradients<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    for vote in [SkipVote::PerBucket, SkipVote::PerStep] {
        let owned = comm
            .split(Some(0), rank as i64)?
            .ok_or_else(|| CommError::InvalidArgument("split left this rank out".into()))?;
        let specs = vec![
            ParamSpec::new("shared", vec![3]),
            ParamSpec::new("unused", vec![2]),
            ParamSpec::new("rank0only", vec![2]),
            ParamSpec::new("sometimes", vec![5]),
        ];
        let sgd = Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9).weight_decay(0.1))?;
        let config = DistOptConfig {
            fusion_threshold: 4,
            vote,
            ..DistOptConfig::default()
        };
        let mut dist = DistOpt::new(sgd, owned, specs, config)?;
        let mut shared = Tensor::from_vec(vec![1f32; 3], 3)?;
        let mut unused = Tensor::from_vec(vec![0.5f32, -0.5], 2)?;
        let mut only = Tensor::from_vec(vec![1f32; 2], 2)?;
        let mut sometimes = Tensor::from_vec(vec![1f32; 5], 5)?;
        let (mut skipped, mut want_skipped) = (0, 0);
        for step in 0..10 {
            let g = |v: f32, n: usize| Tensor::from_vec(vec![v; n], n).ok();
            let writes = |r: usize| (step + r).is_multiple_of(3);
            // Each rank writes a different subset: never a hang.
            let stats = dist.step([
                ("shared", &mut shared, g(1.0, 3)),
                ("unused", &mut unused, None),
                // Written on rank 0 only, W times as large: averaged over W
                // ranks it is the same gradient as "shared".
                (
                    "rank0only",
                    &mut only,
                    if rank == 0 { g(w as f32, 2) } else { None },
                ),
                (
                    "sometimes",
                    &mut sometimes,
                    if writes(rank) { g(2.0, 5) } else { None },
                ),
            ])?;
            skipped += stats.skipped;
            want_skipped += 1 + usize::from(!(0..w).any(writes));
        }
        let has_state = dist.optimizer().param_state("unused").is_some();
        let unused = unused.to_vec::<f32>()?;
        let only = only.to_vec::<f32>()?;
        let shared = shared.to_vec::<f32>()?;
        checks.check(unused == [0.5, -0.5], || {
            format!("{vote:?}: an unwritten parameter changed: {unused:?}")
        });
        checks.check(!has_state, || {
            format!("{vote:?}: state for an unwritten parameter")
        });
        checks.check(skipped == want_skipped, || {
            format!("{vote:?}: {skipped} skips, want {want_skipped}")
        });
        // A library's average may round W * (1/W) and 1/W + ... + 1/W
        // apart.
        let loose = !checks.exact_sums();
        let same = |a: f32, b: f32| {
            a == b || (loose && (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0))
        };
        let agree = only.len() == 2 && only.iter().zip(&shared).all(|(&a, &b)| same(a, b));
        checks.check(agree, || {
            format!("{vote:?}: rank0only {only:?} vs shared {shared:?}")
        });
        let all: Vec<f32> = [shared, only, sometimes.to_vec::<f32>()?].concat();
        same_on_every_rank(comm, checks, &bytes_of(&all), "skipping")?;
    }
    Ok(())
}

/// LocalComm's report of a run of `config`, trained (by `train`) once per
/// process: every harness of a test binary (LocalComm's own, NcclComm's
/// host transport under both reductions) compares with that same run,
/// which on LocalComm is bitwise the same every time (what
/// [`training_runs_match_local`] checks there, against its own run). A
/// failed run is not kept.
fn local_reference(
    config: &gradwire_experiments::TrainConfig,
    train: impl FnOnce() -> gradwire_experiments::Result<gradwire_experiments::RunReport>,
) -> gradwire_experiments::Result<gradwire_experiments::RunReport> {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex, PoisonError};
    type Slot = Arc<Mutex<Option<gradwire_experiments::RunReport>>>;
    static REPORTS: LazyLock<Mutex<HashMap<String, Slot>>> = LazyLock::new(Default::default);
    // Every field of the run, printed: equal keys are equal runs.
    let key = format!("{config:?}");
    let slot = Arc::clone(
        REPORTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_default(),
    );
    // Held while training, so that a second harness asking for the same
    // run waits for this one instead of training it too.
    let mut report = slot.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(report) = report.as_ref() {
        return Ok(report.clone());
    }
    let fresh = train()?;
    *report = Some(fresh.clone());
    Ok(fresh)
}

/// `gradwire train` on this communicator gives rank 0 bitwise the model, the
/// accuracies and the traffic that the same run on LocalComm threads gives,
/// for a strategy of each family (dense, sparse with error feedback, partial
/// averaging, AdaSum by delta weight, DimReduce across its mode switch).
fn training_runs_match_local<C: Backend + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    use gradwire_experiments::train::{Silent, train, train_rank};
    use gradwire_experiments::{
        TrainConfig,
        data::{Dataset, Digits},
    };
    let data = Dataset::Digits(Digits::load(42));
    let mlp = TrainConfig {
        world: comm.world_size(),
        epochs: 2,
        hidden: vec![16],
        dimreduce_dense_epochs: Some(1),
        components: 8,
        ..TrainConfig::default()
    };
    // The convolutional network too, with AdamW's state.
    let cnn = TrainConfig {
        strategy: "fp16".parse().expect("a registry name"),
        model: gradwire_experiments::ModelKind::Cnn,
        channels: vec![4, 8],
        optimizer: gradwire_experiments::OptimizerKind::Adamw,
        lr: 0.01,
        ..mlp.clone()
    };
    let configs = ["dense", "topk:0.05", "partial", "adasum-delta", "dimreduce"].map(|strategy| {
        TrainConfig {
            strategy: strategy.parse().expect("a registry name"),
            ..mlp.clone()
        }
    });
    for config in configs.iter().chain([&cnn]) {
        let (config, strategy) = (config.clone(), config.strategy);
        // A copy of the communicator for the run: train_rank takes it.
        let Some(run_comm) = comm.split(Some(0), comm.rank() as i64)? else {
            checks.check(false, || "split(Some(0)) gave no communicator".into());
            continue;
        };
        let report = train_rank(run_comm, &config, &data, &Silent, None)?;
        if comm.rank() != 0 {
            continue;
        }
        let Some(report) = report else {
            checks.check(false, || format!("{strategy:?}: rank 0 returned no report"));
            continue;
        };
        let local = local_reference(&config, || train(&config, &data, &Silent, None))?;
        if !checks.exact_sums() {
            // A library's sums: the same traffic, and the model as good.
            let traffic = |r: &gradwire_experiments::RunReport| -> Vec<u64> {
                r.epochs.iter().map(|e| e.bytes_total).collect()
            };
            checks.check(traffic(&report) == traffic(&local), || {
                format!("{strategy:?}: per-epoch traffic differs from LocalComm's")
            });
            let last =
                |r: &gradwire_experiments::RunReport| r.epochs.last().map(|e| e.test_accuracy);
            let close = match (last(&report), last(&local)) {
                (Some(a), Some(b)) => (a - b).abs() <= 0.05,
                _ => false,
            };
            checks.check(close, || {
                format!(
                    "{strategy:?}: final accuracy {:?}, LocalComm's {:?}",
                    last(&report),
                    last(&local)
                )
            });
            continue;
        }
        checks.check(report.param_checksum == local.param_checksum, || {
            format!(
                "{strategy:?}: parameters {} here, {} on LocalComm",
                report.param_checksum, local.param_checksum
            )
        });
        let summary = |r: &gradwire_experiments::RunReport| -> Vec<(u64, u64, u64)> {
            r.epochs
                .iter()
                .map(|e| {
                    (
                        e.test_accuracy.to_bits(),
                        e.train_loss.to_bits(),
                        e.bytes_total,
                    )
                })
                .collect()
        };
        checks.check(summary(&report) == summary(&local), || {
            format!("{strategy:?}: per-epoch accuracy, loss or traffic differ from LocalComm")
        });
    }
    Ok(())
}
