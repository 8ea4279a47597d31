//! Gradient accumulation (`DistOptConfig::accumulate`): k micro-batches
//! step as their mean would, in every strategy of the registry, bitwise;
//! against an f64 reference of SGD on the mean; one exchange per step (the
//! micro-batches issue no collective); sample weights over micro-batches of
//! unequal size; a fault in any micro-batch fails the whole step on every
//! rank and changes nothing; checkpoints only between steps; bad settings
//! refused with typed errors.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::common::{named_specs, small_buckets};
use gradwire_algos::Traffic;
use gradwire_comm::{Communicator, Fault, FaultKind, LocalComm, LocalConfig, local};
use gradwire_optim::{
    AnyLoop, GradSync, OptimError, ParamSpec, REGISTRY, Sgd, SgdConfig, StrategyConfig,
    TrainingLoop,
};
use gradwire_tensor::{DType, Device, Tensor};

/// A length-1 vector, a prime-length vector and a matrix; the empty
/// parameter is declared too (a gradient of nothing accumulates nothing).
const SHAPES: &[&[usize]] = &[&[1], &[13], &[4, 7], &[0]];
const STEPS: usize = 4;

fn specs() -> Vec<ParamSpec> {
    named_specs(SHAPES)
}

fn names() -> Vec<String> {
    (0..SHAPES.len()).map(|k| format!("p{k}")).collect()
}

fn len(k: usize) -> usize {
    SHAPES[k].iter().product()
}

/// Rank `rank`'s gradient of parameter `k` in micro-batch `micro` of
/// `step`, as values.
fn values(rank: usize, step: usize, micro: usize, k: usize) -> Vec<f32> {
    (0..len(k))
        .map(|i| (((rank * 131 + step * 17 + micro * 7 + k * 5 + i) as f32) * 0.37).sin() * 0.5)
        .collect()
}

fn tensor(values: Vec<f32>, k: usize) -> Tensor {
    Tensor::from_vec(values, SHAPES[k].to_vec()).unwrap()
}

/// The mean of the micro-batches' gradients as the engine computes it in
/// f32: summed in micro-batch order, then scaled by 1/k.
fn mean_f32(rank: usize, step: usize, micro_batches: usize, k: usize) -> Vec<f32> {
    let mut sum = values(rank, step, 0, k);
    for m in 1..micro_batches {
        for (s, v) in sum.iter_mut().zip(values(rank, step, m, k)) {
            *s += v;
        }
    }
    let factor = 1.0 / micro_batches as f32;
    sum.iter().map(|s| s * factor).collect()
}

fn sgd() -> Sgd {
    Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9)).unwrap()
}

/// Dense DistOpt with [`sgd`] over [`specs`], `k` micro-batches a step.
fn dense_loop(comm: LocalComm, k: u32) -> gradwire_optim::Result<AnyLoop<Sgd, LocalComm>> {
    AnyLoop::new(
        sgd(),
        comm,
        specs(),
        small_buckets(StrategyConfig::Dense, k),
    )
}

fn zeros() -> Vec<Tensor> {
    SHAPES
        .iter()
        .map(|d| Tensor::zeros(d.to_vec(), DType::F32, Device::Cpu).unwrap())
        .collect()
}

fn bits(params: &[Tensor]) -> Vec<u32> {
    params
        .iter()
        .flat_map(|t| t.to_vec::<f32>().unwrap())
        .map(f32::to_bits)
        .collect()
}

/// `STEPS` steps of `strategy` on `world` ranks: with `accumulate` = k,
/// each step is k micro-batches of [`values`]; with `premixed`, one
/// micro-batch per step of their f32 mean ([`mean_f32`]). Every rank's
/// parameters (as bits) and every `finish`'s stats.
fn train(
    strategy: StrategyConfig,
    world: usize,
    micro_batches: usize,
    premixed: bool,
) -> Vec<(Vec<u32>, Vec<gradwire_optim::StepStats>)> {
    let accumulate = if premixed { 1 } else { micro_batches as u32 };
    local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let mut front = AnyLoop::new(sgd(), comm, specs(), small_buckets(strategy, accumulate))?;
        let mut params = zeros();
        let names = names();
        let mut stats = Vec::new();
        for step in 0..STEPS {
            let batches = if premixed { 1 } else { micro_batches };
            for micro in 0..batches {
                let grads = (0..SHAPES.len()).map(|k| {
                    let v = if premixed {
                        mean_f32(rank, step, micro_batches, k)
                    } else {
                        values(rank, step, micro, k)
                    };
                    Some(tensor(v, k))
                });
                let items = names
                    .iter()
                    .map(String::as_str)
                    .zip(params.iter_mut())
                    .zip(grads)
                    .map(|((n, p), g)| (n, p, g));
                stats.push(front.step(items)?);
            }
        }
        Ok::<_, OptimError>((bits(&params), stats))
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

/// Every strategy of the registry (DimReduce takes one micro-batch per
/// step): k micro-batches give bitwise the run whose every step pushes
/// their mean, at W = 1..=4 and k = 2, 3; the micro-batches but the last
/// report `accumulated` and move no byte, the last reports what the mean's
/// step moves.
#[test]
fn every_strategy_steps_on_the_mean_of_its_micro_batches() {
    for strategy in REGISTRY {
        if strategy == StrategyConfig::DimReduce {
            continue;
        }
        for world in 1..=4 {
            for k in [2, 3] {
                let accumulated = train(strategy, world, k, false);
                let premixed = train(strategy, world, k, true);
                for (rank, ((acc_bits, acc_stats), (pre_bits, pre_stats))) in
                    accumulated.iter().zip(&premixed).enumerate()
                {
                    let at = format!("{strategy}, W = {world}, k = {k}, rank {rank}");
                    assert_eq!(acc_bits, pre_bits, "{at}: parameters");
                    assert_eq!(acc_stats.len(), STEPS * k, "{at}");
                    for (i, s) in acc_stats.iter().enumerate() {
                        if i % k + 1 < k {
                            assert!(s.accumulated, "{at}: finish {i}");
                            assert_eq!(s.buckets, 0, "{at}: finish {i}");
                            assert_eq!(s.traffic, Traffic::default(), "{at}: finish {i}");
                            assert_eq!(s.updated, 0, "{at}: finish {i}");
                        } else {
                            let pre = pre_stats[i / k];
                            assert!(!s.accumulated, "{at}: finish {i}");
                            assert_eq!(s.traffic, pre.traffic, "{at}: finish {i}");
                            assert_eq!(s.buckets, pre.buckets, "{at}: finish {i}");
                            assert_eq!(s.updated, pre.updated, "{at}: finish {i}");
                        }
                    }
                }
            }
        }
    }
}

/// Dense SGD with momentum over k micro-batches against f64: the
/// parameters follow SGD on the mean over ranks and micro-batches, within
/// a tolerance that scales with the number of terms summed.
#[test]
fn dense_accumulation_matches_an_f64_reference() {
    let (lr, momentum) = (0.1f64, 0.9f64);
    for world in [1, 2, 5] {
        for k in [1usize, 2, 5] {
            let runs = train(StrategyConfig::Dense, world, k, false);
            for (p, shape) in SHAPES.iter().enumerate() {
                let n: usize = shape.iter().product();
                let mut w = vec![0f64; n];
                let mut v = vec![0f64; n];
                for step in 0..STEPS {
                    for i in 0..n {
                        let mut g = 0f64;
                        for rank in 0..world {
                            for micro in 0..k {
                                g += f64::from(values(rank, step, micro, p)[i]);
                            }
                        }
                        g /= (world * k) as f64;
                        v[i] = momentum * v[i] + g;
                        w[i] -= lr * v[i];
                    }
                }
                let offset: usize = (0..p).map(len).sum();
                let tolerance = 1e-6 * (world * k * STEPS) as f64;
                for (rank, (got, _)) in runs.iter().enumerate() {
                    for i in 0..n {
                        let got = f64::from(f32::from_bits(got[offset + i]));
                        assert!(
                            (got - w[i]).abs() <= tolerance * (1.0 + w[i].abs()),
                            "W = {world}, k = {k}, rank {rank}, p{p}[{i}]: {got} against {}",
                            w[i]
                        );
                    }
                }
            }
        }
    }
}

/// The micro-batches issue no collective: at W = 2, rank 1 enters the
/// step's last micro-batch only after rank 0 has finished all of its
/// earlier ones (a collective among them would wait for rank 1 and run
/// into the communicator's deadline).
#[test]
fn micro_batches_issue_no_collective() {
    let k = 4;
    let gate = Arc::new(Barrier::new(2));
    let settings = LocalConfig::with_timeout(Some(Duration::from_secs(60)));
    let outcomes = local::run_with(2, &settings, |comm: LocalComm| {
        let rank = comm.rank();
        let mut front = dense_loop(comm, k)?;
        let mut params = zeros();
        let names = names();
        let mut step = |front: &mut AnyLoop<Sgd, LocalComm>, micro: usize| {
            let items = names
                .iter()
                .map(String::as_str)
                .zip(params.iter_mut())
                .enumerate()
                .map(|(p, (n, t))| (n, t, Some(tensor(values(rank, 0, micro, p), p))));
            front.step(items)
        };
        if rank == 1 {
            gate.wait(); // until rank 0's micro-batches returned
        }
        for micro in 0..k as usize - 1 {
            assert!(step(&mut front, micro)?.accumulated);
        }
        if rank == 0 {
            gate.wait();
        }
        step(&mut front, k as usize - 1)
    })
    .unwrap();
    for outcome in outcomes {
        let stats = outcome.unwrap().unwrap();
        assert!(!stats.accumulated && stats.buckets > 0, "{stats:?}");
    }
}

/// GradSync with sample weights over micro-batches of unequal sizes: the
/// combined gradient is the sum over ranks and micro-batches of samples
/// times the micro-batch's mean gradient, over the total, against f64.
#[test]
fn sample_weights_span_the_micro_batches() {
    let k = 3u32;
    for world in 1..=4usize {
        let samples = |rank: usize, micro: usize| ((rank * 5 + micro * 3) % 7) as u64 + 1;
        let out = local::run(world, |comm: LocalComm| {
            let rank = comm.rank();
            let mut sync = GradSync::new(comm, specs(), small_buckets(StrategyConfig::Dense, k))?;
            let mut combined: Vec<Vec<f32>> =
                (0..SHAPES.len()).map(|p| vec![0.0; len(p)]).collect();
            for micro in 0..k as usize {
                sync.set_samples(samples(rank, micro))?;
                for p in (0..SHAPES.len()).rev() {
                    sync.push(p, &values(rank, 0, micro, p))?;
                }
                let mut buffers: Vec<&mut [f32]> =
                    combined.iter_mut().map(Vec::as_mut_slice).collect();
                let stats = sync.finish(&mut buffers)?;
                assert_eq!(stats.accumulated, micro + 1 < k as usize);
            }
            Ok::<_, OptimError>(combined)
        })
        .unwrap();
        let total: u64 = (0..world)
            .flat_map(|r| (0..k as usize).map(move |m| samples(r, m)))
            .sum();
        for p in 0..SHAPES.len() {
            for i in 0..len(p) {
                let want: f64 = (0..world)
                    .flat_map(|r| (0..k as usize).map(move |m| (r, m)))
                    .map(|(r, m)| samples(r, m) as f64 * f64::from(values(r, 0, m, p)[i]))
                    .sum::<f64>()
                    / total as f64;
                for (rank, got) in out.iter().enumerate() {
                    let got = f64::from(got.as_ref().unwrap()[p][i]);
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "W = {world}, rank {rank}, p{p}[{i}]: {got} against {want}"
                    );
                }
            }
        }
    }
}

/// A bad push in the first micro-batch on one rank: the step's last
/// `finish` is that rank's fault on every rank, the parameters are as
/// before the step, and the run goes on exactly as if the step had never
/// come (bitwise the run without it).
#[test]
fn a_fault_in_any_micro_batch_fails_the_step_everywhere() {
    let k = 3;
    let run = |faulty: bool| {
        local::run(3, |comm: LocalComm| {
            let rank = comm.rank();
            let mut front = dense_loop(comm, k)?;
            let mut params = zeros();
            let names = names();
            let mut outcome = None;
            for step in 0..STEPS {
                if step == 1 && !faulty {
                    continue; // the step that fails in the other run
                }
                let before = bits(&params);
                let mut last = None;
                for micro in 0..k as usize {
                    let bad = faulty && step == 1 && micro == 0 && rank == 2;
                    let items = names
                        .iter()
                        .map(String::as_str)
                        .zip(params.iter_mut())
                        .enumerate()
                        .map(|(p, (n, t))| {
                            let mut v = values(rank, step, micro, p);
                            if bad && p == 1 {
                                v.push(0.0); // one element too many
                            }
                            let g = Tensor::from_vec(v.clone(), vec![v.len()]).unwrap();
                            (n, t, Some(if bad && p == 1 { g } else { tensor(v, p) }))
                        });
                    last = Some(front.step(items));
                }
                if step == 1 {
                    outcome = last.map(|r| r.map(drop));
                    assert_eq!(
                        bits(&params),
                        before,
                        "rank {rank}: the failed step moved a parameter"
                    );
                }
            }
            Ok::<_, OptimError>((bits(&params), outcome))
        })
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect::<Vec<_>>()
    };
    let faulty = run(true);
    let clean = run(false);
    for (rank, ((bits_f, outcome), (bits_c, _))) in faulty.iter().zip(&clean).enumerate() {
        match outcome {
            Some(Err(OptimError::Fault(Fault {
                rank: Some(2),
                kind: FaultKind::InvalidArgument,
                ..
            }))) => {}
            other => panic!("rank {rank}: the faulty step ended {other:?}"),
        }
        assert_eq!(bits_f, bits_c, "rank {rank}: the run after the failed step");
    }
}

/// A checkpoint between the micro-batches of a step is refused (typed);
/// after the step's last one it works.
#[test]
fn checkpoints_come_between_steps() {
    let comm = LocalComm::create(1).unwrap().pop().unwrap();
    let mut front = dense_loop(comm, 2).unwrap();
    let mut params = zeros();
    let names = names();
    let mut step = |front: &mut AnyLoop<Sgd, LocalComm>, micro| {
        let items = names
            .iter()
            .map(String::as_str)
            .zip(params.iter_mut())
            .enumerate()
            .map(|(p, (n, t))| (n, t, Some(tensor(values(0, 0, micro, p), p))));
        front.step(items).unwrap()
    };
    assert!(step(&mut front, 0).accumulated);
    match front.checkpoint() {
        Err(OptimError::InvalidArgument(m)) => assert!(m.contains("micro-batches"), "{m}"),
        other => panic!("a checkpoint between micro-batches: {other:?}"),
    }
    assert!(!step(&mut front, 1).accumulated);
    front.checkpoint().unwrap();
}

/// Settings that cannot work are typed errors at construction.
#[test]
fn bad_accumulation_settings_are_refused() {
    let comm = || LocalComm::create(1).unwrap().pop().unwrap();
    let refused = |result: Result<(), OptimError>, what: &str| match result {
        Err(OptimError::InvalidArgument(m)) => assert!(m.contains("accumulate"), "{what}: {m}"),
        other => panic!("{what}: {other:?}"),
    };
    refused(
        AnyLoop::new(
            sgd(),
            comm(),
            specs(),
            small_buckets(StrategyConfig::Dense, 0),
        )
        .map(drop),
        "zero micro-batches",
    );
    refused(
        AnyLoop::new(
            sgd(),
            comm(),
            specs(),
            small_buckets(StrategyConfig::DimReduce, 2),
        )
        .map(drop),
        "DimReduce",
    );
    for strategy in REGISTRY {
        if strategy.training_loop() == TrainingLoop::LocalSteps {
            refused(
                GradSync::new(comm(), specs(), small_buckets(strategy, 2)).map(drop),
                "GradSync's local steps",
            );
        }
    }
}
