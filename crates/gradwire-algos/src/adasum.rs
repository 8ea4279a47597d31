//! AdaSum: adaptive summation of the ranks' gradients, for any world size.
//!
//! The pairwise rule, per tensor (a layer), with dot products and norms in f64:
//! `adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b`, a
//! coefficient staying 1 where its norm^2 is below `sqrt(f64::MIN_POSITIVE)`.
//! Orthogonal gradients are summed, equal ones averaged; it is
//! scale-equivariant, so averaging within a node first is consistent.
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
use crate::fault::fail;
use crate::handle::Traffic;
use gradwire_comm::{Communicator, ReduceOp};
#[cfg(feature = "cuda")]
use gradwire_tensor::CudaStorage;
#[cfg(feature = "cuda")]
use gradwire_tensor::DType;
use gradwire_tensor::{Tensor, flat};
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
/// tensor, in f64, into `out` (refilled).
fn partials(
    a: &[f32],
    b: &[f32],
    tensors: &[Range<usize>],
    piece: &Range<usize>,
    out: &mut Vec<f64>,
) {
    out.clear();
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
    pairwise_in(a, b, tensors, &mut Vec::with_capacity(3 * tensors.len()));
    Ok(())
}

/// [`pairwise`] of checked inputs, with the partials in `sums`.
fn pairwise_in(a: &mut [f32], b: &[f32], tensors: &[Range<usize>], sums: &mut Vec<f64>) {
    let all = 0..a.len();
    partials(a, b, tensors, &all, sums);
    apply(a, b, tensors, &all, sums);
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
    /// The buffers of [`AdaSum::combine_reusing_buffers`].
    buffers: AdaSumBuffers,
}

/// The memory one AdaSum combination works in, kept by a caller that
/// combines every step ([`AdaSum::combine_with`]): the packed vector, the
/// partner's pieces, the halving's bookkeeping and the f64 partials. They
/// grow to the largest size seen and are reused, so that a combination of
/// CPU tensors allocates nothing once warm (on a backend whose collectives
/// allocate none, such as LocalComm). `Default` is empty.
#[derive(Debug, Default)]
pub struct AdaSumBuffers {
    /// The tensors packed back to back, in f32.
    flat: Vec<f32>,
    /// Each tensor's range of `flat`.
    ranges: Vec<Range<usize>>,
    /// The halving's own buffers.
    halving: HalvingBuffers,
}

/// What [`AdaSum::halving`] reuses: the partner's pieces, the pieces kept
/// at each level, and the partials.
#[derive(Debug, Default)]
struct HalvingBuffers {
    scratch: Vec<f32>,
    pieces: Vec<(Range<usize>, Range<usize>)>,
    sums: Vec<f64>,
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
            buffers: AdaSumBuffers::default(),
        })
    }

    /// AdaSum flat ([`AdaSum::new`]) or, with `group`, hierarchical over
    /// groups of that size ([`AdaSum::hierarchical`]): the form a
    /// configuration names.
    pub fn grouped(comm: &C, group: Option<usize>) -> Result<Self> {
        match group {
            Some(group) => AdaSum::hierarchical(comm, group),
            None => AdaSum::new(comm),
        }
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
            buffers: AdaSumBuffers::default(),
        })
    }

    /// Combines `tensors` (each rank's, in place) across the ranks of `comm`,
    /// the communicator this AdaSum was prepared on. Every rank ends with the
    /// same tensors. f16 and bf16 tensors are combined in f32 and rounded once.
    ///
    /// Tensors on a CUDA device (feature `cuda`, all on one device) are
    /// combined there (`AdaSum::combine_device`).
    pub fn combine(&self, comm: &C, tensors: &mut [Tensor]) -> Result<Traffic> {
        self.combine_with(comm, tensors, &mut AdaSumBuffers::default())
    }

    /// [`AdaSum::combine`] working in this AdaSum's own buffers, kept from
    /// call to call: for a caller that holds it mutably and combines every
    /// step (DistOpt's strategy). See [`AdaSum::combine_with`].
    pub fn combine_reusing_buffers(&mut self, comm: &C, tensors: &mut [Tensor]) -> Result<Traffic> {
        let mut buffers = std::mem::take(&mut self.buffers);
        let result = self.combine_with(comm, tensors, &mut buffers);
        self.buffers = buffers;
        result
    }

    /// [`AdaSum::combine`] working in `buffers`, reused from call to call:
    /// the same result, bit for bit, and for CPU tensors no allocation once
    /// they have grown.
    pub fn combine_with(
        &self,
        comm: &C,
        tensors: &mut [Tensor],
        buffers: &mut AdaSumBuffers,
    ) -> Result<Traffic> {
        // Without `cuda` no tensor lives on a device: the default build
        // runs the featured one's CPU path.
        #[cfg(feature = "cuda")]
        if !tensors.iter().all(|t| t.device().is_cpu()) {
            return self.combine_packed_on_device(comm, tensors);
        }
        let AdaSumBuffers {
            flat: flat_buf,
            ranges,
            halving,
        } = buffers;
        let n = match flat::pack_into(tensors, flat_buf) {
            Ok(n) => n,
            Err(e) => return Err(fail(comm, e.into())),
        };
        ranges.clear();
        let mut offset = 0;
        for t in tensors.iter() {
            ranges.push(offset..offset + t.len());
            offset += t.len();
        }
        let v = &mut flat_buf[..n];
        let agreed = self.agree_inputs(comm, n, ranges, Ok(()))?;
        let traffic = agreed + self.halving_on_host(comm, v, ranges, halving)?;
        flat::unpack_from(v, tensors)?;
        Ok(traffic)
    }

    /// [`AdaSum::combine`] of tensors not all in CPU memory: packed into
    /// one buffer on their device (feature `cuda`, one device).
    #[cfg(feature = "cuda")]
    fn combine_packed_on_device(&self, comm: &C, tensors: &mut [Tensor]) -> Result<Traffic> {
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let (mut buffer, layout) = match flat::pack_new(&refs, DType::F32) {
            Ok(packed) => packed,
            Err(e) => return Err(fail(comm, e.into())),
        };
        // Not all in CPU memory, so the buffer is on the first tensor's
        // device (pack_new refuses a mix).
        let ranges: Vec<Range<usize>> = (0..layout.len()).filter_map(|i| layout.range(i)).collect();
        let traffic = self.combine_on_device(comm, &mut buffer, &ranges)?;
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
        let agreed = self.agree_inputs(comm, v.len(), tensors, Ok(()))?;
        Ok(agreed + self.halving_on_host(comm, v, tensors, &mut HalvingBuffers::default())?)
    }

    /// The halving of a vector in host memory, in `buffers`.
    fn halving_on_host(
        &self,
        comm: &C,
        v: &mut [f32],
        tensors: &[Range<usize>],
        buffers: &mut HalvingBuffers,
    ) -> Result<Traffic> {
        let HalvingBuffers {
            scratch,
            pieces,
            sums,
        } = buffers;
        let mut ws = HostWorkspace {
            v,
            scratch,
            filled: false,
        };
        self.halving(comm, &mut ws, tensors, pieces, sums)
    }

    /// The agreement before the first exchange (the failure model,
    /// [`crate::fault`]): this rank's local checks (`local`, and that its
    /// tensor ranges lie in the vector) and that every rank passed a vector
    /// of the same length, in one all-reduce of two words on `comm`. A rank
    /// whose checks fail posts the fault there instead, so every rank
    /// returns an error from this collective and none is left waiting in an
    /// exchange.
    fn agree_inputs(
        &self,
        comm: &C,
        n: usize,
        tensors: &[Range<usize>],
        local: Result<()>,
    ) -> Result<Traffic> {
        let local =
            local.and_then(
                |()| match tensors.iter().find(|t| t.start > t.end || t.end > n) {
                    Some(bad) => Err(AlgoError::InvalidArgument(format!(
                        "AdaSum: tensor range {bad:?} outside a vector of {n} elements"
                    ))),
                    None => Ok(()),
                },
            );
        if let Err(e) = local {
            return Err(fail(comm, e));
        }
        let len = n as u64;
        let mut lengths = [len, !len];
        comm.all_reduce(&mut lengths, ReduceOp::Max)?;
        let (longest, shortest) = (lengths[0], !lengths[1]);
        if longest != shortest {
            return Err(AlgoError::InvalidArgument(format!(
                "AdaSum: the ranks passed vectors of {shortest} to {longest} elements"
            )));
        }
        Ok(Traffic::all_reduce(16, comm.world_size()))
    }

    /// AdaSum's recursive vector halving / distance doubling on `ws`, the
    /// vector and its scratch wherever they live (host or device): written
    /// once so that both run the same exchanges in the same order.
    fn halving<W: Workspace>(
        &self,
        comm: &C,
        ws: &mut W,
        tensors: &[Range<usize>],
        pieces: &mut Vec<(Range<usize>, Range<usize>)>,
        sums: &mut Vec<f64>,
    ) -> Result<Traffic> {
        // The ranges were checked by `agree_inputs`, on every rank.
        let n = ws.len();
        if let Some((node, inner, across)) = &self.hierarchy {
            ws.update_vector(0..n, |v| Ok(node.all_reduce(v, ReduceOp::Avg)?))?;
            let mut traffic = Traffic::all_reduce(n * 4, node.world_size());
            traffic += inner.halving(across, ws, tensors, pieces, sums)?;
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
        // Fold: ranks beyond the power of two hand their vector to a partner.
        if r >= p {
            ws.read_vector(0..n, |v| Ok(comm.send(v, r - p)?))?;
            ws.receive_vector(0..n, |v| Ok(comm.recv(v, r - p)?))?;
            traffic.sent += bytes(n);
            traffic.received += bytes(n);
            return Ok(traffic);
        }
        if r + p < w {
            ws.receive_scratch(0..n, |s| Ok(comm.recv(s, r + p)?))?;
            traffic.received += bytes(n);
            ws.pairwise(tensors, sums)?;
        }
        // Halving: keep half of the piece, combine it with the partner's.
        pieces.clear();
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
            ws.exchange_into_scratch(give.clone(), keep.clone(), |out, inc| {
                Ok(comm.sendrecv(out, partner, inc, partner)?)
            })?;
            traffic.sent += bytes(give.len());
            traffic.received += bytes(keep.len());
            // `a` is always the lower rank's side, `b` the upper's.
            ws.partials(lower, tensors, &keep, sums)?;
            group.all_reduce(sums, ReduceOp::Sum)?;
            traffic += Traffic::all_reduce(sums.len() * 8, group.world_size());
            if !lower {
                // a = the partner's half (in scratch), b = mine: swap them so
                // that a's result lands in the vector.
                ws.swap(&keep)?;
            }
            ws.combine(tensors, &keep, sums)?;
            pieces.push((piece.clone(), keep.clone()));
            piece = keep;
            d *= 2;
        }
        // Gathering, in reverse: swap pieces with the same partners.
        for (level, (parent, keep)) in pieces.drain(..).enumerate().rev() {
            let partner = r ^ (1 << level);
            let other = if keep.start == parent.start {
                keep.end..parent.end
            } else {
                parent.start..keep.start
            };
            ws.exchange_within_vector(keep.clone(), other.clone(), |mine, theirs| {
                Ok(comm.sendrecv(mine, partner, theirs, partner)?)
            })?;
            traffic.sent += bytes(keep.len());
            traffic.received += bytes(other.len());
        }
        // Unfold: hand the result back to the folded partner.
        if r + p < w {
            ws.read_vector(0..n, |v| Ok(comm.send(v, r + p)?))?;
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
        let len = v.len();
        // The workspace's device memory is allocated here, before the first
        // collective: a failed allocation travels to every rank through the
        // agreement, never between two exchanges with a partner.
        let workspace = if v.dtype() == DType::F32 {
            device::DeviceWorkspace::new(v)
        } else {
            Err(gradwire_tensor::Error::DTypeMismatch {
                op: "AdaSum::combine_device",
                expected: DType::F32,
                got: v.dtype(),
            }
            .into())
        };
        let (workspace, local) = match workspace {
            Ok(ws) => (Some(ws), Ok(())),
            Err(e) => (None, Err(e)),
        };
        let agreed = self.agree_inputs(comm, len, tensors, local)?;
        let mut ws = workspace.ok_or_else(device::no_workspace)?;
        let (mut pieces, mut sums) = (Vec::new(), Vec::new());
        Ok(agreed + self.halving(comm, &mut ws, tensors, &mut pieces, &mut sums)?)
    }
}

/// AdaSum's vector (the rank's, combined in place) and a scratch vector of
/// the same length for the partner's pieces, as [`AdaSum::halving`] uses
/// them. Pieces cross to the communicator as host slices, handed to the
/// closures; the arithmetic runs where the memory is.
trait Workspace {
    /// The vector's length.
    fn len(&self) -> usize;
    /// `f` reads elements `range` of the vector.
    fn read_vector(&self, range: Range<usize>, f: impl FnOnce(&[f32]) -> Result<()>) -> Result<()>;
    /// `f` overwrites elements `range` of the vector (by default an
    /// update; a workspace that stages pieces can skip reading them).
    fn receive_vector(
        &mut self,
        range: Range<usize>,
        f: impl FnOnce(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        self.update_vector(range, f)
    }
    /// `f` updates elements `range` of the vector in place.
    fn update_vector(
        &mut self,
        range: Range<usize>,
        f: impl FnOnce(&mut [f32]) -> Result<()>,
    ) -> Result<()>;
    /// `f` overwrites elements `range` of the scratch.
    fn receive_scratch(
        &mut self,
        range: Range<usize>,
        f: impl FnOnce(&mut [f32]) -> Result<()>,
    ) -> Result<()>;
    /// `f` reads the vector's `give` and overwrites the scratch's `keep`.
    fn exchange_into_scratch(
        &mut self,
        give: Range<usize>,
        keep: Range<usize>,
        f: impl FnOnce(&[f32], &mut [f32]) -> Result<()>,
    ) -> Result<()>;
    /// `f` reads the vector's `mine` and overwrites its disjoint `other`.
    fn exchange_within_vector(
        &mut self,
        mine: Range<usize>,
        other: Range<usize>,
        f: impl FnOnce(&[f32], &mut [f32]) -> Result<()>,
    ) -> Result<()>;
    /// vector = pairwise(vector, scratch), per tensor (`sums` is room for
    /// the partials).
    fn pairwise(&mut self, tensors: &[Range<usize>], sums: &mut Vec<f64>) -> Result<()>;
    /// The partials over `keep` into `out`, with `a` the vector when
    /// `vector_is_a`, else the scratch.
    fn partials(
        &self,
        vector_is_a: bool,
        tensors: &[Range<usize>],
        keep: &Range<usize>,
        out: &mut Vec<f64>,
    ) -> Result<()>;
    /// Swaps the vector's and the scratch's `keep`.
    fn swap(&mut self, keep: &Range<usize>) -> Result<()>;
    /// vector = ca vector + cb scratch over `keep`, from the summed partials.
    fn combine(
        &mut self,
        tensors: &[Range<usize>],
        keep: &Range<usize>,
        sums: &[f64],
    ) -> Result<()>;
}

/// The vector in host memory, and the scratch (a reused buffer, grown on
/// first use: folded ranks never need it).
struct HostWorkspace<'v> {
    v: &'v mut [f32],
    scratch: &'v mut Vec<f32>,
    /// Whether the scratch was handed out in this combination (before that,
    /// it holds nothing of it).
    filled: bool,
}

impl HostWorkspace<'_> {
    /// The vector and the scratch (grown now if need be), disjointly.
    fn parts(&mut self) -> (&mut [f32], &mut [f32]) {
        let n = self.v.len();
        if self.scratch.len() < n {
            self.scratch.resize(n, 0.0);
        }
        self.filled = true;
        (&mut *self.v, &mut self.scratch[..n])
    }
}

/// The range of a slice, or the error of a range outside it.
fn piece<'s>(s: &'s [f32], range: &Range<usize>) -> Result<&'s [f32]> {
    s.get(range.clone())
        .ok_or_else(|| AlgoError::InvalidArgument(format!("AdaSum: piece {range:?} out of range")))
}

fn piece_mut<'s>(s: &'s mut [f32], range: &Range<usize>) -> Result<&'s mut [f32]> {
    s.get_mut(range.clone())
        .ok_or_else(|| AlgoError::InvalidArgument(format!("AdaSum: piece {range:?} out of range")))
}

/// The scratch of a workspace that has one ([`AdaSum::halving`] fills it
/// before it reads it).
fn no_scratch() -> AlgoError {
    AlgoError::InvalidArgument("AdaSum: the scratch was read before it was written".into())
}

impl Workspace for HostWorkspace<'_> {
    fn len(&self) -> usize {
        self.v.len()
    }

    fn read_vector(&self, range: Range<usize>, f: impl FnOnce(&[f32]) -> Result<()>) -> Result<()> {
        f(piece(self.v, &range)?)
    }

    fn update_vector(
        &mut self,
        range: Range<usize>,
        f: impl FnOnce(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        f(piece_mut(self.v, &range)?)
    }

    fn receive_scratch(
        &mut self,
        range: Range<usize>,
        f: impl FnOnce(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        f(piece_mut(self.parts().1, &range)?)
    }

    fn exchange_into_scratch(
        &mut self,
        give: Range<usize>,
        keep: Range<usize>,
        f: impl FnOnce(&[f32], &mut [f32]) -> Result<()>,
    ) -> Result<()> {
        let (v, scratch) = self.parts();
        f(piece(v, &give)?, piece_mut(scratch, &keep)?)
    }

    fn exchange_within_vector(
        &mut self,
        mine: Range<usize>,
        other: Range<usize>,
        f: impl FnOnce(&[f32], &mut [f32]) -> Result<()>,
    ) -> Result<()> {
        let (mine, theirs) = split_two(self.v, &mine, &other);
        f(mine, theirs)
    }

    fn pairwise(&mut self, tensors: &[Range<usize>], sums: &mut Vec<f64>) -> Result<()> {
        let (v, scratch) = self.parts();
        // The ranges were checked by `agree_inputs`; the lengths are equal.
        pairwise_in(v, scratch, tensors, sums);
        Ok(())
    }

    fn partials(
        &self,
        vector_is_a: bool,
        tensors: &[Range<usize>],
        keep: &Range<usize>,
        out: &mut Vec<f64>,
    ) -> Result<()> {
        if !self.filled {
            return Err(no_scratch());
        }
        let scratch = &self.scratch[..self.v.len()];
        if vector_is_a {
            partials(self.v, scratch, tensors, keep, out);
        } else {
            partials(scratch, self.v, tensors, keep, out);
        }
        Ok(())
    }

    fn swap(&mut self, keep: &Range<usize>) -> Result<()> {
        let (v, scratch) = self.parts();
        piece_mut(v, keep)?.swap_with_slice(piece_mut(scratch, keep)?);
        Ok(())
    }

    fn combine(
        &mut self,
        tensors: &[Range<usize>],
        keep: &Range<usize>,
        sums: &[f64],
    ) -> Result<()> {
        let (v, scratch) = self.parts();
        apply(v, scratch, tensors, keep, sums);
        Ok(())
    }
}

#[cfg(feature = "cuda")]
pub mod kernels;

/// The workspace in CUDA memory (feature `cuda`).
#[cfg(feature = "cuda")]
mod device {
    use super::kernels;
    use super::{Result, Workspace};
    use gradwire_tensor::{CudaStorage, DType};
    use std::ops::Range;

    /// The vector on the device, its scratch (the partner's pieces) and a
    /// spare half for swaps, all allocated when the workspace is made,
    /// before any exchange. Pieces are staged through host buffers for the
    /// communicator.
    pub(super) struct DeviceWorkspace<'v> {
        v: &'v mut CudaStorage,
        scratch: CudaStorage,
        spare: CudaStorage,
    }

    /// The error of a workspace that the agreement says exists but does not
    /// (unreachable: the agreement fails on every rank when one has none).
    pub(super) fn no_workspace() -> crate::AlgoError {
        crate::AlgoError::InvalidArgument("AdaSum's device workspace is missing".into())
    }

    impl<'v> DeviceWorkspace<'v> {
        pub(super) fn new(v: &'v mut CudaStorage) -> Result<Self> {
            let (len, ordinal) = (v.len(), v.ordinal());
            // A swapped piece is at most the first level's half.
            let scratch = CudaStorage::alloc_zeros(len, DType::F32, ordinal)?;
            let spare = CudaStorage::alloc_zeros(len.div_ceil(2), DType::F32, ordinal)?;
            Ok(DeviceWorkspace { v, scratch, spare })
        }
    }

    impl Workspace for DeviceWorkspace<'_> {
        fn len(&self) -> usize {
            self.v.len()
        }

        fn read_vector(
            &self,
            range: Range<usize>,
            f: impl FnOnce(&[f32]) -> Result<()>,
        ) -> Result<()> {
            f(&self.v.read_f32(range)?)
        }

        fn receive_vector(
            &mut self,
            range: Range<usize>,
            f: impl FnOnce(&mut [f32]) -> Result<()>,
        ) -> Result<()> {
            let mut host = vec![0f32; range.len()];
            f(&mut host)?;
            Ok(self.v.write_f32(range.start, &host)?)
        }

        fn update_vector(
            &mut self,
            range: Range<usize>,
            f: impl FnOnce(&mut [f32]) -> Result<()>,
        ) -> Result<()> {
            let mut host = self.v.read_f32(range.clone())?;
            f(&mut host)?;
            Ok(self.v.write_f32(range.start, &host)?)
        }

        fn receive_scratch(
            &mut self,
            range: Range<usize>,
            f: impl FnOnce(&mut [f32]) -> Result<()>,
        ) -> Result<()> {
            let mut host = vec![0f32; range.len()];
            f(&mut host)?;
            Ok(self.scratch.write_f32(range.start, &host)?)
        }

        fn exchange_into_scratch(
            &mut self,
            give: Range<usize>,
            keep: Range<usize>,
            f: impl FnOnce(&[f32], &mut [f32]) -> Result<()>,
        ) -> Result<()> {
            let outgoing = self.v.read_f32(give)?;
            let mut incoming = vec![0f32; keep.len()];
            f(&outgoing, &mut incoming)?;
            Ok(self.scratch.write_f32(keep.start, &incoming)?)
        }

        fn exchange_within_vector(
            &mut self,
            mine: Range<usize>,
            other: Range<usize>,
            f: impl FnOnce(&[f32], &mut [f32]) -> Result<()>,
        ) -> Result<()> {
            let outgoing = self.v.read_f32(mine)?;
            let mut incoming = vec![0f32; other.len()];
            f(&outgoing, &mut incoming)?;
            Ok(self.v.write_f32(other.start, &incoming)?)
        }

        fn pairwise(&mut self, tensors: &[Range<usize>], _: &mut Vec<f64>) -> Result<()> {
            Ok(kernels::pairwise(self.v, &self.scratch, tensors)?)
        }

        fn partials(
            &self,
            vector_is_a: bool,
            tensors: &[Range<usize>],
            keep: &Range<usize>,
            out: &mut Vec<f64>,
        ) -> Result<()> {
            let scratch = &self.scratch;
            *out = if vector_is_a {
                kernels::partials(self.v, scratch, tensors, keep.clone())?
            } else {
                kernels::partials(scratch, self.v, tensors, keep.clone())?
            };
            Ok(())
        }

        fn swap(&mut self, keep: &Range<usize>) -> Result<()> {
            // Through the spare half, allocated with the workspace: nothing
            // is allocated between the exchanges.
            let (v, scratch, spare) = (&mut *self.v, &mut self.scratch, &mut self.spare);
            spare.copy_range_from(0, v, keep.clone())?;
            v.copy_range_from(keep.start, scratch, keep.clone())?;
            scratch.copy_range_from(keep.start, spare, 0..keep.len())?;
            Ok(())
        }

        fn combine(
            &mut self,
            tensors: &[Range<usize>],
            keep: &Range<usize>,
            sums: &[f64],
        ) -> Result<()> {
            Ok(kernels::combine(
                self.v,
                &self.scratch,
                tensors,
                keep.clone(),
                sums,
            )?)
        }
    }
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

/// AdaSum as a bucket's strategy: orthogonal gradients add, identical ones
/// average, so the result is used as it is (`averaged`). Prepare it with
/// [`AdaSum::new`] (or [`AdaSum::hierarchical`]) on the caller's
/// communicator, on every rank.
impl<C: Communicator + 'static> crate::Strategy<C> for AdaSum<C> {
    fn combine(
        &mut self,
        comm: &C,
        _bucket: &crate::BucketView<'_>,
        tensors: &mut [Tensor],
    ) -> Result<crate::Combined> {
        // Its own buffers, reused every step: no allocation once warm.
        let traffic = self.combine_reusing_buffers(comm, tensors)?;
        Ok(crate::Combined {
            traffic,
            averaged: true,
        })
    }
}
