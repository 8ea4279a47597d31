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

use gradwire_kernels::{adasum as k, plan};
use gradwire_tensor::cuda_backend::DeviceVec;
use gradwire_tensor::cuda_backend::launch::{
    Launch, require_f32, require_len, require_same_device,
};
use gradwire_tensor::{CudaStorage, Error, Result};

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
    let (ranges, longest) = plan::adasum_ranges(tensors, &piece);
    if longest == 0 {
        return Ok(vec![0.0; 3 * count]);
    }
    let device = a.device();
    // The launch plans are gradwire-kernels' (`plan::adasum_*`), shared with
    // gradwire-kernels-host's tests of these kernels.
    let cols = plan::adasum_columns(longest);
    let ranges = DeviceVec::from_host(device, &ranges)?;
    let mut column_partials = DeviceVec::<f64>::zeros(device, 3 * count * cols)?;
    let mut sums = DeviceVec::<f64>::zeros(device, 3 * count)?;
    Launch::new(device, &k::ADASUM_PARTIALS_F32)
        .read(a)
        .read(b)
        .len(a.len())
        .read(&ranges)
        .len(count)
        .write(&mut column_partials)
        .run(plan::adasum_partials(longest, count))?;
    Launch::new(device, &k::ADASUM_FINISH_F64)
        .read(&column_partials)
        .len(count)
        .len(cols)
        .write(&mut sums)
        .run(plan::adasum_finish(count))?;
    sums.to_host()
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
    let (ranges, longest) = plan::adasum_ranges(tensors, &piece);
    if count == 0 || longest == 0 {
        return Ok(());
    }
    let device = a.device().clone();
    let ranges = DeviceVec::from_host(&device, &ranges)?;
    let sums = DeviceVec::from_host(&device, sums)?;
    let n = a.len();
    Launch::new(&device, &k::ADASUM_COMBINE_F32)
        .write(a)
        .read(b)
        .len(n)
        .read(&ranges)
        .len(count)
        .read(&sums)
        .run(plan::adasum_combine(longest, count))
}

/// The pairwise rule on whole vectors, `a = adasum(a, b)` per tensor range
/// (gradwire-algos's `adasum::pairwise` on the device).
pub fn pairwise(a: &mut CudaStorage, b: &CudaStorage, tensors: &[Range<usize>]) -> Result<()> {
    let all = 0..a.len();
    let sums = partials(a, b, tensors, all.clone())?;
    combine(a, b, tensors, all, &sums)
}
