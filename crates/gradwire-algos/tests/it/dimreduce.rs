//! DimReduce: PCA recovers the trajectory's subspace, BFGS keeps B symmetric
//! positive definite, a quadratic whose Hessian lies in the subspace is
//! solved in few steps, a rejected line search changes nothing, and W = 1
//! and W = 3 agree.

use gradwire_algos::AlgoError;
use gradwire_algos::dimreduce::{DimReduce, DimReduceConfig, Pca};
use gradwire_comm::{Communicator, LocalComm, local};
use ndarray::{Array1, Array2};

const M: usize = 40;
const K: usize = 5;

fn noise(state: &mut u64) -> f64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
}

/// A trajectory of 9 snapshots spanning a K-dimensional affine subspace.
fn trajectory() -> (Vec<Vec<f32>>, Vec<Array1<f64>>) {
    let mut state = 0x5eed_u64;
    let basis: Vec<Array1<f64>> = (0..K)
        .map(|_| (0..M).map(|_| noise(&mut state)).collect())
        .collect();
    let base: Array1<f64> = (0..M).map(|_| noise(&mut state)).collect();
    let snapshots = (0..9)
        .map(|_| {
            let mut v = base.clone();
            for b in &basis {
                v = v + b * (2.0 * noise(&mut state));
            }
            v.iter().map(|&x| x as f32).collect()
        })
        .collect();
    (snapshots, basis)
}

/// The quadratic 0.5 (w - w*)^T A (w - w*) with A = P^T D P, D from 0.05 to
/// 1.5: badly conditioned, so that gradient steps alone would crawl (0.95 per
/// step along the flattest direction) while BFGS finishes in about K steps.
struct Quadratic {
    a: Array2<f64>,
    target: Array1<f64>,
}

impl Quadratic {
    fn new(pca: &Pca) -> Quadratic {
        let p = &pca.components;
        let d = Array2::from_diag(&Array1::from_iter(
            (0..p.nrows()).map(|i| 0.5 + i as f64 / p.nrows() as f64),
        ));
        let a = p.t().dot(&d).dot(p);
        let target = Array1::from_iter((0..M).map(|i| 0.3 + (i % 7) as f64 * 0.1));
        Quadratic { a, target }
    }

    fn loss(&self, w: &[f32]) -> f64 {
        let e = Array1::from_iter(w.iter().map(|&v| f64::from(v))) - &self.target;
        0.5 * e.dot(&self.a.dot(&e))
    }

    fn grad(&self, w: &[f32]) -> Vec<f32> {
        let e = Array1::from_iter(w.iter().map(|&v| f64::from(v))) - &self.target;
        self.a.dot(&e).iter().map(|&v| v as f32).collect()
    }

    /// A start whose error lies in the subspace.
    fn start(&self, pca: &Pca) -> Vec<f32> {
        let z = Array1::from_iter((0..pca.n_components()).map(|i| 1.0 - 0.3 * i as f64));
        (&self.target + &pca.components.t().dot(&z))
            .iter()
            .map(|&v| v as f32)
            .collect()
    }
}

fn pca() -> Pca {
    let (snapshots, basis) = trajectory();
    let pca = Pca::fit(&snapshots, 8).unwrap();
    assert_eq!(pca.n_components(), K, "the trajectory spans K directions");
    // Rows orthonormal, and the basis lies in their span.
    let gram = pca.components.dot(&pca.components.t());
    for i in 0..K {
        for j in 0..K {
            let want = if i == j { 1.0 } else { 0.0 };
            assert!((gram[[i, j]] - want).abs() < 1e-9);
        }
    }
    // The snapshots are f32, so the span is recovered to f32 precision.
    for b in &basis {
        let projected = pca.components.t().dot(&pca.components.dot(b));
        assert!((&projected - b).iter().all(|x| x.abs() < 1e-5));
    }
    pca
}

/// `steps` DimReduce steps on the quadratic over `world` ranks; returns the
/// parameters and the loss after each step (rank 0), checking B on the way.
fn solve(world: usize, steps: usize) -> (Vec<f32>, Vec<f64>) {
    let pca = pca();
    let q = Quadratic::new(&pca);
    let results = local::run(world, |comm: LocalComm| {
        let mut dr = DimReduce::new(&comm, &pca, DimReduceConfig::default())?;
        let mut w = q.start(&pca);
        let mut losses = Vec::new();
        for _ in 0..steps {
            let g = q.grad(&w);
            let loss = q.loss(&w);
            dr.step(&comm, &mut w, &g, loss, |trial| Ok(q.loss(trial)))?;
            // B stays symmetric positive definite.
            let b = dr.b();
            assert!(
                (b - &b.t()).iter().all(|x| x.abs() < 1e-9),
                "B not symmetric"
            );
            // Positive definite: a Cholesky factor exists.
            let (n, m) = b.dim();
            let dense = nalgebra::DMatrix::from_fn(n, m, |i, j| b[[i, j]]);
            assert!(
                nalgebra::Cholesky::new(dense).is_some(),
                "B not positive definite: {b}"
            );
            losses.push(q.loss(&w));
        }
        Ok::<_, AlgoError>((w, losses))
    })
    .unwrap();
    results.into_iter().next().unwrap().unwrap()
}

#[test]
fn a_quadratic_in_the_subspace_is_solved_in_few_steps() {
    let pca = pca();
    let q = Quadratic::new(&pca);
    let start = q.loss(&q.start(&pca));
    // BFGS reaches f32's floor (~1e-15 here) in about 8 steps; gradient
    // steps alone would still be near 1e-7 of the start after 10.
    let (_, losses) = solve(1, 10);
    assert!(
        losses.last().unwrap() < &(start * 1e-12),
        "losses {losses:?} from {start}"
    );
}

#[test]
fn one_rank_and_three_ranks_agree() {
    let (one, _) = solve(1, 6);
    let (three, _) = solve(3, 6);
    for (a, b) in one.iter().zip(&three) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
    }
}

#[test]
fn a_rejected_line_search_changes_nothing() {
    let pca = pca();
    let q = Quadratic::new(&pca);
    let results = local::run(2, |comm: LocalComm| {
        let mut dr = DimReduce::new(&comm, &pca, DimReduceConfig::default())?;
        let mut w = q.start(&pca);
        // One accepted step first, so that B is not the identity any more.
        let g = q.grad(&w);
        let loss = q.loss(&w);
        dr.step(&comm, &mut w, &g, loss, |t| Ok(q.loss(t)))?;
        let g = q.grad(&w);
        let loss = q.loss(&w);
        dr.step(&comm, &mut w, &g, loss, |t| Ok(q.loss(t)))?;
        let (w_before, b_before) = (w.clone(), dr.b().clone());
        let g = q.grad(&w);
        let loss = q.loss(&w);
        let result = dr.step(&comm, &mut w, &g, loss, |_| Ok(f64::INFINITY))?;
        Ok::<_, AlgoError>((result.step, w == w_before, *dr.b() == b_before))
    })
    .unwrap();
    for r in results {
        assert_eq!(r.unwrap(), (0.0, true, true));
    }
}

#[test]
fn pca_needs_two_snapshots_and_broadcast_copies_the_root() {
    assert!(matches!(
        Pca::fit(&[vec![1.0; 3]], 2),
        Err(AlgoError::InvalidArgument(_))
    ));
    let results = local::run(3, |comm: LocalComm| {
        let mut p = if gradwire_comm::Communicator::rank(&comm) == 1 {
            pca()
        } else {
            Pca {
                components: Array2::zeros((0, 0)),
            }
        };
        p.broadcast(&comm, 1)?;
        Ok::<_, AlgoError>(p)
    })
    .unwrap();
    for r in results {
        assert_eq!(r.unwrap(), pca());
    }
}

#[test]
fn the_state_round_trips_and_resumes_bitwise() {
    let pca = pca();
    let q = Quadratic::new(&pca);
    let run = |split: Option<usize>| {
        let comms = LocalComm::create(1).unwrap();
        let comm = &comms[0];
        let mut dr = DimReduce::new(comm, &pca, DimReduceConfig::default()).unwrap();
        let mut w = q.start(&pca);
        for step in 0..6 {
            if Some(step) == split {
                let saved = dr.state();
                dr = DimReduce::new(comm, &pca, DimReduceConfig::default()).unwrap();
                dr.restore(saved).unwrap();
            }
            let g = q.grad(&w);
            let loss = q.loss(&w);
            dr.step(comm, &mut w, &g, loss, |t| Ok(q.loss(t))).unwrap();
        }
        w
    };
    assert_eq!(run(None), run(Some(3)));
}

#[test]
fn the_recorder_keeps_the_latest_snapshots() {
    use gradwire_algos::dimreduce::TrajectoryRecorder;
    use gradwire_tensor::Tensor;
    let (snapshots, _) = trajectory();
    let mut recorder = TrajectoryRecorder::new(9);
    // Two tensors per snapshot: 30 + 10 elements.
    for s in std::iter::repeat_n(&snapshots[0], 3).chain(&snapshots) {
        let a = Tensor::from_vec(s[..30].to_vec(), 30).unwrap();
        let b = Tensor::from_vec(s[30..].to_vec(), 10).unwrap();
        recorder.record(&[&a, &b]).unwrap();
    }
    assert_eq!(recorder.len(), 9);
    assert_eq!(recorder.fit(8).unwrap(), pca());
    let short = Tensor::from_vec(vec![0f32; 3], 3).unwrap();
    let result = recorder.record(&[&short]);
    assert!(
        matches!(
            &result,
            Err(AlgoError::Tensor(gradwire_tensor::Error::LengthMismatch {
                expected: 40,
                got: 3,
                ..
            }))
        ),
        "{result:?}"
    );
    assert_eq!(recorder.len(), 9);
}

#[test]
fn the_randomized_fit_finds_the_same_subspace_deterministically() {
    let (snapshots, _) = trajectory();
    let exact = pca();
    let a = Pca::fit_randomized(&snapshots, 8, 1234).unwrap();
    let b = Pca::fit_randomized(&snapshots, 8, 1234).unwrap();
    assert_eq!(a, b, "same seed, same components");
    assert_eq!(a.n_components(), K);
    let projector = |p: &Pca| p.components.t().dot(&p.components);
    let diff = &projector(&a) - &projector(&exact);
    assert!(
        diff.iter().all(|x| x.abs() < 1e-6),
        "subspaces differ by {}",
        diff.iter().fold(0.0f64, |m, x| m.max(x.abs()))
    );
}

/// The unsharded algorithm, as DimReduce first ran it (full P on every
/// rank, the averaged gradient given): the reference the sharded step must
/// match within f32 rounding.
struct Reference {
    p: Array2<f64>,
    b: Array2<f64>,
    g_last: Array1<f64>,
    s: Array1<f64>,
    initialized: bool,
    momentum: Vec<f32>,
    config: DimReduceConfig,
}

impl Reference {
    fn new(pca: &Pca) -> Reference {
        let n = pca.n_components();
        Reference {
            p: pca.components.clone(),
            b: Array2::eye(n),
            g_last: Array1::zeros(n),
            s: Array1::zeros(n),
            initialized: false,
            momentum: vec![0.0; pca.components.ncols()],
            config: DimReduceConfig::default(),
        }
    }

    fn step(&mut self, w: &mut [f32], g: &[f32], loss: f64, eval: impl Fn(&[f32]) -> f64) {
        let outer = |a: &Array1<f64>, b: &Array1<f64>| {
            Array2::from_shape_fn((a.len(), b.len()), |(i, j)| a[i] * b[j])
        };
        let g64: Array1<f64> = g.iter().map(|&v| f64::from(v)).collect();
        let gk = self.p.dot(&g64);
        let (b0, g0, i0) = (self.b.clone(), self.g_last.clone(), self.initialized);
        if self.initialized {
            let y = &gk - &self.g_last;
            let c = y.dot(&self.s);
            if c > 1e-20 {
                let t = Array2::eye(gk.len()) - outer(&y, &self.s) / c;
                self.b = t.t().dot(&self.b).dot(&t) + outer(&self.s, &self.s) / c;
            }
        } else {
            self.initialized = true;
        }
        self.g_last = gk.clone();
        let d = -self.b.dot(&gk);
        let dn = self.p.t().dot(&d);
        let gproj = self.p.t().dot(&gk);
        let start = w.to_vec();
        let slope = gk.dot(&d);
        let mut step = 0.0;
        for &t in &self.config.step_sizes {
            let trial: Vec<f32> = start
                .iter()
                .zip(&dn)
                .map(|(&w0, &di)| (f64::from(w0) + t * di) as f32)
                .collect();
            if eval(&trial) < loss + self.config.sigma * t * slope {
                step = t;
                break;
            }
        }
        if step > 0.0 {
            self.s = &d * step;
        } else {
            (self.b, self.g_last, self.initialized) = (b0, g0, i0);
        }
        let (gamma, alpha) = (self.config.gamma, self.config.alpha);
        for i in 0..w.len() {
            let mi = gamma * f64::from(self.momentum[i]) + g64[i] - gproj[i];
            self.momentum[i] = mi as f32;
            w[i] = (f64::from(start[i]) - (alpha * mi - step * dn[i])) as f32;
        }
    }
}

#[test]
fn sharded_steps_match_the_unsharded_algorithm_and_move_one_and_a_half_dense_steps() {
    // Each rank's gradient differs (its own batch): the reference takes
    // their f32 average, summed in rank order as the reduce-scatter does.
    let pca = pca();
    let q = Quadratic::new(&pca);
    for world in 1..=4usize {
        let results = local::run(world, |comm: LocalComm| {
            let mut dr = DimReduce::new(&comm, &pca, DimReduceConfig::default())?;
            let mut reference = Reference::new(&pca);
            let mut w = q.start(&pca);
            let mut w_ref = w.clone();
            let mut worst = 0f64;
            let mut traffic = Vec::new();
            for _ in 0..6 {
                let own = |rank: usize, w: &[f32]| -> Vec<f32> {
                    q.grad(w)
                        .iter()
                        .enumerate()
                        .map(|(i, v)| v + ((i * 13 + rank * 7) % 5) as f32 * 1e-3 - 2e-3)
                        .collect()
                };
                let g = own(comm.rank(), &w);
                let loss = q.loss(&w);
                let step = dr.step(&comm, &mut w, &g, loss, |t| Ok(q.loss(t)))?;
                traffic.push(step.traffic);
                // The reference from its own trajectory.
                let mut avg = vec![0f32; w_ref.len()];
                for r in 0..comm.world_size() {
                    for (a, v) in avg.iter_mut().zip(own(r, &w_ref)) {
                        *a += v;
                    }
                }
                let inverse = 1.0 / comm.world_size() as f32;
                avg.iter_mut().for_each(|a| *a *= inverse);
                let loss = q.loss(&w_ref);
                reference.step(&mut w_ref, &avg, loss, |t| q.loss(t));
                for (a, b) in w.iter().zip(&w_ref) {
                    worst = worst.max(f64::from((a - b).abs()) / (1.0 + f64::from(b.abs())));
                }
            }
            Ok::<_, AlgoError>((worst, traffic))
        })
        .unwrap();
        let m = pca.components.ncols();
        let dense = gradwire_algos::Traffic::all_reduce(4 * m, world);
        for r in results {
            let (worst, traffic) = r.unwrap();
            assert!(
                worst <= 1e-5,
                "W = {world}: the trajectories differ by {worst}"
            );
            for t in traffic {
                // The reduce-scatter and two all-gathers (with uneven
                // slices, a rank may carry a little more than the mean),
                // and n + 2 f64 sums.
                let bound =
                    1.5 * dense.sent as f64 + 8.0 * (pca.n_components() + 2) as f64 * 2.0 + 12.0;
                assert!(
                    t.sent as f64 <= bound,
                    "W = {world}: {} sent, dense {}",
                    t.sent,
                    dense.sent
                );
            }
        }
    }
}

#[test]
fn a_non_finite_gradient_on_one_rank_changes_nothing_anywhere() {
    let pca = pca();
    let q = Quadratic::new(&pca);
    let results = local::run(3, |comm: LocalComm| {
        let mut dr = DimReduce::new(&comm, &pca, DimReduceConfig::default())?;
        let mut w = q.start(&pca);
        let mut g = q.grad(&w);
        if comm.rank() == 1 {
            g[5] = f32::NAN;
        }
        let before = (w.clone(), dr.state());
        let loss = q.loss(&w);
        let step = dr.step(&comm, &mut w, &g, loss, |t| Ok(q.loss(t)))?;
        Ok::<_, AlgoError>((step.non_finite, w == before.0, dr.state() == before.1))
    })
    .unwrap();
    for r in results {
        assert_eq!(r.unwrap(), (true, true, true));
    }
}
