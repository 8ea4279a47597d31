//! PowerSGD on CUDA tensors (feature `cuda`), for a communicator that
//! reduces device tensors ([`Communicator::takes_device_tensors`]:
//! NcclComm): the same step as the host form, with the gradients, both
//! factor buffers, every slot's `Qᵀ` and residual in device memory and the
//! products of gradwire-compress's `cuda::lowrank`.
//!
//! Every elementwise step is bitwise the host's (the device `axpy`,
//! `scale` and copies are); the products are bitwise, the
//! orthonormalisation within a few ulps (its f64 sums are block
//! reductions), so a device run follows a host run within rounding, and
//! every rank of a device world computes the same bits (the same kernels
//! on the same summed `P`).
//!
//! The host [`PowerSgdState`] stays the form checkpoints read and write:
//! the first device step moves it to the device (`DeviceState`), which
//! is the state from then on (the host form is left empty);
//! [`PowerSgd::host_state`] copies it back, and [`PowerSgd::restore`]
//! replaces it. A step keeps a copy of the device
//! state that [`PowerSgd::end_step`] puts back when the step failed or was
//! skipped: kept from step to step and written in place (a steady step's
//! copy allocates nothing; the first is a clone, which shares memory until
//! written), the two swapped by a failed step.

use std::borrow::Cow;

use gradwire_comm::{Communicator, ReduceOp};
use gradwire_compress::cuda::kernels::select::first_non_finite;
use gradwire_compress::cuda::lowrank::{self as products, Window, WindowMut};
use gradwire_compress::{CompressError, lowrank};
use gradwire_tensor::{CpuStorage, CudaStorage, DType, Device, Tensor};

use super::{Part, PowerSgd, PowerSgdState, Slot, check_slot_count, initial_q_seed};
use crate::error::{AlgoError, Result};
use crate::fault::prepare;
use crate::handle::Traffic;

/// One slot's state on the device: its `Qᵀ` (`rank x cols`) and its
/// residual (the tensor's shape), each absent until first needed.
#[derive(Debug, Clone)]
struct DeviceSlot {
    dims: Vec<usize>,
    q: Option<CudaStorage>,
    residual: Option<Tensor>,
}

impl DeviceSlot {
    /// Makes this slot a copy of `other`: in place, on the device, where
    /// the two are alike (shape, and a `Qᵀ` and residual of the same
    /// length on the same device, or none), else as a clone.
    fn copy_from(&mut self, other: &DeviceSlot) -> Result<()> {
        let q_alike = match (&self.q, &other.q) {
            (Some(a), Some(b)) => a.len() == b.len() && a.ordinal() == b.ordinal(),
            (a, b) => a.is_none() && b.is_none(),
        };
        let residual_alike = match (&self.residual, &other.residual) {
            (Some(a), Some(b)) => a.len() == b.len() && a.device() == b.device(),
            (a, b) => a.is_none() && b.is_none(),
        };
        if self.dims != other.dims || !q_alike || !residual_alike {
            *self = other.clone();
            return Ok(());
        }
        if let (Some(q), Some(other)) = (self.q.as_mut(), other.q.as_ref()) {
            q.copy_from(other)?;
        }
        if let (Some(residual), Some(other)) = (self.residual.as_mut(), other.residual.as_ref()) {
            residual.cuda_storage_mut()?.copy_from(&*storage(other)?)?;
        }
        Ok(())
    }
}

/// PowerSGD's state and step buffers on one CUDA device.
#[derive(Debug, Clone)]
pub(super) struct DeviceState {
    ordinal: usize,
    slots: Vec<Option<DeviceSlot>>,
    /// The slots as the current step found them, kept between steps.
    before: Option<Vec<Option<DeviceSlot>>>,
    /// Whether a step is under way (`before` is its copy).
    taken: bool,
    /// The dense values and every `P` (first all-reduce), every `Qᵀ`
    /// (second), exactly the step's lengths.
    first: Option<Tensor>,
    second: Option<Tensor>,
}

fn storage(t: &Tensor) -> Result<Cow<'_, CudaStorage>> {
    Ok(t.cuda_storage()?)
}

/// A device f32 storage holding `values`.
fn upload(values: &[f32], ordinal: usize) -> Result<CudaStorage> {
    Ok(CudaStorage::from_cpu(
        &CpuStorage::F32(values.to_vec()),
        ordinal,
    )?)
}

/// `slot` holding an f32 tensor of exactly `len` elements on `device`.
fn exact(slot: &mut Option<Tensor>, len: usize, device: Device) -> Result<&mut Tensor> {
    if slot.as_ref().is_none_or(|t| t.len() != len) {
        *slot = Some(Tensor::zeros(len, DType::F32, device)?);
    }
    slot.as_mut()
        .ok_or_else(|| AlgoError::InvalidArgument("a device buffer went missing".into()))
}

impl DeviceState {
    /// `host` moved to device `ordinal`.
    fn from_host(host: &PowerSgdState, ordinal: usize) -> Result<DeviceState> {
        let device = Device::Cuda(ordinal);
        let slots = host
            .slots
            .iter()
            .map(|slot| {
                let Some(slot) = slot else { return Ok(None) };
                let q = (!slot.q.is_empty())
                    .then(|| upload(&slot.q, ordinal))
                    .transpose()?;
                let residual = (!slot.residual.is_empty())
                    .then(|| -> Result<Tensor> {
                        Ok(Tensor::from_vec(slot.residual.clone(), slot.dims.clone())?
                            .to_device(device)?)
                    })
                    .transpose()?;
                Ok(Some(DeviceSlot {
                    dims: slot.dims.clone(),
                    q,
                    residual,
                }))
            })
            .collect::<Result<_>>()?;
        Ok(DeviceState {
            ordinal,
            slots,
            before: None,
            taken: false,
            first: None,
            second: None,
        })
    }

    /// The step is over: the slots go back to what the step found unless
    /// `kept`.
    pub(super) fn end_step(&mut self, kept: bool) {
        if std::mem::take(&mut self.taken)
            && !kept
            && let Some(before) = self.before.as_mut()
        {
            std::mem::swap(&mut self.slots, before);
        }
    }

    /// The slots copied aside before a step: into the copy kept from
    /// earlier steps, slot by slot, where they are alike.
    fn keep_copy(&mut self) -> Result<()> {
        match self.before.as_mut() {
            Some(before) if before.len() == self.slots.len() => {
                for (kept, slot) in before.iter_mut().zip(&self.slots) {
                    match (kept, slot) {
                        (Some(kept), Some(slot)) => kept.copy_from(slot)?,
                        (kept, slot) => kept.clone_from(slot),
                    }
                }
            }
            _ => self.before = Some(self.slots.clone()),
        }
        self.taken = true;
        Ok(())
    }

    /// The state copied to the host.
    pub(super) fn to_host(&self) -> Result<PowerSgdState> {
        let slots = self
            .slots
            .iter()
            .map(|slot| {
                let Some(slot) = slot else { return Ok(None) };
                let q = match &slot.q {
                    Some(q) => q.read_f32(0..q.len())?,
                    None => Vec::new(),
                };
                let residual = match &slot.residual {
                    Some(r) => r.to_device(Device::Cpu)?.to_vec::<f32>()?,
                    None => Vec::new(),
                };
                Ok(Some(Slot {
                    dims: slot.dims.clone(),
                    q,
                    residual,
                }))
            })
            .collect::<Result<_>>()?;
        Ok(PowerSgdState { slots })
    }
}

impl PowerSgd {
    /// [`PowerSgd::all_reduce`] on CUDA tensors, on a communicator that
    /// takes device tensors.
    pub(super) fn all_reduce_on_device<C: Communicator>(
        &mut self,
        comm: &C,
        tensors: &mut [Tensor],
        slots: &[usize],
        step: u64,
    ) -> Result<Traffic> {
        let world = comm.world_size();
        let compress = step >= self.config.start_step;
        prepare(comm, || {
            self.lay_out_on_device(tensors, slots, step, compress)
        })?;
        let rank = self.config.rank;
        let inverse = 1.0 / world as f32;
        let Some(device) = self.device.as_mut() else {
            return Err(AlgoError::InvalidArgument(
                "PowerSGD's device state went missing".into(),
            ));
        };
        let (Some(first), mut second) = (device.first.as_mut(), device.second.as_mut()) else {
            return Err(AlgoError::InvalidArgument(
                "PowerSGD's device buffers went missing".into(),
            ));
        };
        comm.all_reduce_tensor(first, ReduceOp::Sum)?;
        let mut traffic = Traffic::all_reduce(first.len() * 4, world);
        let n_second = second.as_ref().map_or(0, |s| s.len());
        let parts = &self.parts;
        // This rank's work between the collectives: a failure is posted in
        // place of the second one.
        prepare(comm, || -> Result<()> {
            for (t, part) in tensors.iter_mut().zip(parts) {
                match *part {
                    Part::Dense { at } => {
                        let n = t.len();
                        let summed = storage(first)?;
                        t.cuda_storage_mut()?
                            .copy_range_from(0, &summed, at..at + n)?;
                        t.scale(inverse)?;
                    }
                    Part::Matrix { rows, cols, p, q } => {
                        let p = p..p + rows * rank;
                        products::orthonormalize(
                            &mut WindowMut::new(first.cuda_storage_mut()?, p.clone())?,
                            rows,
                            rank,
                        )?;
                        let (Some(second), summed) = (second.as_deref_mut(), storage(first)?)
                        else {
                            continue;
                        };
                        let m = storage(t)?;
                        products::project_back(
                            &Window::whole(&m)?,
                            rows,
                            cols,
                            &Window::new(&summed, p)?,
                            &mut WindowMut::new(second.cuda_storage_mut()?, q..q + cols * rank)?,
                        )?;
                    }
                }
            }
            Ok(())
        })?;
        let Some(second) = second.filter(|_| n_second > 0) else {
            return Ok(traffic);
        };
        comm.all_reduce_tensor(second, ReduceOp::Sum)?;
        traffic += Traffic::all_reduce(n_second * 4, world);
        second.scale(inverse)?;
        // After the last collective: a failure here (a device error) is
        // posted in place of this rank's next collective.
        let mut finish = || -> Result<()> {
            let (first, second) = (storage(first)?, storage(second)?);
            for ((t, part), &slot) in tensors.iter_mut().zip(&self.parts).zip(slots) {
                let Part::Matrix { rows, cols, p, q } = *part else {
                    continue;
                };
                let q_range = q..q + cols * rank;
                let (p, q) = (
                    Window::new(&first, p..p + rows * rank)?,
                    Window::new(&second, q_range.clone())?,
                );
                // Checked present by the layout.
                let Some(Some(state)) = device.slots.get_mut(slot) else {
                    continue;
                };
                if self.config.warm_start
                    && let Some(kept) = state.q.as_mut()
                {
                    kept.copy_range_from(0, &second, q_range)?;
                }
                match (self.config.error_feedback, state.residual.as_mut()) {
                    (true, Some(residual)) => {
                        // residual <- P Qᵀ; M <- M - P Qᵀ; then the two swap:
                        // M holds P Qᵀ and the residual M - P Qᵀ, as on the host.
                        products::reconstruct(
                            &p,
                            &q,
                            rows,
                            cols,
                            &mut WindowMut::whole(residual.cuda_storage_mut()?)?,
                        )?;
                        t.axpy(-1.0, residual)?;
                        std::mem::swap(t, residual);
                    }
                    _ => {
                        products::reconstruct(
                            &p,
                            &q,
                            rows,
                            cols,
                            &mut WindowMut::whole(t.cuda_storage_mut()?)?,
                        )?;
                    }
                }
            }
            Ok(())
        };
        finish().map_err(|e| crate::fault::fail(comm, e))?;
        Ok(traffic)
    }

    /// The device step's part before the first collective: the checks (as
    /// the host's, plus the device), the layout, the residuals added, the
    /// `P`s computed. Keeps the device state as it was for `end_step`.
    fn lay_out_on_device(
        &mut self,
        tensors: &mut [Tensor],
        slots: &[usize],
        step: u64,
        compress: bool,
    ) -> Result<()> {
        check_slot_count(tensors, slots)?;
        let ordinal = match tensors.first().map(Tensor::device) {
            Some(Device::Cuda(ordinal)) => ordinal,
            _ => self.device.as_ref().map_or(0, |d| d.ordinal),
        };
        for t in tensors.iter() {
            if t.dtype() != DType::F32 || t.device() != Device::Cuda(ordinal) {
                return Err(AlgoError::InvalidArgument(format!(
                    "PowerSGD on a GPU runs on f32 tensors of CUDA device {ordinal}, got {} on {:?}",
                    t.dtype(),
                    t.device()
                )));
            }
            if !t.is_zeroed()
                && let Some(index) = first_non_finite(&*storage(t)?, &mut self.finite_check)?
            {
                let value = storage(t)?.read_f32(index..index + 1)?;
                return Err(CompressError::NonFinite {
                    index,
                    value: value.first().copied().unwrap_or(f32::NAN),
                }
                .into());
            }
        }
        if self.device.as_ref().is_none_or(|d| d.ordinal != ordinal) {
            self.device = Some(Box::new(DeviceState::from_host(&self.state, ordinal)?));
            // The device copy is the state now: a stale host copy would only
            // be copied by callers keeping `state()` before each step.
            self.state = PowerSgdState::default();
        }
        let rank = self.config.rank;
        let min_rate = self.config.min_compression_rate;
        let (warm_start, error_feedback, seed) = (
            self.config.warm_start,
            self.config.error_feedback,
            self.config.seed,
        );
        let Some(device) = self.device.as_mut() else {
            return Err(AlgoError::InvalidArgument(
                "PowerSGD's device state went missing".into(),
            ));
        };
        device.keep_copy()?;
        let (n_first, n_second) = super::plan(
            &mut self.parts,
            tensors,
            slots,
            rank,
            min_rate,
            compress,
            |slot, dims| match device.slots.get(slot) {
                Some(Some(state)) if state.dims != dims => Some(state.dims.clone()),
                _ => None,
            },
        )?;
        if let Some(&most) = slots.iter().max()
            && device.slots.len() <= most
        {
            device.slots.resize(most + 1, None);
        }
        let cuda = Device::Cuda(ordinal);
        let first = exact(&mut device.first, n_first, cuda)?;
        for ((t, part), &slot) in tensors.iter_mut().zip(&self.parts).zip(slots) {
            let state = device.slots[slot].get_or_insert_with(|| DeviceSlot {
                dims: t.dims().to_vec(),
                q: None,
                residual: None,
            });
            match *part {
                Part::Dense { at } => {
                    let values = storage(t)?;
                    first
                        .cuda_storage_mut()?
                        .copy_range_from(at, &values, 0..values.len())?;
                }
                Part::Matrix { rows, cols, p, .. } => {
                    if error_feedback {
                        match &state.residual {
                            Some(residual) if residual.len() == t.len() => t.axpy(1.0, residual)?,
                            _ => {
                                state.residual =
                                    Some(Tensor::zeros(t.dims().to_vec(), DType::F32, cuda)?)
                            }
                        }
                    }
                    if !warm_start || state.q.as_ref().is_none_or(|q| q.len() != cols * rank) {
                        let mut q = vec![0f32; cols * rank];
                        lowrank::init_q(initial_q_seed(seed, slot, warm_start, step), &mut q);
                        state.q = Some(upload(&q, ordinal)?);
                    }
                    let q = state.q.as_ref().ok_or_else(|| {
                        AlgoError::InvalidArgument("PowerSGD's Q went missing".into())
                    })?;
                    let m = storage(t)?;
                    products::project(
                        &Window::whole(&m)?,
                        rows,
                        cols,
                        &Window::whole(q)?,
                        &mut WindowMut::new(first.cuda_storage_mut()?, p..p + rows * rank)?,
                    )?;
                }
            }
        }
        if n_second > 0 {
            exact(&mut device.second, n_second, cuda)?;
        } else {
            device.second = None;
        }
        Ok(())
    }
}
