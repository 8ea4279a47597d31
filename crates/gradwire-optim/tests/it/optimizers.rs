//! The optimizers against SINGA's formulas: hand-computed first steps, an
//! f64 reference over many random steps, the argument checks, schedules,
//! per-parameter configuration, skipping, and state round trips.

use gradwire_optim::{
    AdaGrad, AdaGradConfig, Adam, AdamConfig, AdamW, OptimError, Optimizer, RmsProp, RmsPropConfig,
    Schedule, Sgd, SgdConfig,
};
use gradwire_tensor::{DType, Tensor};
use proptest::prelude::*;

fn tensor(v: &[f32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), v.len()).unwrap()
}

/// The f64 reference of every optimizer, written from SINGA's formulas directly.
#[derive(Clone, Debug)]
enum Reference {
    Sgd {
        lr: f64,
        mu: f64,
        d: f64,
        wd: f64,
        nesterov: bool,
        buf: Vec<f64>,
    },
    RmsProp {
        lr: f64,
        rho: f64,
        eps: f64,
        r: Vec<f64>,
    },
    AdaGrad {
        lr: f64,
        eps: f64,
        h: Vec<f64>,
    },
    Adam {
        lr: f64,
        b1: f64,
        b2: f64,
        eps: f64,
        wd: f64,
        decoupled: bool,
        m: Vec<f64>,
        v: Vec<f64>,
        t: i32,
    },
}

impl Reference {
    fn step(&mut self, p: &mut [f64], g: &[f64]) {
        match self {
            Reference::Sgd {
                lr,
                mu,
                d,
                wd,
                nesterov,
                buf,
            } => {
                for i in 0..p.len() {
                    let mut gi = g[i];
                    if *wd != 0.0 {
                        gi += *wd * p[i];
                    }
                    if *mu != 0.0 {
                        buf[i] = *mu * buf[i] + (1.0 - *d) * gi;
                        gi = if *nesterov { gi + *mu * buf[i] } else { buf[i] };
                    }
                    p[i] -= *lr * gi;
                }
            }
            Reference::RmsProp { lr, rho, eps, r } => {
                for i in 0..p.len() {
                    r[i] = *rho * r[i] + (1.0 - *rho) * g[i] * g[i];
                    p[i] -= *lr * g[i] / (r[i] + *eps).sqrt();
                }
            }
            Reference::AdaGrad { lr, eps, h } => {
                for i in 0..p.len() {
                    h[i] += g[i] * g[i];
                    p[i] -= *lr * g[i] / (h[i] + *eps).sqrt();
                }
            }
            Reference::Adam {
                lr,
                b1,
                b2,
                eps,
                wd,
                decoupled,
                m,
                v,
                t,
            } => {
                *t += 1;
                for i in 0..p.len() {
                    let mut gi = g[i];
                    if *decoupled {
                        p[i] *= 1.0 - *lr * *wd;
                    } else if *wd != 0.0 {
                        gi += *wd * p[i];
                    }
                    m[i] = *b1 * m[i] + (1.0 - *b1) * gi;
                    v[i] = *b2 * v[i] + (1.0 - *b2) * gi * gi;
                    let mhat = m[i] / (1.0 - b1.powi(*t));
                    let vhat = v[i] / (1.0 - b2.powi(*t));
                    p[i] -= *lr * mhat / (vhat.sqrt() + *eps);
                }
            }
        }
    }
}

/// Runs `steps` through `opt` and through the reference; returns the largest
/// error relative to the parameter's scale.
fn compare<O: Optimizer>(
    mut opt: O,
    mut reference: Reference,
    p0: &[f32],
    steps: &[Vec<f32>],
) -> f64 {
    let mut p = tensor(p0);
    let mut q: Vec<f64> = p0.iter().map(|&v| f64::from(v)).collect();
    let mut worst = 0f64;
    for g in steps {
        opt.update("p", &mut p, &tensor(g)).unwrap();
        opt.step();
        reference.step(&mut q, &g.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
        for (a, b) in p.to_vec::<f32>().unwrap().iter().zip(&q) {
            worst = worst.max((f64::from(*a) - b).abs() / (1.0 + b.abs()));
        }
    }
    worst
}

#[test]
fn sgd_first_three_steps_by_hand() {
    // p = 1, g = 0.5 every step, lr 0.1.
    let g = vec![0.5f32];
    let cases: [(SgdConfig, [f32; 3]); 5] = [
        // plain: p -= 0.05 each step
        (SgdConfig::default(), [0.95, 0.90, 0.85]),
        // momentum 0.9: buf = 0.5, 0.95, 1.355 -> p = 0.95, 0.855, 0.7195
        (SgdConfig::default().momentum(0.9), [0.95, 0.855, 0.7195]),
        // dampening 0.5: buf = 0.25, 0.475, 0.6775 -> p = 0.975, 0.9275, 0.85975
        (
            SgdConfig::default().momentum(0.9).dampening(0.5),
            [0.975, 0.9275, 0.85975],
        ),
        // nesterov: buf = 0.5, 0.95, 1.355; g' = 0.5 + 0.9 buf = 0.95, 1.355, 1.7195
        (
            SgdConfig::default().momentum(0.9).nesterov(true),
            [0.905, 0.7695, 0.59755],
        ),
        // weight decay 0.1: g' = 0.5 + 0.1 p: p = 1 - 0.1*0.6 = 0.94; 0.94 - 0.1*0.594 = 0.8806;
        // 0.8806 - 0.1*0.58806 = 0.821794
        (
            SgdConfig::default().weight_decay(0.1),
            [0.94, 0.8806, 0.821794],
        ),
    ];
    for (config, want) in cases {
        let mut sgd = Sgd::new(config.clone()).unwrap();
        let mut p = tensor(&[1.0]);
        for (step, &w) in want.iter().enumerate() {
            sgd.update("p", &mut p, &tensor(&g)).unwrap();
            sgd.step();
            let got = p.to_vec::<f32>().unwrap()[0];
            assert!(
                (got - w).abs() <= 1e-6,
                "{config:?} step {step}: {got} vs {w}"
            );
        }
    }
}

#[test]
fn adaptive_optimizers_first_three_steps_by_hand() {
    // Adam, lr 0.1, p = 1, g = 0.5: m/(1-b1^t) = 0.5 and v/(1-b2^t) = 0.25 at
    // every step, so each step subtracts 0.1 * 0.5 / (0.5 + 1e-8).
    let mut adam = Adam::new(AdamConfig::default()).unwrap();
    let mut p = tensor(&[1.0]);
    let per_step = 0.1 * 0.5 / (0.5 + 1e-8);
    for step in 1..=3 {
        adam.update("p", &mut p, &tensor(&[0.5])).unwrap();
        adam.step();
        let want = 1.0 - step as f64 * per_step;
        assert!((f64::from(p.to_vec::<f32>().unwrap()[0]) - want).abs() < 1e-6);
    }
    // AdaGrad, lr 0.1, g = 0.5: h = 0.25, 0.5, 0.75.
    let mut ada = AdaGrad::new(AdaGradConfig::default()).unwrap();
    let mut p = tensor(&[1.0]);
    let mut want = 1.0f64;
    for h in [0.25f64, 0.5, 0.75] {
        ada.update("p", &mut p, &tensor(&[0.5])).unwrap();
        ada.step();
        want -= 0.1 * 0.5 / (h + 1e-8).sqrt();
        assert!((f64::from(p.to_vec::<f32>().unwrap()[0]) - want).abs() < 1e-6);
    }
    // RMSProp, lr 0.1, rho 0.9, g = 0.5: r = 0.025, 0.0475, 0.06775.
    let mut rms = RmsProp::new(RmsPropConfig::default()).unwrap();
    let mut p = tensor(&[1.0]);
    let mut want = 1.0f64;
    for r in [0.025f64, 0.0475, 0.06775] {
        rms.update("p", &mut p, &tensor(&[0.5])).unwrap();
        rms.step();
        want -= 0.1 * 0.5 / (r + 1e-8).sqrt();
        assert!(
            (f64::from(p.to_vec::<f32>().unwrap()[0]) - want).abs() < 1e-5,
            "{r}"
        );
    }
}

#[test]
fn a_schedule_applies_per_step_and_one_starting_at_zero_still_works() {
    // Momentum ramps from 0 (SINGA ignored such a schedule forever).
    let ramp = Schedule::CosineWarmup {
        peak: 0.9,
        floor: 0.9,
        warmup_steps: 2,
        total_steps: 2,
    };
    let lr = Schedule::ExponentialDecay {
        init: 0.1,
        decay_steps: 1,
        rate: 0.5,
        staircase: true,
    };
    let mut sgd = Sgd::new(SgdConfig::default().lr(lr).momentum(ramp)).unwrap();
    let mut p = tensor(&[1.0]);
    let mut reference = 1.0f64;
    let mut buf = 0.0f64;
    for step in 0..5u64 {
        sgd.update("p", &mut p, &tensor(&[0.5])).unwrap();
        sgd.step();
        let mu = ramp.value(step);
        let lr = 0.1 * 0.5f64.powi(step as i32);
        let g = if mu != 0.0 {
            buf = mu * buf + 0.5;
            buf
        } else {
            0.5
        };
        reference -= lr * g;
        assert!(
            (f64::from(p.to_vec::<f32>().unwrap()[0]) - reference).abs() < 1e-6,
            "step {step}"
        );
    }
    assert!(
        sgd.param_state("p")
            .unwrap()
            .buffers
            .contains_key("momentum")
    );
}

#[test]
fn argument_checks_are_errors() {
    let bad = [
        SgdConfig::default().momentum(-0.1),
        SgdConfig::default().weight_decay(-1.0),
        SgdConfig::default().nesterov(true),
        SgdConfig::default()
            .momentum(0.9)
            .dampening(0.1)
            .nesterov(true),
        SgdConfig::default().lr(f64::NAN),
        SgdConfig::default().lr(Schedule::ExponentialDecay {
            init: 0.1,
            decay_steps: 0,
            rate: 0.5,
            staircase: false,
        }),
    ];
    for config in bad {
        assert!(
            matches!(
                Sgd::new(config.clone()),
                Err(OptimError::InvalidArgument(_))
            ),
            "{config:?}"
        );
    }
    let beta_one = AdamConfig {
        beta1: Schedule::constant(1.0),
        ..AdamConfig::default()
    };
    assert!(matches!(
        Adam::new(beta_one),
        Err(OptimError::InvalidArgument(_))
    ));
    let negative_eps = RmsPropConfig {
        eps: Schedule::constant(-1.0),
        ..RmsPropConfig::default()
    };
    assert!(matches!(
        RmsProp::new(negative_eps),
        Err(OptimError::InvalidArgument(_))
    ));
    // A gradient of the wrong shape.
    let mut sgd = Sgd::new(SgdConfig::default()).unwrap();
    let mut p = tensor(&[1.0, 2.0]);
    assert!(matches!(
        sgd.update("p", &mut p, &tensor(&[1.0])),
        Err(OptimError::ShapeMismatch { .. })
    ));
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}

#[test]
fn a_lazily_zeroed_gradient_is_skipped_without_advancing_state() {
    let mut adam = Adam::new(AdamConfig::default()).unwrap();
    let mut p = tensor(&[1.0, -1.0]);
    adam.update("p", &mut p, &tensor(&[0.5, 0.5])).unwrap();
    adam.step();
    let before = (p.to_vec::<f32>().unwrap(), adam.param_state("p").cloned());
    let mut g = tensor(&[9.0, 9.0]);
    g.zero_();
    adam.update("p", &mut p, &g).unwrap();
    adam.step();
    assert_eq!(
        (p.to_vec::<f32>().unwrap(), adam.param_state("p").cloned()),
        before
    );
    assert_eq!(adam.param_state("p").unwrap().updates, 1);
}

#[test]
fn per_parameter_configuration_overrides_only_that_parameter() {
    let mut sgd = Sgd::new(SgdConfig::default().lr(0.1)).unwrap();
    sgd.register("special", SgdConfig::default().lr(1.0))
        .unwrap();
    let (mut a, mut b) = (tensor(&[1.0]), tensor(&[1.0]));
    sgd.update("plain", &mut a, &tensor(&[0.5])).unwrap();
    sgd.update("special", &mut b, &tensor(&[0.5])).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![0.95]);
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![0.5]);
    let result = sgd.register("bad", SgdConfig::default().momentum(-1.0));
    assert!(
        matches!(&result, Err(OptimError::InvalidArgument(m)) if m.contains("momentum")),
        "{result:?}"
    );
}

#[test]
fn half_precision_parameters_are_updated_in_f32_and_rounded_once() {
    for dtype in [DType::F16, DType::BF16] {
        let mut sgd = Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9)).unwrap();
        let mut p = Tensor::from_f32(&[1.0, -2.0, 0.25], 3, dtype).unwrap();
        let g = Tensor::from_f32(&[0.5, 0.5, -1.0], 3, dtype).unwrap();
        sgd.update("p", &mut p, &g).unwrap();
        let want: Vec<f32> = [1.0f32 - 0.05, -2.0 - 0.05, 0.25 + 0.1]
            .iter()
            .map(|&v| {
                Tensor::from_f32(&[v], 1, dtype)
                    .unwrap()
                    .to_f32_vec()
                    .unwrap()[0]
            })
            .collect();
        assert_eq!(p.dtype(), dtype);
        assert_eq!(p.to_f32_vec().unwrap(), want, "{dtype}");
    }
}

#[test]
fn state_round_trip_continues_bitwise() {
    let config = AdamConfig::default().lr(0.01);
    let grads: Vec<Vec<f32>> = (0..10)
        .map(|s| (0..7).map(|i| ((i * 3 + s) % 5) as f32 - 2.0).collect())
        .collect();
    let mut straight = AdamW::new(config.clone()).unwrap();
    let mut p = tensor(&[0.5; 7]);
    for g in &grads {
        straight.update("p", &mut p, &tensor(g)).unwrap();
        straight.step();
    }
    let mut first = AdamW::new(config.clone()).unwrap();
    let mut q = tensor(&[0.5; 7]);
    for g in &grads[..4] {
        first.update("p", &mut q, &tensor(g)).unwrap();
        first.step();
    }
    let saved = first.state().unwrap();
    let mut resumed = AdamW::new(AdamConfig::adamw()).unwrap();
    resumed.load_state(&saved).unwrap();
    for g in &grads[4..] {
        resumed.update("p", &mut q, &tensor(g)).unwrap();
        resumed.step();
    }
    let bits = |t: &Tensor| {
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&p), bits(&q));
    assert_eq!(resumed.state().unwrap(), straight.state().unwrap());
    // A state of another kind, or with a buffer of the wrong size, is refused.
    let mut sgd = Sgd::new(SgdConfig::default()).unwrap();
    assert!(matches!(
        sgd.load_state(&saved),
        Err(OptimError::StateMismatch(_))
    ));
    let mut broken = saved.clone();
    broken
        .params
        .get_mut("p")
        .unwrap()
        .buffers
        .get_mut("m")
        .unwrap()
        .pop();
    assert!(matches!(
        AdamW::new(config).unwrap().load_state(&broken),
        Err(OptimError::StateMismatch(_))
    ));
}

fn steps_strategy() -> impl Strategy<Value = (Vec<f32>, Vec<Vec<f32>>)> {
    (1usize..40).prop_flat_map(|n| {
        (
            prop::collection::vec(-2.0f32..2.0, n),
            prop::collection::vec(prop::collection::vec(-1.0f32..1.0, n), 100),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn f32_tracks_the_f64_reference_over_100_steps((p0, steps) in steps_strategy()) {
        let n = p0.len();
        let z = vec![0.0; n];
        let bound = 1e-4; // 100 steps of f32 rounding, relative to 1 + |p|
        let sgd = Sgd::new(SgdConfig::default().lr(0.01).momentum(0.9).weight_decay(0.01)).unwrap();
        let r = Reference::Sgd { lr: 0.01, mu: 0.9, d: 0.0, wd: 0.01, nesterov: false, buf: z.clone() };
        prop_assert!(compare(sgd, r, &p0, &steps) < bound);
        let nesterov = Sgd::new(SgdConfig::default().lr(0.01).momentum(0.9).nesterov(true)).unwrap();
        let r = Reference::Sgd { lr: 0.01, mu: 0.9, d: 0.0, wd: 0.0, nesterov: true, buf: z.clone() };
        prop_assert!(compare(nesterov, r, &p0, &steps) < bound);
        let rms = RmsProp::new(RmsPropConfig { lr: Schedule::constant(0.001), ..RmsPropConfig::default() }).unwrap();
        let r = Reference::RmsProp { lr: 0.001, rho: 0.9, eps: 1e-8, r: z.clone() };
        prop_assert!(compare(rms, r, &p0, &steps) < bound);
        let ada = AdaGrad::new(AdaGradConfig { lr: Schedule::constant(0.01), ..AdaGradConfig::default() }).unwrap();
        let r = Reference::AdaGrad { lr: 0.01, eps: 1e-8, h: z.clone() };
        prop_assert!(compare(ada, r, &p0, &steps) < bound);
        let adam = Adam::new(AdamConfig::default().lr(0.001).weight_decay(0.01)).unwrap();
        let r = Reference::Adam { lr: 0.001, b1: 0.9, b2: 0.999, eps: 1e-8, wd: 0.01, decoupled: false, m: z.clone(), v: z.clone(), t: 0 };
        prop_assert!(compare(adam, r, &p0, &steps) < bound);
        let adamw = AdamW::new(AdamConfig::adamw()).unwrap();
        let r = Reference::Adam { lr: 0.001, b1: 0.9, b2: 0.999, eps: 1e-8, wd: 0.01, decoupled: true, m: z.clone(), v: z, t: 0 };
        prop_assert!(compare(adamw, r, &p0, &steps) < bound);
    }

    #[test]
    fn a_zero_gradient_without_weight_decay_leaves_a_fresh_parameter_unchanged(p0 in prop::collection::vec(-5.0f32..5.0, 0..50)) {
        let sgd = Sgd::new(SgdConfig::default().momentum(0.9).nesterov(true)).unwrap();
        prop_assert_eq!(three_zero_steps(sgd, &p0), p0.clone());
        prop_assert_eq!(three_zero_steps(Adam::new(AdamConfig::default()).unwrap(), &p0), p0.clone());
        prop_assert_eq!(three_zero_steps(AdamW::new(AdamConfig::default()).unwrap(), &p0), p0.clone());
        prop_assert_eq!(three_zero_steps(RmsProp::new(RmsPropConfig::default()).unwrap(), &p0), p0.clone());
        prop_assert_eq!(three_zero_steps(AdaGrad::new(AdaGradConfig::default()).unwrap(), &p0), p0.clone());
    }
}

/// Three steps with an all-zero (written, not lazily zeroed) gradient.
fn three_zero_steps<O: Optimizer>(mut opt: O, p0: &[f32]) -> Vec<f32> {
    let mut p = tensor(p0);
    let zeros = tensor(&vec![0.0; p0.len()]);
    for _ in 0..3 {
        opt.update("p", &mut p, &zeros).unwrap();
        opt.step();
    }
    p.to_vec::<f32>().unwrap()
}

/// Trains 10 steps straight, and 4 steps, a checkpoint file, a fresh
/// optimizer loading it, and 6 more: the parameters and states are bitwise
/// the same.
fn resumes_from_a_file_bitwise<O: Optimizer>(make: impl Fn() -> O) {
    use gradwire_optim::checkpoint::{self, Checkpoint};
    let grads: Vec<Vec<f32>> = (0..10)
        .map(|s| {
            (0..9)
                .map(|i| (((i * 7 + s * 3) % 11) as f32 - 5.0) * 0.1)
                .collect()
        })
        .collect();
    let names = ["layer/w", "layer/b"];
    let run = |opt: &mut O, params: &mut [Tensor], steps: &[Vec<f32>]| {
        for g in steps {
            for (name, p) in names.iter().zip(params.iter_mut()) {
                opt.update(name, p, &tensor(g)).unwrap();
            }
            opt.step();
        }
    };
    let start = || vec![tensor(&[0.3; 9]), tensor(&[-0.2; 9])];
    let mut straight = make();
    let mut p = start();
    run(&mut straight, &mut p, &grads);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("step4.ckpt");
    let mut first = make();
    let mut q = start();
    run(&mut first, &mut q, &grads[..4]);
    checkpoint::save(&path, &Checkpoint::new(first.state().unwrap())).unwrap();
    drop(first);
    let mut resumed = make();
    resumed
        .load_state(&checkpoint::load(&path).unwrap().optimizer)
        .unwrap();
    run(&mut resumed, &mut q, &grads[4..]);

    let bits = |ts: &[Tensor]| {
        ts.iter()
            .flat_map(|t| t.to_vec::<f32>().unwrap())
            .map(f32::to_bits)
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&p), bits(&q), "{}", straight.kind());
    assert_eq!(straight.state().unwrap(), resumed.state().unwrap());
}

#[test]
fn every_optimizer_resumes_from_a_checkpoint_file_bitwise() {
    let decay = Schedule::ExponentialDecay {
        init: 0.05,
        decay_steps: 3,
        rate: 0.7,
        staircase: false,
    };
    resumes_from_a_file_bitwise(|| {
        Sgd::new(
            SgdConfig::default()
                .lr(decay)
                .momentum(0.9)
                .weight_decay(1e-3)
                .nesterov(true),
        )
        .unwrap()
    });
    resumes_from_a_file_bitwise(|| {
        RmsProp::new(RmsPropConfig {
            lr: decay,
            ..RmsPropConfig::default()
        })
        .unwrap()
    });
    resumes_from_a_file_bitwise(|| {
        AdaGrad::new(AdaGradConfig {
            lr: decay,
            ..AdaGradConfig::default()
        })
        .unwrap()
    });
    resumes_from_a_file_bitwise(|| {
        Adam::new(AdamConfig::default().lr(decay).weight_decay(1e-3)).unwrap()
    });
    resumes_from_a_file_bitwise(|| AdamW::new(AdamConfig::adamw().lr(decay)).unwrap());
}

#[test]
fn set_buffer_refuses_an_unknown_buffer_and_a_wrong_length_by_kind() {
    use gradwire_optim::StateBuffers;
    let mut adam = gradwire_optim::Adam::new(gradwire_optim::AdamConfig::default()).unwrap();
    let unknown = adam.set_buffer("w", &[4], "momentum", vec![0.0; 4]);
    assert!(
        matches!(&unknown, Err(gradwire_optim::OptimError::StateMismatch(_))),
        "{unknown:?}"
    );
    let short = adam.set_buffer("w", &[4], "m", vec![0.0; 3]);
    assert!(
        matches!(&short, Err(gradwire_optim::OptimError::ShapeMismatch { expected, got, .. })
            if expected == &[4] && got == &[3]),
        "{short:?}"
    );
    adam.set_buffer("w", &[4], "m", vec![1.0; 4]).unwrap();
    assert_eq!(adam.buffer_values("w", "m").unwrap(), Some(vec![1.0; 4]));
}
