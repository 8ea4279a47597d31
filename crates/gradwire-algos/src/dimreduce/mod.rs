//! DimReduce (MindSpore boost's dimension-reduction training, with
//! its defects corrected): quasi-Newton steps in the subspace spanned by the
//! principal components of the training trajectory.
//!
//! [`Pca::fit`] takes snapshots of the flattened parameters (rows) from a
//! first stage of ordinary training, centres them, and takes the top
//! `n_components` right singular vectors through the eigen-decomposition of
//! the small Gram matrix (`rows x rows`): exact, and cheap when there are far
//! fewer snapshots than parameters. Eigenvector signs are fixed (largest entry
//! positive), so every rank computing P from the same snapshots gets the same
//! P bit for bit; or compute it on one rank and [`Pca::broadcast`] it.
//!
//! [`DimReduce::step`] then runs from each rank's own gradient and loss,
//! with P sharded by parameter columns (each rank holds every component
//! over its slice of the parameters, [`chunk_range`]):
//! 1. a reduce-scatter of the gradients: each rank gets the averaged `g`
//!    over its slice;
//! 2. `gk = P g`: each rank projects its slice, and **one** all-reduce of
//!    `n + 2` values sums the parts, the losses and the squared norms (for
//!    the non-finite check and the optional clipping, alike everywhere);
//! 3. the BFGS inverse update of `B` (when `y.s > 1e-20`), `d = -B gk`;
//! 4. `dn = P^T d` and `gproj = P^T gk` on each rank's slice, and an
//!    all-gather of `dn` (f32) for the trial points;
//! 5. a line search over the configured step sizes (default `rho^0, rho^1`):
//!    the trial point `w + t dn` is evaluated by the caller's loss closure and
//!    undone exactly; the first `t` with `L1 < L0 + sigma t gk.d` (Armijo) is
//!    taken, otherwise the step is 0 and `B` and `g_last` are restored;
//! 6. `m = gamma m + g - gproj; w = w - (alpha m - t dn)` on each rank's
//!    slice (the residual momentum is sharded too), and an all-gather of the
//!    new parameters.
//!
//! A step moves a reduce-scatter and two all-gathers of the parameters' f32
//! size, 1.5 times the bytes of a dense ring all-reduce (the first design,
//! sharding P by components, needed a dense all-reduce, an all-gather and an
//! all-reduce of two f64 vectors of the model's size: about 5 times).
//!
//! Versus MindSpore: losses are averaged with true division (the caller's
//! closure returns the average), any W works, one all-gather and one
//! all-reduce replace W broadcasts, trial points never go through a stateful
//! optimizer, the list of step sizes is configurable, and P is deterministic.

mod pca;

pub use pca::{Pca, TrajectoryRecorder};

use crate::error::{AlgoError, Result};
use gradwire_comm::{Communicator, Gathered, ReduceOp, chunk_range};
use ndarray::{Array1, Array2, s};
use std::ops::Range;

/// DimReduce's hyper-parameters (MindSpore's defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct DimReduceConfig {
    /// Step-size base of the line search.
    pub rho: f64,
    /// Decay of the residual momentum.
    pub gamma: f64,
    /// Step of the residual momentum (the part of g outside the subspace).
    pub alpha: f64,
    /// Armijo constant.
    pub sigma: f64,
    /// The step sizes tried, in order (default `[rho^0, rho^1]`).
    pub step_sizes: Vec<f64>,
    /// Scale the averaged gradient so that its global L2 norm is at most
    /// this (DistOpt's `clip_global_norm`).
    pub clip_global_norm: Option<f64>,
}

impl Default for DimReduceConfig {
    fn default() -> Self {
        DimReduceConfig {
            rho: 0.55,
            gamma: 0.9,
            alpha: 0.001,
            sigma: 0.4,
            step_sizes: vec![1.0, 0.55],
            clip_global_norm: None,
        }
    }
}

/// DimReduce's state as plain data (row-major B).
#[derive(Debug, Clone, PartialEq)]
pub struct DimReduceState {
    /// The inverse-Hessian approximation, `n x n`, row-major.
    pub b: Vec<f64>,
    /// The last projected gradient.
    pub g_last: Vec<f64>,
    /// The last accepted step in the subspace.
    pub s: Vec<f64>,
    /// Whether a first step has been taken.
    pub initialized: bool,
    /// The residual momentum: this rank's slice of the parameters (a
    /// checkpoint of the whole vector, from before the momentum was
    /// sharded, is accepted too).
    pub momentum: Vec<f32>,
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DimReduceStep {
    /// The accepted step size, 0 if the line search rejected every one.
    pub step: f64,
    /// The averaged loss at the accepted point (the starting loss if none).
    pub loss: f64,
    /// Whether the averaged gradient or loss held a NaN or an infinity:
    /// then nothing changed, alike on every rank.
    pub non_finite: bool,
    /// Bytes this rank sent and received (the trials' losses aside, which
    /// the caller's closure averages).
    pub traffic: crate::Traffic,
}

/// The state of DimReduce on one rank.
#[derive(Debug, Clone)]
pub struct DimReduce {
    config: DimReduceConfig,
    /// This rank's slice of the parameters (columns of P).
    cols: Range<usize>,
    /// P's columns of that slice (`n x cols`).
    p_cols: Array2<f64>,
    n: usize,
    /// The parameters' count.
    m: usize,
    /// The inverse-Hessian approximation, `n x n`.
    b: Array2<f64>,
    g_last: Array1<f64>,
    s: Array1<f64>,
    initialized: bool,
    /// Residual momentum over this rank's slice.
    momentum: Vec<f32>,
    /// The step's working memory, kept from step to step.
    buffers: StepBuffers,
}

/// What a step works in, reused: a steady step allocates nothing.
#[derive(Debug, Clone, Default)]
struct StepBuffers {
    /// This rank's slice of the averaged gradient, in f32 and f64.
    g_slice: Vec<f32>,
    g64: Vec<f64>,
    /// The projections' parts, the loss and the squared norm.
    sums: Vec<f64>,
    /// B, g_last and the flag before the step (put back on a rejection).
    b_before: Vec<f64>,
    g_last_before: Vec<f64>,
    /// The BFGS update's `y`, `t` and `B t`.
    y: Vec<f64>,
    t: Vec<f64>,
    bt: Vec<f64>,
    /// The direction, its back-projection on this slice (f64 and f32) and
    /// the projected gradient on it.
    d: Vec<f64>,
    dn_slice: Vec<f64>,
    dn32: Vec<f32>,
    gproj: Vec<f64>,
    /// Every rank's back-projection, and the parameters before the step.
    dn: Gathered<f32>,
    start: Vec<f32>,
    /// This rank's new parameters, and everyone's.
    mine: Vec<f32>,
    updated: Gathered<f32>,
}

impl DimReduce {
    /// Prepares DimReduce on `comm` with the components `pca` (the same on
    /// every rank): this rank keeps the columns of its slice of the
    /// parameters.
    pub fn new<C: Communicator>(comm: &C, pca: &Pca, config: DimReduceConfig) -> Result<DimReduce> {
        if config.step_sizes.is_empty()
            || config
                .step_sizes
                .iter()
                .any(|t| !(t.is_finite() && *t > 0.0))
        {
            return Err(AlgoError::InvalidArgument(
                "step sizes must be positive and finite".into(),
            ));
        }
        if config
            .clip_global_norm
            .is_some_and(|c| !(c.is_finite() && c > 0.0))
        {
            return Err(AlgoError::InvalidArgument(
                "the clipping norm must be positive and finite".into(),
            ));
        }
        let n = pca.n_components();
        let m = pca.components.ncols();
        let cols = chunk_range(m, comm.world_size(), comm.rank());
        let p_cols = pca.components.slice(s![.., cols.clone()]).to_owned();
        Ok(DimReduce {
            config,
            momentum: vec![0.0; cols.len()],
            cols,
            p_cols,
            n,
            m,
            b: Array2::eye(n),
            g_last: Array1::zeros(n),
            s: Array1::zeros(n),
            initialized: false,
            buffers: StepBuffers::default(),
        })
    }

    /// DimReduce's state (B, g_last, s, the initialized flag and this rank's
    /// slice of the residual momentum), for a checkpoint.
    pub fn state(&self) -> DimReduceState {
        DimReduceState {
            b: self.b.iter().copied().collect(),
            g_last: self.g_last.to_vec(),
            s: self.s.to_vec(),
            initialized: self.initialized,
            momentum: self.momentum.clone(),
        }
    }

    /// Restores a state saved by [`DimReduce::state`] from a DimReduce with
    /// the same components and rank (or one whose momentum covers every
    /// parameter: this rank keeps its slice).
    pub fn restore(&mut self, state: DimReduceState) -> Result<()> {
        let n = self.n;
        let momentum = if state.momentum.len() == self.cols.len() {
            state.momentum
        } else if state.momentum.len() == self.m {
            state.momentum[self.cols.clone()].to_vec()
        } else {
            return Err(AlgoError::InvalidArgument(
                "DimReduce state of other dimensions".into(),
            ));
        };
        if state.b.len() != n * n || state.g_last.len() != n || state.s.len() != n {
            return Err(AlgoError::InvalidArgument(
                "DimReduce state of other dimensions".into(),
            ));
        }
        self.b = Array2::from_shape_vec((n, n), state.b)
            .map_err(|e| AlgoError::InvalidArgument(format!("B: {e}")))?;
        self.g_last = Array1::from(state.g_last);
        self.s = Array1::from(state.s);
        self.initialized = state.initialized;
        self.momentum = momentum;
        Ok(())
    }

    /// The inverse-Hessian approximation.
    pub fn b(&self) -> &Array2<f64> {
        &self.b
    }

    /// One step on the flat parameters `w` (the same on every rank) from
    /// this rank's gradient `g` and loss `loss` (both averaged across ranks
    /// here); `eval_loss(w)` returns the averaged loss at a trial point
    /// (every rank calls it with the same point).
    ///
    /// The failure model ([`crate::fault`]): wrong lengths on one rank are
    /// posted as a fault in place of the first collective, so every rank
    /// fails there. A NaN or an infinity in any rank's gradient or loss
    /// reaches every rank through the sums: the step then changes nothing
    /// and says so (`non_finite`) everywhere. `eval_loss` must agree across
    /// ranks itself (DistOpt's averages the losses and turns a failing
    /// rank's error into NaN, which rejects the trial everywhere); if it
    /// returns an error, the step ends with `w` and the subspace state as
    /// they were.
    pub fn step<C: Communicator>(
        &mut self,
        comm: &C,
        w: &mut [f32],
        g: &[f32],
        loss: f64,
        mut eval_loss: impl FnMut(&[f32]) -> Result<f64>,
    ) -> Result<DimReduceStep> {
        let (m, n, world) = (self.m, self.n, comm.world_size());
        if w.len() != m || g.len() != m {
            let err = AlgoError::InvalidArgument(format!(
                "parameters of {} and gradient of {} elements, the components have {m}",
                w.len(),
                g.len()
            ));
            return Err(crate::fault::fail(comm, err));
        }
        let cols = self.cols.clone();
        let mut traffic = crate::Traffic::default();
        let buf = &mut self.buffers;
        // 1. The averaged gradient over this rank's slice.
        buf.g_slice.clear();
        buf.g_slice.resize(cols.len(), 0.0);
        comm.reduce_scatter(g, &mut buf.g_slice, ReduceOp::Sum)?;
        traffic += crate::Traffic::all_gather(4 * cols.len(), 4 * m, world);
        let inverse = 1.0 / world as f32;
        buf.g_slice.iter_mut().for_each(|v| *v *= inverse);
        // 2. gk's parts, the losses and the squared norms in one all-reduce.
        buf.g64.clear();
        buf.g64.extend(buf.g_slice.iter().map(|&v| f64::from(v)));
        buf.sums.clear();
        let p = self.p_cols.as_slice().unwrap_or(&[]);
        let width = cols.len();
        for k in 0..n {
            let row = &p[k * width..(k + 1) * width];
            buf.sums
                .push(row.iter().zip(&buf.g64).map(|(a, b)| a * b).sum());
        }
        buf.sums.push(loss);
        buf.sums.push(buf.g64.iter().map(|v| v * v).sum());
        comm.all_reduce(&mut buf.sums, ReduceOp::Sum)?;
        traffic += crate::Traffic::all_reduce(8 * (n + 2), world);
        let (loss, sum_sq) = (buf.sums[n] / world as f64, buf.sums[n + 1]);
        if !(loss.is_finite() && sum_sq.is_finite()) {
            // The same sums on every rank: the same decision.
            return Ok(DimReduceStep {
                step: 0.0,
                loss,
                non_finite: true,
                traffic,
            });
        }
        let gk = &mut buf.sums[..n];
        if let Some(max_norm) = self.config.clip_global_norm {
            let norm = sum_sq.sqrt();
            if norm > max_norm {
                let factor = max_norm / norm;
                gk.iter_mut().for_each(|v| *v *= factor);
                buf.g64.iter_mut().for_each(|v| *v *= factor);
            }
        }
        // 3. BFGS inverse update: B = tᵀ B t + s sᵀ / c, t = I - y sᵀ / c.
        let b = self.b.as_slice_mut().unwrap_or(&mut []);
        let (g_last, s) = (
            self.g_last.as_slice_mut().unwrap_or(&mut []),
            self.s.as_slice().unwrap_or(&[]),
        );
        buf.b_before.clear();
        buf.b_before.extend_from_slice(b);
        buf.g_last_before.clear();
        buf.g_last_before.extend_from_slice(g_last);
        let initialized_before = self.initialized;
        if self.initialized {
            buf.y.clear();
            buf.y
                .extend(gk.iter().zip(g_last.iter()).map(|(a, b)| a - b));
            let c: f64 = buf.y.iter().zip(s).map(|(a, b)| a * b).sum();
            if c > 1e-20 {
                buf.t.clear();
                buf.t.resize(n * n, 0.0);
                for (i, row) in buf.t.chunks_exact_mut(n).enumerate() {
                    for (j, (t, sj)) in row.iter_mut().zip(s).enumerate() {
                        let eye = if i == j { 1.0 } else { 0.0 };
                        *t = eye - buf.y[i] * sj / c;
                    }
                }
                // B t, then tᵀ (B t) + s sᵀ / c into B.
                buf.bt.clear();
                buf.bt.resize(n * n, 0.0);
                for i in 0..n {
                    for k in 0..n {
                        let bik = b[i * n + k];
                        for j in 0..n {
                            buf.bt[i * n + j] += bik * buf.t[k * n + j];
                        }
                    }
                }
                for (i, row) in b.chunks_exact_mut(n).enumerate() {
                    for (j, (v, sj)) in row.iter_mut().zip(s).enumerate() {
                        *v = s[i] * sj / c
                            + (0..n)
                                .map(|k| buf.t[k * n + i] * buf.bt[k * n + j])
                                .sum::<f64>();
                    }
                }
            }
        } else {
            self.initialized = true;
        }
        g_last.copy_from_slice(gk);
        // d = -B gk.
        buf.d.clear();
        for i in 0..n {
            buf.d.push(
                -b[i * n..(i + 1) * n]
                    .iter()
                    .zip(gk.iter())
                    .map(|(a, b)| a * b)
                    .sum::<f64>(),
            );
        }
        // 4. dn = Pᵀ d and gproj = Pᵀ gk on this rank's slice; dn to all.
        buf.dn_slice.clear();
        buf.dn_slice.resize(width, 0.0);
        buf.gproj.clear();
        buf.gproj.resize(width, 0.0);
        for k in 0..n {
            let row = &p[k * width..(k + 1) * width];
            let (dk, gkk) = (buf.d[k], gk[k]);
            for ((dn, gp), &pkj) in buf.dn_slice.iter_mut().zip(buf.gproj.iter_mut()).zip(row) {
                *dn += pkj * dk;
                *gp += pkj * gkk;
            }
        }
        buf.dn32.clear();
        buf.dn32.extend(buf.dn_slice.iter().map(|&v| v as f32));
        comm.all_gather_varied_into(&buf.dn32, &mut buf.dn)?;
        traffic += crate::Traffic::all_gather(4 * cols.len(), 4 * m, world);
        let dn = buf.dn.data();
        if dn.len() != m {
            return Err(AlgoError::InvalidArgument(
                "ranks disagree on the components".into(),
            ));
        }
        // 5. Line search, each trial undone exactly.
        buf.start.clear();
        buf.start.extend_from_slice(w);
        let slope: f64 = gk.iter().zip(&buf.d).map(|(a, b)| a * b).sum();
        let mut accepted = None;
        for &t in &self.config.step_sizes {
            for ((wi, &w0), &di) in w.iter_mut().zip(&buf.start).zip(dn) {
                *wi = (f64::from(w0) + t * f64::from(di)) as f32;
            }
            let trial = eval_loss(w);
            w.copy_from_slice(&buf.start);
            let trial = match trial {
                Ok(trial) => trial,
                Err(e) => {
                    b.copy_from_slice(&buf.b_before);
                    g_last.copy_from_slice(&buf.g_last_before);
                    self.initialized = initialized_before;
                    return Err(e);
                }
            };
            if trial < loss + self.config.sigma * t * slope {
                accepted = Some((t, trial));
                break;
            }
        }
        let (step, new_loss) = match accepted {
            Some((t, l)) => {
                for (s, d) in self.s.iter_mut().zip(&buf.d) {
                    *s = d * t;
                }
                (t, l)
            }
            None => {
                b.copy_from_slice(&buf.b_before);
                g_last.copy_from_slice(&buf.g_last_before);
                self.initialized = initialized_before;
                (0.0, loss)
            }
        };
        // 6. Residual momentum and the update of this rank's slice, then
        // every slice to every rank.
        let (gamma, alpha) = (self.config.gamma, self.config.alpha);
        buf.mine.clear();
        for (k, i) in cols.clone().enumerate() {
            let mk = gamma * f64::from(self.momentum[k]) + buf.g64[k] - buf.gproj[k];
            self.momentum[k] = mk as f32;
            let delta = alpha * mk - step * buf.dn_slice[k];
            buf.mine.push((f64::from(buf.start[i]) - delta) as f32);
        }
        comm.all_gather_varied_into(&buf.mine, &mut buf.updated)?;
        traffic += crate::Traffic::all_gather(4 * cols.len(), 4 * m, world);
        w.copy_from_slice(buf.updated.data());
        Ok(DimReduceStep {
            step,
            loss: new_loss,
            non_finite: false,
            traffic,
        })
    }
}
