//! The baseline every strategy is measured against: the data-parallel loop
//! without gradwire's machinery, as Horovod runs it on CPUs. Every gradient
//! is copied into one fusion buffer, summed by the backend library's own
//! all-reduce (Open MPI's `MPI_Allreduce` under `--backend mpi`), divided
//! by W, and stepped by the same optimizer as the other strategies. No
//! buckets, no overlap, no skip vote: what a user would write instead.
//! With accumulation (Horovod's `backward_passes_per_step`) the
//! micro-batches' gradients are summed in the fusion buffer's twin and
//! their mean is exchanged once per step. The 16-bit baseline
//! (`baseline:fp16`, `baseline:bf16`) is Horovod's fp16 compression: the
//! fused gradients cast to 16 bits, summed by the library in 16 bits, cast
//! back.

use crate::error::Result;
use candle_core::backprop::GradStore;
use candle_core::{Tensor as CandleTensor, Var};
use candle_nn::Optimizer as _;
use gradwire_algos::HalfPrecision;
use gradwire_algos::Traffic;
use gradwire_candle::{CandleOptim, with_values};
use gradwire_comm::{Communicator, Element, LocalComm, ReduceOp};
use gradwire_optim::{StepStats, UpdateRule};
use gradwire_tensor::{bf16, f16};
use std::time::{Duration, Instant};

/// What a communicator offers the training loop beyond the trait: its
/// library's own all-reduce (the baseline's) and the time its calls took
/// (the network's share of a step).
pub trait Backend: Communicator {
    /// Sums `buf` over the ranks with the library's own algorithm; by
    /// default the communicator's all-reduce (LocalComm has no library).
    fn library_sum<T: Element>(&self, buf: &mut [T]) -> gradwire_comm::Result<()> {
        self.all_reduce(buf, ReduceOp::Sum)
    }

    /// The time spent in this communicator's calls so far (on the caller's
    /// thread, and on its asynchronous jobs' thread), if it keeps count.
    fn time_in_calls(&self) -> Option<(Duration, Duration)> {
        None
    }

    /// Of that time, how long this rank waited in the calls for the last
    /// rank to arrive, if the communicator keeps count.
    fn time_waiting(&self) -> Option<Duration> {
        None
    }
}

impl Backend for LocalComm {}

#[cfg(feature = "mpi")]
impl Backend for gradwire_comm::MpiComm {
    fn library_sum<T: Element>(&self, buf: &mut [T]) -> gradwire_comm::Result<()> {
        self.library_all_reduce(buf, ReduceOp::Sum)
    }

    fn time_in_calls(&self) -> Option<(Duration, Duration)> {
        let t = gradwire_comm::MpiComm::time_in_calls(self);
        Some((t.caller, t.jobs))
    }

    fn time_waiting(&self) -> Option<Duration> {
        Some(gradwire_comm::MpiComm::time_in_calls(self).waiting)
    }
}

#[cfg(feature = "nccl")]
impl<T: gradwire_comm::nccl::NcclTransport> Backend for gradwire_comm::nccl::NcclComm<T> {}

/// The baseline loop of one worker.
pub(crate) struct LibraryLoop<R: UpdateRule, C> {
    pub(super) optimizer: CandleOptim<R>,
    pub(super) comm: C,
    /// Horovod's fusion buffer: every gradient, in the variables' order.
    fused: Vec<f32>,
    /// Micro-batches per step, those of this step so far, and their sum.
    micro_batches: u32,
    micro: u32,
    sum: Vec<f32>,
    /// The 16-bit baseline's format and its wire buffers (reused).
    precision: Option<HalfPrecision>,
    wire_f16: Vec<f16>,
    wire_bf16: Vec<bf16>,
}

impl<R: UpdateRule, C: Backend> LibraryLoop<R, C> {
    pub(super) fn new(
        vars: Vec<(String, Var)>,
        optimizer: R::Config,
        comm: C,
        micro_batches: u32,
        precision: Option<HalfPrecision>,
    ) -> Result<Self> {
        let len = vars.iter().map(|(_, v)| v.elem_count()).sum();
        Ok(LibraryLoop {
            optimizer: CandleOptim::with_names(vars, optimizer)?,
            comm,
            fused: Vec::with_capacity(len),
            micro_batches: micro_batches.max(1),
            micro: 0,
            sum: Vec::new(),
            precision,
            wire_f16: Vec::new(),
            wire_bf16: Vec::new(),
        })
    }

    /// Fuses, sums with the library, averages and steps. A variable without
    /// a gradient on this rank contributes zeros (the sum stays defined).
    pub(super) fn step(&mut self, mut grads: GradStore) -> Result<StepStats> {
        self.fused.clear();
        for (_, var) in self.optimizer.vars() {
            match grads.get(var.as_tensor()) {
                Some(g) => with_values(g, |v| self.fused.extend_from_slice(v))?,
                None => self.fused.resize(self.fused.len() + var.elem_count(), 0.0),
            }
        }
        if self.micro_batches > 1 {
            // Summed in micro-batch order, the mean taken at the last one.
            if self.micro == 0 {
                self.sum.clear();
                self.sum.extend_from_slice(&self.fused);
            } else {
                self.sum
                    .iter_mut()
                    .zip(&self.fused)
                    .for_each(|(s, g)| *s += g);
            }
            self.micro += 1;
            if self.micro < self.micro_batches {
                return Ok(StepStats {
                    accumulated: true,
                    ..StepStats::default()
                });
            }
            self.micro = 0;
            let factor = 1.0 / self.micro_batches as f32;
            self.fused
                .iter_mut()
                .zip(&self.sum)
                .for_each(|(g, s)| *g = s * factor);
        }
        let started = Instant::now();
        let element_bytes = match self.precision {
            None => {
                self.comm.library_sum(&mut self.fused)?;
                4
            }
            Some(HalfPrecision::F16) => {
                half_sum(
                    &self.comm,
                    &mut self.fused,
                    &mut self.wire_f16,
                    f16::from_f32,
                    f16::to_f32,
                )?;
                2
            }
            Some(HalfPrecision::BF16) => {
                half_sum(
                    &self.comm,
                    &mut self.fused,
                    &mut self.wire_bf16,
                    bf16::from_f32,
                    bf16::to_f32,
                )?;
                2
            }
        };
        let wait = started.elapsed();
        let inverse = 1.0 / self.comm.world_size() as f32;
        let mut at = 0;
        for (_, var) in self.optimizer.vars() {
            let n = var.elem_count();
            let averaged: Vec<f32> = self.fused[at..at + n].iter().map(|g| g * inverse).collect();
            at += n;
            let t = CandleTensor::from_vec(averaged, var.dims(), var.device())?;
            grads.insert(var.as_tensor(), t);
        }
        self.optimizer.step(&grads)?;
        Ok(StepStats {
            buckets: 1,
            traffic: Traffic::all_reduce(element_bytes * self.fused.len(), self.comm.world_size()),
            wait,
            combine: wait,
            updated: self.optimizer.vars().len(),
            ..StepStats::default()
        })
    }
}

/// `fused` summed over the ranks in 16 bits: cast into `wire` (reused),
/// summed by the library, cast back (each value rounded once on the way
/// out, and the sum in the library's 16-bit arithmetic).
fn half_sum<C: Backend, H: Element + Copy>(
    comm: &C,
    fused: &mut [f32],
    wire: &mut Vec<H>,
    narrow: impl Fn(f32) -> H,
    widen: impl Fn(H) -> f32,
) -> Result<()> {
    wire.clear();
    wire.extend(fused.iter().map(|&g| narrow(g)));
    comm.library_sum(wire)?;
    fused
        .iter_mut()
        .zip(wire.iter())
        .for_each(|(g, &h)| *g = widen(h));
    Ok(())
}
