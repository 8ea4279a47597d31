//! What gradwire-candle cannot train is a typed candle error. (The training
//! tests, on LocalComm and under mpirun, are in gradwire-tests.)

use candle_core::{DType, Device};
use candle_nn::{SGD, VarBuilder, VarMap, linear};
use gradwire_candle::DataParallel;
use gradwire_optim::DistOptConfig;

#[test]
fn parameters_of_another_dtype_are_refused() {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu);
    let _ = linear(2, 2, vb.pp("fc")).unwrap();
    let comm = gradwire_comm::LocalComm::create(1).unwrap().pop().unwrap();
    let err = DataParallel::<SGD, _>::new(&varmap, 0.1, comm, DistOptConfig::default()).err();
    let message = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("f32"), "{message}");
}
