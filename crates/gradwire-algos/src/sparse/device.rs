//! The sparse strategy on CUDA tensors (feature `cuda`): the bucket's
//! error-feedback residual lives in device memory ([`CudaErrorFeedback`])
//! and the exchange is [`sparse_exchange_on_device`], so the gradient never
//! leaves the GPU; only the selection travels through host memory.
//!
//! The host residual of [`SparseSelect`] stays the form checkpoints are
//! saved from and restored into: the first device step (and the first
//! after a restore) moves it to the bucket's device, and from then on the
//! device copy is the memory ([`DeviceResidual`]). A bucket only partly
//! written in a step takes its written ranges through host memory (a copy
//! each way, only in such steps).

use super::SparseSelect;
use crate::device::sparse_exchange_on_device;
use crate::error::{AlgoError, Result};
use crate::fault::{fail, prepare};
use crate::strategy::{BucketView, Combined};
use gradwire_comm::Communicator;
use gradwire_compress::cuda::CudaErrorFeedback;
use gradwire_compress::{ErrorFeedback, SparseCodec};
use gradwire_tensor::Tensor;
use std::ops::Range;

/// The device residual of a sparse bucket, and its copy from before the
/// current step (put back when the step fails or is skipped). The copy is
/// kept between steps and written in place (a step's copy allocates
/// nothing); a failed step swaps the two.
#[derive(Debug, Default)]
pub(super) struct DeviceResidual {
    memory: Option<CudaErrorFeedback>,
    before: Option<CudaErrorFeedback>,
    taken: bool,
}

impl DeviceResidual {
    /// The memory on device `ordinal`, moved there from `host` unless it
    /// already is.
    fn ensure(&mut self, host: &ErrorFeedback, ordinal: usize) -> Result<&mut CudaErrorFeedback> {
        let fits = self
            .memory
            .as_ref()
            .is_some_and(|m| m.len() == host.len() && m.residual().ordinal() == ordinal);
        if !fits {
            self.memory = Some(CudaErrorFeedback::from_state(host.state(), ordinal)?);
        }
        self.memory
            .as_mut()
            .ok_or_else(|| AlgoError::InvalidArgument("the device residual went missing".into()))
    }

    /// The memory copied aside before a step: into the copy kept from
    /// earlier steps where there is one.
    fn keep_copy(&mut self) -> Result<()> {
        match (&mut self.before, &self.memory) {
            (Some(before), Some(memory)) => before.copy_from(memory)?,
            (before, memory) => before.clone_from(memory),
        }
        self.taken = true;
        Ok(())
    }

    /// The step is over: the memory goes back to its copy unless `kept`
    /// (the two swap: the step's memory is the next copy's buffer).
    pub(super) fn end_step(&mut self, kept: bool) {
        if std::mem::take(&mut self.taken) && !kept {
            std::mem::swap(&mut self.memory, &mut self.before);
        }
    }

    /// The memory copied to the host, when it lives on a device (for a
    /// checkpoint).
    pub(super) fn host_copy(&self) -> Result<Option<ErrorFeedback>> {
        let Some(memory) = &self.memory else {
            return Ok(None);
        };
        Ok(Some(ErrorFeedback::from_state(memory.state()?)?))
    }

    /// Forgets the device memory: the host residual was restored from a
    /// checkpoint and is the memory again.
    pub(super) fn forget(&mut self) {
        *self = DeviceResidual::default();
    }
}

/// The written `ranges` of `whole`, as a memory of their own on `ordinal`.
fn load_parts(
    whole: &CudaErrorFeedback,
    ranges: &[Range<usize>],
    ordinal: usize,
) -> Result<CudaErrorFeedback> {
    let host = ErrorFeedback::from_state(whole.state()?)?;
    let mut sub = ErrorFeedback::new(0);
    sub.load_parts(&host, ranges)?;
    Ok(CudaErrorFeedback::from_state(sub.state(), ordinal)?)
}

/// `sub`, the memory of the written `ranges`, stored back into `whole`.
fn store_parts(
    sub: &CudaErrorFeedback,
    whole: &mut CudaErrorFeedback,
    ranges: &[Range<usize>],
    ordinal: usize,
) -> Result<()> {
    let mut host = ErrorFeedback::from_state(whole.state()?)?;
    ErrorFeedback::from_state(sub.state()?)?.store_parts(&mut host, ranges)?;
    *whole = CudaErrorFeedback::from_state(host.state(), ordinal)?;
    Ok(())
}

impl SparseSelect {
    /// [`crate::Strategy::combine`] for a bucket of CUDA tensors on device
    /// `ordinal`.
    pub(super) fn combine_on_device<C: Communicator>(
        &mut self,
        comm: &C,
        bucket: &BucketView<'_>,
        tensors: &mut [Tensor],
        codec: &SparseCodec,
        ordinal: usize,
    ) -> Result<Combined> {
        let Some(host) = self.residual.as_ref() else {
            let traffic = sparse_exchange_on_device(comm, tensors, codec, None, &mut self.fusion)?;
            return Ok(Combined {
                traffic,
                averaged: false,
            });
        };
        let device = &mut self.device;
        prepare(comm, || {
            device.ensure(host, ordinal)?;
            device.keep_copy()
        })?;
        let Some(memory) = device.memory.as_mut() else {
            return Err(fail(
                comm,
                AlgoError::InvalidArgument("the device residual went missing".into()),
            ));
        };
        let traffic = if bucket.written.iter().all(|&w| w) {
            sparse_exchange_on_device(comm, tensors, codec, Some(memory), &mut self.fusion)?
        } else {
            // Only the written parameters take part: their part of the
            // residual goes through the step, the rest stays as it is.
            let mut ranges = Vec::new();
            bucket.written_ranges(&mut ranges);
            let mut sub = prepare(comm, || load_parts(memory, &ranges, ordinal))?;
            let traffic =
                sparse_exchange_on_device(comm, tensors, codec, Some(&mut sub), &mut self.fusion)?;
            // After the last collective: a failure here (a device copy) is
            // posted in place of the rank's next one.
            store_parts(&sub, memory, &ranges, ordinal).map_err(|e| fail(comm, e))?;
            traffic
        };
        Ok(Combined {
            traffic,
            averaged: false,
        })
    }
}
