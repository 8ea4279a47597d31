//! gradwire-candle: data-parallel training for [candle] models.
//!
//! Candle trains on one device; [`DataParallel`] wraps any
//! [`candle_nn::Optimizer`] (SGD, AdamW, ...) so that every worker computes
//! gradients on its shard of the batch, gradwire combines them across the
//! workers (dense, fp16/bf16, sparse with error feedback, or any
//! [`gradwire_optim::Combiner`] such as AdaSum; over any gradwire
//! [`Communicator`]: threads, MPI processes), and the optimizer steps with
//! the combined gradients on every worker alike.
//!
//! A whole data-parallel step (4 workers as threads here; under `mpirun`,
//! `MpiComm::world()` instead):
//!
//! ```
//! use candle_core::{DType, Device, Module, Tensor};
//! use candle_nn::{VarBuilder, VarMap, linear};
//! use gradwire_candle::DataParallel;
//! use gradwire_comm::{Communicator, local};
//! use gradwire_optim::DistOptConfig;
//!
//! let losses = local::run(4, |comm| -> candle_core::Result<f32> {
//!     let rank = comm.rank();
//!     let varmap = VarMap::new();
//!     let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
//!     let model = linear(3, 1, vb.pp("fc"))?;
//!     // Wrap the optimizer; rank 0's initial weights go to every worker.
//!     let mut dp = DataParallel::<candle_nn::SGD, _>::new(&varmap, 0.1, comm, DistOptConfig::default())?;
//!     dp.broadcast_parameters(0)?;
//!     // This worker's shard of the batch.
//!     let x = Tensor::new(&[[1f32, 2.0, 3.0]], &Device::Cpu)?.affine(1.0 + rank as f64, 0.0)?;
//!     let loss = model.forward(&x)?.sqr()?.mean_all()?;
//!     dp.backward_step(&loss)?; // backward, combine, step
//!     loss.to_scalar::<f32>()
//! })
//! .unwrap();
//! assert_eq!(losses.len(), 4);
//! ```
//!
//! Copies: a gradient is read from candle's CPU storage in place and copied
//! once into gradwire's buffer for that parameter (reused every step); the
//! combined gradient becomes a new candle tensor, because a candle
//! `GradStore` holds tensors it owns. Parameters must be f32 on the CPU in
//! this version (a typed error otherwise).
//!
//! Errors come back as [`candle_core::Error`] (gradwire's wrapped), so `?`
//! works in a candle training loop.
//!
//! [candle]: https://github.com/huggingface/candle

#![deny(missing_docs)]

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Storage, Tensor, Var};
use candle_nn::{Optimizer, VarMap};
use gradwire_comm::Communicator;
use gradwire_optim::checkpoint::Checkpoint;
use gradwire_optim::{Combiner, DistOptConfig, GradSync, ParamSpec, StepStats};

/// A candle error from a gradwire one.
fn wrap(e: impl std::fmt::Display + Send + Sync + 'static) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// The named variables of `varmap`, in the order every worker declares
/// them (sorted by name: a `VarMap` has no order of its own, and every
/// worker must declare the same parameters in the same order).
pub fn named_vars(varmap: &VarMap) -> candle_core::Result<Vec<(String, Var)>> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| candle_core::Error::msg("the VarMap's lock is poisoned"))?;
    let mut vars: Vec<(String, Var)> = data.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(vars)
}

/// gradwire's declarations of `vars` (names and shapes; f32 on the CPU),
/// checked: a variable of another dtype or device is an error.
pub fn specs_of(vars: &[(String, Var)]) -> candle_core::Result<Vec<ParamSpec>> {
    vars.iter()
        .map(|(name, var)| {
            if var.dtype() != DType::F32 || !var.device().is_cpu() {
                candle_core::bail!(
                    "gradwire-candle: {name} is {:?} on {:?}; this version trains f32 parameters on the CPU",
                    var.dtype(),
                    var.device()
                );
            }
            Ok(ParamSpec::new(name.clone(), var.dims().to_vec()))
        })
        .collect()
}

/// A candle optimizer made data-parallel.
#[derive(Debug)]
pub struct DataParallel<O, C: Communicator + 'static> {
    sync: GradSync<C>,
    vars: Vec<(String, Var)>,
    optimizer: O,
    last: StepStats,
}

impl<O: Optimizer, C: Communicator + 'static> DataParallel<O, C> {
    /// Every variable of `varmap`, an optimizer `O` made from `config` over
    /// them, gradients combined as `dist.mode` says (`Dense`, `Half`,
    /// `Sparse`) over `comm`.
    pub fn new(
        varmap: &VarMap,
        config: O::Config,
        comm: C,
        dist: DistOptConfig,
    ) -> candle_core::Result<Self> {
        Self::from_vars(named_vars(varmap)?, config, comm, dist)
    }

    /// [`DataParallel::new`] over a list of named variables (the same
    /// names and order on every worker).
    pub fn from_vars(
        vars: Vec<(String, Var)>,
        config: O::Config,
        comm: C,
        dist: DistOptConfig,
    ) -> candle_core::Result<Self> {
        let sync = GradSync::new(comm, specs_of(&vars)?, dist).map_err(wrap)?;
        Self::from_sync(vars, config, sync)
    }

    /// [`DataParallel::from_vars`] with gradients combined by `combiner`
    /// (`Mode::Custom`: AdaSum by gradient, or a strategy of your own).
    pub fn with_combiner(
        vars: Vec<(String, Var)>,
        config: O::Config,
        comm: C,
        dist: DistOptConfig,
        combiner: impl Combiner<C>,
    ) -> candle_core::Result<Self> {
        let sync = GradSync::with_combiner(comm, specs_of(&vars)?, dist, combiner).map_err(wrap)?;
        Self::from_sync(vars, config, sync)
    }

    fn from_sync(
        vars: Vec<(String, Var)>,
        config: O::Config,
        sync: GradSync<C>,
    ) -> candle_core::Result<Self> {
        let optimizer = O::new(vars.iter().map(|(_, v)| v.clone()).collect(), config)?;
        Ok(DataParallel {
            sync,
            vars,
            optimizer,
            last: StepStats::default(),
        })
    }

    /// Copies `root`'s parameter values into every worker's (collective):
    /// call once before training, so every worker starts from one model
    /// (candle's CPU initialisation is not seeded).
    pub fn broadcast_parameters(&mut self, root: usize) -> candle_core::Result<()> {
        for (_, var) in &self.vars {
            let mut values = var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            self.sync
                .broadcast(&mut [&mut values[..]], root)
                .map_err(wrap)?;
            var.set(&Tensor::from_vec(values, var.shape(), var.device())?)?;
        }
        Ok(())
    }

    /// Combines the gradients of `grads` across the workers and returns the
    /// store with each gradient replaced by the combined one (a gradient no
    /// worker produced stays absent). For users who step themselves; after
    /// a skipped step (a non-finite gradient with `skip_non_finite`) the
    /// store comes back without gradients, so an optimizer step changes
    /// nothing. Every worker must call it, each step.
    pub fn reduce(&mut self, mut grads: GradStore) -> candle_core::Result<GradStore> {
        for (i, (_, var)) in self.vars.iter().enumerate() {
            let Some(grad) = grads.get(var.as_tensor()) else {
                continue; // not written on this worker
            };
            let (storage, layout) = grad.storage_and_layout();
            let pushed = match (&*storage, layout.contiguous_offsets()) {
                (Storage::Cpu(cpu), Some((start, end))) => {
                    let values = cpu.as_slice::<f32>()?;
                    self.sync.push(i, &values[start..end])
                }
                _ => {
                    drop(storage);
                    let values = grad.flatten_all()?.to_vec1::<f32>()?;
                    self.sync.push(i, &values)
                }
            };
            // A bad gradient fails the step on every worker at finish.
            let _ = pushed;
        }
        let vars = &self.vars;
        let mut combined: Vec<(usize, Tensor)> = Vec::new();
        let stats = self.sync.finish_each(|i, values: &[f32]| {
            let var = &vars[i].1;
            let t = Tensor::from_slice(values, var.shape(), &Device::Cpu)
                .map_err(|e| gradwire_optim::OptimError::InvalidArgument(e.to_string()))?;
            combined.push((i, t));
            Ok(())
        });
        let stats = stats.map_err(wrap)?;
        for (_, var) in &self.vars {
            grads.remove(var.as_tensor());
        }
        for (i, t) in combined {
            grads.insert(self.vars[i].1.as_tensor(), t);
        }
        self.last = stats;
        Ok(grads)
    }

    /// Backward from `loss`, the gradients combined across the workers,
    /// then the optimizer's step: the data-parallel `backward_step`.
    pub fn backward_step(&mut self, loss: &Tensor) -> candle_core::Result<()> {
        let grads = self.reduce(loss.backward()?)?;
        if self.last.non_finite {
            return Ok(()); // skipped alike on every worker
        }
        self.optimizer.step(&grads)
    }

    /// What the last step did (traffic, waiting time, skips).
    pub fn last_step(&self) -> StepStats {
        self.last
    }

    /// The wrapped optimizer.
    pub fn optimizer(&self) -> &O {
        &self.optimizer
    }

    /// The wrapped optimizer, mutably (to change its learning rate).
    pub fn optimizer_mut(&mut self) -> &mut O {
        &mut self.optimizer
    }

    /// The variables, in declaration order.
    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// The gradient combiner underneath.
    pub fn sync(&self) -> &GradSync<C> {
        &self.sync
    }

    /// gradwire's state (error-feedback residuals, counters, the
    /// configuration), to save beside candle's safetensors of the weights
    /// (`VarMap::save`) with `gradwire_optim::checkpoint::save`.
    pub fn checkpoint(&self) -> candle_core::Result<Checkpoint> {
        self.sync.checkpoint().map_err(wrap)
    }

    /// Restores what [`DataParallel::checkpoint`] saved.
    pub fn restore(&mut self, ckpt: &Checkpoint) -> candle_core::Result<()> {
        self.sync.restore(ckpt).map_err(wrap)
    }
}
