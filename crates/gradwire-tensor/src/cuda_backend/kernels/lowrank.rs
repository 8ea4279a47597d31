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
use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use gradwire_kernels::lowrank as k;

use crate::cuda_backend::CudaStorage;
use crate::cuda_backend::launch::{
    BLOCK, MAX_GRID, blocks, grid_stride, launched, len_arg, out_of_bounds, require_f32,
    require_len, require_same_device,
};
use crate::error::{Error, Result};

/// Outputs of one block of `lowrank_project_f32` (`GW_LOWRANK_OUTPUTS`:
/// eight threads each).
const PROJECT_OUTPUTS_PER_BLOCK: usize = BLOCK as usize / 8;

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

/// A kernel argument: an element offset or a dimension.
fn arg(n: usize) -> Result<u64> {
    len_arg(n)
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
    const OP: &str = "lowrank::project";
    check_operands(
        OP,
        [(m, shape.m_len()?), (qt, shape.q_len()?)],
        p,
        shape.p_len()?,
    )?;
    let outputs = shape.p_len()?;
    if outputs == 0 {
        return Ok(());
    }
    let device = Arc::clone(p.storage.device());
    let function = device.function(k::NAME, k::LOWRANK_PROJECT_F32)?;
    let grid = outputs
        .div_ceil(PROJECT_OUTPUTS_PER_BLOCK)
        .clamp(1, MAX_GRID as usize);
    let config: LaunchConfig = blocks(u32::try_from(grid).unwrap_or(MAX_GRID));
    let (m_at, qt_at, p_at) = (
        arg(m.range.start)?,
        arg(qt.range.start)?,
        arg(p.range.start)?,
    );
    let (rows, cols, rank) = (arg(shape.rows)?, arg(shape.cols)?, arg(shape.rank)?);
    let (mv, qv) = (m.storage.bytes()?, qt.storage.bytes()?);
    let mut pv = p.storage.bytes_mut()?;
    let mut args = device.stream().launch_builder(&function);
    args.arg(&mv)
        .arg(&m_at)
        .arg(&qv)
        .arg(&qt_at)
        .arg(&mut pv)
        .arg(&p_at)
        .arg(&rows)
        .arg(&cols)
        .arg(&rank);
    #[allow(unsafe_code)]
    // SAFETY: lowrank_project_f32(const float* m, u64 m_at, const float*
    // qt, u64 qt_at, float* p, u64 p_at, u64 rows, u64 cols, u64 rank)
    // reads m[m_at..m_at + rows cols] and qt[qt_at..qt_at + rank cols] and
    // writes p[p_at..p_at + rows rank]: each window lies in its f32 buffer
    // and has exactly that length (checked); `p` is borrowed mutably, so
    // it is a buffer distinct from the inputs; BLOCK threads per block as
    // the kernel requires.
    let result = unsafe { args.launch(config) };
    launched(k::LOWRANK_PROJECT_F32, result)
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
    const OP: &str = "lowrank::project_back";
    check_operands(
        OP,
        [(m, shape.m_len()?), (p, shape.p_len()?)],
        qt,
        shape.q_len()?,
    )?;
    let outputs = shape.q_len()?;
    if outputs == 0 {
        return Ok(());
    }
    let device = Arc::clone(qt.storage.device());
    let function = device.function(k::NAME, k::LOWRANK_PROJECT_BACK_F32)?;
    let (m_at, p_at, qt_at) = (
        arg(m.range.start)?,
        arg(p.range.start)?,
        arg(qt.range.start)?,
    );
    let (rows, cols, rank) = (arg(shape.rows)?, arg(shape.cols)?, arg(shape.rank)?);
    let (mv, pv) = (m.storage.bytes()?, p.storage.bytes()?);
    let mut qv = qt.storage.bytes_mut()?;
    let mut args = device.stream().launch_builder(&function);
    args.arg(&mv)
        .arg(&m_at)
        .arg(&pv)
        .arg(&p_at)
        .arg(&mut qv)
        .arg(&qt_at)
        .arg(&rows)
        .arg(&cols)
        .arg(&rank);
    #[allow(unsafe_code)]
    // SAFETY: lowrank_project_back_f32(const float* m, u64 m_at, const
    // float* p, u64 p_at, float* qt, u64 qt_at, u64 rows, u64 cols, u64
    // rank) reads m[m_at..+rows cols] and p[p_at..+rows rank] and writes
    // qt[qt_at..+rank cols]: windows checked inside their f32 buffers with
    // those lengths, `qt` a distinct buffer (borrowed mutably); a
    // grid-stride loop, any geometry.
    let result = unsafe { args.launch(grid_stride(outputs)) };
    launched(k::LOWRANK_PROJECT_BACK_F32, result)
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
    const OP: &str = "lowrank::reconstruct";
    check_operands(
        OP,
        [(p, shape.p_len()?), (qt, shape.q_len()?)],
        out,
        shape.m_len()?,
    )?;
    let outputs = shape.m_len()?;
    if outputs == 0 {
        return Ok(());
    }
    let device = Arc::clone(out.storage.device());
    let function = device.function(k::NAME, k::LOWRANK_RECONSTRUCT_F32)?;
    let (p_at, qt_at, out_at) = (
        arg(p.range.start)?,
        arg(qt.range.start)?,
        arg(out.range.start)?,
    );
    let (rows, cols, rank) = (arg(shape.rows)?, arg(shape.cols)?, arg(shape.rank)?);
    let (pv, qv) = (p.storage.bytes()?, qt.storage.bytes()?);
    let mut ov = out.storage.bytes_mut()?;
    let mut args = device.stream().launch_builder(&function);
    args.arg(&pv)
        .arg(&p_at)
        .arg(&qv)
        .arg(&qt_at)
        .arg(&mut ov)
        .arg(&out_at)
        .arg(&rows)
        .arg(&cols)
        .arg(&rank);
    #[allow(unsafe_code)]
    // SAFETY: lowrank_reconstruct_f32(const float* p, u64 p_at, const
    // float* qt, u64 qt_at, float* out, u64 out_at, u64 rows, u64 cols,
    // u64 rank) reads p[p_at..+rows rank] and qt[qt_at..+rank cols] and
    // writes out[out_at..+rows cols]: windows checked inside their f32
    // buffers with those lengths, `out` a distinct buffer; grid-stride.
    let result = unsafe { args.launch(grid_stride(outputs)) };
    launched(k::LOWRANK_RECONSTRUCT_F32, result)
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
    let device = Arc::clone(p.storage.device());
    let function = device.function(k::NAME, k::LOWRANK_ORTHONORMALIZE_F32)?;
    let (p_at, rows, rank) = (arg(p.range.start)?, arg(rows)?, arg(rank)?);
    let mut pv = p.storage.bytes_mut()?;
    let mut args = device.stream().launch_builder(&function);
    args.arg(&mut pv).arg(&p_at).arg(&rows).arg(&rank);
    #[allow(unsafe_code)]
    // SAFETY: lowrank_orthonormalize_f32(float* p, u64 p_at, u64 rows, u64
    // rank) reads and writes p[p_at..+rows rank], a window checked inside
    // its f32 buffer with that length; one block of BLOCK threads, as the
    // kernel requires (a block reduction per sum).
    let result = unsafe { args.launch(blocks(1)) };
    launched(k::LOWRANK_ORTHONORMALIZE_F32, result)
}
