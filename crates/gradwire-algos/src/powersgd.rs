//! PowerSGD over any communicator (Vogels, Karimireddy and Jaggi, NeurIPS
//! 2019; the design of PyTorch DDP's `PowerSGDState` and `powerSGD_hook`):
//! each matrix-shaped gradient travels as two rank-`r` factors instead of
//! its `n x m` values, with error feedback and a warm start.
//!
//! A call of [`PowerSgd::all_reduce`] takes a list of tensors (one bucket)
//! and leaves their average-like approximation in them, the same bits on
//! every rank:
//!
//! - tensors that are not worth compressing (vectors, small matrices: see
//!   [`gradwire_compress::lowrank::matrix_shape`]) travel dense, in the
//!   first all-reduce beside the `P` factors;
//! - each matrix `M` gets this rank's residual added (error feedback), then
//!   `P = M Q`; all `P`s and the dense values are summed in **one**
//!   all-reduce; each `P` is orthonormalised (identically on every rank);
//! - `Q = Mᵀ P` for every matrix, averaged in a **second** all-reduce;
//! - the result is `P Qᵀ`, and the residual keeps `M - P Qᵀ`; the averaged
//!   `Q` is the next step's start (warm start).
//!
//! Before `start_step` every step is a plain dense average (DDP's
//! `start_powerSGD_iter`: compression is harmful while gradients change
//! fast), and the residuals stay empty. Each tensor has a slot (its index
//! in the caller's list of parameters) that keeps its `Q` and residual
//! across steps; slots may be left out of a step (a gradient no rank wrote).
//!
//! Failure model ([`crate::fault`]): every check (CPU f32 tensors, shapes
//! against the slots, non-finite values) happens before the first
//! collective, and a failure is posted in its place. On an error the
//! tensors hold unspecified values and the state may be changed: callers
//! that must undo a failed step keep a copy ([`PowerSgd::state`],
//! [`PowerSgdState`] is cheap to copy into with `clone_from`).

use crate::error::{AlgoError, Result};
use crate::fault::prepare;
use crate::handle::Traffic;
use gradwire_comm::{Communicator, ReduceOp};
use gradwire_compress::lowrank;
use gradwire_tensor::Tensor;
use std::borrow::Cow;

#[cfg(feature = "cuda")]
mod device;
mod strategy;

/// PowerSGD's settings (DDP's names in parentheses).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PowerSgdConfig {
    /// The rank of the approximation (`matrix_approximation_rank`): 1 to 4
    /// in the paper's experiments, which reach full-precision accuracy at
    /// rank 2-4 on ResNet and LSTMs.
    pub rank: usize,
    /// Steps before this one are dense averages (`start_powerSGD_iter`).
    pub start_step: u64,
    /// Compress a matrix only when its factors are more than this many
    /// times smaller (`min_compression_rate`, default 2; strictly, as DDP).
    pub min_compression_rate: f64,
    /// Keep what the approximation misses for the next step
    /// (`use_error_feedback`, default on).
    pub error_feedback: bool,
    /// Start each step's power iteration from the last `Q` (`warm_start`,
    /// default on); otherwise from fresh random `Q`s.
    pub warm_start: bool,
    /// The seed of the random `Q`s (the same on every rank).
    pub seed: u64,
}

impl PowerSgdConfig {
    /// The defaults (DDP's hook's, rank 2, dense for 10 steps), as a
    /// constant for tables of settings.
    pub const DEFAULT: PowerSgdConfig = PowerSgdConfig {
        rank: 2,
        start_step: 10,
        min_compression_rate: 2.0,
        error_feedback: true,
        warm_start: true,
        seed: 0x005E_ED0F_90E5,
    };
}

impl Default for PowerSgdConfig {
    fn default() -> Self {
        PowerSgdConfig::DEFAULT
    }
}

impl PowerSgdConfig {
    /// The settings' checks: a positive rank and a finite rate of at
    /// least 1.
    pub fn validate(&self) -> Result<()> {
        if self.rank == 0 {
            return Err(AlgoError::InvalidArgument(
                "PowerSGD's rank must be positive".into(),
            ));
        }
        if !(self.min_compression_rate.is_finite() && self.min_compression_rate >= 1.0) {
            return Err(AlgoError::InvalidArgument(format!(
                "PowerSGD's min_compression_rate must be finite and at least 1, got {}",
                self.min_compression_rate
            )));
        }
        Ok(())
    }
}

/// What PowerSGD keeps for one tensor between steps.
#[derive(Debug, PartialEq)]
pub struct Slot {
    /// The tensor's shape.
    pub dims: Vec<usize>,
    /// The `Q` factor of a compressed matrix, transposed (`rank x cols`,
    /// row-major);
    /// empty for a tensor sent dense, or before its first compressed step.
    pub q: Vec<f32>,
    /// The error-feedback residual (the tensor's length); empty when none
    /// has been kept yet.
    pub residual: Vec<f32>,
}

impl Clone for Slot {
    fn clone(&self) -> Self {
        Slot {
            dims: self.dims.clone(),
            q: self.q.clone(),
            residual: self.residual.clone(),
        }
    }

    // Reuses the vectors' memory: a copy kept every step allocates nothing.
    fn clone_from(&mut self, source: &Self) {
        self.dims.clone_from(&source.dims);
        self.q.clone_from(&source.q);
        self.residual.clone_from(&source.residual);
    }
}

/// Everything PowerSGD keeps between steps: a [`Slot`] per tensor slot.
#[derive(Debug, Default, PartialEq)]
pub struct PowerSgdState {
    /// By slot; `None` for a slot not seen yet.
    pub slots: Vec<Option<Slot>>,
}

impl Clone for PowerSgdState {
    fn clone(&self) -> Self {
        PowerSgdState {
            slots: self.slots.clone(),
        }
    }

    fn clone_from(&mut self, source: &Self) {
        // Vec's and Option's clone_from reuse what is there.
        self.slots.clone_from(&source.slots);
    }
}

/// Where one tensor's values go in the step's buffers.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// Sent dense, at this offset of the first buffer.
    Dense { at: usize },
    /// Compressed: its `P` at `p` of the first buffer, its `Qᵀ` at `q` of
    /// the second.
    Matrix {
        rows: usize,
        cols: usize,
        p: usize,
        q: usize,
    },
}

/// PowerSGD's state and buffers (reused from step to step: no allocation
/// once every slot has been seen).
#[derive(Debug)]
pub struct PowerSgd {
    config: PowerSgdConfig,
    state: PowerSgdState,
    /// The dense values and every `P`, summed in the first all-reduce.
    first: Vec<f32>,
    /// Every `Q`, averaged in the second.
    second: Vec<f32>,
    /// The step's layout, one part per tensor.
    parts: Vec<Part>,
    /// As a [`crate::Strategy`]: the state before this step's combination.
    before: crate::strategy::BeforeStep<PowerSgdState>,
    /// As a [`crate::Strategy`]: the slots of the written parameters.
    written: Vec<usize>,
    /// The state and buffers on a GPU, once steps run there (CUDA tensors
    /// on a communicator that takes them); the state from then on.
    #[cfg(feature = "cuda")]
    device: Option<Box<device::DeviceState>>,
    /// The device finiteness check's kept cell.
    #[cfg(feature = "cuda")]
    finite_check: Box<gradwire_compress::cuda::DeviceSelectScratch>,
}

impl PowerSgd {
    /// PowerSGD with `config` (checked) and no state yet.
    pub fn new(config: PowerSgdConfig) -> Result<Self> {
        config.validate()?;
        Ok(PowerSgd {
            config,
            state: PowerSgdState::default(),
            first: Vec::new(),
            second: Vec::new(),
            parts: Vec::new(),
            before: Default::default(),
            written: Vec::new(),
            #[cfg(feature = "cuda")]
            device: None,
            #[cfg(feature = "cuda")]
            finite_check: Default::default(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &PowerSgdConfig {
        &self.config
    }

    /// The state kept between steps while they run on the host (empty once
    /// they run on a GPU: see [`PowerSgd::host_state`]).
    pub fn state(&self) -> &PowerSgdState {
        &self.state
    }

    /// The state, to restore (a copy taken before a host step that
    /// failed). A state from elsewhere (a checkpoint) goes through
    /// [`PowerSgd::restore`], which also covers the device form.
    pub fn state_mut(&mut self) -> &mut PowerSgdState {
        &mut self.state
    }

    /// The state in its host form: [`PowerSgd::state`] while the steps run
    /// on the host, a copy of the device state once they run on a GPU
    /// (feature `cuda`), for a checkpoint.
    pub fn host_state(&self) -> Result<Cow<'_, PowerSgdState>> {
        #[cfg(feature = "cuda")]
        if let Some(device) = &self.device {
            return Ok(Cow::Owned(device.to_host()?));
        }
        Ok(Cow::Borrowed(&self.state))
    }

    /// Replaces the state (from a checkpoint): the host form becomes the
    /// state; the next step on a GPU moves it there.
    pub fn restore(&mut self, state: PowerSgdState) {
        self.state = state;
        self.before.forget();
        #[cfg(feature = "cuda")]
        {
            self.device = None;
        }
    }

    /// The step is over: a step that ran on a GPU puts its device state
    /// back as the step found it unless `kept` (it failed or was skipped on
    /// some rank). A host step called directly keeps no copy here: its
    /// caller keeps one of [`PowerSgd::state`] and puts it back through
    /// [`PowerSgd::state_mut`]; as a [`crate::Strategy`], PowerSGD keeps
    /// its own (`Strategy::end_step`).
    pub fn end_step(&mut self, kept: bool) {
        #[cfg(feature = "cuda")]
        if let Some(device) = &mut self.device {
            device.end_step(kept);
        }
        let _ = kept;
    }

    /// Averages `tensors` across the ranks of `comm` (see the module docs):
    /// tensor `i` uses slot `slots[i]`; `step` is the optimizer's step
    /// (the same on every rank). Returns the bytes moved.
    pub fn all_reduce<C: Communicator>(
        &mut self,
        comm: &C,
        tensors: &mut [Tensor],
        slots: &[usize],
        step: u64,
    ) -> Result<Traffic> {
        #[cfg(feature = "cuda")]
        if comm.takes_device_tensors() && tensors.iter().any(|t| !t.device().is_cpu()) {
            return self.all_reduce_on_device(comm, tensors, slots, step);
        }
        let world = comm.world_size();
        let compress = step >= self.config.start_step;
        let (n_first, n_second) = prepare(comm, || self.lay_out(tensors, slots, step, compress))?;
        comm.all_reduce(&mut self.first[..n_first], ReduceOp::Sum)?;
        let mut traffic = Traffic::all_reduce(n_first * 4, world);
        let inverse = 1.0 / world as f32;
        let rank = self.config.rank;
        // Dense parts averaged; each P orthonormalised and projected back.
        for (t, part) in tensors.iter_mut().zip(&self.parts) {
            match *part {
                Part::Dense { at } => {
                    let out = t.as_mut_slice::<f32>()?;
                    let n = out.len();
                    for (o, s) in out.iter_mut().zip(&self.first[at..at + n]) {
                        *o = s * inverse;
                    }
                }
                Part::Matrix { rows, cols, p, q } => {
                    let p = &mut self.first[p..p + rows * rank];
                    lowrank::orthonormalize(p, rows, rank)?;
                    let m = t.as_slice::<f32>()?;
                    lowrank::project_back(m, rows, cols, p, &mut self.second[q..q + cols * rank])?;
                }
            }
        }
        if n_second == 0 {
            return Ok(traffic);
        }
        comm.all_reduce(&mut self.second[..n_second], ReduceOp::Sum)?;
        traffic += Traffic::all_reduce(n_second * 4, world);
        for v in &mut self.second[..n_second] {
            *v *= inverse;
        }
        for ((t, part), &slot) in tensors.iter_mut().zip(&self.parts).zip(slots) {
            let Part::Matrix { rows, cols, p, q } = *part else {
                continue;
            };
            let (p, q) = (
                &self.first[p..p + rows * rank],
                &self.second[q..q + cols * rank],
            );
            // Checked present by lay_out.
            let Some(Some(state)) = self.state.slots.get_mut(slot) else {
                continue;
            };
            if self.config.warm_start {
                state.q.clear();
                state.q.extend_from_slice(q);
            }
            let m = t.as_mut_slice::<f32>()?;
            if self.config.error_feedback {
                // residual <- P Qᵀ, then M <- P Qᵀ and residual <- M - P Qᵀ.
                lowrank::reconstruct(p, q, rows, cols, &mut state.residual)?;
                for (m, r) in m.iter_mut().zip(state.residual.iter_mut()) {
                    let approx = *r;
                    *r = *m - approx;
                    *m = approx;
                }
            } else {
                lowrank::reconstruct(p, q, rows, cols, m)?;
            }
        }
        Ok(traffic)
    }

    /// This rank's part before the first collective: the checks, the
    /// layout, the residuals added, the `P`s computed. Returns the lengths
    /// of the two buffers.
    fn lay_out(
        &mut self,
        tensors: &mut [Tensor],
        slots: &[usize],
        step: u64,
        compress: bool,
    ) -> Result<(usize, usize)> {
        check_slot_count(tensors, slots)?;
        for t in tensors.iter() {
            crate::error::require_f32_on_host("PowerSGD", t)?;
            if !t.is_zeroed()
                && let Some((index, &value)) = t
                    .as_slice::<f32>()?
                    .iter()
                    .enumerate()
                    .find(|(_, v)| !v.is_finite())
            {
                return Err(gradwire_compress::CompressError::NonFinite { index, value }.into());
            }
        }
        let rank = self.config.rank;
        let state = &self.state;
        let (n_first, n_second) = plan(
            &mut self.parts,
            tensors,
            slots,
            rank,
            self.config.min_compression_rate,
            compress,
            |slot, dims| match state.slots.get(slot) {
                Some(Some(kept)) if kept.dims != dims => Some(kept.dims.clone()),
                _ => None,
            },
        )?;
        if let Some(&most) = slots.iter().max()
            && self.state.slots.len() <= most
        {
            self.state.slots.resize(most + 1, None);
        }
        if self.first.len() < n_first {
            self.first.resize(n_first, 0.0);
        }
        if self.second.len() < n_second {
            self.second.resize(n_second, 0.0);
        }
        for ((t, part), &slot) in tensors.iter_mut().zip(&self.parts).zip(slots) {
            let state = self.state.slots[slot].get_or_insert_with(|| Slot {
                dims: t.dims().to_vec(),
                q: Vec::new(),
                residual: Vec::new(),
            });
            match *part {
                Part::Dense { at } => {
                    let values = t.as_slice::<f32>()?;
                    self.first[at..at + values.len()].copy_from_slice(values);
                }
                Part::Matrix { rows, cols, p, .. } => {
                    let m = t.as_mut_slice::<f32>()?;
                    if self.config.error_feedback {
                        if state.residual.len() == m.len() {
                            for (m, r) in m.iter_mut().zip(&state.residual) {
                                *m += r;
                            }
                        } else {
                            state.residual.clear();
                            state.residual.resize(m.len(), 0.0);
                        }
                    }
                    if !self.config.warm_start || state.q.len() != cols * rank {
                        state.q.clear();
                        state.q.resize(cols * rank, 0.0);
                        let seed =
                            initial_q_seed(self.config.seed, slot, self.config.warm_start, step);
                        lowrank::init_q(seed, &mut state.q);
                    }
                    lowrank::project(m, rows, cols, &state.q, &mut self.first[p..p + rows * rank])?;
                }
            }
        }
        Ok((n_first, n_second))
    }
}

/// One slot per tensor.
fn check_slot_count(tensors: &[Tensor], slots: &[usize]) -> Result<()> {
    if slots.len() == tensors.len() {
        Ok(())
    } else {
        Err(AlgoError::InvalidArgument(format!(
            "PowerSGD: {} tensors but {} slots",
            tensors.len(),
            slots.len()
        )))
    }
}

/// The seed of a slot's fresh `Q`: per slot, and per step without warm
/// start; the same on every rank (and on the host and a GPU).
fn initial_q_seed(seed: u64, slot: usize, warm_start: bool, step: u64) -> u64 {
    let salt = if warm_start { 0 } else { step };
    seed ^ (slot as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// The step's layout, the same on the host and a GPU: one part per tensor
/// (sent dense at an offset of the first buffer, or compressed with its
/// `P` and `Qᵀ` offsets), after the slots' checks (a slot given twice; a
/// slot whose kept shape, `kept_dims(slot, dims)` when it differs, is not
/// the tensor's). Returns the lengths of the two buffers.
fn plan(
    parts: &mut Vec<Part>,
    tensors: &[Tensor],
    slots: &[usize],
    rank: usize,
    min_rate: f64,
    compress: bool,
    mut kept_dims: impl FnMut(usize, &[usize]) -> Option<Vec<usize>>,
) -> Result<(usize, usize)> {
    parts.clear();
    let (mut n_first, mut n_second) = (0usize, 0usize);
    for (t, &slot) in tensors.iter().zip(slots) {
        if let Some(kept) = kept_dims(slot, t.dims()) {
            return Err(AlgoError::InvalidArgument(format!(
                "PowerSGD: slot {slot} held a tensor of shape {kept:?}, now {:?}",
                t.dims()
            )));
        }
        if slots[..parts.len()].contains(&slot) {
            return Err(AlgoError::InvalidArgument(format!(
                "PowerSGD: slot {slot} given twice"
            )));
        }
        let matrix = lowrank::matrix_shape(t.dims(), rank, min_rate).filter(|_| compress);
        parts.push(match matrix {
            Some((rows, cols)) => {
                let part = Part::Matrix {
                    rows,
                    cols,
                    p: n_first,
                    q: n_second,
                };
                n_first += rows * rank;
                n_second += cols * rank;
                part
            }
            None => {
                let part = Part::Dense { at: n_first };
                n_first += t.len();
                part
            }
        });
    }
    Ok((n_first, n_second))
}
