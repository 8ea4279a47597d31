//! DistOpt's buckets: Singa's fusion rule and the capacity, no fusion
//! threshold changing a bit, and any mix of sizes averaging correctly.

use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::{DistOpt, DistOptConfig, OptimError, ParamSpec, Sgd, SgdConfig};
use gradwire_tensor::Tensor;

use super::{small_buckets, train_distributed};

#[test]
fn any_fusion_threshold_gives_the_same_bits() {
    let sgd = || Sgd::new(SgdConfig::default().lr(0.05).momentum(0.9)).unwrap();
    let reference = train_distributed(
        3,
        4,
        DistOptConfig {
            fusion_threshold: 0,
            ..DistOptConfig::default()
        },
        &sgd,
    );
    for threshold in [1, 7, 16, 40, usize::MAX / 2] {
        let config = DistOptConfig {
            fusion_threshold: threshold,
            capacity: usize::MAX,
            ..DistOptConfig::default()
        };
        let got = train_distributed(3, 4, config, &sgd);
        let bits = |v: &[Vec<f32>]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&reference), "threshold {threshold}");
    }
}

#[test]
fn buckets_follow_singas_rule_and_respect_the_capacity() {
    let comm = LocalComm::create(1).unwrap().pop().unwrap();
    let specs = vec![
        ParamSpec::new("a", vec![4]),
        ParamSpec::new("b", vec![4]),
        ParamSpec::new("big", vec![20]),
        ParamSpec::new("c", vec![3]),
        ParamSpec::new("d", vec![9]),
        ParamSpec::new("e", vec![1]),
    ];
    let config = DistOptConfig {
        fusion_threshold: 10,
        capacity: 20,
        ..DistOptConfig::default()
    };
    let dist = DistOpt::new(
        Sgd::new(SgdConfig::default()).unwrap(),
        comm,
        specs.clone(),
        config,
    )
    .unwrap();
    // a+b = 8 (open) | big alone | c+d = 12 > 10 closes | e trails.
    assert_eq!(dist.buckets(), &[0..2, 2..3, 3..5, 5..6]);
    let comm = LocalComm::create(1).unwrap().pop().unwrap();
    let tight = DistOptConfig {
        fusion_threshold: 10,
        capacity: 19,
        ..DistOptConfig::default()
    };
    assert!(matches!(
        DistOpt::new(Sgd::new(SgdConfig::default()).unwrap(), comm, specs, tight),
        Err(OptimError::InvalidArgument(_))
    ));
}

/// Rank r's gradient of parameter k at a step: deterministic, signed.
fn synthetic_grad(rank: usize, step: usize, k: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7 + k * 13 + rank * 29 + step * 3) % 17) as f32 - 8.0) / 8.0)
        .collect()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..proptest::prelude::ProptestConfig::default() })]

    /// Many mixes of tensor sizes around the fusion threshold (16): the
    /// averaged SGD step equals an f64 reference of the mean gradient.
    #[test]
    fn any_size_mix_around_the_threshold_averages_correctly(
        world in 1usize..=8,
        sizes in proptest::collection::vec(proptest::sample::select(vec![1usize, 2, 15, 16, 17, 31, 33, 64]), 1..8),
    ) {
        let specs: Vec<ParamSpec> = sizes.iter().enumerate().map(|(k, &n)| ParamSpec::new(format!("p{k}"), vec![n])).collect();
        let steps = 3;
        let lr = 0.1f64;
        let results = local::run(world, |comm: LocalComm| {
            let rank = comm.rank();
            let sgd = Sgd::new(SgdConfig::default().lr(lr)).unwrap();
            let mut dist = DistOpt::new(sgd, comm, specs.clone(), small_buckets())?;
            let mut params: Vec<Tensor> = sizes.iter().map(|&n| Tensor::from_vec(vec![0.5f32; n], n).unwrap()).collect();
            let names: Vec<String> = (0..sizes.len()).map(|k| format!("p{k}")).collect();
            for step in 0..steps {
                for (k, &n) in sizes.iter().enumerate() {
                    dist.push(&names[k], Tensor::from_vec(synthetic_grad(rank, step, k, n), n).unwrap())?;
                }
                dist.finish(names.iter().map(String::as_str).zip(params.iter_mut()))?;
            }
            Ok::<_, OptimError>(params.iter().map(|t| t.to_vec::<f32>().unwrap()).collect::<Vec<_>>())
        }).unwrap();
        for (k, &n) in sizes.iter().enumerate() {
            for i in 0..n {
                let mut want = 0.5f64;
                for step in 0..steps {
                    let mean = (0..world).map(|r| f64::from(synthetic_grad(r, step, k, n)[i])).sum::<f64>() / world as f64;
                    want -= lr * mean;
                }
                for r in &results {
                    let got = f64::from(r.as_ref().unwrap()[k][i]);
                    proptest::prop_assert!((got - want).abs() <= 1e-6 * world as f64, "p{} [{}]: {} vs {}", k, i, got, want);
                }
            }
        }
    }
}
