//! [`Optim`]: an [`UpdateRule`] and the bookkeeping every optimizer shares:
//! the global step, the default and per-parameter configurations, and
//! per-parameter state (an update count and named f32 buffers).
//!
//! Parameters may be f32, f16 or bf16; the update is computed in f32 (buffers
//! are f32) and rounded once into the parameter's dtype.
//!
//! With the `cuda` feature a parameter may live on a CUDA device: its update
//! runs there (the rule's `UpdateRule::cuda_kernel`, bitwise the CPU
//! update) and its buffers stay in device memory between steps. They are
//! copied out only for [`Optimizer::state`] (a checkpoint), and move with
//! the parameter if it is later updated on the other side. The kernels read
//! the gradient in the parameter's dtype, so on the device the two must
//! match (the CPU widens any gradient to f32 first).

use crate::error::{OptimError, Result};
use crate::optimizer::{Optimizer, StateBuffers, UpdateRule};
#[cfg(feature = "cuda")]
use crate::rules::cuda::{UpdateKernel, apply_update};
use crate::state::{OptimizerState, ParamState};
#[cfg(feature = "cuda")]
use gradwire_tensor::CudaStorage;
use gradwire_tensor::{DType, Tensor};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// `into` made equal to `from`, in `into`'s memory where the buffers are
/// already there (the same names and lengths): no allocation then.
fn copy_param_states(into: &mut BTreeMap<String, ParamState>, from: &BTreeMap<String, ParamState>) {
    into.retain(|name, _| from.contains_key(name));
    for (name, state) in from {
        match into.get_mut(name) {
            Some(saved) if saved.buffers.keys().eq(state.buffers.keys()) => {
                saved.updates = state.updates;
                saved.shape.clone_from(&state.shape);
                for (dst, src) in saved.buffers.values_mut().zip(state.buffers.values()) {
                    dst.clone_from(src);
                }
            }
            Some(saved) => *saved = state.clone(),
            None => {
                into.insert(name.clone(), state.clone());
            }
        }
    }
}

/// An optimizer made of an [`UpdateRule`] and the shared bookkeeping.
#[derive(Debug, Clone)]
pub struct Optim<R: UpdateRule> {
    config: R::Config,
    overrides: BTreeMap<String, R::Config>,
    params: BTreeMap<String, ParamState>,
    step: u64,
    /// The buffers of parameters updated on a CUDA device, in
    /// [`UpdateRule::BUFFERS`] order. A parameter's buffers live in exactly
    /// one place: here (its `ParamState::buffers` then empty) or on the host.
    #[cfg(feature = "cuda")]
    device_buffers: BTreeMap<String, Vec<CudaStorage>>,
}

impl<R: UpdateRule> Optim<R> {
    /// An optimizer with `config` as every parameter's default.
    pub fn new(config: R::Config) -> Result<Self> {
        R::validate(&config)?;
        R::values(&config, 0)?;
        Ok(Optim {
            config,
            overrides: BTreeMap::new(),
            params: BTreeMap::new(),
            step: 0,
            #[cfg(feature = "cuda")]
            device_buffers: BTreeMap::new(),
        })
    }

    fn config_for(&self, name: &str) -> &R::Config {
        self.overrides.get(name).unwrap_or(&self.config)
    }

    /// Replaces the default configuration (validated like [`Optim::new`]'s);
    /// parameters with their own keep theirs.
    pub fn set_config(&mut self, config: R::Config) -> Result<()> {
        R::validate(&config)?;
        R::values(&config, self.step)?;
        self.config = config;
        Ok(())
    }

    /// The default learning rate at the current step.
    pub fn learning_rate(&self) -> f64 {
        R::learning_rate(&self.config).value(self.step)
    }

    /// The update of an f32 parameter held in the caller's memory (a
    /// framework's tensor storage, updated in place): the same update as
    /// [`Optimizer::update`] of an f32 CPU tensor of `shape`, bitwise, with
    /// the same per-parameter state.
    pub fn update_slice(
        &mut self,
        name: &str,
        shape: &[usize],
        param: &mut [f32],
        grad: &[f32],
    ) -> Result<()> {
        let n = checked_len(shape)?;
        if param.len() != n || grad.len() != n {
            return Err(OptimError::ShapeMismatch {
                what: format!(
                    "parameter and gradient of {name} (lengths {} and {})",
                    param.len(),
                    grad.len()
                ),
                expected: shape.to_vec(),
                got: vec![param.len().max(grad.len())],
            });
        }
        #[cfg(feature = "cuda")]
        self.buffers_to_host(name)?;
        let values = R::values(self.config_for(name), self.step)?;
        let state = state_entry(&mut self.params, name, shape)?;
        apply_host::<R>(&values, state, param, grad);
        Ok(())
    }

    /// Moves parameter `name`'s buffers from the device to its host state
    /// (before a CPU update of a parameter last updated on a GPU).
    #[cfg(feature = "cuda")]
    fn buffers_to_host(&mut self, name: &str) -> Result<()> {
        let Some(device) = self.device_buffers.get(name) else {
            return Ok(());
        };
        let host = download_buffers(R::BUFFERS, device)?;
        if let Some(state) = self.params.get_mut(name) {
            state.buffers = host;
        }
        self.device_buffers.remove(name);
        Ok(())
    }

    /// The update of a parameter in CUDA memory (see the module docs).
    #[cfg(feature = "cuda")]
    fn update_cuda(&mut self, name: &str, param: &mut Tensor, grad: &Tensor) -> Result<()> {
        use gradwire_tensor::{Device, Error as TensorError};
        let ordinal = match param.device() {
            Device::Cuda(ordinal) if grad.device() == param.device() => ordinal,
            _ => {
                return Err(TensorError::DeviceMismatch {
                    op: "Optimizer::update",
                    expected: param.device(),
                    got: grad.device(),
                }
                .into());
            }
        };
        if grad.dtype() != param.dtype() {
            // The kernels read the gradient in the parameter's dtype; a cast
            // here would round an f32 gradient before the update, which the
            // CPU does not do.
            return Err(TensorError::DTypeMismatch {
                op: "Optimizer::update (CUDA)",
                expected: param.dtype(),
                got: grad.dtype(),
            }
            .into());
        }
        let values = R::values(self.config_for(name), self.step)?;
        let state = state_entry(&mut self.params, name, param.dims())?;
        let t = state.updates + 1;
        let kernel: UpdateKernel = R::cuda_kernel(&values, t).ok_or_else(|| {
            OptimError::InvalidArgument(format!("{} has no CUDA kernel", R::KIND))
        })?;
        let device = self.device_buffers.entry(name.to_string()).or_default();
        if device.is_empty() && (R::needs_buffers(&values) || !state.buffers.is_empty()) {
            let n = param.len();
            let mut fresh = Vec::with_capacity(R::BUFFERS.len());
            for &b in R::BUFFERS {
                // Zeros, or the host buffer moved over (a parameter last
                // updated on the CPU, or restored from a checkpoint).
                let mut buffer = CudaStorage::alloc_zeros(n, DType::F32, ordinal)?;
                if let Some(host) = state.buffers.get(b) {
                    buffer.write_f32(0, host)?;
                }
                fresh.push(buffer);
            }
            *device = fresh;
            state.buffers.clear();
        }
        let wanted = kernel.buffers();
        let mut buffers: Vec<&mut CudaStorage> = device.iter_mut().take(wanted).collect();
        let grad = grad.cuda_storage()?;
        apply_update(&kernel, param.cuda_storage_mut()?, &grad, &mut buffers)?;
        state.updates = t;
        Ok(())
    }
}

/// Device buffers (in `names` order, an [`UpdateRule::BUFFERS`]) as host
/// buffers, copied back (waits for the device).
#[cfg(feature = "cuda")]
fn download_buffers(names: &[&str], device: &[CudaStorage]) -> Result<BTreeMap<String, Vec<f32>>> {
    names
        .iter()
        .zip(device)
        .map(|(&name, buffer)| Ok((name.to_string(), buffer.read_f32(0..buffer.len())?)))
        .collect()
}

/// The host update of one f32 parameter with `state` (its buffers created
/// on first need): the one place [`UpdateRule::apply`] runs on the CPU.
fn apply_host<R: UpdateRule>(values: &R::Values, state: &mut ParamState, p: &mut [f32], g: &[f32]) {
    if R::needs_buffers(values) && state.buffers.is_empty() {
        for &b in R::BUFFERS {
            state.buffers.insert(b.to_string(), vec![0.0; p.len()]);
        }
    }
    state.updates += 1;
    let t = state.updates;
    // The buffers as slices on the stack, so that an update allocates
    // nothing: a rule keeps at most `MAX_BUFFERS` (checked when the rule
    // is compiled), and a state holds only its rule's buffers.
    const { assert!(R::BUFFERS.len() <= MAX_BUFFERS) };
    let mut slots: [&mut [f32]; MAX_BUFFERS] = Default::default();
    let n = state.buffers.len().min(MAX_BUFFERS);
    for (slot, b) in slots.iter_mut().zip(state.buffers.values_mut()) {
        *slot = b.as_mut_slice();
    }
    R::apply(values, t, &mut slots[..n], p, g);
}

/// The most per-parameter buffers an [`UpdateRule`] may keep (Adam keeps
/// two).
const MAX_BUFFERS: usize = 4;

/// The element count of `shape`, checked.
fn checked_len(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| OptimError::InvalidArgument(format!("shape {shape:?} overflows")))
}

/// Parameter `name`'s state, created empty for a parameter of `shape` on
/// first use; [`OptimError::ShapeMismatch`] if it exists with another shape.
fn state_entry<'p>(
    params: &'p mut BTreeMap<String, ParamState>,
    name: &str,
    shape: &[usize],
) -> Result<&'p mut ParamState> {
    // Looked up before it is made: the key is allocated only once.
    if !params.contains_key(name) {
        params.insert(
            name.to_string(),
            ParamState {
                shape: shape.to_vec(),
                updates: 0,
                buffers: BTreeMap::new(),
            },
        );
    }
    let state = params
        .get_mut(name)
        .ok_or_else(|| OptimError::InvalidArgument(format!("no state of {name}")))?;
    if state.shape != shape {
        return Err(OptimError::ShapeMismatch {
            what: format!("state of {name}"),
            expected: state.shape.clone(),
            got: shape.to_vec(),
        });
    }
    Ok(state)
}

fn to_json<T: Serialize>(value: &T) -> Result<serde_json::Value> {
    serde_json::to_value(value)
        .map_err(|e| OptimError::InvalidArgument(format!("cannot serialise a configuration: {e}")))
}

fn from_json<T: DeserializeOwned>(value: &serde_json::Value, what: &str) -> Result<T> {
    serde_json::from_value(value.clone())
        .map_err(|e| OptimError::StateMismatch(format!("{what}: {e}")))
}

impl<R: UpdateRule> Optimizer for Optim<R> {
    type Config = R::Config;

    fn kind(&self) -> &'static str {
        R::KIND
    }

    fn config(&self) -> &Self::Config {
        &self.config
    }

    fn register(&mut self, name: &str, config: Self::Config) -> Result<()> {
        R::validate(&config)?;
        R::values(&config, self.step)?;
        self.overrides.insert(name.to_string(), config);
        Ok(())
    }

    fn update(&mut self, name: &str, param: &mut Tensor, grad: &Tensor) -> Result<()> {
        if grad.is_zeroed() {
            return Ok(());
        }
        if param.dims() != grad.dims() {
            return Err(OptimError::ShapeMismatch {
                what: format!("gradient of {name}"),
                expected: param.dims().to_vec(),
                got: grad.dims().to_vec(),
            });
        }
        #[cfg(feature = "cuda")]
        if !param.device().is_cpu() || !grad.device().is_cpu() {
            return self.update_cuda(name, param, grad);
        }
        #[cfg(feature = "cuda")]
        self.buffers_to_host(name)?;
        let values = R::values(self.config_for(name), self.step)?;
        let state = state_entry(&mut self.params, name, param.dims())?;
        let grad32: Cow<'_, [f32]> = match grad.dtype() {
            DType::F32 => Cow::Borrowed(grad.as_slice::<f32>()?),
            _ => Cow::Owned(grad.to_f32_vec()?),
        };
        // Everything that can fail has been checked: from here the update
        // happens in full.
        match param.dtype() {
            DType::F32 => apply_host::<R>(&values, state, param.as_mut_slice::<f32>()?, &grad32),
            dtype => {
                let mut p32 = param.to_f32_vec()?;
                apply_host::<R>(&values, state, &mut p32, &grad32);
                let rounded = Tensor::from_f32(&p32, param.dims().to_vec(), dtype)?;
                param.copy_from(&rounded)?;
            }
        }
        Ok(())
    }

    fn step(&mut self) {
        self.step += 1;
    }

    fn step_count(&self) -> u64 {
        self.step
    }

    fn param_state(&self, name: &str) -> Option<&ParamState> {
        self.params.get(name)
    }

    fn state(&self) -> Result<OptimizerState> {
        #[allow(unused_mut)]
        let mut params = self.params.clone();
        #[cfg(feature = "cuda")]
        for (name, device) in &self.device_buffers {
            if let Some(state) = params.get_mut(name)
                && !device.is_empty()
            {
                state.buffers = download_buffers(R::BUFFERS, device)?;
            }
        }
        Ok(OptimizerState {
            kind: R::KIND.to_string(),
            step: self.step,
            config: to_json(&self.config)?,
            overrides: self
                .overrides
                .iter()
                .map(|(k, v)| Ok((k.clone(), to_json(v)?)))
                .collect::<Result<_>>()?,
            params,
        })
    }

    fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        if state.kind != R::KIND {
            return Err(OptimError::StateMismatch(format!(
                "a {} state cannot be loaded into a {} optimizer",
                state.kind,
                R::KIND
            )));
        }
        let config: R::Config = from_json(&state.config, "configuration")?;
        R::validate(&config)?;
        let mut overrides = BTreeMap::new();
        for (name, value) in &state.overrides {
            let c: R::Config = from_json(value, &format!("configuration of {name}"))?;
            R::validate(&c)?;
            overrides.insert(name.clone(), c);
        }
        for (name, p) in &state.params {
            let n = p.elem_count();
            let names: Vec<&str> = p.buffers.keys().map(String::as_str).collect();
            if !p.buffers.is_empty() && names != R::BUFFERS {
                return Err(OptimError::StateMismatch(format!(
                    "{name}: buffers {names:?}, a {} optimizer keeps {:?}",
                    R::KIND,
                    R::BUFFERS
                )));
            }
            if let Some((b, v)) = p.buffers.iter().find(|(_, v)| v.len() != n) {
                return Err(OptimError::StateMismatch(format!(
                    "{name}: buffer {b} has {} elements, the shape {:?} has {n}",
                    v.len(),
                    p.shape
                )));
            }
        }
        self.config = config;
        self.overrides = overrides;
        self.params = state.params.clone();
        self.step = state.step;
        #[cfg(feature = "cuda")]
        self.device_buffers.clear();
        Ok(())
    }

    fn snapshot_into(&self, snapshot: &mut OptimizerState) -> Result<()> {
        // The first snapshot (or one of another kind), and buffers that
        // live on a device (only with `cuda`: the default build runs the
        // featured one's CPU path): the whole state, copied out.
        let whole = snapshot.kind != R::KIND;
        #[cfg(feature = "cuda")]
        let whole = whole || !self.device_buffers.is_empty();
        if whole {
            *snapshot = self.state()?;
            return Ok(());
        }
        snapshot.step = self.step;
        copy_param_states(&mut snapshot.params, &self.params);
        Ok(())
    }

    fn restore_snapshot(&mut self, snapshot: &OptimizerState) -> Result<()> {
        if snapshot.kind != R::KIND {
            return Err(OptimError::StateMismatch(format!(
                "a {} snapshot cannot be restored into a {} optimizer",
                snapshot.kind,
                R::KIND
            )));
        }
        for (name, p) in &snapshot.params {
            let n = p.elem_count();
            let names_match = p
                .buffers
                .keys()
                .map(String::as_str)
                .eq(R::BUFFERS.iter().copied());
            if (!p.buffers.is_empty() && !names_match) || p.buffers.values().any(|v| v.len() != n) {
                return Err(OptimError::StateMismatch(format!(
                    "{name}: the snapshot's buffers do not fit a {} optimizer of shape {:?}",
                    R::KIND,
                    p.shape
                )));
            }
        }
        self.step = snapshot.step;
        copy_param_states(&mut self.params, &snapshot.params);
        // The snapshot's buffers are on the host now; a later update on a
        // device moves them there again.
        #[cfg(feature = "cuda")]
        self.device_buffers.clear();
        Ok(())
    }
}

impl<R: UpdateRule> StateBuffers for Optim<R> {
    fn buffer_names(&self) -> &'static [&'static str] {
        R::BUFFERS
    }

    fn buffer_values(&self, name: &str, buffer: &str) -> Result<Option<Vec<f32>>> {
        #[cfg(feature = "cuda")]
        if let Some(device) = self.device_buffers.get(name)
            && let Some(index) = R::BUFFERS.iter().position(|&b| b == buffer)
            && let Some(storage) = device.get(index)
        {
            return Ok(Some(storage.read_f32(0..storage.len())?));
        }
        Ok(self
            .params
            .get(name)
            .and_then(|s| s.buffers.get(buffer).cloned()))
    }

    fn set_buffer(
        &mut self,
        name: &str,
        shape: &[usize],
        buffer: &str,
        values: Vec<f32>,
    ) -> Result<()> {
        let n: usize = shape.iter().product();
        if !R::BUFFERS.contains(&buffer) {
            return Err(OptimError::StateMismatch(format!(
                "{name}: a {} optimizer has no buffer {buffer}",
                R::KIND,
            )));
        }
        if values.len() != n {
            return Err(OptimError::ShapeMismatch {
                what: format!("{name}/{buffer}"),
                expected: shape.to_vec(),
                got: vec![values.len()],
            });
        }
        let state = state_entry(&mut self.params, name, shape)?;
        #[cfg(feature = "cuda")]
        if let Some(device) = self.device_buffers.get_mut(name)
            && !device.is_empty()
        {
            // The buffers live on the device: overwrite that one there (its
            // name and length were checked above).
            let slot = R::BUFFERS
                .iter()
                .position(|&b| b == buffer)
                .and_then(|index| device.get_mut(index));
            if let Some(slot) = slot {
                slot.write_f32(0, &values)?;
            }
            return Ok(());
        }
        // Buffers exist all together or not at all.
        if state.buffers.is_empty() {
            for &b in R::BUFFERS {
                state.buffers.insert(b.to_string(), vec![0.0; n]);
            }
        }
        state.buffers.insert(buffer.to_string(), values);
        Ok(())
    }
}
