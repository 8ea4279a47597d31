//! PowerSGD's low-rank codec (Vogels, Karimireddy and Jaggi, NeurIPS 2019;
//! PyTorch DDP's `powerSGD_hook`): a gradient matrix `M` (`n x m`, a tensor
//! of shape `[n, ...]` viewed as `n` rows) travels as two thin factors of
//! rank `r`. One power iteration per step, warm-started from the previous
//! step's `Q`:
//!
//! 1. `P = M Q` (`n x r`), summed across ranks;
//! 2. `P` orthonormalised (the same on every rank: it is the same sum);
//! 3. `Q = Mᵀ P` (`m x r`), averaged across ranks;
//! 4. `M ≈ P Qᵀ`, the average of the ranks' projections.
//!
//! This module holds the arithmetic only (it never communicates):
//! [`matrix_shape`] decides which tensors are worth compressing,
//! [`project`], [`project_back`], [`orthonormalize`] and [`reconstruct`]
//! are the products, [`init_q`] the seeded start. Matrices are row-major
//! `f32` slices (on a GPU, windows of device buffers: `cuda::lowrank`,
//! feature `cuda`); `Q` is kept transposed (`rank x cols`), so that every
//! product streams `M` once, row by row, against contiguous rows of `Q`
//! (dot products and axpys that the compiler vectorises), and allocates
//! nothing: the factors are thin (`rank` is 1 to a few), where a general
//! matrix multiplication spends its time packing.
//!
//! The long sums of [`project`] (over a row's columns) and [`project_back`]
//! (over the rows) run in spans of [`SPAN`] terms: each span summed on its
//! own, then the spans' sums added in order. A matrix of at most `SPAN`
//! columns (or rows) has one span, so the order is the plain one; the
//! spans are what lets the device products (`lowrank.cu`) split a long sum
//! across threads and still give these bits.
//!
//! ```
//! use gradwire_compress::lowrank;
//!
//! // A rank-1 matrix is recovered exactly by one iteration.
//! let (u, v) = ([1.0f32, 2.0, 3.0], [1.0f32, -1.0, 0.5, 2.0]);
//! let m: Vec<f32> = u.iter().flat_map(|a| v.iter().map(move |b| a * b)).collect();
//! let mut q = vec![0.0f32; 4];
//! lowrank::init_q(7, &mut q);
//! let mut p = vec![0.0f32; 3];
//! lowrank::project(&m, 3, 4, &q, &mut p)?;
//! lowrank::orthonormalize(&mut p, 3, 1)?;
//! lowrank::project_back(&m, 3, 4, &p, &mut q)?;
//! let mut approx = vec![0.0f32; 12];
//! lowrank::reconstruct(&p, &q, 3, 4, &mut approx)?;
//! assert!(m.iter().zip(&approx).all(|(a, b)| (a - b).abs() < 1e-5));
//! # Ok::<(), gradwire_compress::CompressError>(())
//! ```

use crate::error::{CompressError, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// The matrix a tensor of shape `dims` is compressed as, `(rows, cols)`,
/// or `None` when it travels uncompressed: fewer than two dimensions, or a
/// rank-`rank` pair of factors not more than `min_rate` times smaller than
/// the matrix: compressed only when `(rows + cols) rank min_rate < rows
/// cols` strictly, as PyTorch DDP's PowerSGD hook decides
/// (`min_compression_rate`, default 2; equality travels dense).
pub fn matrix_shape(dims: &[usize], rank: usize, min_rate: f64) -> Option<(usize, usize)> {
    let (&rows, rest) = dims.split_first()?;
    if rest.is_empty() || rank == 0 {
        return None;
    }
    let cols = rest.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
    let dense = rows.checked_mul(cols)? as f64;
    let factors = rows.checked_add(cols)?.checked_mul(rank)? as f64;
    (factors > 0.0 && min_rate * factors < dense).then_some((rows, cols))
}

fn check_len(op: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(CompressError::LengthMismatch { op, expected, got })
    }
}

/// `a * b`, or an error naming `op` when it overflows (no slice that long
/// exists).
fn product(op: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| CompressError::InvalidArgument(format!("{op}: {a} x {b} elements overflow")))
}

/// The rank of a factor of `len` elements with `rows` rows (or, for `Q`,
/// `rank` rows of `rows` columns).
fn rank_of(op: &'static str, len: usize, rows: usize) -> Result<usize> {
    if rows == 0 || len == 0 || !len.is_multiple_of(rows) {
        return Err(CompressError::InvalidArgument(format!(
            "{op}: a factor of {len} elements cannot go with {rows} rows or columns"
        )));
    }
    Ok(len / rows)
}

/// The checks of [`project`] on operands of these lengths: the rank.
/// Shared with the device form (`cuda::lowrank`), so both refuse the same
/// operands with the same errors.
pub(crate) fn check_project(
    rows: usize,
    cols: usize,
    m: usize,
    qt: usize,
    p: usize,
) -> Result<usize> {
    let rank = rank_of("project", qt, cols)?;
    rank_of("project", p, rows)?;
    check_len("project (m)", m, product("project", rows, cols)?)?;
    check_len("project (p)", p, product("project", rows, rank)?)?;
    Ok(rank)
}

/// The checks of [`project_back`]: the rank.
pub(crate) fn check_project_back(
    rows: usize,
    cols: usize,
    m: usize,
    p: usize,
    qt: usize,
) -> Result<usize> {
    let rank = rank_of("project_back", p, rows)?;
    rank_of("project_back", qt, cols)?;
    check_len("project_back (m)", m, product("project_back", rows, cols)?)?;
    check_len("project_back (q)", qt, product("project_back", rank, cols)?)?;
    Ok(rank)
}

/// The checks of [`reconstruct`]: the rank.
pub(crate) fn check_reconstruct(
    rows: usize,
    cols: usize,
    p: usize,
    qt: usize,
    out: usize,
) -> Result<usize> {
    let rank = rank_of("reconstruct", p, rows)?;
    rank_of("reconstruct", qt, cols)?;
    check_len("reconstruct (q)", qt, product("reconstruct", rank, cols)?)?;
    check_len(
        "reconstruct (out)",
        out,
        product("reconstruct", rows, cols)?,
    )?;
    Ok(rank)
}

/// The checks of [`orthonormalize`].
pub(crate) fn check_orthonormalize(p: usize, rows: usize, rank: usize) -> Result<()> {
    check_len("orthonormalize", p, product("orthonormalize", rows, rank)?)
}

/// Terms of one partial sum of [`project`] (columns of a row) and
/// [`project_back`] (rows): a longer sum is the in-order sum of its spans'
/// sums. `GW_LOWRANK_SPAN` of `lowrank.cu` and gradwire-kernels'
/// `plan::LOWRANK_SPAN`, which the device products split their sums by.
pub const SPAN: usize = 1024;

/// Columns of one tile of [`project_back`]'s later spans, and the rank
/// columns one pass over a tile takes: their partial sums (32 KiB) stay on
/// the stack, and each row of `M` is read 4 KiB at a time (on tall
/// matrices, within about 10 % of one pass over whole rows; 64-column
/// tiles took twice as long).
const TILE: usize = 1024;
const TILE_RANK: usize = 8;

/// `a · b` in f32, span by span ([`SPAN`]): each span's eight partial sums
/// (which the compiler keeps in one vector register) added in order, then
/// its tail; the spans' sums added in order from -0.0 (so a single span's
/// sum is itself, bit for bit).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.chunks(SPAN)
        .zip(b.chunks(SPAN))
        .fold(-0.0, |total, (a, b)| total + span_dot(a, b))
}

/// `a · b` of one span: eight partial sums (entry `e` in lane `e % 8`, over
/// the whole multiples of 8), the lanes added in order, then the tail.
fn span_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// `y += alpha x`.
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

/// `p = m q`: `m` is `rows x cols`, `qt` is `Qᵀ` (`rank x cols`), `p`
/// (written) is `rows x rank`.
pub fn project(m: &[f32], rows: usize, cols: usize, qt: &[f32], p: &mut [f32]) -> Result<()> {
    let rank = check_project(rows, cols, m.len(), qt.len(), p.len())?;
    for (row, p_row) in m.chunks_exact(cols).zip(p.chunks_exact_mut(rank)) {
        for (p, q) in p_row.iter_mut().zip(qt.chunks_exact(cols)) {
            *p = dot(row, q);
        }
    }
    Ok(())
}

/// `qt = (mᵀ p)ᵀ = pᵀ m`: `m` is `rows x cols`, `p` is `rows x rank`, `qt`
/// (written) is `rank x cols`. Each entry sums over the rows span by span
/// ([`SPAN`] rows, each span's sum from 0.0 in row order), the spans' sums
/// added in order.
pub fn project_back(m: &[f32], rows: usize, cols: usize, p: &[f32], qt: &mut [f32]) -> Result<()> {
    let rank = check_project_back(rows, cols, m.len(), p.len(), qt.len())?;
    // Saturating: a span longer than the matrix is the whole of it.
    let mut spans = m
        .chunks(SPAN.saturating_mul(cols))
        .zip(p.chunks(SPAN.saturating_mul(rank)));
    // The first span straight into `qt`, row by row (the whole sum when
    // there is one span): -0.0 + s is s, so this is the in-order sum.
    qt.fill(0.0);
    if let Some((m, p)) = spans.next() {
        for (row, p_row) in m.chunks_exact(cols).zip(p.chunks_exact(rank)) {
            for (&p, q) in p_row.iter().zip(qt.chunks_exact_mut(cols)) {
                axpy(p, row, q);
            }
        }
    }
    // Each later span summed on its own, then added: a tile of columns
    // and of rank columns at a time, the partial sums on the stack.
    for (m, p) in spans {
        for c0 in (0..cols).step_by(TILE) {
            let width = TILE.min(cols - c0);
            for j0 in (0..rank).step_by(TILE_RANK) {
                let height = TILE_RANK.min(rank - j0);
                let mut part = [[0f32; TILE]; TILE_RANK];
                for (row, p_row) in m.chunks_exact(cols).zip(p.chunks_exact(rank)) {
                    let row = &row[c0..c0 + width];
                    for (&p, part) in p_row[j0..j0 + height].iter().zip(&mut part) {
                        axpy(p, row, &mut part[..width]);
                    }
                }
                for (part, q) in part.iter().zip(qt.chunks_exact_mut(cols).skip(j0)) {
                    for (q, s) in q[c0..c0 + width].iter_mut().zip(part) {
                        *q += s;
                    }
                }
            }
        }
    }
    Ok(())
}

/// `out = p qᵀ`: `p` is `rows x rank`, `qt` is `Qᵀ` (`rank x cols`), `out`
/// (written) is `rows x cols`.
pub fn reconstruct(p: &[f32], qt: &[f32], rows: usize, cols: usize, out: &mut [f32]) -> Result<()> {
    let rank = check_reconstruct(rows, cols, p.len(), qt.len(), out.len())?;
    for (out_row, p_row) in out.chunks_exact_mut(cols).zip(p.chunks_exact(rank)) {
        out_row.fill(0.0);
        for (&p, q) in p_row.iter().zip(qt.chunks_exact(cols)) {
            axpy(p, q, out_row);
        }
    }
    Ok(())
}

/// Makes the columns of `p` (`rows x rank`, row-major) orthonormal in
/// place: modified Gram-Schmidt with f64 sums, each projection done twice. A column with no direction
/// left (zero, or a combination of the earlier ones) becomes zero instead
/// of NaN (DDP adds an epsilon to the norm for the same reason), so a zero
/// gradient compresses to zero.
pub fn orthonormalize(p: &mut [f32], rows: usize, rank: usize) -> Result<()> {
    check_orthonormalize(p.len(), rows, rank)?;
    for j in 0..rank {
        let norm_before = column_norm(p, rows, rank, j);
        // Twice ("twice is enough", Giraud et al.): one pass loses
        // orthogonality in proportion to the condition number (seen: 3e-5
        // on a random 4 x 4 in f32); the second brings it to rounding.
        for _ in 0..2 {
            for k in 0..j {
                let dot: f64 = (0..rows)
                    .map(|i| f64::from(p[i * rank + j]) * f64::from(p[i * rank + k]))
                    .sum();
                for i in 0..rows {
                    p[i * rank + j] -= (dot * f64::from(p[i * rank + k])) as f32;
                }
            }
        }
        let norm = column_norm(p, rows, rank, j);
        // What is left of a column that lay in the earlier ones' span is
        // rounding noise: it becomes zero, not a random direction.
        let scale = if norm > 1e-6 * norm_before && norm > f64::from(f32::MIN_POSITIVE) {
            1.0 / norm
        } else {
            0.0
        };
        for i in 0..rows {
            p[i * rank + j] = (f64::from(p[i * rank + j]) * scale) as f32;
        }
    }
    Ok(())
}

fn column_norm(p: &[f32], rows: usize, rank: usize, j: usize) -> f64 {
    (0..rows)
        .map(|i| f64::from(p[i * rank + j]).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// The first `Q` (or `Qᵀ`: the same draws) of a matrix: standard normal
/// entries from `seed` (the same
/// seed gives the same `Q` on every rank, which the sum of the `P`s needs).
pub fn init_q(seed: u64, q: &mut [f32]) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for v in q {
        *v = StandardNormal.sample(&mut rng);
    }
}
