//! DistOpt's PowerSGD mode on LocalComm: its gradients are exactly what
//! the algorithm gives on the same bucket; a skipped step (a NaN on one
//! rank) leaves its warm start and residuals as they were, so the run goes
//! on as if the step had never come; a checkpoint resumes bitwise.

use gradwire_algos::PowerSgdConfig;
use gradwire_algos::powersgd::PowerSgd;
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::checkpoint;
use gradwire_optim::{DistOpt, DistOptConfig, Mode, OptimError, ParamSpec, Sgd, SgdConfig};
use gradwire_tensor::Tensor;

/// Matrices (compressed at rank 2), a conv-shaped kernel and a vector (dense).
const SHAPES: &[&[usize]] = &[&[24, 20], &[12, 3, 3], &[7], &[16, 33]];

fn specs() -> Vec<ParamSpec> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(k, dims)| ParamSpec::new(format!("p{k}"), dims.to_vec()))
        .collect()
}

fn names() -> Vec<String> {
    (0..SHAPES.len()).map(|k| format!("p{k}")).collect()
}

/// Rank `rank`'s gradient of parameter `k` at `step`: a shared low-rank
/// part plus a per-rank part, so compression loses something.
fn gradient(rank: usize, step: usize, k: usize) -> Tensor {
    let dims = SHAPES[k].to_vec();
    let n: usize = dims.iter().product();
    let values = (0..n)
        .map(|i| {
            let shared = ((i % 7) as f32 - 3.0) * 0.01 * (step as f32 + 1.0).sqrt();
            let own = (((rank * 131 + step * 17 + k * 5 + i) as f32) * 0.37).sin() * 0.05;
            shared + own
        })
        .collect();
    Tensor::from_vec(values, dims).unwrap()
}

fn config(fusion_threshold: usize) -> DistOptConfig {
    DistOptConfig {
        mode: Mode::PowerSgd(PowerSgdConfig {
            rank: 2,
            start_step: 1,
            ..PowerSgdConfig::default()
        }),
        fusion_threshold,
        skip_non_finite: true,
        ..DistOptConfig::default()
    }
}

fn sgd() -> Sgd {
    Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9)).unwrap()
}

#[test]
fn distopt_gives_what_the_algorithm_gives_on_the_same_bucket() {
    for world in [1usize, 2, 3, 5] {
        let results = local::run(world, |comm: LocalComm| {
            let rank = comm.rank();
            // The reference runs on a communicator of its own.
            let own = comm
                .split(Some(0), rank as i64)
                .map_err(gradwire_algos::AlgoError::from)?
                .expect("every rank has color 0");
            // One bucket holding every parameter.
            let mut dist = DistOpt::new(sgd(), comm, specs(), config(1 << 20))?;
            let mut reference = PowerSgd::new(match config(0).mode {
                Mode::PowerSgd(c) => c,
                _ => unreachable!(),
            })?;
            let mut worst = 0u32;
            for step in 0..4 {
                for k in 0..SHAPES.len() {
                    dist.push(&format!("p{k}"), gradient(rank, step, k))?;
                }
                let mut got = vec![None; SHAPES.len()];
                dist.finish_gradients(|i, g| {
                    got[i] = Some(g.to_vec::<f32>()?);
                    Ok(())
                })?;
                let mut want: Vec<Tensor> =
                    (0..SHAPES.len()).map(|k| gradient(rank, step, k)).collect();
                let slots: Vec<usize> = (0..SHAPES.len()).collect();
                reference.all_reduce(&own, &mut want, &slots, step as u64)?;
                for (g, w) in got.iter().zip(&want) {
                    let (g, w) = (g.as_ref().unwrap(), w.to_vec::<f32>()?);
                    worst = worst.max(
                        g.iter()
                            .zip(&w)
                            .filter(|(a, b)| a.to_bits() != b.to_bits())
                            .count() as u32,
                    );
                }
            }
            Ok::<_, OptimError>(worst)
        })
        .unwrap();
        for r in results {
            assert_eq!(r.unwrap(), 0, "W = {world}: bits differ");
        }
    }
}

/// Each rank's parameters after training on `steps` (a `None` step is one
/// whose gradient holds a NaN on the last rank, skipped on every rank),
/// with a checkpoint through bytes into a fresh DistOpt after `save_at`
/// steps when given.
fn train(world: usize, steps: &[Option<usize>], save_at: Option<usize>) -> Vec<Vec<u32>> {
    let results = local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let mut dist = Some(DistOpt::new(sgd(), comm, specs(), config(400))?);
        let mut params: Vec<Tensor> = SHAPES
            .iter()
            .map(|d| {
                Tensor::zeros(
                    d.to_vec(),
                    gradwire_tensor::DType::F32,
                    gradwire_tensor::Device::Cpu,
                )
            })
            .collect::<Result<_, _>>()?;
        let names = names();
        for (i, step) in steps.iter().enumerate() {
            if Some(i) == save_at {
                let old = dist.take().unwrap();
                let bytes = checkpoint::to_bytes(&old.checkpoint()?)?;
                let mut fresh = DistOpt::new(sgd(), old.into_comm(), specs(), config(400))?;
                fresh.restore(&checkpoint::from_bytes(&bytes)?)?;
                dist = Some(fresh);
            }
            let dist = dist.as_mut().unwrap();
            let (step, poisoned) = match step {
                Some(s) => (*s, false),
                None => (0, true),
            };
            for (k, name) in names.iter().enumerate() {
                let mut g = gradient(rank, step, k);
                if poisoned && rank == world - 1 && k == 0 {
                    g.as_mut_slice::<f32>()?[3] = f32::NAN;
                }
                dist.push(name, g)?;
            }
            let stats = dist.finish(names.iter().map(String::as_str).zip(params.iter_mut()))?;
            assert_eq!(stats.non_finite, poisoned);
        }
        Ok::<_, OptimError>(
            params
                .iter()
                .flat_map(|p| p.to_vec::<f32>().unwrap())
                .map(f32::to_bits)
                .collect::<Vec<_>>(),
        )
    })
    .unwrap();
    results.into_iter().map(|r| r.unwrap()).collect()
}

#[test]
fn a_skipped_step_leaves_the_warm_start_and_residuals_as_they_were() {
    for world in [2usize, 3] {
        let straight = train(world, &[Some(0), Some(1), Some(2), Some(3)], None);
        let skipped = train(world, &[Some(0), Some(1), None, Some(2), Some(3)], None);
        for r in 0..world {
            assert_eq!(straight[r], straight[0], "W = {world}: ranks diverged");
            assert_eq!(straight[r], skipped[r], "W = {world}, rank {r}");
        }
    }
}

#[test]
fn a_checkpoint_resumes_bitwise() {
    let steps: Vec<Option<usize>> = (0..6).map(Some).collect();
    let straight = train(3, &steps, None);
    let resumed = train(3, &steps, Some(3));
    assert_eq!(straight, resumed);
}

#[test]
fn bad_settings_are_refused_at_construction() {
    let comm = LocalComm::create(1).unwrap().pop().unwrap();
    let config = DistOptConfig {
        mode: Mode::PowerSgd(PowerSgdConfig {
            rank: 0,
            ..PowerSgdConfig::default()
        }),
        ..DistOptConfig::default()
    };
    assert!(DistOpt::new(sgd(), comm, specs(), config).is_err());
}
