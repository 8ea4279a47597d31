//! `GradSync::step_locally`: partial averaging (with the caller's
//! optimizer state too, through `step_locally_with_state`) and
//! delta-weight AdaSum with the caller's own local step give bitwise
//! LocalSteps' results with LocalSteps' optimizer taking that step; a step that fails on one rank
//! fails on every rank (and delta weight puts p0 back); a NaN gradient is
//! skipped on every rank; the next step works.

use gradwire_algos::adasum::AdaSum;
use gradwire_algos::{Fault, FaultKind};
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::{
    DistOptConfig, GradSync, LocalSteps, OptimError, Optimizer, ParamSpec, Result, Sgd, SgdConfig,
    StrategyConfig, TrainingLoop,
};
use gradwire_tensor::Tensor;

/// Lengths 1, a prime and a matrix; three buckets (fusion threshold 12).
fn specs() -> Vec<ParamSpec> {
    vec![
        ParamSpec::new("s", [1]),
        ParamSpec::new("p", [13]),
        ParamSpec::new("m", [4, 7]),
    ]
}

fn config(mode: StrategyConfig) -> DistOptConfig {
    DistOptConfig {
        strategy: mode,
        fusion_threshold: 12,
        skip_non_finite: true,
        ..DistOptConfig::default()
    }
}

fn sgd() -> Sgd {
    Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9)).expect("sgd")
}

fn initial(k: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((k * 31 + i) as f32 * 0.37).cos()).collect()
}

/// Every declared parameter's starting values.
fn initial_params(specs: &[ParamSpec]) -> Vec<Vec<f32>> {
    specs
        .iter()
        .enumerate()
        .map(|(k, s)| initial(k, s.shape.iter().product()))
        .collect()
}

fn gradient(rank: usize, step: usize, k: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((rank * 13 + step * 7 + k * 5 + i) as f32) * 0.61).sin() * 0.2)
        .collect()
}

const STEPS: usize = 5;

fn bits(v: &[Vec<f32>]) -> Vec<u32> {
    v.iter().flatten().map(|x| x.to_bits()).collect()
}

/// LocalSteps with SGD as the local step: every rank's parameters after
/// `STEPS` steps.
fn through_local_steps(comm: LocalComm, mode: StrategyConfig) -> Result<Vec<Vec<f32>>> {
    let rank = comm.rank();
    let specs = specs();
    let mut dist = match mode {
        StrategyConfig::DeltaWeight { group: None } => {
            let adasum = AdaSum::new(&comm)?;
            LocalSteps::with_strategy(sgd(), comm, specs.clone(), config(mode), adasum)?
        }
        _ => LocalSteps::new(sgd(), comm, specs.clone(), config(mode))?,
    };
    let mut params: Vec<Tensor> = specs
        .iter()
        .enumerate()
        .map(|(k, s)| Tensor::from_vec(initial(k, s.shape.iter().product()), s.shape.clone()))
        .collect::<std::result::Result<_, _>>()?;
    for step in 0..STEPS {
        for (k, s) in specs.iter().enumerate() {
            let g = gradient(rank, step, k, s.shape.iter().product());
            dist.push(&s.name, Tensor::from_vec(g, s.shape.clone())?)?;
        }
        dist.finish(specs.iter().map(|s| s.name.as_str()).zip(params.iter_mut()))?;
    }
    params.iter().map(|p| Ok(p.to_vec::<f32>()?)).collect()
}

/// How a step ended: done (whether skipped), or the agreed fault.
type Outcome = std::result::Result<bool, (Option<usize>, FaultKind)>;

/// The caller's own SGD over plain slices, through `step_locally`; with
/// `fail` the last rank's step fails at step 2 and a NaN appears on rank 0
/// at step 3. Every rank's parameters, and every step's outcome.
fn through_grad_sync(
    comm: LocalComm,
    mode: StrategyConfig,
    fail: bool,
) -> Result<(Vec<Vec<f32>>, Vec<Outcome>)> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let specs = specs();
    let mut sync = match mode {
        StrategyConfig::DeltaWeight { group: None } => {
            let adasum = AdaSum::new(&comm)?;
            GradSync::with_strategy(comm, specs.clone(), config(mode), adasum)?
        }
        _ => GradSync::new(comm, specs.clone(), config(mode))?,
    };
    assert_eq!(sync.training_loop(), TrainingLoop::LocalSteps);
    let mut own = sgd();
    let mut params = initial_params(&specs);
    let mut outcomes = Vec::new();
    for step in 0..STEPS {
        let grads: Vec<Vec<f32>> = specs
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let mut g = gradient(rank, step, k, s.shape.iter().product());
                if fail && step == 3 && rank == 0 && k == 1 {
                    g[5] = f32::NAN;
                }
                g
            })
            .collect();
        for (k, g) in grads.iter().enumerate() {
            sync.push(k, g)?;
        }
        let before = params.clone();
        let mut slices: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
        let local = |p: &mut [&mut [f32]], own: &mut Sgd| {
            if fail && step == 2 && rank == world - 1 {
                return Err(OptimError::InvalidArgument(
                    "the caller's optimizer failed".into(),
                ));
            }
            for ((spec, values), g) in specs.iter().zip(p.iter_mut()).zip(&grads) {
                own.update_slice(&spec.name, &spec.shape, values, g)?;
            }
            own.step();
            Ok(())
        };
        let result = match mode {
            StrategyConfig::Partial {
                average_state: true,
            } => sync.step_locally_with_state(&mut slices[..], &mut own, local),
            _ => sync.step_locally(&mut slices[..], |p| local(p, &mut own)),
        };
        outcomes.push(match result {
            Ok(stats) => Ok(stats.non_finite),
            Err(OptimError::Fault(Fault { rank, kind, .. })) => {
                if matches!(mode, StrategyConfig::DeltaWeight { .. }) {
                    assert_eq!(bits(&params), bits(&before), "p0 put back after a failure");
                }
                Err((rank, kind))
            }
            Err(e) => return Err(e),
        });
        if outcomes.last() == Some(&Ok(true)) {
            assert_eq!(
                bits(&params),
                bits(&before),
                "a skipped step changes nothing"
            );
        }
    }
    Ok((params, outcomes))
}

fn modes() -> [StrategyConfig; 3] {
    [
        StrategyConfig::Partial {
            average_state: false,
        },
        StrategyConfig::Partial {
            average_state: true,
        },
        StrategyConfig::DeltaWeight { group: None },
    ]
}

#[test]
fn the_callers_step_gives_local_steps_results_bitwise() {
    for mode in modes() {
        for world in 1..=4 {
            let want = local::run(world, |c| through_local_steps(c, mode)).unwrap();
            let got = local::run(world, |c| through_grad_sync(c, mode, false)).unwrap();
            for (rank, (w, g)) in want.into_iter().zip(got).enumerate() {
                let (w, (g, outcomes)) = (w.unwrap(), g.unwrap());
                assert!(
                    outcomes.iter().all(|o| *o == Ok(false)),
                    "{mode:?}: {outcomes:?}"
                );
                assert_eq!(bits(&g), bits(&w), "{mode:?}, W = {world}, rank {rank}");
            }
        }
    }
}

#[test]
fn a_failing_local_step_or_a_nan_ends_the_step_alike_on_every_rank() {
    for mode in modes() {
        for world in 2..=4 {
            let runs = local::run(world, |c| through_grad_sync(c, mode, true)).unwrap();
            let runs: Vec<_> = runs.into_iter().map(|r| r.unwrap()).collect();
            for (params, outcomes) in &runs {
                assert_eq!(outcomes[..2], [Ok(false), Ok(false)], "{mode:?}");
                assert_eq!(
                    outcomes[2],
                    Err((Some(world - 1), FaultKind::Optimizer)),
                    "{mode:?}, W = {world}"
                );
                assert_eq!(
                    outcomes[3],
                    Ok(true),
                    "{mode:?}: the NaN is skipped everywhere"
                );
                assert_eq!(outcomes[4], Ok(false), "{mode:?}: the next step works");
                if matches!(mode, StrategyConfig::DeltaWeight { .. }) {
                    // Delta weight ends every step with equal parameters.
                    assert_eq!(bits(params), bits(&runs[0].0));
                }
            }
        }
    }
}

/// DiLoCo (rounds of 2) after a warm-up of 2 steps by gradients, with the
/// caller's own SGD: the loop `current_loop` names at each step, the
/// warm-up's steps through `finish` (the caller's optimizer stepping with
/// the mean gradients it writes), the rounds' through `step_locally`.
/// With `misuse`, the first step is tried with `step_locally` first, which
/// fails on every rank and changes nothing. Every rank's parameters, and
/// the loop of each step.
fn through_grad_sync_warming_up(
    comm: LocalComm,
    misuse: bool,
) -> Result<(Vec<Vec<f32>>, Vec<TrainingLoop>)> {
    let rank = comm.rank();
    let specs = specs();
    let mut sync = GradSync::new(comm, specs.clone(), config(warming_up()))?;
    assert_eq!(sync.training_loop(), TrainingLoop::LocalSteps);
    let mut own = sgd();
    let mut params = initial_params(&specs);
    let mut loops = Vec::new();
    for step in 0..STEPS {
        let mut grads: Vec<Vec<f32>> = specs
            .iter()
            .enumerate()
            .map(|(k, s)| gradient(rank, step, k, s.shape.iter().product()))
            .collect();
        loops.push(sync.current_loop());
        if misuse && step == 0 {
            for (k, g) in grads.iter().enumerate() {
                sync.push(k, g)?;
            }
            step_locally_is_refused(&mut sync, &mut params);
            assert_eq!(sync.current_loop(), TrainingLoop::Gradients);
        }
        for (k, g) in grads.iter().enumerate() {
            sync.push(k, g)?;
        }
        if sync.current_loop() == TrainingLoop::Gradients {
            let mut means: Vec<&mut [f32]> = grads.iter_mut().map(Vec::as_mut_slice).collect();
            sync.finish(&mut means)?;
            for ((spec, values), g) in specs.iter().zip(params.iter_mut()).zip(&grads) {
                own.update_slice(&spec.name, &spec.shape, values, g)?;
            }
            own.step();
        } else {
            let mut slices: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
            sync.step_locally(&mut slices[..], |p| {
                for ((spec, values), g) in specs.iter().zip(p.iter_mut()).zip(&grads) {
                    own.update_slice(&spec.name, &spec.shape, values, g)?;
                }
                own.step();
                Ok(())
            })?;
        }
    }
    Ok((params, loops))
}

/// A `step_locally` whose closure changes `params` fails on every rank
/// with a fault of kind `InvalidArgument`, and `params` stay as they were.
fn step_locally_is_refused(sync: &mut GradSync<LocalComm>, params: &mut [Vec<f32>]) {
    let before = params.to_vec();
    let mut slices: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
    let err = sync
        .step_locally(&mut slices[..], |p| {
            p[0][0] += 1.0;
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            OptimError::Fault(Fault {
                kind: FaultKind::InvalidArgument,
                ..
            })
        ),
        "{err}"
    );
    assert_eq!(
        bits(params),
        bits(&before),
        "a refused step changes nothing"
    );
}

/// `diloco:2:uint8:grad-warmup=2`.
fn warming_up() -> StrategyConfig {
    "diloco:2:uint8:grad-warmup=2".parse().expect("a strategy")
}

/// The caller's optimizer through GradSync gives LocalSteps' results
/// bitwise in DiLoCo with a warm-up by gradients: `finish` for the two
/// warm-up steps (`current_loop` says so, on every rank alike), then
/// `step_locally`; `step_locally` in the warm-up is refused on every rank
/// and changes nothing.
#[test]
fn the_callers_step_takes_the_warm_up_by_gradients_through_finish() {
    for world in 1..=4 {
        let want = local::run(world, |c| through_local_steps(c, warming_up())).unwrap();
        for misuse in [false, true] {
            let got = local::run(world, |c| through_grad_sync_warming_up(c, misuse)).unwrap();
            for (rank, (w, g)) in want.iter().zip(got).enumerate() {
                let (w, (g, loops)) = (w.as_ref().unwrap(), g.unwrap());
                let gradients = TrainingLoop::Gradients;
                let local = TrainingLoop::LocalSteps;
                assert_eq!(loops, [gradients, gradients, local, local, local]);
                assert_eq!(
                    bits(&g),
                    bits(w),
                    "W = {world}, rank {rank}, misuse {misuse}"
                );
            }
        }
    }
}

#[test]
fn modes_and_buffers_that_cannot_work_are_refused() {
    local::run(2, |comm| {
        let average_state = StrategyConfig::Partial {
            average_state: true,
        };
        let other = comm.split(Some(0), comm.rank() as i64).unwrap().unwrap();
        // Partial averaging of the state without the optimizer's buffers:
        // the step fails on every rank, and the parameters stay.
        let mut without_state = GradSync::new(other, specs(), config(average_state)).unwrap();
        let mut params = vec![vec![1f32; 1], vec![2f32; 13], vec![3f32; 28]];
        step_locally_is_refused(&mut without_state, &mut params);
        let mut sync = GradSync::new(comm, specs(), config(StrategyConfig::Dense)).unwrap();
        assert_eq!(sync.training_loop(), TrainingLoop::Gradients);
        let mut params = [vec![0f32; 1], vec![0f32; 13], vec![0f32; 28]];
        let mut slices: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
        let err = sync.step_locally(&mut slices[..], |_| Ok(())).unwrap_err();
        assert!(matches!(err, OptimError::InvalidArgument(_)), "{err}");
        // Dense mode still works after it.
        sync.push(0, &[1f32]).unwrap();
        let mut g = [vec![0f32; 1], vec![0f32; 13], vec![0f32; 28]];
        let mut out: Vec<&mut [f32]> = g.iter_mut().map(Vec::as_mut_slice).collect();
        sync.finish(&mut out).unwrap();
    })
    .unwrap();
}

#[test]
fn a_wrong_buffer_on_one_rank_fails_the_step_on_every_rank() {
    for mode in modes() {
        let out = local::run(3, |comm| {
            let rank = comm.rank();
            let mut sync = match mode {
                StrategyConfig::DeltaWeight { group: None } => {
                    let adasum = AdaSum::new(&comm)?;
                    GradSync::with_strategy(comm, specs(), config(mode), adasum)?
                }
                _ => GradSync::new(comm, specs(), config(mode))?,
            };
            let short = if rank == 1 { 12 } else { 13 };
            let mut params = [vec![0f32; 1], vec![0f32; short], vec![0f32; 28]];
            let mut slices: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
            // The optimizer's buffers lent in every mode (read only by
            // partial averaging with the state).
            let mut own = sgd();
            let first = sync.step_locally_with_state(&mut slices[..], &mut own, |_, _| Ok(()));
            params[1].resize(13, 0.0);
            let mut slices: Vec<&mut [f32]> = params.iter_mut().map(Vec::as_mut_slice).collect();
            let second = sync.step_locally_with_state(&mut slices[..], &mut own, |_, _| Ok(()));
            Ok::<_, OptimError>((first.err(), second.is_ok()))
        })
        .unwrap();
        for r in out {
            let (first, second) = r.unwrap();
            assert!(
                matches!(
                    first,
                    Some(OptimError::Fault(Fault {
                        rank: Some(1),
                        kind: FaultKind::InvalidArgument,
                        ..
                    }))
                ),
                "{mode:?}: {first:?}"
            );
            assert!(second, "{mode:?}: the next step works");
        }
    }
}
