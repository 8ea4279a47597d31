//! `kernels/cuda/optim.cu` on the CPU against gradwire-optim's CPU rules,
//! bitwise, as `optim.cu` and the launcher (`gradwire-optim`'s
//! `rules/cuda.rs`, `apply_update`) promise.
//!
//! Every rule (SGD plain, with L2 decay, momentum, dampening, nesterov;
//! RMSProp; AdaGrad; Adam with and without L2; AdamW with and without
//! decoupled decay) on every dtype (f32, f16, bf16 parameters and gradients,
//! f32 state), every length of [`LENGTHS`], three steps with the state
//! carried from step to step on each side: the CPU side is a real
//! [`Optimizer`] updating a CPU tensor (its `update` and `step`), the device
//! side the kernel launched as `apply_update` launches it (`Blocks::Over(n)`,
//! nothing queued for `n = 0`, a null momentum buffer without momentum,
//! zeroed buffers at the first step) with the values the rule's
//! `cuda_kernel` passes: the f32 values of the schedules and, for Adam and
//! AdamW, `step_size`, `inv_c2` and the decay factor from the rule's own
//! values (`AdamValues::step_scalars`, `AdamValues::decay_factor`). After
//! every step the parameter and every buffer must be bitwise the CPU's.
//!
//! Inputs cover every class of float (subnormals, ±0, rounding ties, huge
//! and tiny magnitudes), compared bit for bit; a second run adds infinities
//! and NaNs with payloads, compared up to the payload of NaNs
//! ([`nan_canonical`]: arithmetic gives its NaN the hardware's payload).
//! The launcher passes whole device allocations (no windows), so every
//! buffer is aligned.

use gradwire_kernels::{Blocks, Kernel, optim as k};
use gradwire_kernels_host::{Arg, Element};
use gradwire_optim::{
    AdaGrad, AdaGradConfig, Adam, AdamConfig, AdamRule, AdamW, Optimizer, RmsProp, RmsPropConfig,
    Schedule, Sgd, SgdConfig, UpdateRule,
};
use gradwire_tensor::{Tensor, WithDType};
use half::{bf16, f16};

use crate::common::{LENGTHS, bits, floats, nan_canonical, run_both};

/// Steps each case runs, the state carried.
const STEPS: u64 = 3;

/// A rule and its hyper-parameters as configured (f64 constants, as a
/// [`Schedule`] holds them).
#[derive(Debug, Clone, Copy)]
enum Rule {
    Sgd {
        lr: f64,
        momentum: f64,
        dampening: f64,
        weight_decay: f64,
        nesterov: bool,
    },
    RmsProp {
        lr: f64,
        rho: f64,
        eps: f64,
        weight_decay: f64,
    },
    AdaGrad {
        lr: f64,
        eps: f64,
        weight_decay: f64,
    },
    Adam {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
    AdamW {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
}

/// A schedule's value at a step as the rules use it (`rules/mod.rs`'s `value_at`).
fn f(v: f64) -> f32 {
    v as f32
}

/// The kernels of one dtype: sgd, rmsprop, adagrad, adam, adamw.
type Kernels = [&'static Kernel; 5];

const F32: Kernels = [
    &k::SGD_F32,
    &k::RMSPROP_F32,
    &k::ADAGRAD_F32,
    &k::ADAM_F32,
    &k::ADAMW_F32,
];
const F16: Kernels = [
    &k::SGD_F16,
    &k::RMSPROP_F16,
    &k::ADAGRAD_F16,
    &k::ADAM_F16,
    &k::ADAMW_F16,
];
const BF16: Kernels = [
    &k::SGD_BF16,
    &k::RMSPROP_BF16,
    &k::ADAGRAD_BF16,
    &k::ADAM_BF16,
    &k::ADAMW_BF16,
];

impl Rule {
    /// Its kernel among one dtype's.
    fn kernel(&self, kernels: Kernels) -> &'static Kernel {
        kernels[match self {
            Rule::Sgd { .. } => 0,
            Rule::RmsProp { .. } => 1,
            Rule::AdaGrad { .. } => 2,
            Rule::Adam { .. } => 3,
            Rule::AdamW { .. } => 4,
        }]
    }

    /// The f32 buffers the kernel takes (`UpdateKernel::buffers`).
    fn buffers(&self) -> usize {
        match self {
            Rule::Sgd { momentum, .. } => usize::from(f(*momentum) != 0.0),
            Rule::RmsProp { .. } | Rule::AdaGrad { .. } => 1,
            Rule::Adam { .. } | Rule::AdamW { .. } => 2,
        }
    }

    /// The value arguments after the length at the parameter's update `t`
    /// (1-based), as `cuda_kernel` and `apply_update` pass them.
    fn values(&self, t: u64) -> Vec<Arg<'static>> {
        // The rule's own values, as `cuda_kernel` takes them.
        let adam = |lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64| {
            let c = Schedule::constant;
            let config = AdamConfig {
                lr: c(lr),
                beta1: c(beta1),
                beta2: c(beta2),
                eps: c(eps),
                weight_decay: c(weight_decay),
            };
            AdamRule::values(&config, t).expect("valid settings")
        };
        match *self {
            Rule::Sgd {
                lr,
                momentum,
                dampening,
                weight_decay,
                nesterov,
            } => vec![
                Arg::value(f(lr)),
                Arg::value(f(momentum)),
                Arg::value(f(dampening)),
                Arg::value(f(weight_decay)),
                Arg::value(i32::from(nesterov)),
            ],
            Rule::RmsProp {
                lr,
                rho,
                eps,
                weight_decay,
            } => vec![
                Arg::value(f(lr)),
                Arg::value(f(rho)),
                Arg::value(f(eps)),
                Arg::value(f(weight_decay)),
            ],
            Rule::AdaGrad {
                lr,
                eps,
                weight_decay,
            } => vec![
                Arg::value(f(lr)),
                Arg::value(f(eps)),
                Arg::value(f(weight_decay)),
            ],
            Rule::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let (step_size, inv_c2) = adam(lr, beta1, beta2, eps, weight_decay).step_scalars(t);
                vec![
                    Arg::value(step_size),
                    Arg::value(inv_c2),
                    Arg::value(f(beta1)),
                    Arg::value(f(beta2)),
                    Arg::value(f(eps)),
                    Arg::value(f(weight_decay)),
                ]
            }
            Rule::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let values = adam(lr, beta1, beta2, eps, weight_decay);
                let (step_size, inv_c2) = values.step_scalars(t);
                // None without decay, passed as apply_shrink 0 and shrink 1.
                let shrink = values.decay_factor();
                vec![
                    Arg::value(i32::from(shrink.is_some())),
                    Arg::value(shrink.unwrap_or(1.0)),
                    Arg::value(step_size),
                    Arg::value(inv_c2),
                    Arg::value(f(beta1)),
                    Arg::value(f(beta2)),
                    Arg::value(f(eps)),
                ]
            }
        }
    }

    /// The CPU's parameter and buffers after each of the steps with
    /// `grads`, from `p0`.
    fn cpu<T: WithDType>(&self, p0: &[T], grads: &[Vec<T>]) -> Vec<(Vec<T>, Vec<Vec<f32>>)> {
        let c = Schedule::constant;
        match *self {
            Rule::Sgd {
                lr,
                momentum,
                dampening,
                weight_decay,
                nesterov,
            } => cpu_steps(
                Sgd::new(SgdConfig {
                    lr: c(lr),
                    momentum: c(momentum),
                    dampening: c(dampening),
                    weight_decay: c(weight_decay),
                    nesterov,
                }),
                p0,
                grads,
            ),
            Rule::RmsProp {
                lr,
                rho,
                eps,
                weight_decay,
            } => cpu_steps(
                RmsProp::new(RmsPropConfig {
                    lr: c(lr),
                    rho: c(rho),
                    eps: c(eps),
                    weight_decay: c(weight_decay),
                }),
                p0,
                grads,
            ),
            Rule::AdaGrad {
                lr,
                eps,
                weight_decay,
            } => cpu_steps(
                AdaGrad::new(AdaGradConfig {
                    lr: c(lr),
                    eps: c(eps),
                    weight_decay: c(weight_decay),
                }),
                p0,
                grads,
            ),
            Rule::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => cpu_steps(
                Adam::new(AdamConfig {
                    lr: c(lr),
                    beta1: c(beta1),
                    beta2: c(beta2),
                    eps: c(eps),
                    weight_decay: c(weight_decay),
                }),
                p0,
                grads,
            ),
            Rule::AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => cpu_steps(
                AdamW::new(AdamConfig {
                    lr: c(lr),
                    beta1: c(beta1),
                    beta2: c(beta2),
                    eps: c(eps),
                    weight_decay: c(weight_decay),
                }),
                p0,
                grads,
            ),
        }
    }
}

/// `optim`'s update of a CPU tensor from `p0` with each of `grads` (a step
/// each), and after each its parameter and buffers (in name order, the
/// kernels' order).
fn cpu_steps<O: Optimizer, T: WithDType>(
    optim: gradwire_optim::Result<O>,
    p0: &[T],
    grads: &[Vec<T>],
) -> Vec<(Vec<T>, Vec<Vec<f32>>)> {
    let mut optim = optim.expect("a valid configuration");
    let n = p0.len();
    let mut param = Tensor::from_vec(p0.to_vec(), n).expect("a tensor");
    grads
        .iter()
        .map(|g| {
            let grad = Tensor::from_vec(g.clone(), n).expect("a tensor");
            optim.update("w", &mut param, &grad).expect("the update");
            optim.step();
            let state = optim.param_state("w").expect("updated");
            (
                param.to_vec::<T>().expect("the parameter"),
                state.buffers.values().cloned().collect(),
            )
        })
        .collect()
}

/// The kernel's parameter and buffers after each step, launched as
/// `apply_update` launches it, the buffers carried from step to step.
fn device_steps<T: WithDType + Element>(
    rule: &Rule,
    kernel: &Kernel,
    p0: &[T],
    grads: &[Vec<T>],
    case: &str,
) -> Vec<(Vec<T>, Vec<Vec<f32>>)> {
    let n = p0.len();
    let buffers = rule.buffers();
    // The device's buffers start as zeros (`CudaStorage::alloc_zeros`).
    let mut state = (
        p0.to_vec(),
        Vec::<T>::new(),
        vec![0f32; if buffers >= 1 { n } else { 0 }],
        vec![0f32; if buffers >= 2 { n } else { 0 }],
    );
    let mut out = Vec::new();
    for (step, g) in grads.iter().enumerate() {
        let t = step as u64 + 1;
        state.1 = g.clone();
        // apply_update queues nothing for an empty parameter.
        if n > 0 {
            state = run_both(kernel, Blocks::Over(n), &state, |(p, g, b0, b1)| {
                let mut args = vec![Arg::write(p), Arg::read(g)];
                match buffers {
                    0 => args.push(Arg::Null),
                    1 => args.push(Arg::write(b0)),
                    _ => {
                        args.push(Arg::write(b0));
                        args.push(Arg::write(b1));
                    }
                }
                args.push(Arg::len(n));
                args.extend(rule.values(t));
                args
            })
            .unwrap_or_else(|e| panic!("{case} step {t}: {e}"));
        }
        let kept = [&state.2, &state.3];
        out.push((
            state.0.clone(),
            kept[..buffers].iter().map(|b| b.to_vec()).collect(),
        ));
    }
    out
}

/// `rule` on one dtype, every length, finite inputs and then special ones.
fn check_dtype<T: WithDType + Element>(rule: &Rule, kernels: Kernels) {
    let kernel = rule.kernel(kernels);
    for &n in LENGTHS {
        for special in [false, true] {
            let seed = n as u64 * 16 + u64::from(special) * 8;
            let cast = |v: Vec<f32>| -> Vec<T> { v.into_iter().map(T::from_f32).collect() };
            let p0 = cast(floats(n, seed, special));
            let grads: Vec<Vec<T>> = (1..=STEPS)
                .map(|s| cast(floats(n, seed + s, special)))
                .collect();
            let case = format!("{} {rule:?} n = {n} special {special}", kernel.name());
            let want = rule.cpu(&p0, &grads);
            let got = device_steps(rule, kernel, &p0, &grads, &case);
            for (t, ((gp, gb), (wp, wb))) in got.iter().zip(&want).enumerate() {
                let t = t + 1;
                // With momentum 0 the CPU keeps no buffer; the device then
                // has none either.
                assert_eq!(gb.len(), wb.len(), "{case} step {t}: buffer count");
                let (same_p, same_b) = if special {
                    (
                        nan_canonical(gp) == nan_canonical(wp),
                        gb.iter()
                            .zip(wb)
                            .all(|(g, w)| nan_canonical(g) == nan_canonical(w)),
                    )
                } else {
                    (
                        bits(gp) == bits(wp),
                        gb.iter().zip(wb).all(|(g, w)| bits(g) == bits(w)),
                    )
                };
                assert!(
                    same_p,
                    "{case} step {t}: parameter\nkernel {gp:?}\nCPU    {wp:?}"
                );
                assert!(
                    same_b,
                    "{case} step {t}: buffers\nkernel {gb:?}\nCPU    {wb:?}"
                );
            }
        }
    }
}

/// `rules` on every dtype.
fn check(rules: &[Rule]) {
    for rule in rules {
        check_dtype::<f32>(rule, F32);
        check_dtype::<f16>(rule, F16);
        check_dtype::<bf16>(rule, BF16);
    }
}

#[test]
fn sgd_plain_and_with_momentum_is_bitwise_the_cpu_rule() {
    let sgd = |lr, momentum, dampening, weight_decay| Rule::Sgd {
        lr,
        momentum,
        dampening,
        weight_decay,
        nesterov: false,
    };
    check(&[
        sgd(0.1, 0.0, 0.0, 0.0),
        sgd(0.05, 0.0, 0.0, 1e-2),
        sgd(0.1, 0.9, 0.0, 0.0),
        sgd(0.3, 0.9, 0.1, 1e-3),
    ]);
}

#[test]
fn sgd_nesterov_is_bitwise_the_cpu_rule() {
    let nesterov = |lr, momentum, weight_decay| Rule::Sgd {
        lr,
        momentum,
        dampening: 0.0,
        weight_decay,
        nesterov: true,
    };
    check(&[nesterov(0.1, 0.9, 0.0), nesterov(0.02, 0.7, 1e-2)]);
}

#[test]
fn rmsprop_is_bitwise_the_cpu_rule() {
    check(&[
        Rule::RmsProp {
            lr: 0.01,
            rho: 0.9,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        Rule::RmsProp {
            lr: 0.1,
            rho: 0.99,
            eps: 1e-6,
            weight_decay: 1e-2,
        },
    ]);
}

#[test]
fn adagrad_is_bitwise_the_cpu_rule() {
    check(&[
        Rule::AdaGrad {
            lr: 0.1,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        Rule::AdaGrad {
            lr: 0.01,
            eps: 1e-10,
            weight_decay: 1e-3,
        },
    ]);
}

#[test]
fn adam_is_bitwise_the_cpu_rule() {
    check(&[
        Rule::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        Rule::Adam {
            lr: 0.1,
            beta1: 0.8,
            beta2: 0.99,
            eps: 1e-6,
            weight_decay: 1e-2,
        },
    ]);
}

#[test]
fn adamw_is_bitwise_the_cpu_rule() {
    check(&[
        Rule::AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        Rule::AdamW {
            lr: 3e-2,
            beta1: 0.85,
            beta2: 0.995,
            eps: 1e-7,
            weight_decay: 1e-2,
        },
    ]);
}
