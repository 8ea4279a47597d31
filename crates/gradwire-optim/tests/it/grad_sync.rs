//! GradSync, the gradient-level API: its combined gradients are bitwise
//! those DistOpt hands its optimizer in the same mode (dense, fp16, sparse
//! with and without error feedback, AdaSum) on 1 to 5 ranks; sample
//! weighting matches an f64 reference; broadcast copies the root's
//! parameters; a bad call on one rank fails the step everywhere and the
//! next step works; a lone dense rank's combination is its own gradient,
//! bitwise, where `combines_to_identity` says so.

use gradwire_algos::adasum::AdaSum;
use gradwire_algos::{FaultKind, HalfPrecision};
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_compress::SparseCodec;
use gradwire_optim::{
    DistOpt, DistOptConfig, GradSync, OptimError, Optimizer, OptimizerState, ParamSpec, ParamState,
    Result, StateBuffers, StrategyConfig,
};
use gradwire_tensor::Tensor;
use std::collections::BTreeMap;

/// Three parameters, two buckets (fusion threshold 16), in backward order.
fn specs() -> Vec<ParamSpec> {
    vec![
        ParamSpec::new("c", [11]),
        ParamSpec::new("b", [7]),
        ParamSpec::new("a", [3, 5]),
    ]
}

fn len(spec: &ParamSpec) -> usize {
    spec.shape.iter().product()
}

/// Rank `rank`'s gradient of parameter `k` at `step`; parameter 1 is not
/// written by rank 0 at odd steps (skipping and zeros in play).
fn gradient(rank: usize, step: usize, k: usize, n: usize) -> Option<Vec<f32>> {
    if k == 1 && rank == 0 && step % 2 == 1 {
        return None;
    }
    Some(
        (0..n)
            .map(|i| (((rank * 13 + step * 7 + k * 5 + i) as f32) * 0.61).sin() * 0.2)
            .collect(),
    )
}

fn config(mode: StrategyConfig) -> DistOptConfig {
    DistOptConfig {
        strategy: mode,
        fusion_threshold: 16,
        ..DistOptConfig::default()
    }
}

/// An optimizer that records the gradient DistOpt hands it and changes
/// nothing.
#[derive(Debug, Default)]
struct Recorder {
    seen: BTreeMap<String, Vec<f32>>,
    step: u64,
}

impl Optimizer for Recorder {
    type Config = ();
    fn kind(&self) -> &'static str {
        "recorder"
    }
    fn config(&self) -> &() {
        &()
    }
    fn register(&mut self, _: &str, (): ()) -> Result<()> {
        Ok(())
    }
    fn update(&mut self, name: &str, _: &mut Tensor, grad: &Tensor) -> Result<()> {
        self.seen.insert(name.to_string(), grad.to_vec::<f32>()?);
        Ok(())
    }
    fn step(&mut self) {
        self.step += 1;
    }
    fn step_count(&self) -> u64 {
        self.step
    }
    fn param_state(&self, _: &str) -> Option<&ParamState> {
        None
    }
    fn state(&self) -> Result<OptimizerState> {
        Err(OptimError::InvalidArgument("not saved".into()))
    }
    fn load_state(&mut self, _: &OptimizerState) -> Result<()> {
        Ok(())
    }
}

impl StateBuffers for Recorder {
    fn buffer_names(&self) -> &'static [&'static str] {
        &[]
    }
    fn buffer_values(&self, _: &str, _: &str) -> Result<Option<Vec<f32>>> {
        Ok(None)
    }
    fn set_buffer(&mut self, _: &str, _: &[usize], _: &str, _: Vec<f32>) -> Result<()> {
        Ok(())
    }
}

const STEPS: usize = 4;

/// Per step, per parameter: what DistOpt's optimizer saw (None: skipped).
type Seen = Vec<Vec<Option<Vec<f32>>>>;

fn through_distopt(comm: LocalComm, mode: StrategyConfig) -> Result<Seen> {
    let rank = comm.rank();
    let specs = specs();
    let mut dist = match mode {
        StrategyConfig::Custom => {
            let adasum = AdaSum::new(&comm)?;
            DistOpt::with_strategy(
                Recorder::default(),
                comm,
                specs.clone(),
                config(mode),
                adasum,
            )?
        }
        _ => DistOpt::new(Recorder::default(), comm, specs.clone(), config(mode))?,
    };
    let mut params: Vec<Tensor> = specs
        .iter()
        .map(|s| {
            Tensor::zeros(
                s.shape.clone(),
                gradwire_tensor::DType::F32,
                Default::default(),
            )
        })
        .collect::<std::result::Result<_, _>>()?;
    let mut seen = Vec::new();
    for step in 0..STEPS {
        for (k, spec) in specs.iter().enumerate() {
            if let Some(g) = gradient(rank, step, k, len(spec)) {
                dist.push(&spec.name, Tensor::from_vec(g, spec.shape.clone())?)?;
            }
        }
        dist.optimizer_mut().seen.clear();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        dist.finish(names.iter().copied().zip(params.iter_mut()))?;
        let got = &dist.optimizer().seen;
        seen.push(specs.iter().map(|s| got.get(&s.name).cloned()).collect());
    }
    Ok(seen)
}

fn through_gradsync(comm: LocalComm, mode: StrategyConfig) -> Result<Seen> {
    let rank = comm.rank();
    let specs = specs();
    let mut sync = match mode {
        StrategyConfig::Custom => {
            let adasum = AdaSum::new(&comm)?;
            GradSync::with_strategy(comm, specs.clone(), config(mode), adasum)?
        }
        _ => GradSync::new(comm, specs.clone(), config(mode))?,
    };
    let mut seen = Vec::new();
    for step in 0..STEPS {
        // Sentinel values: a parameter no rank wrote keeps them.
        let mut out: Vec<Vec<f32>> = specs.iter().map(|s| vec![f32::MAX; len(s)]).collect();
        for (k, spec) in specs.iter().enumerate() {
            if let Some(g) = gradient(rank, step, k, len(spec)) {
                // By index for one parameter, by name for the others.
                if k == 0 {
                    sync.push(0usize, &g)?;
                } else {
                    sync.push(spec.name.as_str(), &g)?;
                }
            }
        }
        let mut views: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
        let stats = sync.finish(&mut views)?;
        assert_eq!(stats.skipped + stats.updated, specs.len());
        seen.push(
            out.into_iter()
                .map(|v| (v[0] != f32::MAX).then_some(v))
                .collect(),
        );
    }
    Ok(seen)
}

#[test]
fn combined_gradients_are_bitwise_distopts_in_every_gradient_mode() {
    let modes = [
        StrategyConfig::Dense,
        StrategyConfig::Half {
            precision: HalfPrecision::F16,
            clip: None,
        },
        StrategyConfig::Sparse {
            codec: SparseCodec::TopK(0.3),
            error_feedback: true,
        },
        StrategyConfig::Sparse {
            codec: SparseCodec::Threshold(0.1),
            error_feedback: false,
        },
        StrategyConfig::Sparse {
            codec: SparseCodec::RandomK {
                ratio: 0.5,
                seed: 3,
            },
            error_feedback: false,
        },
        StrategyConfig::Custom,
    ];
    for mode in modes {
        for world in 1..=5 {
            let reference = local::run(world, |comm| through_distopt(comm, mode)).unwrap();
            let got = local::run(world, |comm| through_gradsync(comm, mode)).unwrap();
            for (rank, (want, got)) in reference.into_iter().zip(got).enumerate() {
                let (want, got) = (want.unwrap(), got.unwrap());
                assert!(
                    want.iter().flatten().filter(|g| g.is_some()).count() >= STEPS * 2,
                    "{mode:?}: DistOpt updated too little to compare"
                );
                for step in 0..STEPS {
                    for k in 0..3 {
                        let bits = |v: &Option<Vec<f32>>| {
                            v.as_ref()
                                .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                        };
                        assert_eq!(
                            bits(&got[step][k]),
                            bits(&want[step][k]),
                            "{mode:?}, W = {world}, rank {rank}, step {step}, parameter {k}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn sample_weights_give_the_weighted_mean() {
    for world in 1..=5 {
        let samples: Vec<u64> = (0..world as u64).map(|r| 1 + 3 * r).collect();
        let total: u64 = samples.iter().sum();
        let results = local::run(world, |comm| {
            let rank = comm.rank();
            let mut sync = GradSync::new(comm, specs(), config(StrategyConfig::Dense))?;
            sync.set_samples(samples[rank])?;
            let mut out: Vec<Vec<f32>> = specs().iter().map(|s| vec![0.0; len(s)]).collect();
            for (k, spec) in specs().iter().enumerate() {
                sync.push(k, &gradient(1, 0, k, len(spec)).unwrap_or_default())?;
            }
            let mut views: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            sync.finish(&mut views)?;
            Ok::<_, OptimError>(out)
        })
        .unwrap();
        // Every rank pushed rank 1's gradient scaled by its own weight: the
        // weighted mean of equal gradients is that gradient.
        let _ = total;
        for r in results {
            let out = r.unwrap();
            for (k, spec) in specs().iter().enumerate() {
                let want = gradient(1, 0, k, len(spec)).unwrap_or_default();
                for (got, want) in out[k].iter().zip(&want) {
                    let tol = 4.0 * f32::EPSILON * world as f32 * want.abs().max(1e-3);
                    assert!((got - want).abs() <= tol, "W = {world}: {got} vs {want}");
                }
            }
        }
    }
    // Different gradients: sum_r n_r g_r / sum_r n_r against f64.
    let world = 3;
    let samples = [5u64, 1, 2];
    let results = local::run(world, |comm| {
        let rank = comm.rank();
        let mut sync = GradSync::new(comm, specs(), config(StrategyConfig::Dense))?;
        sync.set_samples(samples[rank])?;
        let mut out: Vec<Vec<f32>> = specs().iter().map(|s| vec![0.0; len(s)]).collect();
        for (k, spec) in specs().iter().enumerate() {
            sync.push(k, &gradient(rank + 2, 0, k, len(spec)).unwrap_or_default())?;
        }
        let mut views: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
        sync.finish(&mut views)?;
        Ok::<_, OptimError>(out)
    })
    .unwrap();
    let total: f64 = samples.iter().map(|&s| s as f64).sum();
    for r in results {
        let out = r.unwrap();
        for (k, spec) in specs().iter().enumerate() {
            for (i, &got) in out[k].iter().enumerate() {
                let want: f64 = (0..world)
                    .map(|r| {
                        samples[r] as f64 * f64::from(gradient(r + 2, 0, k, len(spec)).unwrap()[i])
                    })
                    .sum::<f64>()
                    / total;
                let got = f64::from(got);
                assert!(
                    (got - want).abs() <= 8.0 * f64::from(f32::EPSILON) * (want.abs() + 0.2),
                    "parameter {k}[{i}]: {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn broadcast_copies_the_roots_parameters() {
    let results = local::run(4, |comm| {
        let rank = comm.rank() as f32;
        let sync = GradSync::new(comm, specs(), config(StrategyConfig::Dense))?;
        let mut a = vec![rank; 15];
        let mut b = vec![rank + 10.0; 7];
        sync.broadcast(&mut [&mut a[..], &mut b[..]], 2)?;
        Ok::<_, OptimError>((a, b))
    })
    .unwrap();
    for r in results {
        assert_eq!(r.unwrap(), (vec![2.0; 15], vec![12.0; 7]));
    }
}

#[test]
fn a_bad_call_on_one_rank_fails_the_step_everywhere_and_the_next_works() {
    let results = local::run(3, |comm| {
        let rank = comm.rank();
        let mut sync = GradSync::new(comm, specs(), config(StrategyConfig::Dense))?;
        let mut outcomes = Vec::new();
        for step in 0..3 {
            let mut out: Vec<Vec<f32>> = specs().iter().map(|s| vec![0.0; len(s)]).collect();
            for (k, spec) in specs().iter().enumerate() {
                let mut g = gradient(rank, step, k, len(spec)).unwrap_or(vec![0.0; len(spec)]);
                if step == 1 && rank == 2 && k == 1 {
                    g.push(1.0); // a wrong length
                }
                let _ = sync.push(k, &g);
            }
            let mut views: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            outcomes.push(match sync.finish(&mut views) {
                Ok(_) => None,
                Err(OptimError::Fault(f)) => Some((f.rank, f.kind)),
                Err(e) => panic!("{e}"),
            });
        }
        Ok::<_, OptimError>(outcomes)
    })
    .unwrap();
    for r in results {
        assert_eq!(
            r.unwrap(),
            vec![None, Some((Some(2), FaultKind::InvalidArgument)), None]
        );
    }
}

/// Every strategy of the registry runs through GradSync, in its training
/// loop; only `Custom` without the strategy it names is refused.
#[test]
fn every_registry_strategy_builds_and_custom_needs_its_strategy() {
    let one = || LocalComm::create(1).unwrap().pop().unwrap();
    for mode in StrategyConfig::examples() {
        let built = GradSync::new(one(), specs(), config(mode));
        assert_eq!(
            built.map(|sync| sync.training_loop()).ok(),
            Some(mode.training_loop()),
            "{mode}"
        );
    }
    // A user's strategy without a strategy (AdaSum's strategies, `AdaSum`
    // and `DeltaWeight`, are prepared by the engine).
    let custom = GradSync::new(one(), specs(), config(StrategyConfig::Custom)).err();
    assert!(
        matches!(custom, Some(OptimError::InvalidArgument(_))),
        "{custom:?}"
    );
}

/// One failure has one kind at every layer: the communicator's error, the
/// strategy's that wraps it and DistOpt's that wraps that say the same.
#[test]
fn an_error_keeps_its_kind_through_every_layer() {
    use gradwire_algos::AlgoError;
    use gradwire_comm::{CommError, Fault};
    use gradwire_tensor::ErrorKind;
    let cases = [
        (
            CommError::PeerLost {
                op: "all_reduce",
                ranks: vec![2],
            },
            ErrorKind::PeerLost,
        ),
        (CommError::lane_lost(1), ErrorKind::PeerLost),
        (
            CommError::Fault(Fault::posted(1, FaultKind::NonFinite)),
            ErrorKind::Fault,
        ),
        (
            CommError::Timeout {
                op: "barrier",
                waited: std::time::Duration::from_secs(1),
                missing: vec![0],
            },
            ErrorKind::Timeout,
        ),
        (
            CommError::Mismatch {
                detail: "lengths".into(),
            },
            ErrorKind::Mismatch,
        ),
        (
            CommError::InvalidArgument("root".into()),
            ErrorKind::InvalidArgument,
        ),
    ];
    for (comm, kind) in cases {
        assert_eq!(comm.kind(), kind, "{comm}");
        let algo = AlgoError::from(comm.clone());
        assert_eq!(algo.kind(), kind, "{algo}");
        assert_eq!(OptimError::from(algo).kind(), kind, "{comm}");
        assert_eq!(OptimError::from(comm).kind(), kind);
    }
    let non_finite = gradwire_compress::select::top_k(&[f32::NAN, 1.0], 0.5).unwrap_err();
    assert_eq!(OptimError::from(non_finite).kind(), ErrorKind::NonFinite);
    let strategy = "topk:2".parse::<StrategyConfig>().unwrap_err();
    assert_eq!(
        OptimError::from(strategy).kind(),
        ErrorKind::InvalidArgument
    );
    let corrupt = gradwire_optim::checkpoint::from_bytes(b"not a checkpoint").unwrap_err();
    assert_eq!(corrupt.kind(), ErrorKind::Corrupt);
}

#[test]
fn a_departed_rank_is_peer_lost_on_the_others() {
    use gradwire_tensor::ErrorKind;
    let results = local::run(3, |comm: LocalComm| -> Result<()> {
        let rank = comm.rank();
        let mut sync = GradSync::new(comm, specs(), config(StrategyConfig::Dense))?;
        if rank == 2 {
            // Leaves before the step: its communicator is dropped.
            return Ok(());
        }
        for (k, spec) in specs().iter().enumerate() {
            // A push may already see the departure; finish reports it.
            let _ = sync.push(k, &vec![0.5; len(spec)]);
        }
        let mut out: Vec<Vec<f32>> = specs().iter().map(|s| vec![0.0; len(s)]).collect();
        let mut views: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
        let err = sync.finish(&mut views).expect_err("a peer left");
        assert_eq!(err.kind(), ErrorKind::PeerLost, "{err}");
        Ok(())
    })
    .unwrap();
    for r in results {
        r.unwrap();
    }
}

/// Every core crate's error converts into `OptimError` with `?`, keeping
/// what it says.
#[test]
fn every_layers_error_converts_into_optim_error() {
    fn comm() -> Result<(), OptimError> {
        Err(gradwire_comm::CommError::InvalidArgument(
            "comm says no".into(),
        ))?
    }
    fn compress() -> Result<(), OptimError> {
        gradwire_compress::select::top_k(&[1.0, 2.0], 2.0)?;
        Ok(())
    }
    fn tensor() -> Result<(), OptimError> {
        Tensor::from_vec(vec![1f32; 3], vec![2])?;
        Ok(())
    }
    assert!(comm().unwrap_err().to_string().contains("comm says no"));
    assert!(matches!(compress(), Err(OptimError::Distributed(_))));
    assert!(matches!(tensor(), Err(OptimError::Tensor(_))));
}

/// A framework's own error on one rank (`fail_step`, e.g. a gradient it
/// could not convert) fails the step on every rank, naming that rank, and
/// the next step works.
#[test]
fn a_failed_hand_over_on_one_rank_fails_the_step_on_every_rank() {
    for world in 1..=4 {
        let out = local::run(world, |comm| {
            let rank = comm.rank();
            let mut sync = GradSync::new(comm, specs(), config(StrategyConfig::Dense))?;
            let mut run = |fail: bool| {
                for (i, spec) in specs().iter().enumerate() {
                    sync.push(i, &vec![1f32 + rank as f32; len(spec)])?;
                }
                if fail && rank == world - 1 {
                    sync.fail_step(&"the gradient could not be converted");
                }
                let mut bufs: Vec<Vec<f32>> = specs().iter().map(|s| vec![0f32; len(s)]).collect();
                let mut out: Vec<&mut [f32]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
                sync.finish(&mut out).map(|_| bufs)
            };
            let failed = run(true).err();
            let next = run(false)?;
            Ok::<_, OptimError>((failed, next))
        })
        .unwrap();
        for r in out {
            let (failed, next) = r.unwrap();
            assert!(
                matches!(
                    failed,
                    Some(OptimError::Fault(gradwire_comm::Fault {
                        rank: Some(r),
                        kind: FaultKind::InvalidArgument,
                        ..
                    })) if r == world - 1
                ),
                "W = {world}: {failed:?}"
            );
            let mean = (1..=world).sum::<usize>() as f32 / world as f32;
            assert!(next.iter().flatten().all(|&v| v == mean), "W = {world}");
        }
    }
}

/// `combines_to_identity` holds exactly where the combination is the
/// gradient itself (one rank, dense, no clipping, no accumulation, weight
/// 1), and there the combined gradients are bitwise the pushed ones for
/// any bits a finite gradient holds (-0.0, subnormals, the extremes), so a
/// front end may keep the framework's own.
#[test]
fn a_lone_dense_rank_combines_to_its_own_gradients_bitwise() {
    let specs = vec![ParamSpec::new("a", [7]), ParamSpec::new("b", [1])];
    let values = [
        vec![
            -0.0f32,
            0.0,
            f32::MIN_POSITIVE / 4.0,
            -f32::MAX,
            f32::MAX,
            1e-30,
            -3.5,
        ],
        vec![0.1f32],
    ];
    let lone = |config: DistOptConfig, samples: Option<u64>| {
        let comm = LocalComm::create(1).unwrap().pop().unwrap();
        let mut sync = GradSync::new(comm, specs.clone(), config).unwrap();
        if let Some(n) = samples {
            sync.set_samples(n).unwrap();
        }
        for (k, v) in values.iter().enumerate() {
            sync.push(k, v).unwrap();
        }
        let identity = sync.combines_to_identity();
        let mut out = vec![vec![1.0f32; 7], vec![1.0f32]];
        let mut views: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
        // (fp16 overflows on f32::MAX: only the identity's step must pass.)
        let done = sync.finish(&mut views).map(drop);
        (identity, out, done)
    };
    for samples in [None, Some(3)] {
        let (identity, out, done) = lone(config(StrategyConfig::Dense), samples);
        assert!(identity, "samples {samples:?}");
        done.unwrap();
        for (got, want) in out.iter().zip(&values) {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got), bits(want), "samples {samples:?}");
        }
    }
    let fp16 = StrategyConfig::Half {
        precision: HalfPrecision::F16,
        clip: None,
    };
    let clipped = DistOptConfig {
        clip_global_norm: Some(1.0),
        ..config(StrategyConfig::Dense)
    };
    for (what, c) in [("fp16", config(fp16)), ("clipping", clipped)] {
        assert!(!lone(c, None).0, "{what} is not the identity");
    }
    let accumulating = DistOptConfig {
        accumulate: 2,
        ..config(StrategyConfig::Dense)
    };
    let comm = LocalComm::create(1).unwrap().pop().unwrap();
    let sync = GradSync::new(comm, specs.clone(), accumulating).unwrap();
    assert!(
        !sync.combines_to_identity(),
        "a mean of micro-batches is not the identity"
    );
    let pairs = local::run(2, |comm| {
        let sync = GradSync::new(comm, specs.clone(), config(StrategyConfig::Dense))?;
        Ok::<_, OptimError>(sync.combines_to_identity())
    })
    .unwrap();
    for identity in pairs {
        assert!(!identity.unwrap(), "two ranks' mean is not the identity");
    }
}
