//! The principal components of a training trajectory ([`Pca`]: exact
//! through the small Gram matrix, or a seeded randomized SVD) and the
//! recorder of the snapshots they are fitted from ([`TrajectoryRecorder`]).

use crate::error::{AlgoError, Result};
use gradwire_comm::Communicator;
use nalgebra::{DMatrix, SymmetricEigen};
use ndarray::{Array2, Axis};

/// The principal components of a trajectory: `components` is `n x M` with
/// orthonormal rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Pca {
    /// The components, one per row.
    pub components: Array2<f64>,
}

impl Pca {
    /// Fits the top `n_components` components of `snapshots` (each a
    /// flattened parameter vector of the same length). Fewer come back if the
    /// centred snapshots span fewer directions.
    pub fn fit(snapshots: &[Vec<f32>], n_components: usize) -> Result<Pca> {
        let x = centred(snapshots, n_components)?;
        top_components(&x, n_components)
    }

    /// Fits like [`Pca::fit`] with a randomized SVD (Halko et al.; MindSpore's
    /// choice: oversampling 10, one power iteration) for trajectories with
    /// many snapshots, where the Gram matrix would be large. Seeded, so every
    /// rank computes the same components from the same snapshots.
    pub fn fit_randomized(snapshots: &[Vec<f32>], n_components: usize, seed: u64) -> Result<Pca> {
        use rand::{Rng, SeedableRng};
        let x = centred(snapshots, n_components)?;
        let (rows, m) = x.dim();
        let width = (n_components + 10).min(rows).min(m);
        // A seeded Gaussian test matrix (Box-Muller).
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let omega = Array2::from_shape_fn((m, width), |_| {
            let (u, v): (f64, f64) = (rng.random::<f64>().max(f64::MIN_POSITIVE), rng.random());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        });
        // Range of X X^T X (one power iteration), orthonormalised.
        let y = x.dot(&omega);
        let y = x.dot(&x.t().dot(&y));
        let q = from_nalgebra(&to_nalgebra(&y).qr().q());
        // The components of the small B = Q^T X are X's.
        let b = q.t().dot(&x);
        top_components(&b, n_components)
    }

    /// Number of components.
    pub fn n_components(&self) -> usize {
        self.components.nrows()
    }

    /// Copies `root`'s components to every rank (collective).
    pub fn broadcast<C: Communicator>(&mut self, comm: &C, root: usize) -> Result<()> {
        let mut shape = [
            self.components.nrows() as u64,
            self.components.ncols() as u64,
        ];
        comm.broadcast(&mut shape, root)?;
        let (n, m) = (shape[0] as usize, shape[1] as usize);
        let mut flat: Vec<f64> = if comm.rank() == root {
            self.components.iter().copied().collect()
        } else {
            vec![0.0; n * m]
        };
        comm.broadcast(&mut flat, root)?;
        self.components = Array2::from_shape_vec((n, m), flat)
            .map_err(|e| AlgoError::InvalidArgument(format!("components: {e}")))?;
        Ok(())
    }
}

/// The snapshots as a matrix (rows), each column centred.
fn centred(snapshots: &[Vec<f32>], n_components: usize) -> Result<Array2<f64>> {
    let rows = snapshots.len();
    let m = snapshots.first().map_or(0, Vec::len);
    if rows < 2 || snapshots.iter().any(|s| s.len() != m) || n_components == 0 {
        return Err(AlgoError::InvalidArgument(format!(
            "PCA needs at least 2 snapshots of equal length and n_components > 0 (got {rows} rows)"
        )));
    }
    let mut x = Array2::<f64>::zeros((rows, m));
    for (mut row, snap) in x.rows_mut().into_iter().zip(snapshots) {
        row.iter_mut()
            .zip(snap)
            .for_each(|(a, &b)| *a = f64::from(b));
    }
    let mean = x
        .mean_axis(Axis(0))
        .ok_or_else(|| AlgoError::InvalidArgument("empty".into()))?;
    x -= &mean;
    Ok(x)
}

/// The top right singular vectors of `x` (rows x M) from the eigenvectors
/// of its Gram matrix, signs fixed (largest entry positive); directions with
/// a negligible singular value are left out.
fn top_components(x: &Array2<f64>, n_components: usize) -> Result<Pca> {
    let (rows, m) = x.dim();
    let gram = x.dot(&x.t());
    if gram.iter().any(|v| !v.is_finite()) {
        return Err(AlgoError::InvalidArgument(
            "PCA: the snapshots hold a NaN or an infinity".into(),
        ));
    }
    let eigen = SymmetricEigen::new(to_nalgebra(&gram));
    let (values, vectors) = (eigen.eigenvalues, from_nalgebra(&eigen.eigenvectors));
    // Largest first; ties in index order, so the choice is deterministic.
    let mut order: Vec<usize> = (0..rows).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    let largest = values.iter().copied().fold(0.0, f64::max);
    let mut components = Vec::new();
    for i in order {
        if components.len() == n_components || values[i] <= largest * 1e-12 || values[i] <= 0.0 {
            break;
        }
        let mut v = x.t().dot(&vectors.column(i)) / values[i].sqrt();
        let pivot = v
            .iter()
            .copied()
            .fold(0.0f64, |a, b| if b.abs() > a.abs() { b } else { a });
        if pivot < 0.0 {
            v.mapv_inplace(|a| -a);
        }
        components.push(v);
    }
    let mut out = Array2::zeros((components.len(), m));
    for (mut row, v) in out.rows_mut().into_iter().zip(components) {
        row.assign(&v);
    }
    Ok(Pca { components: out })
}

/// An ndarray matrix as nalgebra's (the linear algebra is nalgebra's pure
/// Rust: no system BLAS or LAPACK).
fn to_nalgebra(a: &Array2<f64>) -> DMatrix<f64> {
    let (rows, cols) = a.dim();
    DMatrix::from_fn(rows, cols, |i, j| a[[i, j]])
}

/// nalgebra's matrix as ndarray's.
fn from_nalgebra(a: &DMatrix<f64>) -> Array2<f64> {
    Array2::from_shape_fn((a.nrows(), a.ncols()), |(i, j)| a[(i, j)])
}

/// Collects flattened parameter snapshots during a first training stage,
/// keeping at most `capacity` (the oldest are dropped: MindSpore's recipe
/// keeps the later part of the run).
#[derive(Debug, Clone, Default)]
pub struct TrajectoryRecorder {
    capacity: usize,
    snapshots: std::collections::VecDeque<Vec<f32>>,
}

impl TrajectoryRecorder {
    /// A recorder keeping the last `capacity` snapshots.
    pub fn new(capacity: usize) -> TrajectoryRecorder {
        TrajectoryRecorder {
            capacity,
            snapshots: std::collections::VecDeque::new(),
        }
    }

    /// Records the parameters (flattened in order, as f32); a snapshot of
    /// another length than the first is
    /// [`gradwire_tensor::Error::LengthMismatch`].
    pub fn record(&mut self, params: &[&gradwire_tensor::Tensor]) -> Result<()> {
        let mut flat = Vec::new();
        for p in params {
            flat.extend(p.to_f32_vec()?);
        }
        if let Some(first) = self.snapshots.front()
            && first.len() != flat.len()
        {
            return Err(gradwire_tensor::Error::LengthMismatch {
                op: "TrajectoryRecorder::record",
                expected: first.len(),
                got: flat.len(),
            }
            .into());
        }
        if self.capacity == 0 {
            return Ok(());
        }
        if self.snapshots.len() == self.capacity {
            self.snapshots.pop_front();
        }
        self.snapshots.push_back(flat);
        Ok(())
    }

    /// Number of snapshots kept.
    pub fn len(&self) -> usize {
        self.snapshots.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.snapshots.is_empty()
    }

    /// The snapshots kept, oldest first (to save them with a checkpoint and
    /// [`TrajectoryRecorder::record`] them again on resume).
    pub fn snapshots(&self) -> impl Iterator<Item = &[f32]> {
        self.snapshots.iter().map(Vec::as_slice)
    }

    /// Fits the components of what was recorded ([`Pca::fit`]).
    pub fn fit(&self, n_components: usize) -> Result<Pca> {
        let rows: Vec<Vec<f32>> = self.snapshots.iter().cloned().collect();
        Pca::fit(&rows, n_components)
    }
}
