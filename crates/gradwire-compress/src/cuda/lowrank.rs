//! PowerSGD's low-rank products of [`crate::lowrank`] on CUDA device
//! buffers: each matrix or factor is a [`Window`] (an f32 range of a
//! storage, as PowerSGD keeps every matrix's factors side by side in one
//! buffer per all-reduce), checked as the CPU checks its slices, with the
//! CPU's errors.
//!
//! [`project`], [`project_back`] and [`reconstruct`] give the CPU's bits;
//! [`orthonormalize`] gives the same bits on every run and every GPU, and
//! the CPU's within a few f32 ulps (its f64 sums are block reductions, in a
//! different order from the CPU's sequential ones). A PowerSGD world keeps
//! its ranks on one kind of device, so each step's factors agree bitwise
//! across ranks either way.

use crate::cuda::kernels::lowrank::{self as kernels, LowRankShape};

pub use crate::cuda::kernels::lowrank::{Window, WindowMut};

use crate::error::Result;
use crate::lowrank::{check_orthonormalize, check_project, check_project_back, check_reconstruct};

/// `p = m q` ([`crate::lowrank::project`]): `m` is `rows x cols`, `qt` is
/// `Qᵀ` (`rank x cols`), `p` (written) is `rows x rank`.
pub fn project(
    m: &Window<'_>,
    rows: usize,
    cols: usize,
    qt: &Window<'_>,
    p: &mut WindowMut<'_>,
) -> Result<()> {
    let rank = check_project(rows, cols, m.len(), qt.len(), p.len())?;
    Ok(kernels::project(
        m,
        qt,
        p,
        LowRankShape { rows, cols, rank },
    )?)
}

/// `qt = (mᵀ p)ᵀ` ([`crate::lowrank::project_back`]): `m` is
/// `rows x cols`, `p` is `rows x rank`, `qt` (written) is `rank x cols`.
pub fn project_back(
    m: &Window<'_>,
    rows: usize,
    cols: usize,
    p: &Window<'_>,
    qt: &mut WindowMut<'_>,
) -> Result<()> {
    let rank = check_project_back(rows, cols, m.len(), p.len(), qt.len())?;
    Ok(kernels::project_back(
        m,
        p,
        qt,
        LowRankShape { rows, cols, rank },
    )?)
}

/// `out = p qᵀ` ([`crate::lowrank::reconstruct`]): `p` is `rows x rank`,
/// `qt` is `Qᵀ` (`rank x cols`), `out` (written) is `rows x cols`.
pub fn reconstruct(
    p: &Window<'_>,
    qt: &Window<'_>,
    rows: usize,
    cols: usize,
    out: &mut WindowMut<'_>,
) -> Result<()> {
    let rank = check_reconstruct(rows, cols, p.len(), qt.len(), out.len())?;
    Ok(kernels::reconstruct(
        p,
        qt,
        out,
        LowRankShape { rows, cols, rank },
    )?)
}

/// Makes the columns of `p` (`rows x rank`, row-major) orthonormal in
/// place ([`crate::lowrank::orthonormalize`]: modified Gram-Schmidt with
/// f64 sums, each projection twice, a column with no direction left
/// zeroed).
pub fn orthonormalize(p: &mut WindowMut<'_>, rows: usize, rank: usize) -> Result<()> {
    check_orthonormalize(p.len(), rows, rank)?;
    Ok(kernels::orthonormalize(p, rows, rank)?)
}
