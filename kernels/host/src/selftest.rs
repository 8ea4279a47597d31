//! Kernels that test the execution layer itself (`cpp/selftest.cpp`), each
//! `(gw_u32* out, gw_u64 n)`: what it must run as CUDA does, and the faults
//! it must report.

use std::ffi::{c_int, c_void};

use crate::{Error, Order, RawLaunch, RawLauncher, run_raw};

/// A self-test kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelfTest {
    /// `out[block]` = the sum of `1..=blockDim.x`, through shared memory
    /// and a barrier.
    BlockSum,
    /// [`SelfTest::BlockSum`] without its barrier.
    MissingBarrier,
    /// Half the block exits, the rest waits at a barrier.
    DivergentBarrier,
    /// `out[2t]`, `out[2t + 1]` = the warp's ballot of `t % 3 == 0` and
    /// thread `t`'s `__match_any_sync` of `t % 5`.
    Warp,
    /// Lane 5 of each warp exits before a full-warp ballot.
    LaneExits,
    /// Half of each warp waits at a barrier, the other half at a ballot.
    Deadlock,
    /// Thread 7 of block 1 traps.
    Trap,
    /// `out[0]`, `out[1]` = the bits of a float `atomicAdd` and of a plain
    /// add of the same two subnormals.
    FloatAtomic,
    /// `out[i]` = thread `i`'s position (x, blockDim.x, block x, block y in
    /// bytes 0 to 3), `i` counting blocks row by row.
    Positions,
}

unsafe extern "C" {
    fn gw_host_launch_selftest_block_sum(l: *mut RawLaunch, a: *const *mut c_void) -> c_int;
    fn gw_host_launch_selftest_missing_barrier(l: *mut RawLaunch, a: *const *mut c_void) -> c_int;
    fn gw_host_launch_selftest_divergent_barrier(l: *mut RawLaunch, a: *const *mut c_void)
    -> c_int;
    fn gw_host_launch_selftest_warp(l: *mut RawLaunch, a: *const *mut c_void) -> c_int;
    fn gw_host_launch_selftest_lane_exits(l: *mut RawLaunch, a: *const *mut c_void) -> c_int;
    fn gw_host_launch_selftest_deadlock(l: *mut RawLaunch, a: *const *mut c_void) -> c_int;
    fn gw_host_launch_selftest_trap(l: *mut RawLaunch, a: *const *mut c_void) -> c_int;
    fn gw_host_launch_selftest_float_atomic(l: *mut RawLaunch, a: *const *mut c_void) -> c_int;
    fn gw_host_launch_selftest_positions(l: *mut RawLaunch, a: *const *mut c_void) -> c_int;
}

impl SelfTest {
    fn launcher(self) -> RawLauncher {
        match self {
            SelfTest::BlockSum => gw_host_launch_selftest_block_sum,
            SelfTest::MissingBarrier => gw_host_launch_selftest_missing_barrier,
            SelfTest::DivergentBarrier => gw_host_launch_selftest_divergent_barrier,
            SelfTest::Warp => gw_host_launch_selftest_warp,
            SelfTest::LaneExits => gw_host_launch_selftest_lane_exits,
            SelfTest::Deadlock => gw_host_launch_selftest_deadlock,
            SelfTest::Trap => gw_host_launch_selftest_trap,
            SelfTest::FloatAtomic => gw_host_launch_selftest_float_atomic,
            SelfTest::Positions => gw_host_launch_selftest_positions,
        }
    }
}

/// Runs `kernel` on `grid` blocks of `block` threads (at most 1024),
/// writing `out`.
pub fn run(
    kernel: SelfTest,
    grid: (u32, u32),
    block: u32,
    order: Order,
    out: &mut [u32],
) -> Result<(), Error> {
    let mut pointer: *mut c_void = out.as_mut_ptr().cast();
    let mut n: u64 = out.len() as u64;
    let argv: [*mut c_void; 2] = [
        (&mut pointer as *mut *mut c_void).cast(),
        (&mut n as *mut u64).cast(),
    ];
    // SAFETY: every self-test kernel is `(gw_u32* out, gw_u64 n)` and
    // touches at most `n` elements of `out`, live for the call.
    unsafe { run_raw(kernel.launcher(), grid, block, order, &argv) }.map_err(|message| {
        Error::Failed {
            kernel: "selftest",
            message,
        }
    })
}
