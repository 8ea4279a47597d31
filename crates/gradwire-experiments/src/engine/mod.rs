//! How a run's steps are taken, through gradwire-candle: with
//! [`DataParallel`] (gradwire's optimizer updating candle's variables in
//! place, no copy of the parameters kept) every strategy it runs, the
//! gradient-combining ones, partial averaging and AdaSum by delta weight;
//! with [`DistOptVars`] (DistOpt over a gradwire copy of the variables)
//! DimReduce, whose update is its own, and partial averaging of the
//! optimizer's state too (`-s partial:state`); with [`LibraryLoop`] the
//! baseline (`library.rs`: the backend library's own all-reduce).

use crate::config::TrainConfig;
use crate::error::Result;
use crate::model::Model;
use candle_core::backprop::GradStore;
use gradwire_algos::dimreduce::{DimReduceConfig, Pca};
use gradwire_candle::{
    CandleOptim, DataParallel, DistOptVars, parameters_in, parameters_of, write_values,
};
use gradwire_optim::Optimizer as _;
use gradwire_optim::checkpoint::Checkpoint;
use gradwire_optim::{DistOptConfig, Optim, StepStats, StrategyConfig, UpdateRule};
use gradwire_tensor::Tensor;

mod library;

pub use library::Backend;
use library::LibraryLoop;

/// One worker's training engine.
pub(crate) enum Engine<R: UpdateRule, C: Backend + 'static> {
    /// DataParallel: the variables updated in place.
    InPlace(Box<DataParallel<CandleOptim<R>, C>>),
    /// DistOpt over a copy of the variables.
    Copied(Box<DistOptVars<Optim<R>, C>>),
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
                vars, optimizer, comm,
            )?)));
        }
        // DimReduce's update is its own; the caller's optimizer state
        // cannot be averaged through DataParallel.
        let copied = matches!(
            config.strategy,
            StrategyConfig::DimReduce
                | StrategyConfig::Partial {
                    average_state: true
                }
        );
        if copied {
            let optimizer = Optim::<R>::new(optimizer)?;
            return Ok(Engine::Copied(Box::new(DistOptVars::new(
                vars, optimizer, comm, dist,
            )?)));
        }
        Ok(Engine::InPlace(Box::new(DataParallel::from_vars(
            vars, optimizer, comm, dist,
        )?)))
    }

    /// The communicator.
    pub(crate) fn comm(&self) -> &C {
        match self {
            Engine::InPlace(dp) => dp.sync().comm(),
            Engine::Copied(dv) => dv.dist().comm(),
            Engine::Library(library) => &library.comm,
        }
    }

    /// Whether DimReduce's first stage is over.
    pub(crate) fn in_dimreduce(&self) -> bool {
        matches!(self, Engine::Copied(dv) if dv.dist().strategy() == StrategyConfig::DimReduce)
    }

    /// Switches to DimReduce with `pca` (the DimReduce strategy only).
    pub(crate) fn start_dimreduce(&mut self, pca: &Pca, config: DimReduceConfig) -> Result<()> {
        match self {
            Engine::Copied(dv) => match dv.dist_mut().dimreduce_mut() {
                Some(dimreduce) => Ok(dimreduce.start(pca, config)?),
                None => Err(crate::ExperimentError::Usage(
                    "DimReduce's start in another strategy".into(),
                )),
            },
            Engine::InPlace(_) | Engine::Library(_) => Err(crate::ExperimentError::Usage(
                "DimReduce runs on DistOptVars".into(),
            )),
        }
    }

    /// One step with this worker's gradients.
    pub(crate) fn step(&mut self, grads: GradStore) -> Result<StepStats> {
        Ok(match self {
            Engine::InPlace(dp) => dp.step(grads)?,
            Engine::Copied(dv) => dv.step(&grads)?,
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
            Engine::Copied(dv) => Ok(dv.step_dimreduce(&grads, loss, loss_at)?),
            Engine::InPlace(_) | Engine::Library(_) => Err(crate::ExperimentError::Usage(
                "DimReduce runs on DistOptVars".into(),
            )),
        }
    }

    /// The parameters as gradwire tensors, in declaration order (a
    /// trajectory snapshot; a checkpoint).
    pub(crate) fn parameters(&self, model: &Model) -> Result<Vec<Tensor>> {
        match self {
            Engine::Copied(dv) => Ok(dv.params().to_vec()),
            Engine::InPlace(_) | Engine::Library(_) => Ok(parameters_of(model.vars())?),
        }
    }

    /// gradwire's whole state and the parameters (`param/<name>`).
    pub(crate) fn checkpoint(&self, model: &Model) -> Result<Checkpoint> {
        let mut ckpt = match self {
            Engine::Copied(dv) => return Ok(dv.checkpoint()?),
            Engine::InPlace(dp) => {
                let mut ckpt = dp.checkpoint()?;
                dp.optimizer().save_into(&mut ckpt)?;
                ckpt
            }
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

    /// Restores a [`Engine::checkpoint`], the variables included.
    pub(crate) fn restore(&mut self, ckpt: &Checkpoint) -> Result<()> {
        match self {
            Engine::Copied(dv) => dv.restore(ckpt)?,
            Engine::InPlace(dp) => {
                // Everything read before anything changes.
                let params = parameters_in(ckpt, dp.vars())?;
                dp.restore(ckpt)?;
                dp.optimizer_mut().restore_from(ckpt)?;
                for ((_, var), param) in dp.vars().iter().zip(&params) {
                    write_values(var, param.as_slice::<f32>()?)?;
                }
            }
            Engine::Library(library) => {
                let params = parameters_in(ckpt, library.optimizer.vars())?;
                library.optimizer.restore_from(ckpt)?;
                for ((_, var), param) in library.optimizer.vars().iter().zip(&params) {
                    write_values(var, param.as_slice::<f32>()?)?;
                }
            }
        }
        Ok(())
    }
}
