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

/// The digit shifts of the radix select's passes over the 31-bit magnitude
/// keys, most significant first: one `radix_histogram_f32` and one
/// `radix_select_digit` launch per shift.
pub const RADIX_SHIFTS: [u32; 4] = [24, 16, 8, 0];

/// The tiling of `select_count_f32` and `select_compact_f32` over `n`
/// elements: `(tile, tiles)`, launched as `Blocks::Exactly(tiles, 1)`, block
/// `b` handling elements `[b tile, (b + 1) tile)`. `tile` is a multiple of
/// [`BLOCK`], there are at most [`MAX_GRID`] tiles, at least one, and (for
/// `n >= 1`) none is empty.
pub fn select_tiles(n: usize) -> (usize, u32) {
    let block = BLOCK as usize;
    let tiles = n.div_ceil(block).clamp(1, MAX_GRID as usize);
    let tile = n.div_ceil(tiles).div_ceil(block).max(1) * block;
    let tiles = n.div_ceil(tile).max(1);
    // At most MAX_GRID: no more than the clamped count above.
    (tile, u32::try_from(tiles).unwrap_or(MAX_GRID))
}

/// Sampled top-k's settings, the CPU codec's (gradwire-compress's
/// `select::SAMPLED_MIN_LEN`, `SAMPLE_STRIDE` and `SAMPLED_TOP_K_SLACK`),
/// which its callers pass: this leaf crate holds the device sequence, not
/// the codec's rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledRule {
    /// Below this length (or for k = 0) the exact top k.
    pub min_len: usize,
    /// The sample: every `stride`-th entry (`sample_strided_f32`).
    pub stride: usize,
    /// At most `ceil(slack k)` survivors are kept as they are.
    pub slack: f64,
}

/// The device steps sampled top-k is made of, which [`sampled_top_k`]
/// sequences: performed by the CUDA launcher (gradwire-compress) and by the
/// CPU execution's test of the same kernels.
pub trait SampledSteps {
    /// A selection of the input's entries (values and indices).
    type Selected;
    /// What a step fails with.
    type Error;
    /// The exact top `k` of the input (the radix select and compaction).
    fn exact(&mut self, k: usize) -> Result<Self::Selected, Self::Error>;
    /// Takes the input's strided sample (every `stride`-th entry) and
    /// returns its length.
    fn sample(&mut self, stride: usize) -> Result<usize, Self::Error>;
    /// The input's entries at least as large as the sample's `take`-th
    /// largest magnitude (its ties kept), and how many there are.
    fn survivors(&mut self, take: usize) -> Result<(Self::Selected, usize), Self::Error>;
    /// The exact top `k` among `survivors`, indexed as in the input.
    fn best_among(
        &mut self,
        survivors: Self::Selected,
        k: usize,
    ) -> Result<Self::Selected, Self::Error>;
}

/// Which way [`sampled_top_k`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampledOutcome {
    /// Below [`SampledRule::min_len`] entries or k = 0: the exact top k.
    Small,
    /// The survivors of the sample's threshold, between k and the cap.
    Survivors,
    /// More than the cap survived: the exact top k among them.
    AmongSurvivors,
    /// Fewer than k survived even the whole sample: the exact top k.
    Fallback,
}

/// Sampled top-k of `n` entries keeping `ratio` of them under `rule`: a
/// threshold from the strided sample's `ceil(ratio len)`-th largest
/// magnitude, doubled (up to the whole sample) until at least `k` entries
/// survive it; at most `ceil(slack k)` survivors are kept as they are, more
/// are cut to the exact top `k` among them, and a sample that never yields
/// `k` falls back to the exact top `k`.
pub fn sampled_top_k<S: SampledSteps>(
    steps: &mut S,
    n: usize,
    k: usize,
    ratio: f64,
    rule: SampledRule,
) -> Result<(S::Selected, SampledOutcome), S::Error> {
    if n < rule.min_len || k == 0 {
        return Ok((steps.exact(k)?, SampledOutcome::Small));
    }
    let cap = ((k as f64 * rule.slack).ceil() as usize).max(k);
    let len = steps.sample(rule.stride)?;
    let mut take = ((ratio * len as f64).ceil() as usize).clamp(1, len.max(1));
    loop {
        let (survivors, count) = steps.survivors(take)?;
        if count >= k {
            if count <= cap {
                return Ok((survivors, SampledOutcome::Survivors));
            }
            return Ok((
                steps.best_among(survivors, k)?,
                SampledOutcome::AmongSurvivors,
            ));
        }
        if take >= len {
            return Ok((steps.exact(k)?, SampledOutcome::Fallback));
        }
        take = (take * 2).min(len);
    }
}

// -- quant.cu --

/// The grid of the quantizers' encoders (`quant_sign_encode_f32`,
/// `quant_qsgd_encode_f32`, `quant_minmax_encode_f32`) over `chunks`
/// payload chunks of 512 entries: one block per chunk, at most [`MAX_GRID`]
/// blocks (each then strides over the chunks `MAX_GRID` apart).
pub fn quant_encode(chunks: usize) -> Blocks {
    let blocks = chunks.clamp(1, MAX_GRID as usize);
    // In range by the clamp.
    Blocks::Exactly(u32::try_from(blocks).unwrap_or(MAX_GRID), 1)
}

// -- lowrank.cu --

/// Terms of one partial sum of PowerSGD's projections (`GW_LOWRANK_SPAN`):
/// gradwire-compress's `lowrank::SPAN`. A longer sum is the in-order sum of
/// its spans' sums, which a launch may take side by side.
pub const LOWRANK_SPAN: usize = 1024;

/// The most spans of one output a projection's launch sums side by side
/// (`GW_LOWRANK_MAX_SLOTS`; the kernels trap on more, or on none).
pub const LOWRANK_MAX_SLOTS: usize = 32;

/// The launch of `lowrank_project_f32` or `lowrank_project_back_f32`: the
/// grid, and `slots`, the kernel's last argument (how many spans of one
/// output its threads sum side by side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanLaunch {
    /// The grid.
    pub blocks: Blocks,
    /// Spans of one output summed side by side: 1 to
    /// [`LOWRANK_MAX_SLOTS`].
    pub slots: usize,
}

/// Slots for a sum of `terms` terms: its spans, rounded up to a power of
/// two (so that the block's threads divide among the outputs evenly), at
/// most [`LOWRANK_MAX_SLOTS`].
fn span_slots(terms: usize) -> usize {
    terms
        .div_ceil(LOWRANK_SPAN)
        .max(1)
        .next_power_of_two()
        .min(LOWRANK_MAX_SLOTS)
}

/// A launch over `outputs` outputs, `per_block_threads / slots` of them
/// per block, at least one block, at most [`MAX_GRID`] (the blocks stride
/// over the rest).
fn span_launch(outputs: usize, slots: usize, per_block_threads: usize) -> SpanLaunch {
    let per_block = per_block_threads / slots;
    let blocks = outputs.div_ceil(per_block).clamp(1, MAX_GRID as usize);
    SpanLaunch {
        // In range by the clamp.
        blocks: Blocks::Exactly(u32::try_from(blocks).unwrap_or(MAX_GRID), 1),
        slots,
    }
}

/// The launch of `lowrank_project_f32` over `outputs` entries of `P`
/// (`rows x rank`), each a dot product of `cols` terms: a block holds 32
/// groups of eight threads (a span's eight lanes), `slots` groups per
/// output.
pub fn lowrank_project(outputs: usize, cols: usize) -> SpanLaunch {
    span_launch(outputs, span_slots(cols), BLOCK as usize / 8)
}

/// The launch of `lowrank_project_back_f32` over `outputs` entries of `Qᵀ`
/// (`rank x cols`), each a sum over `rows` rows: `slots` threads per
/// output, [`BLOCK`] threads per block.
pub fn lowrank_project_back(outputs: usize, rows: usize) -> SpanLaunch {
    span_launch(outputs, span_slots(rows), BLOCK as usize)
}

/// The grid of `lowrank_orthonormalize_f32`: one block per matrix (its
/// Gram-Schmidt runs its f64 sums as reductions over the block).
pub fn lowrank_orthonormalize() -> Blocks {
    Blocks::Exactly(1, 1)
}

// -- adasum.cu --

/// The `ranges` argument of the AdaSum kernels over the part `piece` of a
/// fused buffer: each tensor's range clipped to `piece`, as `(start, end)`
/// pairs (an empty intersection gives `start == end`), and the longest
/// clipped range (which sizes the grids below).
pub fn adasum_ranges(
    tensors: &[std::ops::Range<usize>],
    piece: &std::ops::Range<usize>,
) -> (Vec<u64>, usize) {
    let mut ranges = Vec::with_capacity(2 * tensors.len());
    let mut longest = 0;
    for t in tensors {
        let lo = t.start.max(piece.start);
        let hi = t.end.min(piece.end).max(lo);
        longest = longest.max(hi - lo);
        // A usize fits a u64 on every target Rust supports.
        ranges.push(u64::try_from(lo).unwrap_or(u64::MAX));
        ranges.push(u64::try_from(hi).unwrap_or(u64::MAX));
    }
    (ranges, longest)
}

/// The most tensors an AdaSum launch's grid covers in y (CUDA's limit on
/// `gridDim.y`); the kernels stride over the rest.
const ADASUM_MAX_GRID_Y: usize = 65_535;

/// Block columns per tensor of `adasum_partials_f32` (the `columns` that
/// `adasum_finish_f64` adds up): one per 16 blocks' worth of the longest
/// tensor range (clipped to the piece the launch covers), at least one, at
/// most 256, so the f64 partials stay few and the launch shape depends only
/// on the ranges.
pub fn adasum_columns(longest: usize) -> usize {
    longest.div_ceil(BLOCK as usize * 16).clamp(1, 256)
}

/// The grid of AdaSum's kernels over `tensors` tensor ranges, `x` blocks per
/// tensor: `x` by `tensors`, at least one in each, at most 65535 in y.
fn adasum_grid(x: u32, tensors: usize) -> Blocks {
    let y = tensors.clamp(1, ADASUM_MAX_GRID_Y);
    // In range by the clamp.
    Blocks::Exactly(x.max(1), u32::try_from(y).unwrap_or(u16::MAX.into()))
}

/// The grid of `adasum_partials_f32` over `tensors` ranges whose longest
/// (clipped) range has `longest` elements: [`adasum_columns`] block columns
/// by one row per tensor (at most 65535 rows; the kernel strides).
pub fn adasum_partials(longest: usize, tensors: usize) -> Blocks {
    // In range: at most 256.
    let x = u32::try_from(adasum_columns(longest)).unwrap_or(256);
    adasum_grid(x, tensors)
}

/// The grid of `adasum_finish_f64` over `tensors` tensors: one block per
/// tensor, at least one, at most [`MAX_GRID`] (the blocks stride over the
/// rest).
pub fn adasum_finish(tensors: usize) -> Blocks {
    let blocks = tensors.clamp(1, MAX_GRID as usize);
    // In range by the clamp.
    Blocks::Exactly(u32::try_from(blocks).unwrap_or(MAX_GRID), 1)
}

/// The grid of `adasum_combine_f32` over `tensors` ranges whose longest
/// (clipped) range has `longest` elements: one block column per [`BLOCK`]
/// elements of it, at least one, at most 1024, by one row per tensor (at
/// most 65535 rows; the kernel strides in both).
pub fn adasum_combine(longest: usize, tensors: usize) -> Blocks {
    let x = longest.div_ceil(BLOCK as usize).clamp(1, 1024);
    // In range by the clamp.
    adasum_grid(u32::try_from(x).unwrap_or(1024), tensors)
}

// -- reduce.cu --

/// The grid of a `<op>_partial_<dtype>` reduction over `n` elements: one f64
/// partial per block, as many blocks as a grid-stride launch over `n`
/// ([`blocks_for`]); `finish_sum_f64` then adds them on one block.
pub fn partial_sums(n: usize) -> Blocks {
    Blocks::Exactly(blocks_for(n), 1)
}
