//! `AnyOptimizer` is the optimizer it wraps: the same updates bit for bit
//! (in DistOpt too), the same state, its configuration as JSON.

use gradwire_comm::{Communicator, local};
use gradwire_optim::StateBuffers as _;
use gradwire_optim::{
    AdamConfig, AdamW, AnyOptimizer, DistOpt, DistOptConfig, OptimError, Optimizer, ParamSpec, Sgd,
    SgdConfig,
};
use gradwire_tensor::Tensor;

fn grad(step: usize, rank: usize, n: usize) -> Tensor {
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + step * 13 + rank * 5) % 11) as f32 / 5.0 - 1.0)
        .collect();
    Tensor::from_vec(v, n).unwrap()
}

/// Four DistOpt steps on 3 ranks; rank 0's parameter bits.
fn train<O: Optimizer + 'static>(make: impl Fn() -> O + Sync) -> Vec<u32> {
    let out = local::run(3, |comm| {
        let rank = comm.rank();
        let specs = vec![ParamSpec::new("w", [13])];
        let mut dist = DistOpt::new(make(), comm, specs, DistOptConfig::default())?;
        let mut w = Tensor::from_vec(vec![0.5f32; 13], 13)?;
        for step in 0..4 {
            dist.push("w", grad(step, rank, 13))?;
            dist.finish([("w", &mut w)])?;
        }
        Ok::<_, OptimError>(w.to_vec::<f32>()?.iter().map(|x| x.to_bits()).collect())
    })
    .unwrap();
    out.into_iter().next().unwrap().unwrap()
}

#[test]
fn any_optimizer_trains_bitwise_as_the_one_it_wraps() {
    let sgd = || Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9)).unwrap();
    let adamw = || AdamW::new(AdamConfig::adamw().lr(0.01)).unwrap();
    assert_eq!(train(sgd), train(|| AnyOptimizer::new(sgd()).unwrap()));
    assert_eq!(train(adamw), train(|| AnyOptimizer::new(adamw()).unwrap()));
}

#[test]
fn configurations_travel_as_json_and_state_round_trips() {
    let mut any = AnyOptimizer::new(Sgd::new(SgdConfig::default().lr(0.1)).unwrap()).unwrap();
    assert_eq!(any.kind(), "sgd");
    assert_eq!(any.buffer_names(), &["momentum"]);
    // A per-parameter configuration in JSON; another kind's is refused.
    let own = serde_json::to_value(SgdConfig::default().lr(0.5).momentum(0.5)).unwrap();
    any.register("w", own).unwrap();
    let adam = serde_json::to_value(AdamConfig::default()).unwrap();
    assert!(matches!(
        any.register("w", adam),
        Err(OptimError::InvalidArgument(_))
    ));
    let mut w = Tensor::from_vec(vec![1f32; 3], 3).unwrap();
    any.update("w", &mut w, &Tensor::from_vec(vec![1f32; 3], 3).unwrap())
        .unwrap();
    any.step();
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![0.5; 3]);
    let state = any.state().unwrap();
    let mut other = AnyOptimizer::new(Sgd::new(SgdConfig::default().lr(0.1)).unwrap()).unwrap();
    other.load_state(&state).unwrap();
    assert_eq!(other.state().unwrap(), state);
    assert_eq!(other.step_count(), 1);
    let mut adamw = AnyOptimizer::new(AdamW::new(AdamConfig::adamw()).unwrap()).unwrap();
    let err = adamw.load_state(&state).unwrap_err();
    assert!(matches!(err, OptimError::StateMismatch(_)), "{err}");
}
