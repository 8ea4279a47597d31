//! Checkpoint files (atomic, checksummed, validated): the states and loaders
//! the tests of each concern share, one submodule per concern.

mod atomic;
mod damaged;
mod edited;
mod non_finite;
mod round_trip;

use std::collections::BTreeMap;
use std::path::Path;

use gradwire_optim::checkpoint::{self, Checkpoint, LoadOptions};
use gradwire_optim::{OptimError, OptimizerState, ParamState, StateDict};
use gradwire_tensor::{Tensor, bf16, f16};
use serde_json::json;

/// The loader as most of these tests use it: every check of the format,
/// with the NaN and infinities `rich()` holds on purpose accepted (their
/// refusal by default is tested on its own).
const ANY_VALUE: LoadOptions = LoadOptions {
    allow_non_finite: true,
};

fn from_bytes(bytes: &[u8]) -> gradwire_optim::Result<Checkpoint> {
    checkpoint::from_bytes_with(bytes, &ANY_VALUE)
}

fn load(path: impl AsRef<Path>) -> gradwire_optim::Result<Checkpoint> {
    checkpoint::load_with(path, &ANY_VALUE)
}

fn param(shape: &[usize], updates: u64, buffers: &[(&str, Vec<f32>)]) -> ParamState {
    ParamState {
        shape: shape.to_vec(),
        updates,
        buffers: buffers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
    }
}

fn seq(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 - 3.5) * scale).collect()
}

/// A state exercising everything: names with '/' and unicode, several
/// buffers, zero-size and scalar parameters, a parameter without buffers,
/// special floats, overrides, values and extra tensors of every dtype.
fn rich() -> Checkpoint {
    let mut params = BTreeMap::new();
    params.insert(
        "layer1/weight".to_owned(),
        param(
            &[3, 4],
            7,
            &[
                ("m", seq(12, 0.125)),
                ("v", seq(12, 1e-3)),
                ("a/b", seq(12, -2.0)),
            ],
        ),
    );
    let mut specials = vec![
        f32::from_bits(0x7fc0_1234), // NaN with a payload
        f32::from_bits(0xffa0_0001), // signalling-pattern NaN, negative
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(1), // smallest subnormal
        f32::MAX,
    ];
    specials.resize(8, 0.0);
    params.insert(
        "блок/γ/bias 😀".to_owned(),
        param(&[8], u64::MAX, &[("m", specials), ("v", seq(8, 3.0))]),
    );
    params.insert("empty".to_owned(), param(&[0, 7], 2, &[("m", vec![])]));
    params.insert(
        "scalar".to_owned(),
        param(&[], 1, &[("momentum", vec![42.5])]),
    );
    params.insert("no buffers".to_owned(), param(&[5, 5], 3, &[]));
    let mut overrides = BTreeMap::new();
    overrides.insert(
        "layer1/weight".to_owned(),
        json!({"lr": {"Constant": {"value": 0.01}}, "nesterov": true}),
    );
    let optimizer = OptimizerState {
        kind: "adam".to_owned(),
        step: 1234,
        config: json!({"lr": {"ExponentialDecay": {"init": 0.1, "decay_steps": 10,
            "rate": 0.5, "staircase": true}}, "beta1": 0.9, "eps": 1e-8, "none": null}),
        overrides,
        params,
    };
    let mut tensors = BTreeMap::new();
    tensors.insert(
        "residual/0".to_owned(),
        Tensor::from_vec(seq(6, 0.5), [2, 3]).unwrap(),
    );
    tensors.insert(
        "residual/γ".to_owned(),
        Tensor::from_vec(
            vec![
                f16::from_f32(1.5),
                f16::NAN,
                f16::from_bits(0x8001),
                f16::MAX,
            ],
            [4],
        )
        .unwrap(),
    );
    tensors.insert(
        "bf".to_owned(),
        Tensor::from_vec(
            vec![
                bf16::from_f32(-2.25),
                bf16::from_bits(0x7fc1),
                bf16::from_f32(3e38),
                bf16::ZERO,
            ],
            [2, 2],
        )
        .unwrap(),
    );
    tensors.insert(
        "empty".to_owned(),
        Tensor::from_vec(Vec::<f16>::new(), [0]).unwrap(),
    );
    let mut values = BTreeMap::new();
    values.insert("partial_update_counter".to_owned(), json!(3));
    values.insert(
        "nested/thing".to_owned(),
        json!({"a": [1, 2.5, "x", null], "b": u64::MAX}),
    );
    Checkpoint {
        optimizer,
        state: StateDict { tensors, values },
    }
}

/// A small checkpoint, so that every truncation and many flips are cheap.
fn small() -> Checkpoint {
    let mut params = BTreeMap::new();
    params.insert(
        "w/0".to_owned(),
        param(&[2, 2], 1, &[("m", seq(4, 0.5)), ("v", seq(4, 0.25))]),
    );
    params.insert("b".to_owned(), param(&[0], 1, &[("m", vec![])]));
    let mut ckpt = Checkpoint::new(OptimizerState {
        kind: "sgd".to_owned(),
        step: 5,
        config: json!({"lr": 0.5, "momentum": 0.9}),
        overrides: BTreeMap::from([("b".to_owned(), json!({"lr": 0.25}))]),
        params,
    });
    ckpt.state.tensors.insert(
        "r".to_owned(),
        Tensor::from_vec(vec![f16::from_f32(0.5), f16::from_f32(-1.0)], [2]).unwrap(),
    );
    ckpt.state.values.insert("counter".to_owned(), json!(2));
    ckpt
}

/// A checkpoint with one large parameter.
fn big() -> Checkpoint {
    let mut params = BTreeMap::new();
    params.insert(
        "big".to_owned(),
        param(
            &[300, 100],
            9,
            &[("m", seq(30_000, 1e-2)), ("v", seq(30_000, 1e-4))],
        ),
    );
    Checkpoint::new(OptimizerState {
        kind: "adam".to_owned(),
        step: 9,
        config: json!({"lr": 0.001}),
        overrides: BTreeMap::new(),
        params,
    })
}

fn corrupt_reason(r: gradwire_optim::Result<Checkpoint>) -> String {
    match r {
        Err(OptimError::CorruptCheckpoint(reason)) => reason,
        Err(e) => panic!("expected CorruptCheckpoint, got error {e:?}"),
        Ok(_) => panic!("expected CorruptCheckpoint, got Ok"),
    }
}
