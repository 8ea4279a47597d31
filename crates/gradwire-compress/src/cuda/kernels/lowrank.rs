//! PowerSGD's low-rank products of `kernels/cuda/lowrank.cu` on f32 device
//! buffers: [`project`] (`P = M Q`), [`project_back`] (`Qᵀ = (Mᵀ P)ᵀ`),
//! [`reconstruct`] (`P Qᵀ`) and [`orthonormalize`] (the columns of `P`),
//! each matrix a [`Window`] of its buffer (PowerSGD keeps every matrix's
//! factors side by side in one fused buffer per all-reduce).
//!
//! The products are bitwise gradwire-compress's `lowrank::{project,
//! project_back, reconstruct}` (the same sums in the same order, each
//! multiply and add rounded). [`orthonormalize`] is its modified
//! Gram-Schmidt with the f64 sums done as block reductions: deterministic,
//! and within a few f32 ulps of the CPU's (see `lowrank.cu`).

use std::ops::Range;

use gradwire_kernels::{Kernel, lowrank as k, plan};
use gradwire_tensor::cuda_backend::launch::{
    Blocks, Launch, out_of_bounds, require_f32, require_len, require_same_device,
};
use gradwire_tensor::{CudaStorage, Error, Result};

/// The shape of a low-rank product: `M` is `rows x cols`, `P` is
/// `rows x rank`, `Qᵀ` is `rank x cols`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LowRankShape {
    /// Rows of `M` and `P`.
    pub rows: usize,
    /// Columns of `M` and `Qᵀ`.
    pub cols: usize,
    /// Columns of `P`, rows of `Qᵀ`.
    pub rank: usize,
}

impl LowRankShape {
    fn product(a: usize, b: usize) -> Result<usize> {
        a.checked_mul(b).ok_or(Error::ShapeOverflow)
    }

    /// Entries of `M`.
    pub fn m_len(&self) -> Result<usize> {
        Self::product(self.rows, self.cols)
    }

    /// Entries of `P`.
    pub fn p_len(&self) -> Result<usize> {
        Self::product(self.rows, self.rank)
    }

    /// Entries of `Qᵀ`.
    pub fn q_len(&self) -> Result<usize> {
        Self::product(self.rank, self.cols)
    }
}

/// Elements `range` of an f32 storage, read by a kernel.
#[derive(Debug, Clone)]
pub struct Window<'a> {
    storage: &'a CudaStorage,
    range: Range<usize>,
}

/// Elements `range` of an f32 storage, written by a kernel.
#[derive(Debug)]
pub struct WindowMut<'a> {
    storage: &'a mut CudaStorage,
    range: Range<usize>,
}

/// The checks of a window: f32 storage, a range inside it.
fn check_window(op: &'static str, storage: &CudaStorage, range: &Range<usize>) -> Result<()> {
    require_f32(op, storage)?;
    if range.start > range.end || range.end > storage.len() {
        return Err(out_of_bounds(op, range, storage.len()));
    }
    Ok(())
}

impl<'a> Window<'a> {
    /// Elements `range` of `storage` ([`Error::DTypeMismatch`] unless f32,
    /// [`Error::InvalidArgument`] for a range outside).
    pub fn new(storage: &'a CudaStorage, range: Range<usize>) -> Result<Window<'a>> {
        check_window("lowrank::Window", storage, &range)?;
        Ok(Window { storage, range })
    }

    /// All of `storage` (f32).
    pub fn whole(storage: &'a CudaStorage) -> Result<Window<'a>> {
        Window::new(storage, 0..storage.len())
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Whether the window has no elements.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

impl<'a> WindowMut<'a> {
    /// Elements `range` of `storage`, to write (errors as [`Window::new`]).
    pub fn new(storage: &'a mut CudaStorage, range: Range<usize>) -> Result<WindowMut<'a>> {
        check_window("lowrank::WindowMut", storage, &range)?;
        Ok(WindowMut { storage, range })
    }

    /// All of `storage` (f32).
    pub fn whole(storage: &'a mut CudaStorage) -> Result<WindowMut<'a>> {
        let len = storage.len();
        WindowMut::new(storage, 0..len)
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Whether the window has no elements.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

/// The operands of a product: the windows' lengths are the shape's, and
/// all lie on the output's device.
fn check_operands(
    op: &'static str,
    inputs: [(&Window<'_>, usize); 2],
    out: &WindowMut<'_>,
    out_len: usize,
) -> Result<()> {
    for (window, len) in inputs {
        require_same_device(op, &*out.storage, window.storage)?;
        require_len(op, len, window.len())?;
    }
    require_len(op, out_len, out.len())
}

/// The three products' kernels take the same arguments: two input
/// windows, the output window (each an f32 buffer and an element offset)
/// and the shape: `kernel(const float* a, u64 a_at, const float* b, u64
/// b_at, float* out, u64 out_at, u64 rows, u64 cols, u64 rank)`, and the
/// two projections a last `u64 slots` (their [`plan::SpanLaunch`]). Checks
/// that the windows have the lengths `lens` gives (a, b, out) and lie on
/// `out`'s device, then launches `kernel` on `grid(outputs)`: its blocks,
/// and its slots where it has them.
fn launch_product(
    op: &'static str,
    kernel: &'static Kernel,
    (a, b, out): (&Window<'_>, &Window<'_>, &mut WindowMut<'_>),
    lens: [usize; 3],
    shape: LowRankShape,
    grid: impl FnOnce(usize) -> (Blocks, Option<usize>),
) -> Result<()> {
    let [a_len, b_len, outputs] = lens;
    check_operands(op, [(a, a_len), (b, b_len)], out, outputs)?;
    if outputs == 0 {
        return Ok(());
    }
    let (blocks, slots) = grid(outputs);
    let device = out.storage.device().clone();
    let launch = Launch::new(&device, kernel)
        .read(a.storage)
        .len(a.range.start)
        .read(b.storage)
        .len(b.range.start)
        .write(&mut *out.storage)
        .len(out.range.start)
        .len(shape.rows)
        .len(shape.cols)
        .len(shape.rank);
    match slots {
        Some(slots) => launch.len(slots).run(blocks),
        None => launch.run(blocks),
    }
}

/// A projection's [`plan::SpanLaunch`] as `launch_product` takes it.
fn spans(launch: plan::SpanLaunch) -> (Blocks, Option<usize>) {
    (launch.blocks, Some(launch.slots))
}

/// `p = m q` (gradwire-compress's `lowrank::project`, bitwise): `m` is
/// `rows x cols`, `qt` is `Qᵀ` (`rank x cols`), `p` (written) is
/// `rows x rank`.
pub fn project(
    m: &Window<'_>,
    qt: &Window<'_>,
    p: &mut WindowMut<'_>,
    shape: LowRankShape,
) -> Result<()> {
    launch_product(
        "lowrank::project",
        &k::LOWRANK_PROJECT_F32,
        (m, qt, p),
        [shape.m_len()?, shape.q_len()?, shape.p_len()?],
        shape,
        |outputs| spans(plan::lowrank_project(outputs, shape.cols)),
    )
}

/// `qt = (mᵀ p)ᵀ` (gradwire-compress's `lowrank::project_back`, bitwise):
/// `m` is `rows x cols`, `p` is `rows x rank`, `qt` (written) is
/// `rank x cols`.
pub fn project_back(
    m: &Window<'_>,
    p: &Window<'_>,
    qt: &mut WindowMut<'_>,
    shape: LowRankShape,
) -> Result<()> {
    launch_product(
        "lowrank::project_back",
        &k::LOWRANK_PROJECT_BACK_F32,
        (m, p, qt),
        [shape.m_len()?, shape.p_len()?, shape.q_len()?],
        shape,
        |outputs| spans(plan::lowrank_project_back(outputs, shape.rows)),
    )
}

/// `out = p qᵀ` (gradwire-compress's `lowrank::reconstruct`, bitwise): `p`
/// is `rows x rank`, `qt` is `Qᵀ` (`rank x cols`), `out` (written) is
/// `rows x cols`.
pub fn reconstruct(
    p: &Window<'_>,
    qt: &Window<'_>,
    out: &mut WindowMut<'_>,
    shape: LowRankShape,
) -> Result<()> {
    launch_product(
        "lowrank::reconstruct",
        &k::LOWRANK_RECONSTRUCT_F32,
        (p, qt, out),
        [shape.p_len()?, shape.q_len()?, shape.m_len()?],
        shape,
        |outputs| (Blocks::Over(outputs), None),
    )
}

/// Makes the `rank` columns of `p` (`rows x rank`, row-major) orthonormal
/// in place, as gradwire-compress's `lowrank::orthonormalize` (a column
/// with no direction left becomes zero), its f64 sums in a fixed block
/// order: deterministic, within a few f32 ulps of the CPU's.
pub fn orthonormalize(p: &mut WindowMut<'_>, rows: usize, rank: usize) -> Result<()> {
    const OP: &str = "lowrank::orthonormalize";
    let len = rows.checked_mul(rank).ok_or(Error::ShapeOverflow)?;
    require_len(OP, len, p.len())?;
    if len == 0 {
        return Ok(());
    }
    let device = p.storage.device().clone();
    Launch::new(&device, &k::LOWRANK_ORTHONORMALIZE_F32)
        .write(&mut *p.storage)
        .len(p.range.start)
        .len(rows)
        .len(rank)
        .run(plan::lowrank_orthonormalize())
}
