//! `kernels/cuda/comm.cu` on the CPU against gradwire-comm's rank-ordered
//! reduction (the block kernels LocalComm, MpiComm and NcclComm's
//! `RankOrdered` host path share).
//!
//! Each test runs NcclComm's device all-reduce in rank order
//! (`all_reduce_device_in_rank_order`) rank by rank: rank `me` stages its
//! `chunk_range` of every rank's buffer back to back (an aligned region of
//! the scratch), and `reduce_chunks_<dt>` runs as gradwire-tensor's
//! `reduce_chunks_bytes` launches it (`Blocks::Over(n)`, no launch when
//! `n = 0`), writing into rank `me`'s block of the gather region: a window
//! `me x` (the first chunk's length) elements past an aligned address, so
//! misaligned for most ranks. The gathered chunks must be bitwise the
//! all-reduce LocalComm gives for the same buffers, for sum, avg, max and
//! min, world sizes 1 to 8, f32, f16 and bf16, every length of [`LENGTHS`],
//! inputs of every class (subnormals, ±0, ties, huge and tiny magnitudes,
//! infinities, NaNs with payloads). Max and min move their NaN, so its
//! payload is compared too; a NaN that a sum or average creates has the
//! hardware's payload (a GPU's is canonical), so those are compared up to
//! NaN payloads ([`nan_canonical`]).

use gradwire_comm::{Communicator, ReduceOp, chunk_range, local};
use gradwire_kernels::{Blocks, Kernel, comm as k};
use gradwire_kernels_host::{Arg, Element};
use gradwire_tensor::WithDType;
use half::{bf16, f16};

use crate::common::{LENGTHS, bits, floats, nan_canonical, run_both};

/// The operators with their codes in `comm.cu` (gradwire-kernels'
/// `comm::OP_*`, which gradwire-tensor's `ChunkOp` passes).
const OPS: [(ReduceOp, u32); 4] = [
    (ReduceOp::Sum, k::OP_SUM),
    (ReduceOp::Avg, k::OP_AVG),
    (ReduceOp::Max, k::OP_MAX),
    (ReduceOp::Min, k::OP_MIN),
];

/// Rank `rank`'s buffer of `len` elements in a world of `world`, for `op`.
fn buffer<T: WithDType>(len: usize, world: usize, rank: usize, op: u32) -> Vec<T> {
    let seed = ((len * 8 + world) * 8 + rank) as u64 * 4 + u64::from(op);
    floats(len, seed, true)
        .into_iter()
        .map(T::from_f32)
        .collect()
}

/// What LocalComm's all-reduce gives for every `(op, len)` of a world of
/// `world` ranks, in `OPS` x `LENGTHS` order.
fn local_all_reduce<T>(world: usize) -> Vec<Vec<T>>
where
    T: WithDType + gradwire_comm::Element,
{
    let per_rank = local::run(world, |comm| {
        let rank = comm.rank();
        let mut results = Vec::new();
        for &(op, code) in &OPS {
            for &len in LENGTHS {
                let mut buf = buffer::<T>(len, world, rank, code);
                comm.all_reduce(&mut buf, op)
                    .unwrap_or_else(|e| panic!("LocalComm all_reduce {op:?} len {len}: {e}"));
                results.push(buf);
            }
        }
        results
    })
    .unwrap_or_else(|e| panic!("LocalComm world {world}: {e}"));
    per_rank.into_iter().next().expect("one rank at least")
}

/// The device all-reduce of the ranks' `buffers` in rank order with
/// `kernel`, rank by rank, gathered.
fn device_all_reduce<T>(kernel: &Kernel, buffers: &[Vec<T>], code: u32, case: &str) -> Vec<T>
where
    T: WithDType + Element,
{
    let world = buffers.len();
    let len = buffers[0].len();
    // The gather region, in blocks as long as the first (largest) chunk;
    // poisoned, so that an element the kernel misses shows.
    let block = chunk_range(len, world, 0).len();
    let mut gathered = vec![T::from_f32(f32::NAN); world * block];
    for me in 0..world {
        let mine = chunk_range(len, world, me);
        let n = mine.len();
        if n == 0 {
            // reduce_chunks_bytes queues nothing for an empty chunk.
            continue;
        }
        let stage: Vec<T> = buffers
            .iter()
            .flat_map(|b| b[mine.clone()].iter().copied())
            .collect();
        let out = vec![T::from_f32(f32::NAN); n];
        let at = me * block;
        let (out, _) = run_both(kernel, Blocks::Over(n), &(out, stage), |(out, stage)| {
            vec![
                Arg::write_at(out, at),
                Arg::read(stage),
                Arg::len(n),
                Arg::value(world as u32),
                Arg::value(code),
            ]
        })
        .unwrap_or_else(|e| panic!("{case}, rank {me}: {e}"));
        gathered[at..at + n].copy_from_slice(&out);
    }
    (0..world)
        .flat_map(|q| {
            let at = q * block;
            gathered[at..at + chunk_range(len, world, q).len()].to_vec()
        })
        .collect()
}

/// Every operator, world size and length of one dtype.
fn check_dtype<T>(kernel: &Kernel)
where
    T: WithDType + Element + gradwire_comm::Element,
{
    for world in 1..=8 {
        let expected = local_all_reduce::<T>(world);
        let mut cases = expected.iter();
        for &(op, code) in &OPS {
            for &len in LENGTHS {
                let want = cases.next().expect("a result per case");
                let buffers: Vec<Vec<T>> = (0..world)
                    .map(|rank| buffer::<T>(len, world, rank, code))
                    .collect();
                let case = format!("{} {op:?} world {world} len {len}", kernel.name());
                let got = device_all_reduce(kernel, &buffers, code, &case);
                if matches!(op, ReduceOp::Max | ReduceOp::Min) {
                    assert!(
                        bits(&got) == bits(want),
                        "{case}: the kernel gives\n{got:?}\nLocalComm\n{want:?}"
                    );
                } else {
                    assert!(
                        nan_canonical(&got) == nan_canonical(want),
                        "{case}: the kernel gives\n{got:?}\nLocalComm\n{want:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn reduce_chunks_f32_is_bitwise_localcomms_all_reduce() {
    check_dtype::<f32>(&k::REDUCE_CHUNKS_F32);
}

#[test]
fn reduce_chunks_f16_is_bitwise_localcomms_all_reduce() {
    check_dtype::<f16>(&k::REDUCE_CHUNKS_F16);
}

#[test]
fn reduce_chunks_bf16_is_bitwise_localcomms_all_reduce() {
    check_dtype::<bf16>(&k::REDUCE_CHUNKS_BF16);
}
