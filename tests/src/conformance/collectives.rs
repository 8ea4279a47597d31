//! The cases of the collectives themselves: every operation over every
//! length, element type and op, against the f64 references and LocalComm.

use super::reference::{
    Float, bound, bytes_of, check_within_library_bound, input, library_bound, local_all_reduce,
    reference, same_on_every_rank,
};
use super::{CaseError, Checks};
use gradwire_comm::{Communicator, ReduceOp, chunk_range};
use gradwire_tensor::Tensor;
use half::{bf16, f16};

/// Lengths every collective is tried with: empty, one, primes (never a
/// multiple of the world size), and sizes around the reduction block (2048).
pub const LENGTHS: &[usize] = &[0, 1, 2, 3, 5, 7, 13, 31, 127, 1031, 2053, 4099];

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

pub(super) fn all_reduce_floats<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
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

pub(super) fn all_reduce_integers<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
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

pub(super) fn broadcast<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
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

pub(super) fn all_gather<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
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

pub(super) fn reduce_scatter<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
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

pub(super) fn point_to_point<C: Communicator>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
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

pub(super) fn split<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
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

pub(super) fn async_forms<C: Communicator>(comm: &C, checks: &mut Checks) -> Result<(), CaseError> {
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
