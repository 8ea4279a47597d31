//! DistOpt against single-process training on the whole batch: every
//! optimizer and world size, and half precision within its rounding.

use gradwire_algos::HalfPrecision;
use gradwire_optim::{
    AdaGrad, AdaGradConfig, Adam, AdamConfig, AdamW, DistOptConfig, Optimizer, RmsProp,
    RmsPropConfig, Schedule, Sgd, SgdConfig, StrategyConfig,
};

use super::{max_diff, small_buckets, train_distributed, train_single};

/// Checks DistOpt against single-process training for every world size.
fn equivalent<O: Optimizer + 'static>(name: &str, make: impl Fn() -> O + Sync, scale: f32) {
    let want = train_single(5, make());
    for world in 1..=8 {
        // Each rank's shard mean, averaged: the batch mean up to the f32
        // rounding of W partial gradients; adaptive optimizers normalise the
        // step, which amplifies relative errors of tiny gradients (`scale`).
        let tol = 2e-6 * world as f32 * scale;
        let got = train_distributed(world, 5, small_buckets(), &make);
        let diff = max_diff(&got, &want);
        assert!(diff <= tol, "{name}, world {world}: {diff} > {tol}");
    }
}

#[test]
fn data_parallel_equals_single_process_for_every_optimizer_and_world_size() {
    equivalent(
        "sgd",
        || {
            Sgd::new(
                SgdConfig::default()
                    .lr(0.05)
                    .momentum(0.9)
                    .weight_decay(1e-3),
            )
            .unwrap()
        },
        1.0,
    );
    equivalent(
        "adam",
        || Adam::new(AdamConfig::default().lr(0.01)).unwrap(),
        50.0,
    );
    equivalent(
        "adamw",
        || AdamW::new(AdamConfig::adamw().lr(0.01)).unwrap(),
        50.0,
    );
    let rms = RmsPropConfig {
        lr: Schedule::constant(0.01),
        ..RmsPropConfig::default()
    };
    equivalent("rmsprop", || RmsProp::new(rms.clone()).unwrap(), 50.0);
    let ada = AdaGradConfig {
        lr: Schedule::constant(0.01),
        ..AdaGradConfig::default()
    };
    equivalent("adagrad", || AdaGrad::new(ada.clone()).unwrap(), 50.0);
}

#[test]
fn half_precision_stays_within_its_rounding() {
    let sgd = || Sgd::new(SgdConfig::default().lr(0.05)).unwrap();
    let dense = train_distributed(4, 3, small_buckets(), &sgd);
    for (precision, u) in [
        (HalfPrecision::F16, 2f32.powi(-11)),
        (HalfPrecision::BF16, 2f32.powi(-8)),
    ] {
        let config = DistOptConfig {
            strategy: StrategyConfig::Half {
                precision,
                clip: None,
            },
            ..small_buckets()
        };
        let half = train_distributed(4, 3, config, &sgd);
        // Three steps of lr 0.05 with gradients of magnitude below ~10, each
        // gradient off by at most two roundings.
        let bound = 3.0 * 0.05 * 2.0 * u * 10.0;
        assert!(
            max_diff(&half, &dense) <= bound,
            "{precision:?}: {}",
            max_diff(&half, &dense)
        );
        assert!(
            max_diff(&half, &dense) > 0.0,
            "{precision:?} should round something"
        );
    }
}
