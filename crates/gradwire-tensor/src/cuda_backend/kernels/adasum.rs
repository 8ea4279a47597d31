//! AdaSum's pairwise rule of `kernels/cuda/adasum.cu` on f32 device
//! buffers, per tensor range of a fused buffer, as gradwire-algos's
//! `adasum` does on the CPU: the f64 partials `(a.b, |a|^2, |b|^2)` of each
//! tensor over the piece a rank holds ([`partials`], which a distributed
//! AdaSum then all-reduces), and `a = ca a + cb b` from the summed partials
//! ([`combine`]).
//!
//! The partials are added in a fixed order that differs from the CPU's, so
//! they agree with it within the rounding of f64 additions (not bitwise);
//! from the same partials, [`combine`] is bitwise the CPU's.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use gradwire_kernels::adasum as k;

use crate::cuda_backend::CudaStorage;
use crate::cuda_backend::launch::{
    BLOCK, download, launched, len_arg, require_f32, require_len, require_same_device, u32_arg,
    upload, zeros,
};
use crate::error::{Error, Result};

/// Most tensors one launch's grid covers in y (the kernels stride beyond).
const MAX_GRID_Y: usize = 65_535;

/// Block columns per tensor: one per 16 blocks' worth of the longest range,
/// at most 256, so the f64 partials stay few and the launch shape depends
/// only on the ranges.
fn columns(longest: usize) -> usize {
    longest.div_ceil(BLOCK as usize * 16).clamp(1, 256)
}

/// Each tensor's range clipped to `piece`, as the kernels' `(start, end)`
/// pairs (an empty intersection gives `start == end`), and the longest.
fn clipped(tensors: &[Range<usize>], piece: &Range<usize>) -> Result<(Vec<u64>, usize)> {
    let mut ranges = Vec::with_capacity(2 * tensors.len());
    let mut longest = 0;
    for t in tensors {
        let lo = t.start.max(piece.start);
        let hi = t.end.min(piece.end).max(lo);
        longest = longest.max(hi - lo);
        ranges.push(len_arg(lo)?);
        ranges.push(len_arg(hi)?);
    }
    Ok((ranges, longest))
}

fn check(
    op: &'static str,
    a: &CudaStorage,
    b: &CudaStorage,
    tensors: &[Range<usize>],
    piece: &Range<usize>,
) -> Result<()> {
    require_f32(op, a)?;
    require_f32(op, b)?;
    require_same_device(op, a, b)?;
    require_len(op, a.len(), b.len())?;
    let bad = |r: &Range<usize>| r.start > r.end || r.end > a.len();
    if bad(piece) || tensors.iter().any(bad) {
        return Err(Error::InvalidArgument(format!(
            "{op}: ranges {tensors:?} / piece {piece:?} outside {} elements",
            a.len()
        )));
    }
    Ok(())
}

fn grid(x: usize, y: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (
            u32_arg("grid x", x.max(1))?,
            u32_arg("grid y", y.clamp(1, MAX_GRID_Y))?,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// `(a.b, |a|^2, |b|^2)` of every tensor range over `piece`, three f64 per
/// tensor (zeros for a tensor outside the piece), like gradwire-algos's CPU
/// partials within the rounding of f64 additions.
pub fn partials(
    a: &CudaStorage,
    b: &CudaStorage,
    tensors: &[Range<usize>],
    piece: Range<usize>,
) -> Result<Vec<f64>> {
    const OP: &str = "adasum_partials";
    check(OP, a, b, tensors, &piece)?;
    let count = tensors.len();
    if count == 0 {
        return Ok(Vec::new());
    }
    let (ranges, longest) = clipped(tensors, &piece)?;
    if longest == 0 {
        return Ok(vec![0.0; 3 * count]);
    }
    let device = Arc::clone(a.device());
    let stream = device.stream();
    let cols = columns(longest);
    let ranges = upload(&device, &ranges)?;
    let mut column_partials = zeros::<f64>(&device, 3 * count * cols)?;
    let mut sums = zeros::<f64>(&device, 3 * count)?;
    let (count_arg, cols_arg) = (len_arg(count)?, len_arg(cols)?);
    let (av, bv) = (a.bytes()?, b.bytes()?);
    {
        let function = device.function(k::NAME, k::ADASUM_PARTIALS_F32)?;
        let mut args = stream.launch_builder(&function);
        args.arg(&av)
            .arg(&bv)
            .arg(&ranges)
            .arg(&count_arg)
            .arg(&mut column_partials);
        #[allow(unsafe_code)]
        // SAFETY: adasum_partials_f32(const float* a, const float* b, const
        // u64* ranges, u64 tensors, double* partials): every range lies in
        // both buffers (checked, then clipped), `ranges` holds 2 u64 per
        // tensor and `partials` 3 x tensors x gridDim.x doubles; BLOCK
        // threads per block as required.
        let result = unsafe { args.launch(grid(cols, count)?) };
        launched(k::ADASUM_PARTIALS_F32, result)?;
    }
    {
        let function = device.function(k::NAME, k::ADASUM_FINISH_F64)?;
        let mut args = stream.launch_builder(&function);
        args.arg(&column_partials)
            .arg(&count_arg)
            .arg(&cols_arg)
            .arg(&mut sums);
        #[allow(unsafe_code)]
        // SAFETY: adasum_finish_f64(const double* partials, u64 tensors, u64
        // columns, double* sums) reads the 3 x tensors x columns partials
        // written above and writes 3 x tensors sums; BLOCK threads.
        let result = unsafe { args.launch(grid(count.min(4096), 1)?) };
        launched(k::ADASUM_FINISH_F64, result)?;
    }
    download(&device, &sums, 3 * count)
}

/// `a = ca a + cb b` on every tensor range over `piece`, with each tensor's
/// coefficients from its summed partials `sums` (three f64 per tensor, as
/// [`partials`] gives them): `c = 1 - a.b / (2 |x|^2)`, or 1 when `|x|^2` is
/// below `sqrt(f64::MIN_POSITIVE)`; computed in f64, rounded once to f32.
pub fn combine(
    a: &mut CudaStorage,
    b: &CudaStorage,
    tensors: &[Range<usize>],
    piece: Range<usize>,
    sums: &[f64],
) -> Result<()> {
    const OP: &str = "adasum_combine";
    check(OP, a, b, tensors, &piece)?;
    require_len(OP, 3 * tensors.len(), sums.len())?;
    let count = tensors.len();
    let (ranges, longest) = clipped(tensors, &piece)?;
    if count == 0 || longest == 0 {
        return Ok(());
    }
    let device = Arc::clone(a.device());
    let ranges = upload(&device, &ranges)?;
    let sums = upload(&device, sums)?;
    let count_arg = len_arg(count)?;
    let function = device.function(k::NAME, k::ADASUM_COMBINE_F32)?;
    let bv = b.bytes()?;
    let mut av = a.bytes_mut()?;
    let mut args = device.stream().launch_builder(&function);
    args.arg(&mut av)
        .arg(&bv)
        .arg(&ranges)
        .arg(&count_arg)
        .arg(&sums);
    let blocks_x = longest.div_ceil(BLOCK as usize).clamp(1, 1024);
    #[allow(unsafe_code)]
    // SAFETY: adasum_combine_f32(float* a, const float* b, const u64*
    // ranges, u64 tensors, const double* sums): ranges inside both buffers
    // (checked and clipped), 3 sums per tensor (checked), `a` and `b`
    // distinct buffers (`a` borrowed mutably).
    let result = unsafe { args.launch(grid(blocks_x, count)?) };
    launched(k::ADASUM_COMBINE_F32, result)
}

/// The pairwise rule on whole vectors, `a = adasum(a, b)` per tensor range
/// (gradwire-algos's `adasum::pairwise` on the device).
pub fn pairwise(a: &mut CudaStorage, b: &CudaStorage, tensors: &[Range<usize>]) -> Result<()> {
    let all = 0..a.len();
    let sums = partials(a, b, tensors, all.clone())?;
    combine(a, b, tensors, all, &sums)
}
