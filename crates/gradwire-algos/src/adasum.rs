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
//!
//! The pairwise rule and its reference are in `rule.rs`, the halving's
//! exchanges in `halving.rs`, over a vector in host memory (`host.rs`) or
//! on a CUDA device (`device.rs`, `kernels.rs`).

use crate::error::{AlgoError, Result};
use crate::fault::fail;
use crate::handle::Traffic;
use gradwire_comm::Communicator;
#[cfg(feature = "cuda")]
use gradwire_tensor::CudaStorage;
#[cfg(feature = "cuda")]
use gradwire_tensor::DType;
use gradwire_tensor::{Tensor, flat};
use rule::largest_power_of_two;
use std::ops::Range;

#[cfg(feature = "cuda")]
mod device;
mod halving;
mod host;
#[cfg(feature = "cuda")]
pub mod kernels;
mod rule;

pub use rule::{pairwise, reference};

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
