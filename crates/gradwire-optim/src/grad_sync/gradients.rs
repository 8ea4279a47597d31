//! The gradients' hand-over during backward and the end of a gradient
//! step: push, finish (into buffers or a callback), sample weights, join.

use super::{GradSync, ParamRef};
use crate::distopt::StepStats;
use crate::error::{OptimError, Result};
use gradwire_algos::FaultKind;
use gradwire_comm::Communicator;
use gradwire_tensor::{Tensor, WithDType};

impl<C: Communicator + 'static> GradSync<C> {
    /// Hands over the gradient of `param` (a name or a declaration index)
    /// as a slice in the declared dtype; it is copied once into this
    /// parameter's buffer, and its bucket starts as soon as it is complete.
    /// A bad call (an unknown parameter, a wrong length or dtype) is an
    /// error here and fails the step on every rank: end it with
    /// [`GradSync::finish`] as usual.
    pub fn push<T: WithDType>(&mut self, param: impl ParamRef, grad: &[T]) -> Result<()> {
        let i = self.index_of(param)?;
        let spec = &self.specs[i];
        let n: usize = spec.shape.iter().product();
        if grad.len() != n || T::DTYPE != spec.dtype || !spec.device.is_cpu() {
            let err = OptimError::InvalidArgument(format!(
                "gradient of {}: {} elements of {} given, {n} of {} on {:?} declared",
                spec.name,
                grad.len(),
                T::DTYPE,
                spec.dtype,
                spec.device
            ));
            self.dist.record(FaultKind::InvalidArgument, &err);
            return Err(err);
        }
        let mut buffer = match self.pool[i].take() {
            Some(buffer) => buffer,
            None => Tensor::zeros(spec.shape.clone(), spec.dtype, spec.device)?,
        };
        buffer.as_mut_slice::<T>()?.copy_from_slice(grad);
        // The engine applies the sample weight, in place.
        self.dist.push(&self.specs[i].name, buffer)
    }

    /// Hands over the gradient of `param` as a gradwire tensor (any device
    /// DistOpt supports), without a copy.
    pub fn push_tensor(&mut self, param: impl ParamRef, grad: Tensor) -> Result<()> {
        let i = self.index_of(param)?;
        self.dist.push(&self.specs[i].name, grad)
    }

    /// Fails this step on this rank with `detail`: for a framework's own
    /// error while it hands over the gradients (a conversion that failed),
    /// which must not end the step early on this rank alone. The step's
    /// next collective carries it, and every rank's `finish` (or
    /// `step_locally`, `step_dimreduce`) returns the fault, kind
    /// `InvalidArgument`, naming this rank. End the step as usual.
    pub fn fail_step(&mut self, detail: &dyn std::fmt::Display) {
        self.dist.record(FaultKind::InvalidArgument, detail);
    }

    /// The declaration index of `param`; an unknown one is an error, and
    /// this step's fault (every rank fails the step).
    fn index_of(&mut self, param: impl ParamRef) -> Result<usize> {
        param.index_in(self).ok_or_else(|| {
            let err = OptimError::InvalidArgument(format!(
                "unknown parameter given to GradSync ({} declared)",
                self.specs.len()
            ));
            self.dist.record(FaultKind::InvalidArgument, &err);
            err
        })
    }

    /// Weights this step's average by samples: this rank saw `samples` of
    /// the step's global batch, and the combined gradient becomes
    /// `sum_r samples_r * g_r / sum_r samples_r` (each rank's gradient being
    /// the mean over its own samples) instead of the plain mean over ranks.
    /// Call before the step's first push, on every rank (one all-reduce of
    /// two u64; the engine's push then scales each gradient in place:
    /// [`crate::DistOpt::set_samples`], one mechanism). Not for `Custom`
    /// (AdaSum is not an average).
    ///
    /// With accumulation
    /// ([`DistOptConfig::accumulate`](crate::DistOptConfig::accumulate))
    /// call it before every micro-batch's first push (or before none): each
    /// micro-batch's gradient is weighted by its own samples, and the step's
    /// combined gradient is `sum over ranks and micro-batches of samples * g
    /// / the total`; the all-reduce runs once, at the step's last micro-batch.
    pub fn set_samples(&mut self, samples: u64) -> Result<()> {
        self.dist.set_samples(samples)
    }

    /// Out of data (uneven inputs: PyTorch DDP's `Join`, Horovod's
    /// `hvd.join()`): this rank takes its part in every step the others
    /// still take, contributing no samples, until every rank has joined;
    /// then returns how many steps it took part in
    /// ([`GradSync::join_step`], the combined gradients dropped). The
    /// others go on with [`GradSync::set_samples`] before each step (which
    /// every rank must call, each step, for ranks to join: that all-reduce
    /// is where the ranks learn who is still training), and their combined
    /// gradient is the mean over the samples actually seen, `sum_r
    /// samples_r * g_r / sum_r samples_r` over the ranks still training. A
    /// rank that joins between the micro-batches of a step contributes the
    /// micro-batches it took to that step (if another rank still takes
    /// it). Every gradient strategy that averages runs while ranks have
    /// joined (a joined rank sends zeros; its error-feedback residual still
    /// drains into the exchange, so no mass is lost); AdaSum, `Custom` and
    /// the loops of local steps are refused (typed). A step that fails on
    /// the ranks still training fails here too (the same error): call
    /// `join` again to go on taking part.
    pub fn join(&mut self) -> Result<u64> {
        let mut steps = 0;
        while self.dist.join_agreed()? {
            // The combination is not read (in any dtype): the buffers go
            // back to the pool.
            let pool = &mut self.pool;
            self.dist.finish_gradients(|i, g| {
                if let Some(slot) = pool.get_mut(i) {
                    *slot = Some(g);
                }
                Ok(())
            })?;
            steps += 1;
        }
        Ok(steps)
    }

    /// One step of a rank that has joined ([`GradSync::join`]): `None`
    /// once every rank has joined (nothing is exchanged); otherwise this
    /// rank's part in the step the others take, each combined gradient
    /// handed to `write(index, values)` as [`GradSync::finish_each`] does,
    /// so that a joined rank can go on stepping its optimizer with the
    /// others' mean and stay their replica.
    pub fn join_step<T: WithDType>(
        &mut self,
        write: impl FnMut(usize, &[T]) -> Result<()>,
    ) -> Result<Option<StepStats>> {
        if !self.dist.join_agreed()? {
            return Ok(None);
        }
        self.finish_each(write).map(Some)
    }

    /// Waits for every bucket and writes the combined gradients into
    /// `grads` (one buffer per declared parameter, in declaration order, of
    /// its declared dtype and length), in place. A gradient no rank pushed
    /// leaves its buffer as it was (see [`StepStats::skipped`]). A skipped
    /// step (a non-finite gradient with `skip_non_finite`) writes nothing.
    ///
    /// Completes on every rank or fails on every rank (DistOpt's failure
    /// model): buffers of the wrong number, length or dtype are found
    /// before the step's last collective, which carries the fault.
    pub fn finish<T: WithDType>(&mut self, grads: &mut [&mut [T]]) -> Result<StepStats> {
        let shape_error = if grads.len() != self.specs.len() {
            Some(format!(
                "{} buffers given to GradSync::finish, {} parameters declared",
                grads.len(),
                self.specs.len()
            ))
        } else {
            self.specs.iter().zip(grads.iter()).find_map(|(spec, g)| {
                let n: usize = spec.shape.iter().product();
                (g.len() != n || T::DTYPE != spec.dtype).then(|| {
                    format!(
                        "buffer of {}: {} elements of {} given, {n} of {} declared",
                        spec.name,
                        g.len(),
                        T::DTYPE,
                        spec.dtype
                    )
                })
            })
        };
        if let Some(e) = &shape_error {
            self.dist.record(FaultKind::InvalidArgument, e);
        }
        let result = self.finish_each(|i, combined: &[T]| {
            if let Some(out) = grads.get_mut(i) {
                out.copy_from_slice(combined);
            }
            Ok(())
        });
        match (result, shape_error) {
            (Err(e), _) => Err(e),
            (Ok(_), Some(e)) => Err(OptimError::InvalidArgument(e)),
            (Ok(stats), None) => Ok(stats),
        }
    }

    /// [`GradSync::finish`] handing each combined gradient some rank wrote
    /// to `write(index, values)` (declaration index, values in the declared
    /// dtype `T`) instead of copying it into a buffer: for a framework that
    /// builds its own gradient objects from them. A `write` error on one
    /// rank is an error on every rank.
    pub fn finish_each<T: WithDType>(
        &mut self,
        mut write: impl FnMut(usize, &[T]) -> Result<()>,
    ) -> Result<StepStats> {
        let pool = &mut self.pool;
        if self.dist.accumulating() {
            // The buffers come back at once: the sums are the engine's.
            return Ok(self.dist.accumulate_micro_batch(|i, g| {
                if let Some(slot) = pool.get_mut(i) {
                    *slot = Some(g);
                }
            }));
        }
        self.dist.finish_gradients(|i, g| {
            write(i, g.as_slice::<T>()?)?;
            // The buffer comes back for the next step (one that did not,
            // after a failed step, is made again on first use).
            if let Some(slot) = pool.get_mut(i) {
                *slot = Some(g);
            }
            Ok(())
        })
    }

    /// The end of a step for a front end that takes uneven inputs:
    /// [`GradSync::finish_each`] on a rank still stepping (`joined`
    /// false), [`GradSync::join_step`] on one that has joined (`None` once
    /// every rank has).
    pub fn finish_each_or_join<T: WithDType>(
        &mut self,
        joined: bool,
        write: impl FnMut(usize, &[T]) -> Result<()>,
    ) -> Result<Option<StepStats>> {
        if joined {
            self.join_step(write)
        } else {
            self.finish_each(write).map(Some)
        }
    }
}
