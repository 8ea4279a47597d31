//! The execution layer itself: barriers, warp intrinsics, positions, traps,
//! the float atomic, and the faults it must report.

use gradwire_kernels_host::selftest::{SelfTest, run};
use gradwire_kernels_host::{Error, Order};

fn failed(kernel: SelfTest, grid: (u32, u32), block: u32, out: &mut [u32]) -> String {
    match run(kernel, grid, block, Order::Forward, out) {
        Err(Error::Failed { message, .. }) => message,
        other => panic!("{kernel:?}: expected Error::Failed, got {other:?}"),
    }
}

#[test]
fn a_barrier_orders_shared_memory_in_both_orders() {
    for order in [Order::Forward, Order::Reverse] {
        for block in [1u32, 32, 33, 256, 1024] {
            let mut out = vec![0u32; 3];
            run(SelfTest::BlockSum, (3, 1), block, order, &mut out).expect("runs");
            let expected = block * (block + 1) / 2;
            assert_eq!(out, vec![expected; 3], "block {block}, {order:?}");
        }
    }
}

#[test]
fn a_missing_barrier_gives_a_wrong_sum_in_one_order() {
    // Forward, thread 0 sums before the others have written; reverse, after.
    let mut forward = vec![0u32; 2];
    run(
        SelfTest::MissingBarrier,
        (2, 1),
        256,
        Order::Forward,
        &mut forward,
    )
    .expect("runs");
    let mut reverse = vec![0u32; 2];
    run(
        SelfTest::MissingBarrier,
        (2, 1),
        256,
        Order::Reverse,
        &mut reverse,
    )
    .expect("runs");
    assert_ne!(forward, reverse);
    assert_eq!(reverse, vec![256 * 257 / 2; 2]);
}

#[test]
fn thread_and_block_indices_cover_the_grid() {
    let (gx, gy, block) = (3u32, 2u32, 64u32);
    let mut out = vec![u32::MAX; (gx * gy * block) as usize];
    run(
        SelfTest::Positions,
        (gx, gy),
        block,
        Order::Reverse,
        &mut out,
    )
    .expect("runs");
    for by in 0..gy {
        for bx in 0..gx {
            for t in 0..block {
                let i = ((by * gx + bx) * block + t) as usize;
                assert_eq!(out[i], t | (block << 8) | (bx << 16) | (by << 24));
            }
        }
    }
}

#[test]
fn warp_votes_follow_their_definitions() {
    for block in [32u32, 64, 256] {
        let mut out = vec![0u32; 2 * block as usize];
        run(SelfTest::Warp, (1, 1), block, Order::Forward, &mut out).expect("runs");
        for t in 0..block {
            let warp = t / 32 * 32;
            let ballot = (0..32)
                .filter(|l| (warp + l) % 3 == 0)
                .fold(0u32, |b, l| b | 1 << l);
            let peers = (0..32)
                .filter(|l| (warp + l) % 5 == t % 5)
                .fold(0u32, |b, l| b | 1 << l);
            assert_eq!(out[2 * t as usize], ballot, "ballot of thread {t}");
            assert_eq!(out[2 * t as usize + 1], peers, "match_any of thread {t}");
        }
    }
}

#[test]
fn a_float_atomic_add_flushes_subnormals_where_a_plain_add_keeps_them() {
    let mut out = vec![0u32; 2];
    run(SelfTest::FloatAtomic, (1, 1), 32, Order::Forward, &mut out).expect("runs");
    assert_eq!(out[0], 0, "red.global.add.f32 flushes to zero");
    assert_eq!(out[1], 0x30, "an IEEE add keeps the subnormal sum");
}

#[test]
fn a_barrier_after_exits_is_reported() {
    let message = failed(SelfTest::DivergentBarrier, (1, 1), 256, &mut [0; 256]);
    assert!(
        message.contains("__syncthreads reached after 128"),
        "{message}"
    );
}

#[test]
fn a_lane_missing_from_a_warp_vote_is_reported() {
    let message = failed(SelfTest::LaneExits, (1, 1), 64, &mut [0; 64]);
    assert!(
        message.contains("thread 5: exited before a warp intrinsic"),
        "{message}"
    );
}

#[test]
fn a_deadlock_is_reported() {
    let message = failed(SelfTest::Deadlock, (1, 1), 64, &mut [0; 64]);
    assert!(message.contains("deadlock"), "{message}");
}

#[test]
fn a_trap_names_its_block_and_thread() {
    let message = failed(SelfTest::Trap, (2, 1), 32, &mut [0; 32]);
    assert_eq!(message, "block (1, 0) thread 7: __trap");
}

#[test]
fn an_invalid_geometry_is_refused() {
    for (grid, block) in [((0, 1), 32), ((1, 0), 32), ((1, 1), 0), ((1, 1), 1025)] {
        let message = failed(SelfTest::BlockSum, grid, block, &mut [0; 4]);
        assert!(message.contains("invalid launch"), "{message}");
    }
}
