//! The steps that write the caller's parameters: local steps (`Partial`,
//! `DeltaWeight`) with the caller's step as a closure, and DimReduce's.

use super::{GradSync, ParamAccess};
use crate::distopt::StepStats;
use crate::error::{OptimError, Result};
use crate::optimizer::StateBuffers;
use gradwire_algos::FaultKind;
use gradwire_algos::dimreduce::{DimReduceConfig, Pca};
use gradwire_comm::Communicator;
use gradwire_tensor::{DType, Device, Tensor};
use std::cell::RefCell;

/// An optimizer's buffers lent to the engine between the uses of the local
/// step ([`GradSync::step_locally_with_state`]).
struct BorrowedBuffers<'c, 'o, S: ?Sized>(&'c RefCell<&'o mut S>);

impl<S: StateBuffers + ?Sized> StateBuffers for BorrowedBuffers<'_, '_, S> {
    fn buffer_names(&self) -> &'static [&'static str] {
        self.0.borrow().buffer_names()
    }

    fn buffer_values(&self, name: &str, buffer: &str) -> Result<Option<Vec<f32>>> {
        self.0.borrow().buffer_values(name, buffer)
    }

    fn set_buffer(
        &mut self,
        name: &str,
        shape: &[usize],
        buffer: &str,
        values: Vec<f32>,
    ) -> Result<()> {
        self.0.borrow_mut().set_buffer(name, shape, buffer, values)
    }
}

impl<C: Communicator + 'static> GradSync<C> {
    /// A step of `Partial` or `DeltaWeight` with the caller's own local
    /// step: `step(params)` updates the caller's parameters (its optimizer,
    /// with this rank's own gradients), then GradSync averages one bucket
    /// of them across ranks (`Partial`, a bucket in turn) or combines the
    /// weight changes (`DeltaWeight`: `p = p0 - combined(p0 - p)`, the
    /// strategy's AdaSum), writing the result through `params`. Gradients
    /// pushed before ([`GradSync::push`], optional) are checked for NaN and
    /// infinities, which fail (or, with `skip_non_finite`, skip) the step
    /// on every rank before anything changes. Partial averaging with the
    /// optimizer's state takes [`GradSync::step_locally_with_state`].
    ///
    /// Completes on every rank or fails on every rank: a `step` or a
    /// `params.read` error on one rank is an error on every rank
    /// ([`OptimError::Fault`]), and `DeltaWeight` puts `p0` back. Copies:
    /// the parameters are read into GradSync's buffers before and after the
    /// step and written back once.
    pub fn step_locally<P: ParamAccess + ?Sized>(
        &mut self,
        params: &mut P,
        step: impl FnOnce(&mut P) -> Result<()>,
    ) -> Result<StepStats> {
        self.local_step(params, None, step)
    }

    /// [`GradSync::step_locally`] whose averaging, in `Partial` with
    /// `average_state` (`partial:state`), covers the buffers of the
    /// caller's optimizer too (momentum, moments: `optimizer`'s
    /// [`StateBuffers`]), one bucket's at a time, as [`crate::LocalSteps`]
    /// does with gradwire's optimizer. `step(params, optimizer)` is the
    /// local step. In the other local-step strategies the buffers are not
    /// read.
    pub fn step_locally_with_state<P, S>(
        &mut self,
        params: &mut P,
        optimizer: &mut S,
        step: impl FnOnce(&mut P, &mut S) -> Result<()>,
    ) -> Result<StepStats>
    where
        P: ParamAccess + ?Sized,
        S: StateBuffers + ?Sized,
    {
        // The local step and then the averaging use the optimizer in turn.
        let optimizer = RefCell::new(optimizer);
        let mut buffers = BorrowedBuffers(&optimizer);
        self.local_step(params, Some(&mut buffers), |p| {
            step(p, &mut **optimizer.borrow_mut())
        })
    }

    fn local_step<P: ParamAccess + ?Sized>(
        &mut self,
        params: &mut P,
        state: Option<&mut dyn StateBuffers>,
        step: impl FnOnce(&mut P) -> Result<()>,
    ) -> Result<StepStats> {
        let unreadable = self.read_values(params)?;
        let mut step = Some(step);
        let mut values = std::mem::take(&mut self.values);
        let names = self.specs.iter().map(|s| s.name.as_str());
        let result = self.dist.finish_with_caller_step(
            names.zip(values.iter_mut()),
            &mut |targets| {
                let step = step.take().ok_or_else(|| {
                    OptimError::InvalidArgument("the local step ran twice".into())
                })?;
                step(params)?;
                for (i, target) in targets.iter_mut().enumerate() {
                    if let Some(t) = target {
                        params.read(i, t.as_mut_slice::<f32>()?)?;
                    }
                }
                Ok(())
            },
            state,
        );
        // The step's outcome is agreed; the values are the combined ones
        // (or p0 put back, or the local step when the averaging failed).
        self.write_values(params, values, unreadable)?;
        result
    }

    /// Ends DimReduce's first stage (the dense steps through
    /// [`GradSync::finish`]): from now on each step is
    /// [`GradSync::step_dimreduce`], in the subspace of the components
    /// `pca` (the same on every rank: fit from the same trajectory, or
    /// broadcast) over all declared parameters flattened in declaration
    /// order. Call between steps. Another strategy, a component count that
    /// does not cover the parameters, or a call in the middle of a step is
    /// an error and changes nothing.
    pub fn start_dimreduce(&mut self, pca: &Pca, config: DimReduceConfig) -> Result<()> {
        self.dist.start_dimreduce(pca, config)
    }

    /// Whether [`GradSync::start_dimreduce`] ended DimReduce's first stage.
    pub fn dimreduce_started(&self) -> bool {
        self.dist.dimreduce_started()
    }

    /// One DimReduce step ([`crate::DimReduceOpt::finish_dimreduce`]) on
    /// the caller's parameters: from this rank's pushed gradients and
    /// `loss` (this rank's loss on its batch), both averaged across ranks
    /// within the step; the line search writes each trial point into
    /// `params` and calls `loss_at(params)`, this rank's loss there on the
    /// same batch. The parameters end at the accepted point (or where they
    /// were, after a rejected or failed step), written through `params`.
    ///
    /// Completes on every rank or fails on every rank: a `params` or
    /// `loss_at` error on one rank is an error on every rank
    /// ([`OptimError::Fault`]); before [`GradSync::start_dimreduce`] the
    /// step fails on every rank alike and changes nothing.
    pub fn step_dimreduce<P: ParamAccess + ?Sized>(
        &mut self,
        params: &mut P,
        loss: f64,
        mut loss_at: impl FnMut(&mut P) -> Result<f64>,
    ) -> Result<StepStats> {
        let unreadable = self.read_values(params)?;
        let mut values = std::mem::take(&mut self.values);
        let names = self.specs.iter().map(|s| s.name.as_str());
        let result = self
            .dist
            .finish_dimreduce(names.zip(values.iter_mut()), loss, |trial| {
                for (i, (_, t)) in trial.iter().enumerate() {
                    params.write(i, t.as_slice::<f32>()?)?;
                }
                loss_at(params)
            });
        self.write_values(params, values, unreadable)?;
        result
    }

    /// Reads the caller's parameters into GradSync's buffers (made on
    /// first use, reused). A read error is returned as this rank's fault,
    /// recorded for the step's first collective to carry.
    fn read_values<P: ParamAccess + ?Sized>(
        &mut self,
        params: &mut P,
    ) -> Result<Option<OptimError>> {
        if self.values.len() != self.specs.len() {
            self.values = self
                .specs
                .iter()
                .map(|spec| Tensor::zeros(spec.shape.clone(), DType::F32, Device::Cpu))
                .collect::<std::result::Result<_, _>>()?;
        }
        let mut unreadable = None;
        for (i, value) in self.values.iter_mut().enumerate() {
            if let Err(e) = params.read(i, value.as_mut_slice::<f32>()?) {
                unreadable.get_or_insert(e);
            }
        }
        if let Some(e) = &unreadable {
            self.dist.record(FaultKind::InvalidArgument, e);
        }
        Ok(unreadable)
    }

    /// Writes the step's outcome, `values`, into the caller's parameters
    /// (unless they could not be read: they stay as they are), and keeps
    /// the buffers for the next step.
    fn write_values<P: ParamAccess + ?Sized>(
        &mut self,
        params: &mut P,
        values: Vec<Tensor>,
        unreadable: Option<OptimError>,
    ) -> Result<()> {
        let written = if unreadable.is_none() {
            values
                .iter()
                .enumerate()
                .try_for_each(|(i, value)| params.write(i, value.as_slice::<f32>()?))
        } else {
            Ok(())
        };
        self.values = values;
        written
    }
}
