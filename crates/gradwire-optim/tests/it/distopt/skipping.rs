//! DistOpt's skipping: unwritten parameters are left alone under either
//! vote without desynchronising ranks; clipping and the non-finite check
//! act on every rank alike.

use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::{
    DistOpt, DistOptConfig, OptimError, Optimizer, ParamSpec, Sgd, SgdConfig, SkipVote,
};
use gradwire_tensor::Tensor;

#[test]
fn skipping_leaves_unwritten_parameters_alone_and_never_desynchronises() {
    let per_bucket = skipping_run(SkipVote::PerBucket);
    let per_step = skipping_run(SkipVote::PerStep);
    assert_eq!(per_bucket, per_step, "the vote's timing changes nothing");
}

type SkipOutcome = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, bool, usize);

fn skipping_run(vote: SkipVote) -> SkipOutcome {
    let world = 4;
    let results = local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let specs = vec![
            ParamSpec::new("shared", vec![3]),
            ParamSpec::new("unused", vec![2]),
            ParamSpec::new("rank0only", vec![2]),
            ParamSpec::new("sometimes", vec![5]),
        ];
        let sgd = Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9).weight_decay(0.1)).unwrap();
        let config = DistOptConfig {
            fusion_threshold: 4,
            vote,
            ..DistOptConfig::default()
        };
        let mut dist = DistOpt::new(sgd, comm, specs, config)?;
        let mut shared = Tensor::from_vec(vec![1f32; 3], 3)?;
        let mut unused = Tensor::from_vec(vec![0.5f32, -0.5], 2)?;
        let mut only = Tensor::from_vec(vec![1f32; 2], 2)?;
        let mut sometimes = Tensor::from_vec(vec![1f32; 5], 5)?;
        let mut skipped = 0;
        for step in 0..10 {
            let g = |v: f32, n: usize| Some(Tensor::from_vec(vec![v; n], n).unwrap());
            // Each rank writes a different subset: never a hang.
            let stats = dist.step([
                ("shared", &mut shared, g(1.0, 3)),
                ("unused", &mut unused, None),
                (
                    "rank0only",
                    &mut only,
                    if rank == 0 { g(4.0, 2) } else { None },
                ),
                (
                    "sometimes",
                    &mut sometimes,
                    if (step + rank).is_multiple_of(3) {
                        g(2.0, 5)
                    } else {
                        None
                    },
                ),
            ])?;
            skipped += stats.skipped;
        }
        let has_state = dist.optimizer().param_state("unused").is_some();
        Ok::<_, OptimError>((
            shared.to_vec::<f32>()?,
            unused.to_vec::<f32>()?,
            only.to_vec::<f32>()?,
            sometimes.to_vec::<f32>()?,
            has_state,
            skipped,
        ))
    })
    .unwrap();
    let results: Vec<_> = results.into_iter().map(|r| r.unwrap()).collect();
    for r in &results {
        assert_eq!(r, &results[0], "ranks diverged");
    }
    let (_, unused, only, _, has_state, skipped) = &results[0];
    assert_eq!(unused, &vec![0.5, -0.5], "never written, so never decayed");
    assert!(
        !has_state,
        "no optimizer state for a parameter never updated"
    );
    assert_eq!(*skipped, 10);
    // rank0only: averaged gradient 4/4 = 1 each step, same update as "shared".
    assert_eq!(only, &results[0].0[..2].to_vec());
    results.into_iter().next().unwrap()
}

#[test]
fn clipping_and_the_non_finite_check_act_on_every_rank_alike() {
    let results = local::run(2, |comm: LocalComm| {
        let rank = comm.rank();
        let config = DistOptConfig {
            clip_global_norm: Some(1.0),
            skip_non_finite: true,
            ..DistOptConfig::default()
        };
        let mut dist = DistOpt::new(
            Sgd::new(SgdConfig::default().lr(1.0)).unwrap(),
            comm,
            vec![ParamSpec::new("p", vec![2])],
            config,
        )?;
        let mut p = Tensor::from_vec(vec![0f32, 0.0], 2)?;
        // Averaged gradient (3, 4): norm 5, clipped to (0.6, 0.8).
        dist.step([(
            "p",
            &mut p,
            Some(Tensor::from_vec(
                vec![3f32 * 2.0 * rank as f32, 4.0 * 2.0 * rank as f32],
                2,
            )?),
        )])?;
        let after_clip = p.to_vec::<f32>()?;
        let bad = if rank == 1 { f32::NAN } else { 1.0 };
        let stats = dist.step([("p", &mut p, Some(Tensor::from_vec(vec![bad, 1.0], 2)?))])?;
        Ok::<_, OptimError>((after_clip, stats.non_finite, p.to_vec::<f32>()?))
    })
    .unwrap();
    for r in results {
        let (after_clip, non_finite, after_nan) = r.unwrap();
        assert!(
            (after_clip[0] + 0.6).abs() < 1e-6 && (after_clip[1] + 0.8).abs() < 1e-6,
            "{after_clip:?}"
        );
        assert!(non_finite);
        assert_eq!(
            after_nan, after_clip,
            "the non-finite step is skipped everywhere"
        );
    }
}
