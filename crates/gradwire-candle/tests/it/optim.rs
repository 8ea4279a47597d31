//! gradwire's update rules as candle optimizers: bitwise gradwire's own
//! optimizers on the same gradients, all-or-nothing steps, checkpoints that
//! resume bitwise, the learning rate through candle's interface.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Optimizer as _;
use gradwire_candle::{AdaGrad, Adam, AdamW, CandleOptim, Error, RmsProp, Sgd, with_values};
use gradwire_optim::checkpoint::{self, Checkpoint};
use gradwire_optim::{
    AdaGradConfig, AdamConfig, Optim, OptimError, Optimizer, RmsPropConfig, Schedule, SgdConfig,
    UpdateRule,
};
use gradwire_tensor::{ErrorKind, Tensor as GwTensor};

use crate::support::{STEPS, values, vars};

/// The gradients of step `step` (one parameter left out every third step).
fn grads(vars: &[(String, Var)], step: usize) -> GradStore {
    let mut store = GradStore::default();
    for (k, (_, var)) in vars.iter().enumerate() {
        if (step + k) % 3 == 2 {
            continue;
        }
        let g = Tensor::from_vec(
            values(var.elem_count(), 10 + step * 3 + k),
            var.shape(),
            &Device::Cpu,
        )
        .unwrap();
        store.insert(var.as_tensor(), g);
    }
    store
}

/// A checkpoint holding nothing of the candle optimizer.
fn empty() -> Checkpoint {
    let base = Optim::<gradwire_optim::SgdRule>::new(SgdConfig::default()).unwrap();
    Checkpoint::new(base.state().unwrap())
}

fn read(var: &Var) -> Vec<f32> {
    with_values(var.as_tensor(), <[f32]>::to_vec).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `CandleOptim<R>` on candle variables and `Optim<R>` on gradwire tensors,
/// the same gradients: bitwise the same parameters after every step.
fn same_as_gradwire<R: UpdateRule>(config: R::Config) {
    let vars = vars();
    let mut candle = CandleOptim::<R>::with_names(vars.clone(), config.clone()).unwrap();
    let mut gradwire = Optim::<R>::new(config).unwrap();
    let mut params: Vec<GwTensor> = vars
        .iter()
        .map(|(_, v)| GwTensor::from_vec(read(v), v.dims().to_vec()).unwrap())
        .collect();
    for step in 0..STEPS {
        let store = grads(&vars, step);
        candle.step(&store).unwrap();
        for ((name, var), param) in vars.iter().zip(&mut params) {
            if let Some(g) = store.get(var.as_tensor()) {
                let g =
                    GwTensor::from_vec(with_values(g, <[f32]>::to_vec).unwrap(), g.dims().to_vec())
                        .unwrap();
                gradwire.update(name, param, &g).unwrap();
            }
        }
        gradwire.step();
        for ((name, var), param) in vars.iter().zip(&params) {
            assert_eq!(
                bits(&read(var)),
                bits(param.as_slice::<f32>().unwrap()),
                "{} step {step}: {name}",
                R::KIND
            );
        }
    }
    assert_eq!(candle.inner().step_count(), STEPS as u64);
}

#[test]
fn every_rule_updates_candle_variables_as_gradwire_updates_its_tensors() {
    same_as_gradwire::<gradwire_optim::SgdRule>(
        SgdConfig::default()
            .lr(0.1)
            .momentum(0.9)
            .nesterov(true)
            .weight_decay(0.01),
    );
    same_as_gradwire::<gradwire_optim::SgdRule>(SgdConfig::default().lr(0.3));
    same_as_gradwire::<gradwire_optim::AdamRule>(AdamConfig::default().lr(0.01));
    same_as_gradwire::<gradwire_optim::AdamWRule>(AdamConfig::adamw().lr(0.01));
    same_as_gradwire::<gradwire_optim::RmsPropRule>(RmsPropConfig::default());
    same_as_gradwire::<gradwire_optim::AdaGradRule>(AdaGradConfig::default());
}

#[test]
fn a_bad_gradient_leaves_every_variable_as_it_was() {
    let vars = vars();
    let mut opt =
        Sgd::with_names(vars.clone(), SgdConfig::default().lr(0.1).momentum(0.9)).unwrap();
    let before: Vec<Vec<f32>> = vars.iter().map(|(_, v)| read(v)).collect();
    let mut store = grads(&vars, 0);
    // The last variable's gradient has the wrong shape.
    store.insert(
        vars[2].1.as_tensor(),
        Tensor::zeros((7, 4), candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    let err = opt.step_checked(&store).unwrap_err();
    assert!(
        matches!(&err, Error::Gradwire(OptimError::ShapeMismatch { what, expected, got })
            if what.contains("p2") && expected == &[4, 7] && got == &[7, 4]),
        "{err:?}"
    );
    // Through candle's trait: candle's error, the same text.
    let err = opt.step(&store).unwrap_err().to_string();
    assert!(err.contains("the gradient of p2"), "{err}");
    for ((_, var), want) in vars.iter().zip(&before) {
        assert_eq!(bits(&read(var)), bits(want));
    }
    assert_eq!(opt.inner().step_count(), 0);
    // A repeated name or another dtype is refused at construction.
    let twice = vec![vars[0].clone(), ("p0".to_string(), vars[1].1.clone())];
    let err = Adam::with_names(twice, AdamConfig::default()).unwrap_err();
    assert!(
        matches!(&err, Error::Gradwire(OptimError::InvalidArgument(m))
            if m.contains("the variable name p0 is used twice")),
        "{err:?}"
    );
    let f64_var = Var::zeros(3, candle_core::DType::F64, &Device::Cpu).unwrap();
    let err = AdamW::with_names(vec![("w".into(), f64_var)], AdamConfig::adamw()).unwrap_err();
    assert!(
        matches!(&err, Error::Unsupported { name, dtype: DType::F64, .. } if name == "w"),
        "{err:?}"
    );
    // A bad setting: gradwire-optim's InvalidArgument.
    let err = RmsProp::with_names(
        vec![],
        RmsPropConfig {
            lr: Schedule::constant(f64::NAN),
            ..RmsPropConfig::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::Gradwire(OptimError::InvalidArgument(m)) if m.starts_with("lr: not finite")),
        "{err:?}"
    );
}

#[test]
fn a_checkpoint_resumes_bitwise() {
    let config = AdamConfig::default().lr(0.02);
    // Straight through.
    let straight = vars();
    let mut opt = Adam::with_names(straight.clone(), config.clone()).unwrap();
    for step in 0..STEPS {
        opt.step(&grads(&straight, step)).unwrap();
    }
    // Stopped after two steps, saved to a file, restored into fresh ones.
    let first = vars();
    let mut opt = Adam::with_names(first.clone(), config.clone()).unwrap();
    for step in 0..2 {
        opt.step(&grads(&first, step)).unwrap();
    }
    let mut ckpt = empty();
    opt.save_into(&mut ckpt).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("adam.ckpt");
    checkpoint::save(&path, &ckpt).unwrap();
    let loaded = checkpoint::load(&path).unwrap();
    let resumed = vars();
    for ((_, from), (_, to)) in first.iter().zip(&resumed) {
        to.set(from.as_tensor()).unwrap();
    }
    let mut opt = Adam::with_names(resumed.clone(), config).unwrap();
    opt.restore_from(&loaded).unwrap();
    for step in 2..STEPS {
        opt.step(&grads(&resumed, step)).unwrap();
    }
    for ((_, a), (_, b)) in straight.iter().zip(&resumed) {
        assert_eq!(bits(&read(a)), bits(&read(b)));
    }
    // A state of another kind is refused.
    let mut sgd = Sgd::with_names(vars(), SgdConfig::default()).unwrap();
    let err = sgd.restore_from(&loaded).unwrap_err();
    assert!(
        matches!(&err, Error::Gradwire(OptimError::StateMismatch(m))
            if m.starts_with("a adam state cannot be loaded into a sgd optimizer")),
        "{err:?}"
    );
    let err = sgd.restore_from(&empty()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Mismatch, "{err:?}");
    assert!(
        err.to_string()
            .contains("the checkpoint holds no optimizer state"),
        "{err}"
    );
}

#[test]
fn the_learning_rate_follows_the_schedule_until_candle_sets_it() {
    let schedule = Schedule::StepDecay {
        init: 0.4,
        step_size: 1,
        gamma: 0.5,
    };
    let vars = vars();
    let mut opt = AdaGrad::with_names(
        vars.clone(),
        AdaGradConfig {
            lr: schedule,
            ..AdaGradConfig::default()
        },
    )
    .unwrap();
    assert_eq!(opt.learning_rate(), 0.4);
    opt.step(&grads(&vars, 0)).unwrap();
    assert_eq!(opt.learning_rate(), 0.2);
    opt.set_learning_rate(0.05);
    assert_eq!(opt.learning_rate(), 0.05);
    opt.step(&grads(&vars, 1)).unwrap();
    assert_eq!(opt.learning_rate(), 0.05);
    // A rate candle's interface cannot refuse is ignored.
    opt.set_learning_rate(f64::NAN);
    assert_eq!(opt.learning_rate(), 0.05);
}
