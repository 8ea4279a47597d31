//! How a run's steps are taken, through gradwire-candle: with
//! [`DataParallel`] (gradwire's optimizer updating candle's variables in
//! place, no copy of the parameters kept) every strategy, in its training
//! loop (gradients combined, local steps with partial averaging or AdaSum
//! by delta weight, DimReduce); with [`LibraryLoop`] the baseline
//! (`library.rs`: the backend library's own all-reduce).

use crate::config::TrainConfig;
use crate::error::Result;
use crate::model::Model;
use candle_core::backprop::GradStore;
use gradwire_algos::dimreduce::{DimReduceConfig, Pca};
use gradwire_candle::{CandleOptim, DataParallel, parameters_in, parameters_of, write_values};
use gradwire_optim::Optimizer as _;
use gradwire_optim::checkpoint::Checkpoint;
use gradwire_optim::{DistOptConfig, StepStats, UpdateRule};
use gradwire_tensor::Tensor;

mod library;

pub use library::Backend;
use library::LibraryLoop;

/// One worker's training engine.
pub(crate) enum Engine<R: UpdateRule, C: Backend + 'static> {
    /// DataParallel: every strategy, the variables updated in place.
    Strategy(Box<DataParallel<CandleOptim<R>, C>>),
    /// The baseline: the library's all-reduce, then the optimizer.
    Library(Box<LibraryLoop<R, C>>),
}

impl<R: UpdateRule, C: Backend + 'static> Engine<R, C> {
    /// The engine of `config.strategy` for `model`'s variables.
    pub(crate) fn new(
        config: &TrainConfig,
        model: &Model,
        comm: C,
        optimizer: R::Config,
        dist: DistOptConfig,
    ) -> Result<Self> {
        let vars = model.vars().to_vec();
        if config.baseline {
            return Ok(Engine::Library(Box::new(LibraryLoop::new(
                vars,
                optimizer,
                comm,
                config.accumulate,
                config.baseline_precision(),
            )?)));
        }
        Ok(Engine::Strategy(Box::new(DataParallel::from_vars(
            vars, optimizer, comm, dist,
        )?)))
    }

    /// The communicator.
    pub(crate) fn comm(&self) -> &C {
        match self {
            Engine::Strategy(dp) => dp.sync().comm(),
            Engine::Library(library) => &library.comm,
        }
    }

    /// Whether DimReduce's first stage is over.
    pub(crate) fn in_dimreduce(&self) -> bool {
        matches!(self, Engine::Strategy(dp) if dp.dimreduce_started())
    }

    /// Switches to DimReduce with `pca` (the DimReduce strategy only).
    pub(crate) fn start_dimreduce(&mut self, pca: &Pca, config: DimReduceConfig) -> Result<()> {
        match self {
            Engine::Strategy(dp) => Ok(dp.start_dimreduce(pca, config)?),
            Engine::Library(_) => Err(crate::ExperimentError::Usage(
                "DimReduce is a strategy, not the baseline".into(),
            )),
        }
    }

    /// Weights the next step by this worker's samples (`--uneven-shards`).
    pub(crate) fn set_samples(&mut self, samples: u64) -> Result<()> {
        match self {
            Engine::Strategy(dp) => Ok(dp.set_samples(samples)?),
            Engine::Library(_) => Err(crate::ExperimentError::Usage(
                "--uneven-shards: the baseline has no sample weights".into(),
            )),
        }
    }

    /// Out of data: this worker's part in the others' steps until every
    /// worker is (`--uneven-shards`): the steps and what they did, summed.
    pub(crate) fn join(&mut self) -> Result<(u64, StepStats)> {
        match self {
            Engine::Strategy(dp) => Ok(dp.join()?),
            Engine::Library(_) => Err(crate::ExperimentError::Usage(
                "--uneven-shards: the baseline cannot join".into(),
            )),
        }
    }

    /// One step with this worker's gradients.
    pub(crate) fn step(&mut self, grads: GradStore) -> Result<StepStats> {
        Ok(match self {
            Engine::Strategy(dp) => dp.step(grads)?,
            Engine::Library(library) => library.step(grads)?,
        })
    }

    /// One DimReduce step: `loss_at` is this worker's loss at the
    /// variables' current values.
    pub(crate) fn step_dimreduce(
        &mut self,
        grads: GradStore,
        loss: f64,
        loss_at: impl FnMut() -> candle_core::Result<f64>,
    ) -> Result<StepStats> {
        match self {
            Engine::Strategy(dp) => Ok(dp.step_dimreduce(&grads, loss, loss_at)?),
            Engine::Library(_) => Err(crate::ExperimentError::Usage(
                "DimReduce is a strategy, not the baseline".into(),
            )),
        }
    }

    /// The variables, in declaration order.
    fn vars(&self) -> &[(String, candle_core::Var)] {
        match self {
            Engine::Strategy(dp) => dp.vars(),
            Engine::Library(library) => library.optimizer.vars(),
        }
    }

    /// The parameters as gradwire tensors, in declaration order (a
    /// trajectory snapshot; a checkpoint).
    pub(crate) fn parameters(&self, model: &Model) -> Result<Vec<Tensor>> {
        Ok(parameters_of(model.vars())?)
    }

    /// gradwire's whole state and the parameters (`param/<name>`).
    pub(crate) fn checkpoint(&self, model: &Model) -> Result<Checkpoint> {
        let mut ckpt = match self {
            Engine::Strategy(dp) => dp.checkpoint()?,
            Engine::Library(library) => {
                let mut ckpt = Checkpoint::new(library.optimizer.inner().state()?);
                library.optimizer.save_into(&mut ckpt)?;
                ckpt
            }
        };
        // The variables hold the parameters: saved beside gradwire's state.
        let params = self.parameters(model)?;
        ckpt.set_parameters(
            model
                .vars()
                .iter()
                .map(|(n, _)| n.as_str())
                .zip(params.iter()),
        );
        Ok(ckpt)
    }

    /// The checkpoint this rank restores to go on with the set `saved`
    /// (one checkpoint per rank of the world that wrote it, which may have
    /// had another size): DataParallel's rule
    /// ([`gradwire_optim::DistOpt::resharded`]); in the baseline, where
    /// every rank holds the same state, rank 0's.
    pub(crate) fn resharded(&self, saved: &[Checkpoint]) -> Result<Checkpoint> {
        match self {
            Engine::Strategy(dp) => Ok(dp.sync().resharded(saved)?),
            Engine::Library(_) => saved.first().cloned().ok_or_else(|| {
                crate::ExperimentError::Resume("no checkpoints to resume from".into())
            }),
        }
    }

    /// Restores a [`Engine::checkpoint`], the variables included.
    pub(crate) fn restore(&mut self, ckpt: &Checkpoint) -> Result<()> {
        // Everything read before anything changes.
        let params = parameters_in(ckpt, self.vars())?;
        match self {
            Engine::Strategy(dp) => dp.restore(ckpt)?,
            Engine::Library(library) => library.optimizer.restore_from(ckpt)?,
        }
        for ((_, var), param) in self.vars().iter().zip(&params) {
            write_values(var, param.as_slice::<f32>()?)?;
        }
        Ok(())
    }
}
