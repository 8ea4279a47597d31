//! Launch geometry and helpers shared by every kernel launcher.
//!
//! The kernels of gradwire-kernels come in two shapes: grid-stride loops
//! (`GW_FOR_EACH`, any grid works, 64-bit indices) and block algorithms
//! (block reductions, histograms, compaction) that require exactly
//! [`BLOCK`] threads per block and trap otherwise. Launchers build their
//! [`LaunchConfig`] here so those two rules live in one place.

use cudarc::driver::{DriverError, LaunchConfig};

use crate::error::{Error, Result};

/// Threads per block: `GW_BLOCK` in `kernels/cuda/gradwire.cuh`, which the
/// block algorithms check (`GW_REQUIRE_BLOCK`).
pub const BLOCK: u32 = 256;

/// The most blocks a grid-stride launch uses: enough to fill any current GPU
/// (a few thousand resident blocks), few enough that per-block partial
/// results stay small.
pub const MAX_GRID: u32 = 4096;

/// A grid-stride launch over `n` elements: [`BLOCK`] threads per block and
/// enough blocks to give each thread about one element, capped at
/// [`MAX_GRID`]. At least one block, so `n = 0` launches are well formed
/// (launchers skip them anyway).
pub fn grid_stride(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks_for(n), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The number of blocks [`grid_stride`] uses for `n` elements.
pub fn blocks_for(n: usize) -> u32 {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_GRID as usize);
    // In range by the clamp.
    u32::try_from(blocks).unwrap_or(MAX_GRID)
}

/// A launch of exactly `blocks` blocks of [`BLOCK`] threads (block
/// algorithms that index per-block outputs).
pub fn blocks(blocks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.max(1), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A driver error as gradwire-tensor's [`Error::Cuda`], naming the call.
pub fn driver_error(call: &str, e: DriverError) -> Error {
    Error::Cuda(format!("{call}: {e:?}"))
}

/// `n` as the `gw_u64` length argument every kernel takes.
pub fn len_arg(n: usize) -> Result<u64> {
    u64::try_from(n).map_err(|_| Error::ShapeOverflow)
}
