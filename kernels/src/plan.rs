//! Launch plans: the grid and block a kernel runs on, computed from the
//! sizes of its work.
//!
//! One plan per kernel, shared by gradwire's CUDA launchers and by the CPU
//! execution of the kernels in gradwire-kernels-host's tests, so the grids
//! those tests run are the grids the GPU runs.

/// Threads per block of every launch: `GW_BLOCK` in
/// `kernels/cuda/gradwire.cuh`, which the block algorithms check
/// (`GW_REQUIRE_BLOCK`).
pub const BLOCK: u32 = 256;

/// The most blocks a grid-stride launch uses: enough to fill any current GPU
/// (a few thousand resident blocks), few enough that per-block partial
/// results stay small.
pub const MAX_GRID: u32 = 4096;

/// The number of blocks a grid-stride launch over `n` elements uses: about
/// one element per thread, at least one block, at most [`MAX_GRID`].
pub fn blocks_for(n: usize) -> u32 {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_GRID as usize);
    // In range by the clamp.
    u32::try_from(blocks).unwrap_or(MAX_GRID)
}

/// The grid of a launch, in blocks of [`BLOCK`] threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocks {
    /// A grid-stride launch over this many elements ([`blocks_for`]).
    Over(usize),
    /// Exactly `x` by `y` blocks (block algorithms with per-block outputs;
    /// a zero is taken as one).
    Exactly(u32, u32),
}

impl Blocks {
    /// The grid as `(x, y)` blocks.
    pub fn grid(self) -> (u32, u32) {
        match self {
            Blocks::Over(n) => (blocks_for(n), 1),
            Blocks::Exactly(x, y) => (x.max(1), y.max(1)),
        }
    }
}

// Named plans of the kernels whose grid is not a grid-stride launch
// (`Blocks::Exactly`), one section per module, each used by its CUDA
// launcher and by gradwire-kernels-host's tests.

// -- select.cu --

// -- quant.cu --

// -- lowrank.cu --

// -- adasum.cu --

// -- reduce.cu --
