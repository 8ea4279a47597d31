//! Property tests of the in-process backend's collectives against f64
//! references: world sizes 1..=8, lengths 0, 1, primes and non-multiples of
//! the world size, every element type; results bitwise equal on every rank
//! and across runs; asynchronous forms equal to the blocking ones.

use gradwire_comm::{Communicator, ElemType, LocalComm, ReduceOp, chunk_range, local};
use half::{bf16, f16};
use proptest::prelude::*;

/// Lengths that exercise the chunking: empty, one element, primes (never a
/// multiple of the world size), and sizes around the reduction block (2048).
const LENGTHS: &[usize] = &[0, 1, 2, 3, 5, 7, 13, 31, 127, 257, 1031, 2053, 4099];

fn world_and_len() -> impl Strategy<Value = (usize, usize)> {
    (1usize..=8, prop::sample::select(LENGTHS))
}

/// Rank r's input: deterministic per (seed, rank), magnitudes spread over
/// several decades so that rounding matters.
fn input(seed: u64, rank: usize, len: usize) -> Vec<f64> {
    let mut state = seed ^ ((rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
            let scale = [1e-3, 1.0, 1e3][(state % 3) as usize];
            (unit * 2.0 - 1.0) * scale
        })
        .collect()
}

fn reference(inputs: &[Vec<f64>], op: ReduceOp) -> Vec<f64> {
    let len = inputs[0].len();
    (0..len)
        .map(|i| {
            let column = inputs.iter().map(|x| x[i]);
            match op {
                ReduceOp::Sum => column.sum(),
                ReduceOp::Avg => column.sum::<f64>() / inputs.len() as f64,
                ReduceOp::Max => column.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => column.fold(f64::INFINITY, f64::min),
            }
        })
        .collect()
}

/// The error bound of a sum of `w` terms accumulated in a precision with unit
/// roundoff `u_acc`, then rounded once to a precision with unit roundoff
/// `u_out`: (w - 1) u_acc sum|x| + u_out |result| (+ the smallest normal, for
/// results that land in the subnormal range).
fn bound(inputs: &[Vec<f64>], i: usize, result: f64, u_acc: f64, u_out: f64, tiny: f64) -> f64 {
    let steps = inputs.len() as f64 - 1.0;
    let abs_sum: f64 = inputs.iter().map(|x| x[i].abs()).sum();
    // gamma_{w-1} of Higham's bound for recursive summation.
    let gamma = steps * u_acc / (1.0 - steps * u_acc);
    gamma * abs_sum + u_out * result + tiny
}

/// How a type is converted from and to f64 and how precisely it stores a
/// result: unit roundoff `u_out`, and `tiny` for results in its subnormal range.
struct Precision<T> {
    from: fn(f64) -> T,
    to: fn(T) -> f64,
    u_out: f64,
    tiny: f64,
}

/// Runs an all-reduce of `T` and checks every rank's result against the f64
/// reference within the bound, and all ranks bitwise equal. Returns rank 0's
/// result for the determinism check.
fn check_all_reduce<T>(world: usize, len: usize, seed: u64, op: ReduceOp, p: Precision<T>) -> Vec<T>
where
    T: gradwire_comm::Element,
{
    let Precision {
        from,
        to,
        u_out,
        tiny,
    } = p;
    let inputs: Vec<Vec<f64>> = (0..world).map(|r| input(seed, r, len)).collect();
    // The reference sees the inputs as the ranks hold them (already rounded to T).
    let held: Vec<Vec<f64>> = inputs
        .iter()
        .map(|x| x.iter().map(|&v| to(from(v))).collect())
        .collect();
    let expected = reference(&held, op);
    let results = local::run(world, |comm| {
        let mut buf: Vec<T> = held[comm.rank()].iter().map(|&v| from(v)).collect();
        comm.all_reduce(&mut buf, op).map(|()| buf)
    })
    .expect("run");
    let results: Vec<Vec<T>> = results
        .into_iter()
        .map(|r| r.expect("all_reduce"))
        .collect();
    for (r, got) in results.iter().enumerate() {
        assert_eq!(got.len(), len);
        assert!(
            bytemuck::cast_slice::<T, u8>(got) == bytemuck::cast_slice::<T, u8>(&results[0]),
            "rank {r} differs from rank 0"
        );
    }
    // f32 accumulation for every float type but f64.
    let u_acc = if T::TYPE == ElemType::F64 {
        f64::EPSILON / 2.0
    } else {
        f32::EPSILON as f64 / 2.0
    };
    for (i, (&want, &got)) in expected.iter().zip(&results[0]).enumerate() {
        let got = to(got);
        let err = (got - want).abs();
        let allowed = match op {
            ReduceOp::Max | ReduceOp::Min => 0.0,
            _ => bound(&held, i, want.abs().max(got.abs()), u_acc, u_out, tiny),
        };
        assert!(
            err <= allowed,
            "{op} of {} at {i} (world {world}, len {len}): got {got}, want {want}, error {err} > {allowed}",
            T::TYPE
        );
    }
    results.into_iter().next().unwrap_or_default()
}

fn op_strategy() -> impl Strategy<Value = ReduceOp> {
    prop::sample::select(ReduceOp::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn all_reduce_f32_matches_f64_reference((world, len) in world_and_len(), seed: u64, op in op_strategy()) {
        let u = f32::EPSILON as f64 / 2.0;
        let tiny = f32::MIN_POSITIVE as f64;
        let first = check_all_reduce(world, len, seed, op, Precision { from: |v| v as f32, to: f64::from, u_out: u, tiny });
        // Deterministic: a second run gives the same bits.
        let second = check_all_reduce(world, len, seed, op, Precision { from: |v| v as f32, to: f64::from, u_out: u, tiny });
        prop_assert_eq!(bytemuck::cast_slice::<f32, u32>(&first), bytemuck::cast_slice::<f32, u32>(&second));
    }

    #[test]
    fn all_reduce_f64_matches_reference((world, len) in world_and_len(), seed: u64, op in op_strategy()) {
        let u = f64::EPSILON / 2.0;
        check_all_reduce(world, len, seed, op, Precision { from: |v| v, to: |v| v, u_out: u, tiny: f64::MIN_POSITIVE });
    }

    #[test]
    fn all_reduce_f16_accumulates_in_f32((world, len) in world_and_len(), seed: u64, op in op_strategy()) {
        // One rounding to f16 at the end (unit roundoff 2^-11), none on the way.
        let u = 2f64.powi(-11);
        let tiny = 2f64.powi(-24); // f16's smallest subnormal
        let first = check_all_reduce(world, len, seed, op, Precision { from: f16::from_f64, to: f64::from, u_out: u, tiny });
        let second = check_all_reduce(world, len, seed, op, Precision { from: f16::from_f64, to: f64::from, u_out: u, tiny });
        prop_assert_eq!(bytemuck::cast_slice::<f16, u16>(&first), bytemuck::cast_slice::<f16, u16>(&second));
    }

    #[test]
    fn all_reduce_bf16_accumulates_in_f32((world, len) in world_and_len(), seed: u64, op in op_strategy()) {
        let u = 2f64.powi(-8);
        let tiny = f32::MIN_POSITIVE as f64;
        check_all_reduce(world, len, seed, op, Precision { from: bf16::from_f64, to: f64::from, u_out: u, tiny });
    }

    #[test]
    fn all_reduce_integers_are_exact((world, len) in world_and_len(), seed: u64) {
        let results = local::run(world, |comm| {
            let mine: Vec<i64> = input(seed, comm.rank(), len).iter().map(|v| (v * 1e6) as i64).collect();
            let mut sum = mine.clone();
            let mut max = mine.clone();
            let mut bytes: Vec<u8> = mine.iter().map(|&v| v as u8).collect();
            comm.all_reduce(&mut sum, ReduceOp::Sum)?;
            comm.all_reduce(&mut max, ReduceOp::Max)?;
            comm.all_reduce(&mut bytes, ReduceOp::Sum)?;
            Ok::<_, gradwire_comm::CommError>((sum, max, bytes))
        }).unwrap();
        let inputs: Vec<Vec<i64>> = (0..world)
            .map(|r| input(seed, r, len).iter().map(|v| (v * 1e6) as i64).collect())
            .collect();
        for result in results {
            let (sum, max, bytes) = result.unwrap();
            for i in 0..len {
                prop_assert_eq!(sum[i], inputs.iter().map(|x| x[i]).sum::<i64>());
                prop_assert_eq!(max[i], inputs.iter().map(|x| x[i]).max().unwrap());
                prop_assert_eq!(bytes[i], inputs.iter().fold(0u8, |a, x| a.wrapping_add(x[i] as u8)));
            }
        }
    }

    #[test]
    fn broadcast_copies_the_root((world, len) in world_and_len(), seed: u64, root_pick: usize) {
        let root = root_pick % world;
        let results = local::run(world, |comm| {
            let mut buf: Vec<f32> = input(seed, comm.rank(), len).iter().map(|&v| v as f32).collect();
            comm.broadcast(&mut buf, root).map(|()| buf)
        }).unwrap();
        let want: Vec<f32> = input(seed, root, len).iter().map(|&v| v as f32).collect();
        for r in results {
            prop_assert_eq!(r.unwrap(), want.clone());
        }
    }

    #[test]
    fn all_gather_concatenates_in_rank_order((world, len) in world_and_len(), seed: u64) {
        let results = local::run(world, |comm| {
            let send: Vec<f64> = input(seed, comm.rank(), len);
            let mut recv = vec![0.0; len * world];
            comm.all_gather(&send, &mut recv).map(|()| recv)
        }).unwrap();
        let want: Vec<f64> = (0..world).flat_map(|r| input(seed, r, len)).collect();
        for r in results {
            prop_assert_eq!(r.unwrap(), want.clone());
        }
    }

    #[test]
    fn all_gather_varied_keeps_each_ranks_length(world in 1usize..=8, lens in prop::collection::vec(prop::sample::select(LENGTHS), 8), seed: u64) {
        let results = local::run(world, |comm| {
            let send: Vec<u32> = input(seed, comm.rank(), lens[comm.rank()]).iter().map(|v| v.to_bits() as u32).collect();
            comm.all_gather_varied(&send)
        }).unwrap();
        for r in results {
            let gathered = r.unwrap();
            prop_assert_eq!(gathered.world_size(), world);
            prop_assert_eq!(gathered.counts(), lens[..world].to_vec());
            for (src, &len) in lens.iter().enumerate().take(world) {
                let want: Vec<u32> = input(seed, src, len).iter().map(|v| v.to_bits() as u32).collect();
                prop_assert_eq!(gathered.part(src), &want[..]);
            }
        }
    }

    #[test]
    fn reduce_scatter_is_a_chunk_of_all_reduce((world, len) in world_and_len(), seed: u64, op in op_strategy()) {
        let results = local::run(world, |comm| {
            let send: Vec<f32> = input(seed, comm.rank(), len).iter().map(|&v| v as f32).collect();
            let mut full = send.clone();
            comm.all_reduce(&mut full, op)?;
            let mut mine = vec![0f32; chunk_range(len, world, comm.rank()).len()];
            comm.reduce_scatter(&send, &mut mine, op)?;
            Ok::<_, gradwire_comm::CommError>((full, mine))
        }).unwrap();
        for (rank, r) in results.into_iter().enumerate() {
            let (full, mine) = r.unwrap();
            let chunk = &full[chunk_range(len, world, rank)];
            prop_assert_eq!(bytemuck::cast_slice::<f32, u32>(chunk), bytemuck::cast_slice::<f32, u32>(&mine));
        }
    }

    #[test]
    fn send_recv_ring_delivers_in_order((world, len) in world_and_len(), seed: u64) {
        let results = local::run(world, |comm| {
            let rank = comm.rank();
            let next = (rank + 1) % world;
            let prev = (rank + world - 1) % world;
            // Two messages each way round the ring: order is kept per pair.
            let first: Vec<f32> = input(seed, rank, len).iter().map(|&v| v as f32).collect();
            let second: Vec<f32> = first.iter().map(|v| v * 2.0).collect();
            comm.send(&first, next)?;
            comm.send(&second, next)?;
            let mut a = vec![0f32; len];
            let mut b = vec![0f32; len];
            comm.recv(&mut a, prev)?;
            comm.recv(&mut b, prev)?;
            // And a sendrecv shift the other way.
            let mut c = vec![0f32; len];
            comm.sendrecv(&first, prev, &mut c, next)?;
            Ok::<_, gradwire_comm::CommError>((a, b, c))
        }).unwrap();
        for (rank, r) in results.into_iter().enumerate() {
            let (a, b, c) = r.unwrap();
            let prev = (rank + world - 1) % world;
            let next = (rank + 1) % world;
            let from_prev: Vec<f32> = input(seed, prev, len).iter().map(|&v| v as f32).collect();
            let from_next: Vec<f32> = input(seed, next, len).iter().map(|&v| v as f32).collect();
            prop_assert_eq!(&a, &from_prev);
            prop_assert_eq!(b, from_prev.iter().map(|v| v * 2.0).collect::<Vec<_>>());
            prop_assert_eq!(c, from_next);
        }
    }

    #[test]
    fn split_groups_reduce_only_their_members(world in 1usize..=8, colors in 1u32..=3, seed: u64) {
        let results = local::run(world, |comm| {
            let rank = comm.rank();
            // Ranks with color None take no part; keys reverse the order.
            let color = if rank % 4 == 3 { None } else { Some(rank as u32 % colors) };
            let sub = comm.split(color, -(rank as i64))?;
            let Some(sub) = sub else {
                comm.barrier()?;
                return Ok(None);
            };
            let mut v = vec![input(seed, rank, 1)[0]];
            sub.all_reduce(&mut v, ReduceOp::Sum)?;
            // The parent still works after the split, and is not disturbed.
            comm.barrier()?;
            Ok::<_, gradwire_comm::CommError>(Some((sub.rank(), sub.world_size(), v[0])))
        }).unwrap();
        for (rank, r) in results.into_iter().enumerate() {
            let got = r.unwrap();
            if rank % 4 == 3 {
                prop_assert!(got.is_none());
                continue;
            }
            let color = rank as u32 % colors;
            let mut members: Vec<usize> = (0..world).filter(|&q| q % 4 != 3 && q as u32 % colors == color).collect();
            members.sort_by_key(|&q| std::cmp::Reverse(q));
            let (sub_rank, sub_size, sum) = got.unwrap();
            prop_assert_eq!(sub_size, members.len());
            prop_assert_eq!(members[sub_rank], rank);
            // Summed in new-rank order.
            let want = members.iter().fold(0.0, |a, &q| a + input(seed, q, 1)[0]);
            prop_assert_eq!(sum.to_bits(), want.to_bits());
        }
    }

    #[test]
    fn async_forms_equal_blocking_forms((world, len) in world_and_len(), seed: u64) {
        let results = local::run(world, |comm| {
            let mine: Vec<f32> = input(seed, comm.rank(), len).iter().map(|&v| v as f32).collect();
            // Several in flight at once, overlapping blocking calls on the parent.
            let sum = comm.all_reduce_async(mine.clone(), ReduceOp::Sum)?;
            let gathered = comm.all_gather_async(mine.clone())?;
            let varied = comm.all_gather_varied_async(mine[..comm.rank().min(len)].to_vec())?;
            let mut blocking_sum = mine.clone();
            comm.all_reduce(&mut blocking_sum, ReduceOp::Sum)?;
            let mut blocking_gather = vec![0f32; len * world];
            comm.all_gather(&mine, &mut blocking_gather)?;
            let blocking_varied = comm.all_gather_varied(&mine[..comm.rank().min(len)])?;
            Ok::<_, gradwire_comm::CommError>((
                sum.wait()? == blocking_sum,
                gathered.wait()? == blocking_gather,
                varied.wait()? == blocking_varied,
            ))
        }).unwrap();
        for r in results {
            prop_assert_eq!(r.unwrap(), (true, true, true));
        }
    }
}

#[test]
fn tensors_of_every_dtype_all_reduce() {
    use gradwire_tensor::{DType, Tensor};
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let results = local::run(3, |comm| {
            let values: Vec<f32> = (0..7).map(|i| (i + comm.rank()) as f32).collect();
            let mut t = Tensor::from_f32(&values, [7], dtype)?;
            comm.all_reduce_tensor(&mut t, ReduceOp::Sum)?;
            let pending = comm.all_reduce_tensor_async(t.clone(), ReduceOp::Max)?;
            let max = pending.wait()?;
            Ok::<_, gradwire_comm::CommError>((t.to_f32_vec()?, max.to_f32_vec()?))
        })
        .unwrap();
        for r in results {
            let (sum, max) = r.unwrap();
            let want: Vec<f32> = (0..7).map(|i| (3 * i + 3) as f32).collect();
            assert_eq!(sum, want, "{dtype}");
            assert_eq!(max, want, "{dtype}");
        }
    }
}

#[test]
fn a_lazily_zeroed_gradient_contributes_zeros() {
    use gradwire_tensor::Tensor;
    let results = local::run(4, |comm| {
        let mut grad = Tensor::from_vec(vec![100f32; 5], [5])?;
        if comm.rank() % 2 == 0 {
            grad.zero_(); // stale 100s stay in memory; the flag says zeros
        } else {
            grad.as_mut_slice::<f32>()?.fill(comm.rank() as f32);
        }
        comm.all_reduce_tensor(&mut grad, ReduceOp::Sum)?;
        Ok::<_, gradwire_comm::CommError>((grad.is_zeroed(), grad.to_vec::<f32>()?))
    })
    .unwrap();
    for r in results {
        let (zeroed, values) = r.unwrap();
        assert!(
            !zeroed,
            "the all-reduce wrote the tensor, so it is no longer zeroed"
        );
        assert_eq!(values, vec![4.0; 5]); // 1 + 3
    }
}

#[test]
fn the_world_shares_nothing_with_a_second_world() {
    let a = LocalComm::create(2).unwrap();
    let b = LocalComm::create(2).unwrap();
    let out = std::thread::scope(|s| {
        let handles: Vec<_> = a
            .into_iter()
            .chain(b)
            .enumerate()
            .map(|(i, comm)| {
                s.spawn(move || {
                    let mut v = vec![i as f64];
                    comm.all_reduce(&mut v, ReduceOp::Sum).map(|()| v[0])
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect::<Vec<_>>()
    });
    assert_eq!(out, vec![1.0, 1.0, 5.0, 5.0]);
}

/// The asynchronous queue takes any number of jobs, like MPI's nonblocking
/// calls: even ranks queue 3000 collective jobs and then make a blocking
/// call on the parent communicator, odd ranks make that call first and
/// queue afterwards (a valid order: they are different communicators). A
/// bounded queue would leave an even rank blocked in `run_async` (its lane
/// waiting for an odd rank's jobs) while the odd rank waits in the barrier.
#[test]
fn thousands_of_queued_jobs_before_a_blocking_call_do_not_deadlock() {
    const JOBS: usize = 3000;
    let out = gradwire_comm::local::run(3, |comm| {
        let queue_all = || {
            (0..JOBS)
                .map(|i| {
                    comm.run_async(move |lane| {
                        let mut x = [i as u32];
                        lane.all_reduce(&mut x, gradwire_comm::ReduceOp::Sum)?;
                        Ok(x[0])
                    })
                })
                .collect::<gradwire_comm::Result<Vec<_>>>()
        };
        let handles = if comm.rank() % 2 == 0 {
            let handles = queue_all()?;
            comm.barrier()?;
            handles
        } else {
            comm.barrier()?;
            queue_all()?
        };
        let sums: Vec<u32> = handles
            .into_iter()
            .map(gradwire_comm::Pending::wait)
            .collect::<gradwire_comm::Result<_>>()?;
        Ok::<_, gradwire_comm::CommError>(sums)
    })
    .unwrap();
    for sums in out {
        let sums = sums.unwrap();
        assert_eq!(sums.len(), JOBS);
        assert!(sums.iter().enumerate().all(|(i, &s)| s == 3 * i as u32));
    }
}
