//! AdaSum: adaptive summation of the ranks' gradients, for any world size.
//!
//! The pairwise rule, per tensor (a layer), with dot products and norms in f64:
//! `adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b`, a
//! coefficient staying 1 where its norm^2 is below `sqrt(f64::MIN_POSITIVE)`.
//! Orthogonal gradients are summed, equal ones averaged; it is
//! scale-equivariant (SPEC §4).
//!
//! Across W ranks it runs as Horovod does, by recursive vector halving and
//! distance doubling: at each level every rank keeps half of its current
//! piece, swaps the other half with its partner (`rank XOR distance`), and the
//! group of `2 x distance` ranks that share the vectors being combined sums
//! their partial (dot, |a|^2, |b|^2) per tensor in one small f64 all-reduce;
//! an all-gather phase in reverse then rebuilds the whole vector. Unlike
//! Horovod (which refuses) and MindSpore (which silently falls back), any
//! W >= 1 works: ranks beyond the largest power of two first fold into a
//! partner, which combines the two with the pairwise rule, and receive the
//! result at the end. W = 1 is the identity.
//!
//! The result is the binary tree of pairwise combinations over ranks in order:
//! first `v[r] = adasum(v[r], v[r + P])` for the folded ranks (P the largest
//! power of two <= W), then `v[r] = adasum(v[r], v[r + d])` for d = 1, 2, 4...
//! (see [`reference()`]), computed with partial sums, so equal to it up to the
//! order of the f64 additions. Every rank receives bitwise the same result.
//!
//! [`AdaSum::hierarchical`] averages within groups of consecutive ranks (a
//! node) first, then runs AdaSum across the groups (MindSpore's scheme).

use crate::error::{AlgoError, Result};
use crate::handle::Traffic;
use gradwire_comm::{Communicator, ReduceOp};
#[cfg(feature = "cuda")]
use gradwire_tensor::CudaStorage;
use gradwire_tensor::{DType, Tensor, flat};
use std::ops::Range;

/// Below this a squared norm counts as zero: its coefficient stays 1.
fn tiny() -> f64 {
    f64::MIN_POSITIVE.sqrt()
}

/// The two coefficients of the pairwise rule from the f64 partials.
fn coefficients(dot: f64, aa: f64, bb: f64) -> (f64, f64) {
    let ca = if aa < tiny() {
        1.0
    } else {
        1.0 - dot / (2.0 * aa)
    };
    let cb = if bb < tiny() {
        1.0
    } else {
        1.0 - dot / (2.0 * bb)
    };
    (ca, cb)
}

/// Partial (dot, |a|^2, |b|^2) of each tensor over `piece`, three values per
/// tensor, in f64.
fn partials(a: &[f32], b: &[f32], tensors: &[Range<usize>], piece: &Range<usize>) -> Vec<f64> {
    let mut out = Vec::with_capacity(3 * tensors.len());
    for t in tensors {
        let (lo, hi) = (t.start.max(piece.start), t.end.min(piece.end));
        let (mut dot, mut aa, mut bb) = (0f64, 0f64, 0f64);
        if lo < hi {
            for (&x, &y) in a[lo..hi].iter().zip(&b[lo..hi]) {
                let (x, y) = (f64::from(x), f64::from(y));
                dot += x * y;
                aa += x * x;
                bb += y * y;
            }
        }
        out.extend([dot, aa, bb]);
    }
    out
}

/// `a = ca a + cb b` per tensor over `piece`, from the summed partials.
fn apply(a: &mut [f32], b: &[f32], tensors: &[Range<usize>], piece: &Range<usize>, sums: &[f64]) {
    for (t, s) in tensors.iter().zip(sums.chunks_exact(3)) {
        let (lo, hi) = (t.start.max(piece.start), t.end.min(piece.end));
        if lo >= hi {
            continue;
        }
        let (ca, cb) = coefficients(s[0], s[1], s[2]);
        for (x, &y) in a[lo..hi].iter_mut().zip(&b[lo..hi]) {
            *x = (ca * f64::from(*x) + cb * f64::from(y)) as f32;
        }
    }
}

/// The pairwise rule on whole vectors: `a = adasum(a, b)`, per tensor range.
pub fn pairwise(a: &mut [f32], b: &[f32], tensors: &[Range<usize>]) -> Result<()> {
    if a.len() != b.len() || tensors.iter().any(|t| t.end > a.len() || t.start > t.end) {
        return Err(AlgoError::InvalidArgument(format!(
            "pairwise: vectors of {} and {} elements, tensor ranges {tensors:?}",
            a.len(),
            b.len()
        )));
    }
    let all = 0..a.len();
    let sums = partials(a, b, tensors, &all);
    apply(a, b, tensors, &all, &sums);
    Ok(())
}

/// The sequential reference: the binary tree of [`pairwise`] combinations
/// that [`AdaSum::combine`] computes, over `vectors` (one per rank).
pub fn reference(mut vectors: Vec<Vec<f32>>, tensors: &[Range<usize>]) -> Result<Vec<f32>> {
    let w = vectors.len();
    if w == 0 {
        return Ok(Vec::new());
    }
    let p = largest_power_of_two(w);
    for r in p..w {
        let b = vectors[r].clone();
        pairwise(&mut vectors[r - p], &b, tensors)?;
    }
    let mut d = 1;
    while d < p {
        for r in (0..p).step_by(2 * d) {
            let b = vectors[r + d].clone();
            pairwise(&mut vectors[r], &b, tensors)?;
        }
        d *= 2;
    }
    Ok(vectors.swap_remove(0))
}

fn largest_power_of_two(w: usize) -> usize {
    if w == 0 {
        0
    } else {
        1 << (usize::BITS - 1 - w.leading_zeros())
    }
}

/// AdaSum over one communicator, with the sub-groups its levels need
/// (created once, collectively, by [`AdaSum::new`]).
#[derive(Debug)]
pub struct AdaSum<C: Communicator> {
    /// Largest power of two <= world size.
    pow2: usize,
    /// For distance 1, 2, 4, ...: the group of `2 x distance` ranks that sum
    /// the partials at that level (None for folded-out ranks).
    levels: Vec<Option<C>>,
    /// Hierarchical: (the node group, AdaSum across nodes for this local rank).
    hierarchy: Option<(C, Box<AdaSum<C>>, C)>,
}

impl<C: Communicator> AdaSum<C> {
    /// Prepares AdaSum on `comm` (collective: every rank calls it).
    pub fn new(comm: &C) -> Result<Self> {
        let w = comm.world_size();
        let r = comm.rank();
        let pow2 = largest_power_of_two(w);
        let mut levels = Vec::new();
        let mut d = 1;
        while d < pow2 {
            let color = (r < pow2).then(|| (r / (2 * d)) as u32);
            levels.push(comm.split(color, r as i64)?);
            d *= 2;
        }
        Ok(AdaSum {
            pow2,
            levels,
            hierarchy: None,
        })
    }

    /// Hierarchical AdaSum: ranks `[g k, g (k + 1))` form node k; gradients
    /// are averaged within the node, then combined with AdaSum across nodes
    /// (among ranks with the same position in their node). `group_size` must
    /// divide the world size.
    pub fn hierarchical(comm: &C, group_size: usize) -> Result<Self> {
        let w = comm.world_size();
        if group_size == 0 || !w.is_multiple_of(group_size) {
            return Err(AlgoError::InvalidArgument(format!(
                "a group size of {group_size} does not divide a world of {w}"
            )));
        }
        let r = comm.rank();
        let node = comm.split(Some((r / group_size) as u32), r as i64)?;
        let across = comm.split(Some((r % group_size) as u32), r as i64)?;
        let (Some(node), Some(across)) = (node, across) else {
            return Err(AlgoError::InvalidArgument("split gave no group".into()));
        };
        let inner = AdaSum::new(&across)?;
        Ok(AdaSum {
            pow2: 0,
            levels: Vec::new(),
            hierarchy: Some((node, Box::new(inner), across)),
        })
    }

    /// Combines `tensors` (each rank's, in place) across the ranks of `comm`,
    /// the communicator this AdaSum was prepared on. Every rank ends with the
    /// same tensors. f16 and bf16 tensors are combined in f32 and rounded once.
    ///
    /// Tensors on a CUDA device (feature `cuda`, all on one device) are
    /// combined there (`AdaSum::combine_device`).
    pub fn combine(&self, comm: &C, tensors: &mut [Tensor]) -> Result<Traffic> {
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let (mut buffer, layout) = flat::pack_new(&refs, DType::F32)?;
        let ranges: Vec<Range<usize>> = (0..layout.len()).filter_map(|i| layout.range(i)).collect();
        let traffic = if buffer.device().is_cpu() {
            self.combine_flat(comm, buffer.as_mut_slice::<f32>()?, &ranges)?
        } else {
            self.combine_on_device(comm, &mut buffer, &ranges)?
        };
        let mut outs: Vec<&mut Tensor> = tensors.iter_mut().collect();
        flat::unpack(&buffer, &layout, &mut outs)?;
        Ok(traffic)
    }

    /// [`AdaSum::combine`] on one flat f32 vector with its tensor ranges.
    pub fn combine_flat(
        &self,
        comm: &C,
        v: &mut [f32],
        tensors: &[Range<usize>],
    ) -> Result<Traffic> {
        if let Some((node, inner, across)) = &self.hierarchy {
            node.all_reduce(v, ReduceOp::Avg)?;
            let mut traffic = Traffic::all_reduce(v.len() * 4, node.world_size());
            traffic += inner.combine_flat(across, v, tensors)?;
            return Ok(traffic);
        }
        let w = comm.world_size();
        let r = comm.rank();
        let n = v.len();
        let bytes = |len: usize| (len * 4) as u64;
        let mut traffic = Traffic::default();
        if w <= 1 {
            return Ok(traffic);
        }
        let p = self.pow2;
        // Fold: ranks beyond the power of two hand their vector to a partner.
        if r >= p {
            comm.send(v, r - p)?;
            comm.recv(v, r - p)?;
            traffic.sent += bytes(n);
            traffic.received += bytes(n);
            return Ok(traffic);
        }
        let mut scratch = vec![0f32; n];
        if r + p < w {
            comm.recv(&mut scratch, r + p)?;
            traffic.received += bytes(n);
            pairwise(v, &scratch, tensors)?;
        }
        // Halving: keep half of the piece, combine it with the partner's.
        let mut pieces = Vec::with_capacity(self.levels.len());
        let mut piece = 0..n;
        let mut d = 1;
        for group in &self.levels {
            let group = group
                .as_ref()
                .ok_or_else(|| AlgoError::InvalidArgument("no level group".into()))?;
            let partner = r ^ d;
            let mid = piece.start + piece.len() / 2;
            let lower = r & d == 0;
            let (keep, give) = if lower {
                (piece.start..mid, mid..piece.end)
            } else {
                (mid..piece.end, piece.start..mid)
            };
            comm.sendrecv(
                &v[give.clone()],
                partner,
                &mut scratch[keep.clone()],
                partner,
            )?;
            traffic.sent += bytes(give.len());
            traffic.received += bytes(keep.len());
            // `a` is always the lower rank's side, `b` the upper's.
            let mut sums = if lower {
                partials(v, &scratch, tensors, &keep)
            } else {
                partials(&scratch, v, tensors, &keep)
            };
            group.all_reduce(&mut sums, ReduceOp::Sum)?;
            traffic += Traffic::all_reduce(sums.len() * 8, group.world_size());
            if lower {
                apply(v, &scratch, tensors, &keep, &sums);
            } else {
                // a = partner's half (in scratch), b = mine: write a's result into v.
                let (lo, hi) = (keep.start, keep.end);
                let mine: Vec<f32> = v[lo..hi].to_vec();
                v[lo..hi].copy_from_slice(&scratch[lo..hi]);
                scratch[lo..hi].copy_from_slice(&mine);
                apply(v, &scratch, tensors, &keep, &sums);
            }
            pieces.push((piece.clone(), keep.clone()));
            piece = keep;
            d *= 2;
        }
        // Gathering, in reverse: swap pieces with the same partners.
        for (level, (parent, keep)) in pieces.into_iter().enumerate().rev() {
            let partner = r ^ (1 << level);
            let other = if keep.start == parent.start {
                keep.end..parent.end
            } else {
                parent.start..keep.start
            };
            let (mine, theirs) = split_two(v, &keep, &other);
            comm.sendrecv(mine, partner, theirs, partner)?;
            traffic.sent += bytes(keep.len());
            traffic.received += bytes(other.len());
        }
        // Unfold: hand the result back to the folded partner.
        if r + p < w {
            comm.send(v, r + p)?;
            traffic.sent += bytes(n);
        }
        Ok(traffic)
    }
}

#[cfg(feature = "cuda")]
impl<C: Communicator> AdaSum<C> {
    fn combine_on_device(
        &self,
        comm: &C,
        buffer: &mut Tensor,
        tensors: &[Range<usize>],
    ) -> Result<Traffic> {
        self.combine_device(comm, buffer.cuda_storage_mut()?, tensors)
    }

    /// [`AdaSum::combine_flat`] on a flat f32 vector in CUDA memory: the
    /// same recursive vector halving, with the partials and the pairwise
    /// combinations computed on the device (gradwire-tensor's AdaSum
    /// kernels) and the pieces exchanged through host buffers with `comm`,
    /// so any communicator carries them. The f64 partials are added in the
    /// device's fixed order, so the result agrees with the CPU's within the
    /// rounding of those sums (bitwise on every rank of one run).
    pub fn combine_device(
        &self,
        comm: &C,
        v: &mut CudaStorage,
        tensors: &[Range<usize>],
    ) -> Result<Traffic> {
        use gradwire_tensor::cuda_backend::kernels::adasum as kernels;
        let n = v.len();
        if v.dtype() != DType::F32 || tensors.iter().any(|t| t.start > t.end || t.end > n) {
            return Err(AlgoError::InvalidArgument(format!(
                "combine_device: a {:?} vector of {n} elements, tensor ranges {tensors:?}",
                v.dtype()
            )));
        }
        if let Some((node, inner, across)) = &self.hierarchy {
            let mut host = download(v, 0..n)?;
            node.all_reduce(&mut host, ReduceOp::Avg)?;
            upload(v, 0, &host)?;
            let mut traffic = Traffic::all_reduce(n * 4, node.world_size());
            traffic += inner.combine_device(across, v, tensors)?;
            return Ok(traffic);
        }
        let w = comm.world_size();
        let r = comm.rank();
        let bytes = |len: usize| (len * 4) as u64;
        let mut traffic = Traffic::default();
        if w <= 1 {
            return Ok(traffic);
        }
        let p = self.pow2;
        if r >= p {
            let mut host = download(v, 0..n)?;
            comm.send(&host, r - p)?;
            comm.recv(&mut host, r - p)?;
            upload(v, 0, &host)?;
            traffic.sent += bytes(n);
            traffic.received += bytes(n);
            return Ok(traffic);
        }
        let mut scratch = CudaStorage::alloc_zeros(n, DType::F32, v.ordinal())?;
        if r + p < w {
            let mut host = vec![0f32; n];
            comm.recv(&mut host, r + p)?;
            traffic.received += bytes(n);
            upload(&mut scratch, 0, &host)?;
            kernels::pairwise(v, &scratch, tensors)?;
        }
        let mut pieces = Vec::with_capacity(self.levels.len());
        let mut piece = 0..n;
        let mut d = 1;
        for group in &self.levels {
            let group = group
                .as_ref()
                .ok_or_else(|| AlgoError::InvalidArgument("no level group".into()))?;
            let partner = r ^ d;
            let mid = piece.start + piece.len() / 2;
            let lower = r & d == 0;
            let (keep, give) = if lower {
                (piece.start..mid, mid..piece.end)
            } else {
                (mid..piece.end, piece.start..mid)
            };
            let outgoing = download(v, give.clone())?;
            let mut incoming = vec![0f32; keep.len()];
            comm.sendrecv(&outgoing, partner, &mut incoming, partner)?;
            upload(&mut scratch, keep.start, &incoming)?;
            traffic.sent += bytes(give.len());
            traffic.received += bytes(keep.len());
            // `a` is always the lower rank's side, `b` the upper's.
            let mut sums = if lower {
                kernels::partials(v, &scratch, tensors, keep.clone())?
            } else {
                kernels::partials(&scratch, v, tensors, keep.clone())?
            };
            group.all_reduce(&mut sums, ReduceOp::Sum)?;
            traffic += Traffic::all_reduce(sums.len() * 8, group.world_size());
            if !lower {
                // a = the partner's half (in scratch), b = mine: swap them so
                // that a's result lands in v.
                let mut mine = CudaStorage::alloc_zeros(keep.len(), DType::F32, v.ordinal())?;
                mine.copy_range_from(0, v, keep.clone())?;
                v.copy_range_from(keep.start, &scratch, keep.clone())?;
                scratch.copy_range_from(keep.start, &mine, 0..keep.len())?;
            }
            kernels::combine(v, &scratch, tensors, keep.clone(), &sums)?;
            pieces.push((piece.clone(), keep.clone()));
            piece = keep;
            d *= 2;
        }
        for (level, (parent, keep)) in pieces.into_iter().enumerate().rev() {
            let partner = r ^ (1 << level);
            let other = if keep.start == parent.start {
                keep.end..parent.end
            } else {
                parent.start..keep.start
            };
            let mine = download(v, keep.clone())?;
            let mut theirs = vec![0f32; other.len()];
            comm.sendrecv(&mine, partner, &mut theirs, partner)?;
            upload(v, other.start, &theirs)?;
            traffic.sent += bytes(keep.len());
            traffic.received += bytes(other.len());
        }
        if r + p < w {
            comm.send(&download(v, 0..n)?, r + p)?;
            traffic.sent += bytes(n);
        }
        Ok(traffic)
    }
}

#[cfg(not(feature = "cuda"))]
impl<C: Communicator> AdaSum<C> {
    fn combine_on_device(&self, _: &C, _: &mut Tensor, _: &[Range<usize>]) -> Result<Traffic> {
        Err(gradwire_tensor::Error::NotCompiledWithCuda.into())
    }
}

/// Elements `range` of a device vector, on the host.
#[cfg(feature = "cuda")]
fn download(v: &CudaStorage, range: Range<usize>) -> Result<Vec<f32>> {
    let mut part = CudaStorage::alloc_zeros(range.len(), DType::F32, v.ordinal())?;
    part.copy_range_from(0, v, range)?;
    match part.to_cpu()? {
        gradwire_tensor::CpuStorage::F32(host) => Ok(host),
        other => Err(AlgoError::InvalidArgument(format!(
            "a device piece of {:?}",
            other.dtype()
        ))),
    }
}

/// Writes `host` into a device vector from element `offset` on.
#[cfg(feature = "cuda")]
fn upload(v: &mut CudaStorage, offset: usize, host: &[f32]) -> Result<()> {
    if host.is_empty() {
        return Ok(());
    }
    let part = CudaStorage::from_cpu(
        &gradwire_tensor::CpuStorage::F32(host.to_vec()),
        v.ordinal(),
    )?;
    v.copy_range_from(offset, &part, 0..host.len())?;
    Ok(())
}

/// Disjoint views `(&v[a], &mut v[b])` of one slice.
fn split_two<'v>(
    v: &'v mut [f32],
    a: &Range<usize>,
    b: &Range<usize>,
) -> (&'v [f32], &'v mut [f32]) {
    if a.start <= b.start {
        let (left, right) = v.split_at_mut(b.start);
        (&left[a.clone()], &mut right[..b.len()])
    } else {
        let (left, right) = v.split_at_mut(a.start);
        (&right[..a.len()], &mut left[b.clone()])
    }
}
