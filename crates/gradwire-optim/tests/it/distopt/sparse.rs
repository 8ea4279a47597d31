//! The sparse strategy through DistOpt: dense when everything is selected,
//! top-k resuming bitwise from its checkpoint, random-k drawing anew.

use gradwire_comm::{LocalComm, local};
use gradwire_optim::{
    DistOpt, DistOptConfig, OptimError, ParamSpec, Sgd, SgdConfig, StrategyConfig,
};
use gradwire_tensor::Tensor;

use super::{bits, run_mode, small_buckets};

#[test]
fn sparse_with_everything_selected_equals_dense() {
    use gradwire_compress::SparseCodec;
    let dense = run_mode(3, 3, small_buckets(), None);
    for (codec, error_feedback) in [
        (SparseCodec::Threshold(0.0), false),
        (SparseCodec::TopK(1.0), true),
        (SparseCodec::TopK(1.0), false),
    ] {
        let config = DistOptConfig {
            strategy: StrategyConfig::Sparse {
                codec,
                error_feedback,
            },
            ..small_buckets()
        };
        let sparse = run_mode(3, 3, config, None);
        assert_eq!(bits(&sparse[0][2]), bits(&dense[0][2]), "{codec:?}");
    }
}

#[test]
fn sparse_top_k_trains_and_its_checkpoint_resumes_bitwise() {
    use gradwire_compress::SparseCodec;
    let config = DistOptConfig {
        strategy: StrategyConfig::Sparse {
            codec: SparseCodec::TopK(0.2),
            error_feedback: true,
        },
        ..small_buckets()
    };
    let straight = run_mode(4, 6, config.clone(), None);
    let resumed = run_mode(4, 6, config, Some(3));
    for rank in 0..4 {
        assert_eq!(
            bits(&straight[rank][5]),
            bits(&resumed[rank][5]),
            "rank {rank}"
        );
        assert_eq!(
            bits(&straight[rank][5]),
            bits(&straight[0][5]),
            "ranks diverged"
        );
    }
}

#[test]
fn random_k_without_error_feedback_draws_anew_every_step() {
    use gradwire_compress::SparseCodec;
    let changed = local::run(2, |comm: LocalComm| {
        let config = DistOptConfig {
            strategy: StrategyConfig::Sparse {
                codec: SparseCodec::RandomK {
                    ratio: 0.1,
                    seed: 5,
                },
                error_feedback: false,
            },
            ..DistOptConfig::default()
        };
        let sgd = Sgd::new(SgdConfig::default().lr(1.0)).unwrap();
        let mut dist = DistOpt::new(sgd, comm, vec![ParamSpec::new("p", vec![200])], config)?;
        let mut p = Tensor::from_vec(vec![0f32; 200], 200).unwrap();
        let mut sets = Vec::new();
        for _ in 0..3 {
            let before = p.to_vec::<f32>().unwrap();
            dist.push("p", Tensor::from_vec(vec![1f32; 200], 200).unwrap())?;
            dist.finish([("p", &mut p)])?;
            let after = p.to_vec::<f32>().unwrap();
            let set: Vec<usize> = (0..200).filter(|&i| before[i] != after[i]).collect();
            sets.push(set);
        }
        Ok::<_, OptimError>(sets)
    })
    .unwrap();
    let sets = changed[0].as_ref().unwrap();
    assert_eq!(sets, changed[1].as_ref().unwrap(), "ranks drew differently");
    for set in sets {
        assert_eq!(set.len(), 20, "ceil(0.1 x 200) entries each step");
    }
    assert!(
        sets[0] != sets[1] && sets[1] != sets[2],
        "the same draw twice"
    );
}
