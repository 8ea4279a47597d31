//! The halving's workspace in host memory: the rank's vector and a reused
//! scratch for the partner's pieces.

use super::halving::Workspace;
use super::rule::{apply, pairwise_in, partials};
use super::{AdaSum, HalvingBuffers};
use crate::error::{AlgoError, Result};
use crate::handle::Traffic;
use gradwire_comm::Communicator;
use std::ops::Range;

impl<C: Communicator> AdaSum<C> {
    /// The halving of a vector in host memory, in `buffers`.
    pub(super) fn halving_on_host(
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
