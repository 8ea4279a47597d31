//! The recursive vector halving and distance doubling that every
//! combination runs, over a [`Workspace`] in host or device memory, and the
//! agreement on the inputs before its first exchange.

use super::AdaSum;
use crate::error::{AlgoError, Result};
use crate::fault::fail;
use crate::handle::Traffic;
use gradwire_comm::{Communicator, ReduceOp};
use std::ops::Range;

impl<C: Communicator> AdaSum<C> {
    /// The agreement before the first exchange (the failure model,
    /// [`crate::fault`]): this rank's local checks (`local`, and that its
    /// tensor ranges lie in the vector) and that every rank passed a vector
    /// of the same length, in one all-reduce of two words on `comm`. A rank
    /// whose checks fail posts the fault there instead, so every rank
    /// returns an error from this collective and none is left waiting in an
    /// exchange.
    pub(super) fn agree_inputs(
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
    pub(super) fn halving<W: Workspace>(
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

/// AdaSum's vector (the rank's, combined in place) and a scratch vector of
/// the same length for the partner's pieces, as [`AdaSum::halving`] uses
/// them. Pieces cross to the communicator as host slices, handed to the
/// closures; the arithmetic runs where the memory is.
pub(super) trait Workspace {
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
