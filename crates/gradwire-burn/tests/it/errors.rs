//! gradwire-burn's errors are typed and a failed step changes nothing: a
//! worker that leaves is `PeerLost` on the others; a gradient of the wrong
//! shape on one worker fails the step on every worker as the same `Fault`,
//! leaving every module and optimizer as they were (the next step ends
//! where a run without the failed step does);
//! a module other than the declared one is refused; `partial:state`, which
//! would average the optimizer's private state, is refused.

use burn::optim::momentum::MomentumConfig;
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::{Device, Tensor, TensorData};
use gradwire_burn::{DataParallel, Error, parameters_of};
use gradwire_comm::{Communicator, Fault, FaultKind, LocalComm, local};
use gradwire_optim::{DistOptConfig, OptimError, StrategyError};
use gradwire_tensor::ErrorKind;

use crate::support::{Mlp, batch, bits, device, seeded};

fn one_worker() -> LocalComm {
    LocalComm::create(1).unwrap().pop().unwrap()
}

/// A worker's seeded model and its `DataParallel` over `comm`: dense, SGD
/// with momentum (state a failed step must not advance).
fn worker(comm: LocalComm) -> Result<(Device, Mlp, DataParallel<LocalComm>), Error> {
    let device = device();
    let model = seeded(&device);
    let sgd = SgdConfig::new()
        .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
        .init();
    let dp = DataParallel::new(&model, sgd, comm, DistOptConfig::default())?;
    Ok((device, model, dp))
}

/// Rank `rank`'s samples of each step's batch.
fn shard(rank: usize) -> std::ops::Range<usize> {
    rank * 3..rank * 3 + 3
}

/// A worker that leaves: every other worker's next step is
/// `Error::Gradwire` of kind `PeerLost`, and its module is as it was, for
/// W = 2..=4.
#[test]
fn a_departed_worker_is_a_lost_peer_on_the_others() {
    for world in 2..=4 {
        let outcomes = local::run(world, |comm| -> Result<_, Error> {
            let rank = comm.rank();
            let (device, mut model, mut dp) = worker(comm)?;
            if rank == world - 1 {
                return Ok(None); // leaves: its communicator is dropped
            }
            let before = bits(&model);
            let loss = model.loss(&batch(0, shard(rank), &device));
            let err = dp
                .backward_step(0.1, &mut model, &loss)
                .expect_err("a step without the departed worker fails");
            assert_eq!(bits(&model), before, "a failed step changed the module");
            Ok(Some(err))
        })
        .unwrap();
        for (rank, outcome) in outcomes.into_iter().enumerate().take(world - 1) {
            let err = outcome.unwrap().expect("a survivor's error");
            assert_eq!(
                err.kind(),
                ErrorKind::PeerLost,
                "W = {world}, rank {rank}: {err}"
            );
            assert!(err.as_gradwire().is_some());
        }
    }
}

/// `grads` with the gradient of `fc2.bias` replaced by one of two values
/// (its parameter holds one).
fn with_a_bad_gradient(model: &Mlp, mut grads: GradientsParams) -> GradientsParams {
    let id = model.fc2.bias.as_ref().unwrap().id;
    let device = model.fc2.weight.val().device().without_autodiff();
    let _: Option<Tensor<1>> = grads.remove(id);
    grads.register(
        id,
        Tensor::<1>::from_data(TensorData::new(vec![0.5f32; 2], [2]), &device),
    );
    grads
}

/// A gradient of the wrong shape on rank 1 fails the step on every rank
/// (W = 2..=4) as a `Fault` naming rank 1 and leaves every module as it
/// was; the next step then ends bitwise where a run that never took the
/// failed step does, so no optimizer state moved either (momentum would
/// show it).
#[test]
fn a_bad_gradient_on_one_worker_fails_the_step_everywhere_and_changes_nothing() {
    for world in 2..=4 {
        let out = local::run(world, |comm| -> Result<_, Error> {
            let rank = comm.rank();
            let (device, mut model, mut dp) = worker(comm)?;
            let before = bits(&model);
            let loss = model.loss(&batch(0, shard(rank), &device));
            let mut grads = GradientsParams::from_grads(loss.backward(), &model);
            if rank == 1 {
                grads = with_a_bad_gradient(&model, grads);
            }
            let err = dp.step(0.1, &mut model, grads).expect_err("the step fails");
            assert_eq!(bits(&model), before, "a failed step changed the module");
            let loss = model.loss(&batch(1, shard(rank), &device));
            dp.backward_step(0.1, &mut model, &loss)?;
            Ok((err, bits(&model)))
        })
        .unwrap();
        // The same workers taking only the second step.
        let fault_free = local::run(world, |comm| -> Result<_, Error> {
            let rank = comm.rank();
            let (device, mut model, mut dp) = worker(comm)?;
            let loss = model.loss(&batch(1, shard(rank), &device));
            dp.backward_step(0.1, &mut model, &loss)?;
            Ok(bits(&model))
        })
        .unwrap();
        let out: Vec<_> = out.into_iter().map(Result::unwrap).collect();
        for (rank, ((err, b), want)) in out.iter().zip(fault_free).enumerate() {
            assert!(
                matches!(
                    err.as_gradwire(),
                    Some(OptimError::Fault(Fault {
                        rank: Some(1),
                        kind: FaultKind::InvalidArgument,
                        ..
                    }))
                ),
                "W = {world}, rank {rank}: {err:?}"
            );
            assert_eq!(
                b,
                &want.unwrap(),
                "W = {world}, rank {rank}: not where the fault-free run is"
            );
        }
    }
}

/// A module that is not the one DataParallel was built over (other
/// parameter ids) fails the step as this worker's `InvalidArgument` fault
/// (carried by the step, as every failure is).
#[test]
fn another_module_is_refused() {
    let device = device();
    let mut model = seeded(&device);
    let mut dp = DataParallel::new(
        &model,
        SgdConfig::new().init(),
        one_worker(),
        DistOptConfig::default(),
    )
    .unwrap();
    let mut other = Mlp::new(&device);
    let loss = other.loss(&batch(0, 0..3, &device));
    let err = dp
        .backward_step(0.1, &mut other, &loss)
        .expect_err("another module");
    assert!(
        matches!(
            err.as_gradwire(),
            Some(OptimError::Fault(Fault {
                kind: FaultKind::InvalidArgument,
                ..
            }))
        ),
        "{err:?}"
    );
    // The declared one still trains.
    let loss = model.loss(&batch(0, 0..3, &device));
    dp.backward_step(0.1, &mut model, &loss).unwrap();
    assert_eq!(parameters_of(&model).unwrap(), dp.params());
}

/// `partial:state` needs the optimizer's buffers, which a burn optimizer
/// keeps to itself: refused at construction as `PrivateState`.
#[test]
fn partial_with_state_is_refused() {
    let device = device();
    let model = seeded(&device);
    let dist = DistOptConfig {
        strategy: "partial:state".parse().unwrap(),
        ..DistOptConfig::default()
    };
    let err = DataParallel::new(&model, SgdConfig::new().init(), one_worker(), dist)
        .expect_err("partial:state is refused");
    assert!(
        matches!(
            &err,
            Error::Gradwire(OptimError::Strategy(StrategyError::PrivateState { .. }))
        ),
        "{err:?}"
    );
}
