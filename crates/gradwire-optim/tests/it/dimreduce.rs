//! DimReduce through DimReduceOpt: a dense first stage records the
//! trajectory, then `start` switches to DimReduce's step. Every rank holds the same bits; W = 3
//! matches W = 1 on the same global batch within a bound; the loss goes
//! down; a checkpoint (DimReduceOpt's state plus the PCA file) resumes bitwise;
//! misuse is an error on every rank, never a hang.

use gradwire_algos::dimreduce::{DimReduceConfig, Pca, TrajectoryRecorder};
use gradwire_algos::{Fault, FaultKind};
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::checkpoint::{self, Checkpoint};
use gradwire_optim::{
    DimReduceOpt, DistOptConfig, GradSync, OptimError, Optimizer, Sgd, SgdConfig, StrategyConfig,
    StrategyError, TrainingLoop,
};
use gradwire_tensor::Tensor;
use std::path::Path;

use crate::common::{BATCH, BLOCKS, gradient, initial, loss, specs};

const DENSE_STEPS: usize = 12;
const COMPONENTS: usize = 6;

fn sgd() -> Sgd {
    Sgd::new(SgdConfig::default().lr(0.05).momentum(0.5)).unwrap()
}

/// MindSpore's defaults with a longer line search (rho^0 .. rho^5): with
/// only two step sizes a rejected step repeats itself on this problem.
/// DimReduceOpt's settings: the defaults, in DimReduce.
fn dimreduce() -> DistOptConfig {
    DistOptConfig {
        strategy: StrategyConfig::DimReduce,
        ..DistOptConfig::default()
    }
}

fn config() -> DimReduceConfig {
    let defaults = DimReduceConfig::default();
    DimReduceConfig {
        step_sizes: (0..6).map(|m| defaults.rho.powi(m)).collect(),
        ..defaults
    }
}

fn names() -> Vec<String> {
    (0..BLOCKS.len()).map(|k| format!("w{k}")).collect()
}

fn values(w: &[Tensor]) -> Vec<Vec<f32>> {
    w.iter().map(|t| t.to_vec::<f32>().unwrap()).collect()
}

/// Values of the trial parameters DimReduceOpt hands to the loss closure, in
/// block order.
fn trial_values(trial: &[(&str, &Tensor)]) -> Vec<Vec<f32>> {
    (0..BLOCKS.len())
        .map(|k| {
            let name = format!("w{k}");
            let (_, t) = trial.iter().find(|(n, _)| *n == name).unwrap();
            t.to_vec::<f32>().unwrap()
        })
        .collect()
}

/// Pushes this rank's shard gradient in backward order.
fn push_gradient(
    dist: &mut DimReduceOpt<Sgd, LocalComm>,
    w: &[Tensor],
    shard: std::ops::Range<usize>,
) -> Result<(), OptimError> {
    let g = gradient(&values(w), shard);
    for k in (0..BLOCKS.len()).rev() {
        let gk: Vec<f32> = g[k].iter().map(|&v| v as f32).collect();
        dist.push(&format!("w{k}"), Tensor::from_vec(gk, BLOCKS[k])?)?;
    }
    Ok(())
}

/// What the dense stage leaves: DimReduceOpt, the parameters, the components.
type DenseStage = (DimReduceOpt<Sgd, LocalComm>, Vec<Tensor>, Pca);

/// The dense stage on `comm`: returns the DimReduceOpt, the parameters and the
/// components fitted from the recorded trajectory (declaration order, as
/// DimReduce flattens).
fn dense_stage(comm: LocalComm) -> Result<DenseStage, OptimError> {
    let world = comm.world_size();
    let shard = comm.rank() * BATCH / world..(comm.rank() + 1) * BATCH / world;
    let mut dist = DimReduceOpt::new(sgd(), comm, specs(), dimreduce())?;
    let mut w: Vec<Tensor> = initial()
        .into_iter()
        .map(|v| {
            let n = v.len();
            Tensor::from_vec(v, n).unwrap()
        })
        .collect();
    let mut recorder = TrajectoryRecorder::new(DENSE_STEPS);
    let names = names();
    for _ in 0..DENSE_STEPS {
        push_gradient(&mut dist, &w, shard.clone())?;
        dist.finish(names.iter().map(String::as_str).zip(w.iter_mut()))?;
        // Declaration order is backward order: the last block first.
        let ordered: Vec<&Tensor> = w.iter().rev().collect();
        recorder
            .record(&ordered)
            .map_err(|e| OptimError::InvalidArgument(e.to_string()))?;
    }
    let pca = recorder
        .fit(COMPONENTS)
        .map_err(|e| OptimError::InvalidArgument(e.to_string()))?;
    Ok((dist, w, pca))
}

/// `steps` DimReduce steps through DimReduceOpt; returns the step sizes taken.
fn dimreduce_steps(
    dist: &mut DimReduceOpt<Sgd, LocalComm>,
    w: &mut [Tensor],
    steps: usize,
) -> Result<Vec<f64>, OptimError> {
    let world = dist.world_size();
    let rank = dist.rank();
    let shard = rank * BATCH / world..(rank + 1) * BATCH / world;
    let names = names();
    let mut taken = Vec::new();
    for _ in 0..steps {
        push_gradient(dist, w, shard.clone())?;
        let local_loss = loss(&values(w), shard.clone());
        let stats = dist.finish_dimreduce(
            names.iter().map(String::as_str).zip(w.iter_mut()),
            local_loss,
            |trial| Ok(loss(&trial_values(trial), shard.clone())),
        )?;
        taken.push(stats.dimreduce.expect("a DimReduce step").step);
    }
    Ok(taken)
}

/// Dense stage then `steps` DimReduce steps on `world` ranks: every rank's
/// final parameters and step sizes.
fn run(world: usize, steps: usize) -> Vec<(Vec<Vec<f32>>, Vec<f64>)> {
    local::run(world, |comm: LocalComm| {
        let (mut dist, mut w, pca) = dense_stage(comm)?;
        dist.start(&pca, config())?;
        let taken = dimreduce_steps(&mut dist, &mut w, steps)?;
        Ok::<_, OptimError>((values(&w), taken))
    })
    .unwrap()
    .into_iter()
    .map(Result::unwrap)
    .collect()
}

/// This rank's shard gradient, pushed to GradSync by declaration index
/// (`w` in declaration order: the last block first).
fn push_to_grad_sync(
    sync: &mut GradSync<LocalComm>,
    w: &[Vec<f32>],
    shard: std::ops::Range<usize>,
) -> Result<(), OptimError> {
    let blocks: Vec<Vec<f32>> = w.iter().rev().cloned().collect();
    for (i, g) in gradient(&blocks, shard).iter().rev().enumerate() {
        let g: Vec<f32> = g.iter().map(|&v| v as f32).collect();
        sync.push(i, &g)?;
    }
    Ok(())
}

/// [`run`] through GradSync: the caller's own SGD over plain slices in the
/// dense stage, then GradSync's DimReduce steps writing the trial points
/// into those slices. Every rank's final parameters (block order) and
/// step sizes.
fn run_grad_sync(world: usize, steps: usize) -> Vec<(Vec<Vec<f32>>, Vec<f64>)> {
    local::run(world, |comm: LocalComm| {
        let shard = comm.rank() * BATCH / world..(comm.rank() + 1) * BATCH / world;
        let specs = specs();
        let mut sync = GradSync::new(comm, specs.clone(), dimreduce())?;
        assert_eq!(sync.training_loop(), TrainingLoop::DimReduce);
        let mut own = sgd();
        let mut w: Vec<Vec<f32>> = initial().into_iter().rev().collect();
        let mut recorder = TrajectoryRecorder::new(DENSE_STEPS);
        for _ in 0..DENSE_STEPS {
            push_to_grad_sync(&mut sync, &w, shard.clone())?;
            let mut g: Vec<Vec<f32>> = w.iter().map(|p| vec![0.0; p.len()]).collect();
            let mut out: Vec<&mut [f32]> = g.iter_mut().map(Vec::as_mut_slice).collect();
            sync.finish(&mut out)?;
            for (spec, (p, g)) in specs.iter().zip(w.iter_mut().zip(&g)) {
                own.update_slice(&spec.name, &spec.shape, p, g)?;
            }
            own.step();
            let snapshot = w
                .iter()
                .map(|p| Tensor::from_vec(p.clone(), p.len()))
                .collect::<Result<Vec<_>, _>>()?;
            recorder
                .record(&snapshot.iter().collect::<Vec<_>>())
                .map_err(|e| OptimError::InvalidArgument(e.to_string()))?;
        }
        let pca = recorder
            .fit(COMPONENTS)
            .map_err(|e| OptimError::InvalidArgument(e.to_string()))?;
        assert!(!sync.dimreduce_started());
        sync.start_dimreduce(&pca, config())?;
        assert!(sync.dimreduce_started());
        let mut taken = Vec::new();
        for _ in 0..steps {
            push_to_grad_sync(&mut sync, &w, shard.clone())?;
            let blocks: Vec<Vec<f32>> = w.iter().rev().cloned().collect();
            let local_loss = loss(&blocks, shard.clone());
            let mut slices: Vec<&mut [f32]> = w.iter_mut().map(Vec::as_mut_slice).collect();
            let stats = sync.step_dimreduce(&mut slices[..], local_loss, |trial| {
                let blocks: Vec<Vec<f32>> = trial.iter().rev().map(|p| p.to_vec()).collect();
                Ok(loss(&blocks, shard.clone()))
            })?;
            taken.push(stats.dimreduce.expect("a DimReduce step").step);
        }
        Ok::<_, OptimError>((w.into_iter().rev().collect(), taken))
    })
    .unwrap()
    .into_iter()
    .map(Result::unwrap)
    .collect()
}

/// GradSync runs DimReduce (its dense first stage with the caller's
/// optimizer, then DimReduce's steps on the caller's parameters) bitwise
/// as DimReduceOpt does, at every world size.
#[test]
fn grad_sync_runs_dimreduce_bitwise_as_dimreduce_opt() {
    let bits = |r: &(Vec<Vec<f32>>, Vec<f64>)| -> (Vec<u32>, Vec<u64>) {
        (
            r.0.iter().flatten().map(|v| v.to_bits()).collect(),
            r.1.iter().map(|v| v.to_bits()).collect(),
        )
    };
    for world in 1..=4 {
        let want = run(world, 5);
        let got = run_grad_sync(world, 5);
        for (rank, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(bits(g), bits(w), "W = {world}, rank {rank}");
        }
    }
}

/// DimReduce's calls through GradSync: a DimReduce step before
/// `start_dimreduce` fails on every rank and changes nothing; another
/// strategy's `start_dimreduce` is refused as the wrong loop.
#[test]
fn grad_sync_refuses_dimreduce_calls_out_of_place() {
    let out = local::run(2, |comm: LocalComm| {
        let rank = comm.rank();
        let dense = DistOptConfig {
            strategy: StrategyConfig::Dense,
            ..DistOptConfig::default()
        };
        let other = comm.split(Some(0), rank as i64)?.expect("a member");
        let mut sync = GradSync::new(comm, specs(), dimreduce())?;
        let mut w: Vec<Vec<f32>> = initial().into_iter().rev().collect();
        let before = w.clone();
        push_to_grad_sync(&mut sync, &w, 0..BATCH)?;
        let mut slices: Vec<&mut [f32]> = w.iter_mut().map(Vec::as_mut_slice).collect();
        let early = sync
            .step_dimreduce(&mut slices[..], 1.0, |_| Ok(1.0))
            .unwrap_err();
        let mut gradients = GradSync::new(other, specs(), dense)?;
        let pca = Pca {
            components: ndarray::Array2::zeros((COMPONENTS, crate::common::features())),
        };
        let wrong = gradients.start_dimreduce(&pca, config()).unwrap_err();
        Ok::<_, OptimError>((early, wrong, w == before))
    })
    .unwrap();
    for r in out {
        let (early, wrong, unchanged) = r.unwrap();
        assert!(
            matches!(
                early,
                OptimError::Fault(Fault {
                    kind: FaultKind::InvalidArgument,
                    ..
                })
            ),
            "{early}"
        );
        assert!(
            matches!(wrong, OptimError::Strategy(StrategyError::WrongLoop { .. })),
            "{wrong}"
        );
        assert!(unchanged, "a refused step changed the parameters");
    }
}

#[test]
fn ranks_agree_the_loss_falls_and_world_sizes_match() {
    let one = run(1, 8);
    let three = run(3, 8);
    for r in &three {
        assert_eq!(r, &three[0], "ranks diverged");
    }
    let (w1, steps1) = &one[0];
    let (w3, steps3) = &three[0];
    assert_eq!(steps1, steps3, "the line searches took other steps");
    assert!(
        steps1.iter().all(|&t| t > 0.0),
        "a line search failed on a quadratic"
    );
    // Same global batch, different summation order: close, scaled by size.
    let scale = w1.iter().flatten().fold(1f32, |m, v| m.max(v.abs()));
    let diff = w1
        .iter()
        .flatten()
        .zip(w3.iter().flatten())
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff <= 1e-4 * scale, "W=1 vs W=3 differ by {diff}");
    // The DimReduce stage lowers the loss below where the dense stage ended.
    let dense_end = local::run(1, |comm: LocalComm| {
        dense_stage(comm).map(|(_, w, _)| values(&w))
    })
    .unwrap()
    .remove(0)
    .unwrap();
    let before = loss(&dense_end, 0..BATCH);
    let after = loss(w1, 0..BATCH);
    println!("step sizes {steps1:?}; loss {before} -> {after}; W=1 vs W=3 max diff {diff}");
    assert!(after < before / 4.0, "loss {before} -> {after}");
}

fn save_state(
    dir: &Path,
    dist: &DimReduceOpt<Sgd, LocalComm>,
    w: &[Tensor],
) -> Result<(), OptimError> {
    let mut ckpt = dist.checkpoint()?;
    let names = names();
    ckpt.set_parameters(names.iter().map(String::as_str).zip(w.iter()));
    checkpoint::save(dir.join(format!("rank{}.ckpt", dist.rank())), &ckpt)
}

#[test]
fn a_checkpoint_and_the_pca_file_resume_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let straight = run(3, 8);
    let dir_path = dir.path();
    let resumed = local::run(3, |comm: LocalComm| {
        // First run: dense stage, 4 DimReduce steps, save, drop everything.
        let (mut dist, mut w, pca) = dense_stage(comm)?;
        if dist.rank() == 0 {
            checkpoint::save_pca(dir_path.join("pca.safetensors"), &pca)?;
        }
        dist.start(&pca, config())?;
        let mut taken = dimreduce_steps(&mut dist, &mut w, 4)?;
        save_state(dir_path, &dist, &w)?;
        dist.comm()
            .barrier()
            .map_err(gradwire_algos::AlgoError::from)?;
        let comm = dist.into_comm();
        // Second run: a new DimReduceOpt from the files.
        let ckpt: Checkpoint =
            checkpoint::load(dir_path.join(format!("rank{}.ckpt", comm.rank())))?;
        let pca = checkpoint::load_pca(dir_path.join("pca.safetensors"))?;
        let mut dist = DimReduceOpt::new(sgd(), comm, specs(), dimreduce())?;
        // DimReduce state cannot go into a DimReduceOpt in its first stage.
        assert!(matches!(
            dist.restore(&ckpt),
            Err(OptimError::StateMismatch(_))
        ));
        dist.start(&pca, config())?;
        dist.restore(&ckpt)?;
        let mut w: Vec<Tensor> = (0..BLOCKS.len())
            .map(|k| {
                let flat = ckpt.flat_parameters(&[&format!("w{k}")])?;
                Ok(Tensor::from_vec(flat, BLOCKS[k])?)
            })
            .collect::<Result<_, OptimError>>()?;
        taken.extend(dimreduce_steps(&mut dist, &mut w, 4)?);
        Ok::<_, OptimError>((values(&w), taken))
    })
    .unwrap();
    for (r, s) in resumed.into_iter().zip(&straight) {
        let r = r.unwrap();
        assert_eq!(&r.1, &s.1, "step sizes");
        let bits = |v: &[Vec<f32>]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&r.0),
            bits(&s.0),
            "resumed run is not bitwise the same"
        );
    }
}

#[test]
fn pca_files_round_trip_exactly_and_reject_damage() {
    let rows: Vec<Vec<f32>> = (0..5)
        .map(|i| {
            (0..11)
                .map(|j| ((i * 7 + j * 3) % 13) as f32 * 0.37 - 1.1)
                .collect()
        })
        .collect();
    let pca = Pca::fit(&rows, 3).unwrap();
    let bytes = checkpoint::pca_to_bytes(&pca).unwrap();
    assert_eq!(checkpoint::pca_from_bytes(&bytes).unwrap(), pca);
    for cut in [0, 7, bytes.len() / 2, bytes.len() - 1] {
        assert!(matches!(
            checkpoint::pca_from_bytes(&bytes[..cut]),
            Err(OptimError::CorruptCheckpoint(_))
        ));
    }
    // A checkpoint is not a PCA file.
    let sgd = sgd();
    let ckpt = checkpoint::to_bytes(&Checkpoint::new(
        gradwire_optim::Optimizer::state(&sgd).unwrap(),
    ))
    .unwrap();
    assert!(matches!(
        checkpoint::pca_from_bytes(&ckpt),
        Err(OptimError::CorruptCheckpoint(_))
    ));
}

#[test]
fn misuse_is_an_error_on_every_rank() {
    let outcomes = local::run(3, |comm: LocalComm| {
        let rank = comm.rank();
        let (mut dist, mut w, pca) = dense_stage(comm)?;
        let names = names();
        // finish_dimreduce before start.
        push_gradient(&mut dist, &w, 0..BATCH)?;
        let early = dist.finish_dimreduce(
            names.iter().map(String::as_str).zip(w.iter_mut()),
            0.0,
            |_| Ok(0.0),
        );
        assert!(
            matches!(
                early,
                Err(OptimError::Fault(Fault {
                    kind: FaultKind::InvalidArgument,
                    rank: Some(0),
                    ..
                }))
            ),
            "{early:?}"
        );
        // Components of the wrong width.
        let narrow = Pca::fit(&[vec![0.0, 1.0], vec![1.0, 0.0], vec![0.5, 0.5]], 1)
            .map_err(|e| OptimError::InvalidArgument(e.to_string()))?;
        let err = dist.start(&narrow, config()).unwrap_err();
        assert!(matches!(err, OptimError::InvalidArgument(_)), "{err}");
        dist.start(&pca, config())?;
        // Plain finish in DimReduce mode (its buckets already travelled).
        push_gradient(&mut dist, &w, 0..BATCH)?;
        let plain = dist.finish(names.iter().map(String::as_str).zip(w.iter_mut()));
        assert!(
            matches!(
                plain,
                Err(OptimError::Fault(Fault {
                    kind: FaultKind::InvalidArgument,
                    rank: Some(0),
                    ..
                }))
            ),
            "{plain:?}"
        );
        // A parameter of the wrong element count on rank 2 only (w5, the
        // first declared, is 3 long; 4 given, which shifts every later
        // parameter's place in the flat model): an error naming rank 2 on
        // every rank, no panic, and nothing changes.
        push_gradient(&mut dist, &w, 0..BATCH)?;
        let before = values(&w);
        let mut long = Tensor::from_vec(vec![0f32; BLOCKS[5] + 1], BLOCKS[5] + 1)?;
        let mut given: Vec<(&str, &mut Tensor)> =
            names.iter().map(String::as_str).zip(w.iter_mut()).collect();
        if rank == 2 {
            given[5].1 = &mut long; // w5
        }
        let wrong = dist.finish_dimreduce(given, 1.0, |_| Ok(0.5));
        assert!(
            matches!(
                wrong,
                Err(OptimError::Fault(Fault {
                    kind: FaultKind::InvalidArgument,
                    rank: Some(2),
                    ..
                }))
            ),
            "{wrong:?}"
        );
        assert_eq!(values(&w), before, "a refused step changed the parameters");
        // A loss closure failing on rank 1 only: every rank finishes the
        // step (every trial rejected, instead of hanging), then every rank
        // returns the fault, naming rank 1.
        push_gradient(&mut dist, &w, 0..BATCH)?;
        let failing = dist.finish_dimreduce(
            names.iter().map(String::as_str).zip(w.iter_mut()),
            1.0,
            |_| {
                if rank == 1 {
                    Err(OptimError::InvalidArgument("loss failed".into()))
                } else {
                    Ok(0.5)
                }
            },
        );
        // The step completed alike everywhere: the ranks still agree, and
        // DimReduceOpt stays usable.
        let after_failure = values(&w);
        push_gradient(&mut dist, &w, 0..BATCH)?;
        dist.finish_dimreduce(
            names.iter().map(String::as_str).zip(w.iter_mut()),
            1.0,
            |_| Ok(0.5),
        )?;
        Ok::<_, OptimError>((failing.map(|s| s.dimreduce.map(|d| d.step)), after_failure))
    })
    .unwrap();
    let outcomes: Vec<_> = outcomes.into_iter().map(Result::unwrap).collect();
    for (_, w) in &outcomes {
        assert_eq!(w, &outcomes[0].1, "ranks diverged after a failing loss");
    }
    for (rank, (failing, _)) in outcomes.into_iter().enumerate() {
        match failing {
            Err(OptimError::Fault(Fault {
                rank: Some(1),
                kind: FaultKind::Other,
                detail,
            })) => assert!(
                (rank == 1) == detail.contains("loss failed"),
                "rank {rank}: {detail}"
            ),
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}
