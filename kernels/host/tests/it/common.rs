//! Shared by the kernel suites: launching in both thread orders, the lengths
//! the device suites use, inputs with every class of float.

use gradwire_kernels::{Blocks, Kernel};
use gradwire_kernels_host::{Arg, Error, Order, launch};

/// Lengths the device suites use: empty, one, primes, around a block and a
/// 4-wide vector, and several blocks.
pub const LENGTHS: &[usize] = &[0, 1, 2, 3, 5, 7, 31, 255, 256, 257, 1021, 4099];

/// Runs `kernel` on `blocks` in both thread orders on fresh copies of the
/// memory `args` builds, checks both leave every buffer bitwise equal, and
/// returns the forward run's buffers.
pub fn run_both<S: Clone>(
    kernel: &Kernel,
    blocks: Blocks,
    state: &S,
    args: impl Fn(&mut S) -> Vec<Arg<'_>>,
) -> Result<S, Error>
where
    S: PartialEq + std::fmt::Debug,
{
    let mut forward = state.clone();
    launch(kernel, blocks, Order::Forward, &mut args(&mut forward))?;
    let mut reverse = state.clone();
    launch(kernel, blocks, Order::Reverse, &mut args(&mut reverse))?;
    assert_eq!(
        forward,
        reverse,
        "{}: the two thread orders disagree",
        kernel.name()
    );
    Ok(forward)
}
