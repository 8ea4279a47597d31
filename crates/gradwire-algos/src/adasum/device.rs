//! The halving's workspace in CUDA memory (feature `cuda`): the vector,
//! the partner's pieces and a spare half on the device.

use super::halving::Workspace;
use super::kernels;
use crate::error::Result;
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

    fn read_vector(&self, range: Range<usize>, f: impl FnOnce(&[f32]) -> Result<()>) -> Result<()> {
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
