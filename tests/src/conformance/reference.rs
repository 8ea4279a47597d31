//! The f64 references the cases check against, their error bounds, and the
//! small helpers every case shares: deterministic inputs, bytes of a
//! buffer, agreement between ranks, LocalComm's all-reduce.

use super::{CaseError, Checks};
use gradwire_comm::{CommError, Communicator, Element, LocalComm, ReduceOp, local};
use half::{bf16, f16};
use std::ops::Range;

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

pub(super) fn reference(inputs: &[Vec<f64>], i: usize, op: ReduceOp) -> f64 {
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
pub(super) fn bound<T: Float>(inputs: &[Vec<f64>], i: usize, magnitude: f64, op: ReduceOp) -> f64 {
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
///
/// [`Reductions::Library`]: super::Reductions::Library
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
pub(super) fn check_within_library_bound<T: Float>(
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

pub(super) fn bytes_of<T: Element>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice::<T, u8>(v).to_vec()
}

/// Checks that `mine` is bitwise the same on every rank (one all-gather of
/// its bytes; the same collective on every rank whatever `mine` holds).
pub(super) fn same_on_every_rank<C: Communicator>(
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
pub(super) fn local_all_reduce<T: Element>(
    inputs: &[Vec<T>],
    op: ReduceOp,
) -> Result<Vec<T>, CommError> {
    let results = local::run(inputs.len(), |comm: LocalComm| {
        let mut buf = inputs[comm.rank()].clone();
        comm.all_reduce(&mut buf, op).map(|()| buf)
    })?;
    results.into_iter().next().unwrap_or_else(|| Ok(Vec::new()))
}
