//! The fabric's unit tests: NCCL's rules as the host transport enforces
//! them (joins and splits in progress until every rank arrives, a first
//! transfer until its peer asks too, a self-send with its receive in the
//! group, one order of collectives on every rank), and data moved through
//! both of its copy paths between rank threads.

use super::*;

fn is_invalid_usage(r: &Result<()>) -> bool {
    matches!(
        r,
        Err(CommError::Nccl {
            code: INVALID_USAGE,
            ..
        })
    )
}

#[test]
fn a_join_is_in_progress_until_every_rank_joined_once_inside_the_world() {
    let id = u64::MAX - 1;
    let outside = Fabric::join(id + 1, 2, 2).map(|_| ());
    assert!(is_invalid_usage(&outside), "{outside:?}");
    let fabric = Fabric::join(id, 2, 0).expect("rank 0 joins, at once");
    assert_eq!(
        fabric.progress(0).ok(),
        Some(false),
        "rank 1 has not joined"
    );
    let twice = Fabric::join(id, 2, 0).map(|_| ());
    assert!(is_invalid_usage(&twice), "{twice:?}");
    let other = Fabric::join(id, 2, 1).expect("rank 1 joins");
    assert!(Arc::ptr_eq(&fabric, &other));
    assert_eq!(fabric.progress(0).ok(), Some(true));
    assert_eq!(fabric.progress(1).ok(), Some(true));
}

fn joined(world: usize) -> Arc<Fabric> {
    let fabric = Fabric::new(world);
    lock(&fabric.state).joined = (0..world).collect();
    fabric
}

#[test]
fn a_first_transfer_is_in_progress_until_the_peer_asks_too() {
    let fabric = joined(3);
    let to = |peer| Transfer {
        peer,
        ptr: 0,
        bytes: 4,
    };
    fabric.issue_group(0, &[to(1)], &[]).expect("issued");
    assert_eq!(fabric.progress(0).ok(), Some(false));
    assert_eq!(fabric.progress(2).ok(), Some(true), "rank 2 asked nothing");
    fabric.issue_group(1, &[], &[to(0)]).expect("issued");
    assert_eq!(fabric.progress(0).ok(), Some(true));
    assert_eq!(fabric.progress(1).ok(), Some(true));
    // Connected: a later transfer of the pair needs no answer.
    fabric.issue_group(0, &[to(1)], &[]).expect("issued");
    assert_eq!(fabric.progress(0).ok(), Some(true));
}

#[test]
fn a_split_is_in_progress_until_every_rank_split() {
    let fabric = joined(3);
    let seq = fabric.split(2, Some(7), 0).expect("registered");
    assert!(fabric.split_result(seq, 2).is_none());
    assert_eq!(fabric.progress(2).ok(), Some(false));
    assert_eq!(fabric.split(0, None, 0).expect("registered"), seq);
    assert_eq!(fabric.split(1, Some(7), -1).expect("registered"), seq);
    assert_eq!(fabric.progress(2).ok(), Some(true));
    // Rank 1's key orders it first.
    let (made, new_rank) = fabric.split_result(seq, 2).expect("made");
    assert_eq!((made.world(), new_rank), (2, 1));
    let (also, first) = fabric.split_result(seq, 1).expect("made");
    assert!(Arc::ptr_eq(&made, &also));
    assert_eq!(first, 0);
    assert!(
        fabric.split_result(seq, 0).is_none(),
        "no color, no communicator"
    );
}

#[test]
fn a_send_to_self_needs_its_receive_in_the_group() {
    let fabric = Fabric::new(2);
    let to_self = Transfer {
        peer: 0,
        ptr: 0,
        bytes: 4,
    };
    let alone = fabric.issue_group(0, &[to_self], &[]);
    assert!(is_invalid_usage(&alone), "{alone:?}");
    fabric
        .issue_group(0, &[to_self], &[to_self])
        .expect("paired in the group");
}

#[test]
fn differing_collectives_break_the_communicator_on_every_rank() {
    let fabric = Fabric::new(2);
    let native = Native {
        elem: ElemType::F32,
        op: ReduceOp::Sum,
    };
    let mut buffers = [[1f32; 4], [2f32; 4]];
    let [a, b] = &mut buffers;
    let (a, b) = (
        a.as_mut_ptr().expose_provenance() as u64,
        b.as_mut_ptr().expose_provenance() as u64,
    );
    let (r0, r1) = std::thread::scope(|scope| {
        let r0 = scope.spawn(|| {
            #[allow(unsafe_code)]
            // SAFETY: 4 f32 at `a`, alive for the scope.
            unsafe {
                fabric.collective(0, Collective::AllReduce { count: 4, native }, a, a)
            }
        });
        #[allow(unsafe_code)]
        // SAFETY: 4 f32 at `b`, alive for the scope.
        let r1 = unsafe { fabric.collective(1, Collective::AllReduce { count: 3, native }, b, b) };
        (r0.join().expect("rank 0"), r1)
    });
    assert!(is_invalid_usage(&r0), "{r0:?}");
    assert!(is_invalid_usage(&r1), "{r1:?}");
    assert!(is_invalid_usage(&fabric.async_error()));
}

/// Both of the fabric's copy paths move data between rank threads at the
/// addresses the ranks posted: a collective (an all-reduce, its result
/// copied to every rank, a broadcast from the last rank) and a group of
/// sends and receives around a ring (each send copied into its peer's
/// receive by whichever rank matched them). `cargo xtask miri` runs it,
/// where an address that outlived its borrow would be an error.
#[test]
fn data_moves_through_both_copy_paths_between_rank_threads() {
    const LEN: usize = 5;
    let world = 3;
    let fabric = joined(world);
    let native = Native {
        elem: ElemType::F32,
        op: ReduceOp::Sum,
    };
    let input = |rank: usize| -> [f32; LEN] { std::array::from_fn(|i| (10 * rank + i) as f32) };
    let mut inputs: Vec<[f32; LEN]> = (0..world).map(input).collect();
    let mut sums = vec![[0f32; LEN]; world];
    let mut broadcast = vec![[-1f32; LEN]; world];
    let mut received = vec![[0f32; LEN]; world];
    let address = |v: &mut [f32; LEN]| v.as_mut_ptr().expose_provenance() as u64;
    std::thread::scope(|scope| {
        let per_rank = inputs
            .iter_mut()
            .zip(&mut sums)
            .zip(&mut broadcast)
            .zip(&mut received);
        let ranks: Vec<_> = per_rank
            .enumerate()
            .map(|(rank, (((input, sum), broadcast), received))| {
                let fabric = &fabric;
                scope.spawn(move || {
                    let (send, sum, broadcast, received) = (
                        address(input),
                        address(sum),
                        address(broadcast),
                        address(received),
                    );
                    let all_reduce = Collective::AllReduce { count: LEN, native };
                    let from_last = Collective::Broadcast {
                        bytes: 4 * LEN,
                        root: world - 1,
                    };
                    let to = Transfer {
                        peer: (rank + 1) % world,
                        ptr: send,
                        bytes: 4 * LEN,
                    };
                    let from = Transfer {
                        peer: (rank + world - 1) % world,
                        ptr: received,
                        bytes: 4 * LEN,
                    };
                    #[allow(unsafe_code)]
                    // SAFETY: LEN f32 at every address, this thread's own
                    // buffers, alive for the scope and touched by nothing else
                    // until the calls return.
                    unsafe {
                        fabric.collective(rank, all_reduce, send, sum)?;
                        fabric.collective(rank, from_last, send, broadcast)?;
                        fabric.group(rank, &[to], &[from])
                    }
                })
            })
            .collect();
        for (rank, handle) in ranks.into_iter().enumerate() {
            let done = handle
                .join()
                .unwrap_or_else(|_| panic!("rank {rank} panicked"));
            done.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        }
    });
    let total: [f32; LEN] = std::array::from_fn(|i| (0..world).map(|r| input(r)[i]).sum());
    for rank in 0..world {
        assert_eq!(inputs[rank], input(rank), "rank {rank}'s input unchanged");
        assert_eq!(sums[rank], total, "rank {rank}'s sum");
        assert_eq!(broadcast[rank], input(world - 1), "rank {rank}'s broadcast");
        assert_eq!(
            received[rank],
            input((rank + world - 1) % world),
            "rank {rank} received its left neighbour's input"
        );
    }
}
