//! What fuzzing the strategy registry (`StrategyConfig`'s `FromStr`, the
//! `name[:value][:key=value|:flag]...` texts of `gradwire train -s`) with
//! arbitrary text checks.
//!
//! A strategy is typed by a user: parsing it must never panic, and neither
//! must what follows. Whatever parses prints as a text that parses back to
//! the same strategy and prints the same again; and the strategy's training
//! loop, made on one rank for a matrix and a vector, takes two steps or
//! refuses with a typed error.
//!
//! One function for `fuzz_targets/strategy.rs` (libFuzzer) and for the
//! corpus replay of `cargo xtask test` (gradwire-tests' `fuzz_corpus`),
//! both including this file with `#[path]`.

use gradwire_comm::LocalComm;
use gradwire_optim::{AnyLoop, DistOptConfig, ParamSpec, Sgd, SgdConfig, StrategyConfig};
use gradwire_tensor::{DType, Device, Tensor};

/// Checks one input; a failed check panics.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(strategy) = text.parse::<StrategyConfig>() else {
        return;
    };
    let printed = strategy.to_string();
    let again: StrategyConfig = printed
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} prints as {printed:?}, which is refused: {e}"));
    assert_eq!(again, strategy, "{text:?} prints as {printed:?}");
    assert_eq!(again.to_string(), printed, "{text:?}");
    train(strategy);
}

/// Two steps of `strategy`'s loop on one rank; every error is a value.
fn train(strategy: StrategyConfig) {
    let Ok(mut comms) = LocalComm::create(1) else {
        return;
    };
    let Some(comm) = comms.pop() else {
        return;
    };
    let specs = vec![ParamSpec::new("w", [6, 5]), ParamSpec::new("b", [7])];
    let config = DistOptConfig {
        strategy,
        fusion_threshold: 16,
        ..DistOptConfig::default()
    };
    let Ok(optimizer) = Sgd::new(SgdConfig::default()) else {
        return;
    };
    let Ok(mut front) = AnyLoop::new(optimizer, comm, specs.clone(), config) else {
        return;
    };
    let Ok(mut params) = specs
        .iter()
        .map(|s| Tensor::zeros(s.shape.clone(), DType::F32, Device::Cpu))
        .collect::<Result<Vec<Tensor>, _>>()
    else {
        return;
    };
    for step in 0..2 {
        for (k, spec) in specs.iter().enumerate().rev() {
            let n: usize = spec.shape.iter().product();
            let grad: Vec<f32> = (0..n).map(|i| ((i + 3 * k + step) as f32).sin()).collect();
            if let Ok(grad) = Tensor::from_vec(grad, spec.shape.clone()) {
                let _ = front.push(&spec.name, grad);
            }
        }
        let targets = specs.iter().map(|s| s.name.as_str()).zip(params.iter_mut());
        let _ = front.finish(targets);
    }
}
