//! The arithmetic of MPI and NCCL reductions, done by gradwire rather than by the transport.
//!
//! MPI moves the bytes; each rank reduces its own chunk of every rank's
//! buffer here, in rank order 0, 1, ..., W-1, with the same block kernels as
//! [`crate::LocalComm`] (f16 and bf16 accumulate in f32 and round once, Max
//! and Min propagate NaN, Avg is the sum divided by W in the accumulator's
//! precision). The result is therefore bitwise the same on every rank, in
//! every run, whatever algorithm MPI picks for the data movement, and
//! bitwise equal to LocalComm's. MPI's own `MPI_SUM` promises none of that
//! (its order depends on the algorithm its tuning picks for the size), and
//! MPI has no half-precision types at all.

use crate::element::{BLOCK, Element};
use crate::error::{CommError, Result};
use crate::op::ReduceOp;

/// `dst = op(sources[0], sources[1], ...)` element-wise, in rank order;
/// every source must be as long as `dst`. `world` divides for `Avg`.
pub(crate) fn in_rank_order<T: Element>(
    sources: &[&[T]],
    op: ReduceOp,
    world: usize,
    dst: &mut [T],
) -> Result<()> {
    if let Some(bad) = sources.iter().find(|s| s.len() != dst.len()) {
        return Err(CommError::InvalidArgument(format!(
            "reduction source of {} elements for a result of {}",
            bad.len(),
            dst.len()
        )));
    }
    // Like LocalComm's reduction: the half-precision conversions are several
    // times faster with AVX2 (x86-64's baseline has no packed narrowing).
    // Same code, same results, compiled twice.
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above), which is all
        // the target-feature function requires beyond its safe signature.
        unsafe { blocks_avx2(sources, op, world, dst) };
        return Ok(());
    }
    blocks(sources, op, world, dst);
    Ok(())
}

/// [`blocks`] compiled with AVX2 enabled.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn blocks_avx2<T: Element>(sources: &[&[T]], op: ReduceOp, world: usize, dst: &mut [T]) {
    blocks(sources, op, world, dst);
}

/// The block loop: the first source's block is loaded into an L1-sized
/// accumulator, the others are combined into it in order, and it is rounded
/// once into `dst`. Always inlined, so each caller compiles it for its own
/// target features. Sources are the same length as `dst` (checked by the
/// caller); a short one would only end the loop early, never panic.
#[inline(always)]
fn blocks<T: Element>(sources: &[&[T]], op: ReduceOp, world: usize, dst: &mut [T]) {
    let Some((first, rest)) = sources.split_first() else {
        return;
    };
    let mut acc = [T::Acc::default(); BLOCK];
    for (b, out) in dst.chunks_mut(BLOCK).enumerate() {
        let start = b * BLOCK;
        let range = start..start + out.len();
        let acc = &mut acc[..out.len()];
        let Some(block) = first.get(range.clone()) else {
            return;
        };
        T::load(block, acc);
        for src in rest {
            let Some(block) = src.get(range.clone()) else {
                return;
            };
            T::combine(block, acc, op);
        }
        if op == ReduceOp::Avg {
            T::average(acc, world);
        }
        T::store(acc, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn sums_in_rank_order_and_rounds_halves_once() {
        // 2048 + 1 + 1 in f16 would stay 2048 when rounded at every step
        // (f16's spacing there is 2); accumulated in f32 it is 2050.
        let a = [f16::from_f32(2048.0); 3];
        let b = [f16::from_f32(1.0); 3];
        let mut out = [f16::ZERO; 3];
        in_rank_order(&[&a[..], &b, &b], ReduceOp::Sum, 3, &mut out).unwrap();
        assert_eq!(out, [f16::from_f32(2050.0); 3]);
        in_rank_order(&[&a[..], &b, &b], ReduceOp::Avg, 3, &mut out).unwrap();
        assert_eq!(out, [f16::from_f32(2050.0 / 3.0); 3]);
        // Order matters in floating point: (1e8 + 1) - 1e8 is 0 in f32.
        let big = vec![1e8f32; BLOCK + 3];
        let one = vec![1f32; BLOCK + 3];
        let minus = vec![-1e8f32; BLOCK + 3];
        let mut sum = vec![0f32; BLOCK + 3];
        in_rank_order(&[&big[..], &one, &minus], ReduceOp::Sum, 3, &mut sum).unwrap();
        assert!(sum.iter().all(|&v| v == 0.0));
        in_rank_order(&[&big[..], &minus, &one], ReduceOp::Sum, 3, &mut sum).unwrap();
        assert!(sum.iter().all(|&v| v == 1.0));
        let short = in_rank_order(&[&big[..2]], ReduceOp::Sum, 1, &mut sum);
        assert!(
            matches!(short, Err(CommError::InvalidArgument(_))),
            "{short:?}"
        );
    }
}
