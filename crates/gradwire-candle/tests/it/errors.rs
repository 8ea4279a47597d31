//! gradwire-candle's errors are typed: a variable it cannot train is
//! `Error::Unsupported`, gradwire's failures arrive as `Error::Gradwire`
//! with their kind (a lost peer is `PeerLost`; a bad gradient on one worker
//! is the same `Fault` on every worker, naming that worker and the kind of
//! its failure), and `?` into a
//! candle loop keeps the text. (The training tests, on LocalComm and under
//! mpirun, are in gradwire-tests.)

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use candle_nn::{SGD, VarBuilder, VarMap, linear};
use gradwire_candle::{DataParallel, Error};
use gradwire_comm::{Communicator, Fault, FaultKind, local};
use gradwire_optim::{DistOptConfig, OptimError};
use gradwire_tensor::ErrorKind;

use crate::support::vars;

#[test]
fn parameters_of_another_dtype_are_refused() {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu);
    let _ = linear(2, 2, vb.pp("fc")).unwrap();
    let comm = gradwire_comm::LocalComm::create(1).unwrap().pop().unwrap();
    let err = DataParallel::<SGD, _>::new(&varmap, 0.1, comm, DistOptConfig::default())
        .expect_err("an f64 model is refused");
    assert!(
        matches!(&err, Error::Unsupported { name, dtype: DType::F64, .. } if name == "fc.bias"),
        "{err:?}"
    );
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    // Into candle's error for a candle loop: the text survives.
    let candle: candle_core::Error = err.into();
    assert!(
        candle.to_string().contains("trains f32 parameters"),
        "{candle}"
    );
}

/// Gradients for `vars()` of value 0.5, the variable `bad` (if any) with
/// one element too many.
fn gradients(dp_vars: &[(String, candle_core::Var)], bad: Option<usize>) -> GradStore {
    let mut store = GradStore::default();
    for (k, (_, var)) in dp_vars.iter().enumerate() {
        let n = var.elem_count() + usize::from(bad == Some(k));
        let g = Tensor::full(0.5f32, n, &Device::Cpu).unwrap();
        let g = if bad == Some(k) {
            g
        } else {
            g.reshape(var.dims()).unwrap()
        };
        store.insert(var.as_tensor(), g);
    }
    store
}

/// A worker that leaves: every other worker's next step is
/// `Error::Gradwire` of kind `PeerLost`, for W = 2..=4.
#[test]
fn a_departed_worker_is_a_lost_peer_on_the_others() {
    for world in 2..=4 {
        let outcomes = local::run(world, |comm| {
            let rank = comm.rank();
            let vars = vars();
            let mut dp = DataParallel::<SGD, _>::from_vars(
                vars.clone(),
                0.1,
                comm,
                DistOptConfig::default(),
            )?;
            if rank == world - 1 {
                return Ok(None); // leaves: its communicator is dropped
            }
            Ok::<_, Error>(dp.step(gradients(&vars, None)).err())
        })
        .unwrap();
        for (rank, outcome) in outcomes.into_iter().enumerate().take(world - 1) {
            let err = outcome
                .expect("the survivors build their DataParallel")
                .expect("a step without the departed worker fails");
            assert_eq!(
                err.kind(),
                ErrorKind::PeerLost,
                "W = {world}, rank {rank}: {err:?}"
            );
            assert!(err.as_gradwire().is_some(), "{err:?}");
        }
    }
}

/// A gradient of the wrong size on one worker fails the step on every
/// worker, each with a typed gradwire error, and changes no variable; the
/// next step works.
#[test]
fn a_bad_gradient_on_one_worker_fails_the_step_everywhere() {
    for world in 1..=3 {
        let outcomes = local::run(world, |comm| {
            let rank = comm.rank();
            let vars = vars();
            let before: Vec<Vec<f32>> = vars
                .iter()
                .map(|(_, v)| v.flatten_all().unwrap().to_vec1::<f32>().unwrap())
                .collect();
            let mut dp = DataParallel::<gradwire_candle::Sgd, _>::from_vars(
                vars.clone(),
                gradwire_optim::SgdConfig::default().lr(0.1),
                comm,
                DistOptConfig::default(),
            )?;
            let bad = (rank == 0).then_some(1);
            let err = dp.step(gradients(&vars, bad)).err();
            let after: Vec<Vec<f32>> = vars
                .iter()
                .map(|(_, v)| v.flatten_all().unwrap().to_vec1::<f32>().unwrap())
                .collect();
            let unchanged = before == after;
            let next = dp.step(gradients(&vars, None)).map(drop);
            Ok::<_, Error>((err, unchanged, next))
        })
        .unwrap();
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            let (err, unchanged, next) = outcome.expect("DataParallel builds");
            let err = err.expect("the step fails on every worker");
            // The same fault on every worker, the bad one included: rank 0's,
            // of the kind its own check found.
            assert_eq!(err.kind(), ErrorKind::Fault, "rank {rank}: {err:?}");
            assert!(
                matches!(
                    err.as_gradwire(),
                    Some(OptimError::Fault(Fault {
                        rank: Some(0),
                        kind: FaultKind::InvalidArgument,
                        ..
                    }))
                ),
                "W = {world}, rank {rank}: {err:?}"
            );
            assert!(
                unchanged,
                "W = {world}, rank {rank}: a failed step moved a variable"
            );
            next.unwrap_or_else(|e| panic!("W = {world}, rank {rank}: the next step: {e}"));
        }
    }
}
