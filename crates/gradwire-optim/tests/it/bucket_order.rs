//! Buckets in push order (`BucketOrder::Pushed`, PyTorch DDP's rebuilt
//! buckets): after the first step every rank's buckets follow rank 0's push
//! order whatever order each rank pushed in; the run is bitwise the run
//! that declared the parameters in that order; an order equal to the
//! declared one changes nothing; a checkpoint keeps the order and resumes
//! bitwise, here with top-k's error feedback in the buckets.

use crate::common::small_buckets;
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::checkpoint::Checkpoint;
use gradwire_optim::{BucketOrder, DistOpt, OptimError, ParamSpec, Sgd, SgdConfig, StrategyConfig};
use gradwire_tensor::{DType, Device, Tensor};

const SHAPES: &[(&str, &[usize])] = &[
    ("p0", &[1]),
    ("p1", &[13]),
    ("p2", &[4, 7]),
    ("p3", &[5]),
    ("p4", &[3, 3]),
];

fn spec(k: usize) -> ParamSpec {
    ParamSpec::new(SHAPES[k].0, SHAPES[k].1.to_vec())
}

fn len(k: usize) -> usize {
    SHAPES[k].1.iter().product()
}

/// Rank `rank`'s push order: a rotation of the reversed declaration.
fn push_order(rank: usize) -> Vec<usize> {
    let n = SHAPES.len();
    (0..n).map(|j| (n - 1 - j + 2 * rank) % n).collect()
}

fn gradient(rank: usize, step: usize, k: usize) -> Tensor {
    let v = (0..len(k))
        .map(|i| (((rank * 37 + step * 11 + k * 5 + i) as f32) * 0.61).sin())
        .collect();
    Tensor::from_vec(v, SHAPES[k].1.to_vec()).unwrap()
}

/// A run: parameters declared in `declared` order, pushed in each rank's
/// `pushes(rank)` order, `steps` steps from `from` (a checkpoint to restore
/// first); every rank's parameters by declaration index (bits), its bucket
/// order after the run, and its last checkpoint.
type Run = (Vec<Vec<u32>>, Vec<String>, Checkpoint);

/// A rank's parameters (bits) and checkpoint to go on from.
type Saved = (Vec<Vec<u32>>, Checkpoint);

fn run(
    world: usize,
    strategy: StrategyConfig,
    order: BucketOrder,
    declared: &[usize],
    pushes: impl Fn(usize) -> Vec<usize> + Sync,
    steps: std::ops::Range<usize>,
    from: Option<&[Saved]>,
) -> Vec<Run> {
    local::run(world, |comm: LocalComm| {
        let rank = comm.rank();
        let config = gradwire_optim::DistOptConfig {
            bucket_order: order,
            ..small_buckets(strategy, 1)
        };
        let sgd = Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9))?;
        let specs = declared.iter().map(|&k| spec(k)).collect();
        let mut opt = DistOpt::new(sgd, comm, specs, config)?;
        let mut params: Vec<Tensor> = (0..SHAPES.len())
            .map(|k| Tensor::zeros(SHAPES[k].1.to_vec(), DType::F32, Device::Cpu).unwrap())
            .collect();
        if let Some(saved) = from {
            let (bits, ckpt) = &saved[rank];
            for (p, b) in params.iter_mut().zip(bits) {
                let v: Vec<f32> = b.iter().map(|&x| f32::from_bits(x)).collect();
                p.as_mut_slice::<f32>()?.copy_from_slice(&v);
            }
            opt.restore(ckpt)?;
        }
        for step in steps.clone() {
            for k in pushes(rank) {
                opt.push(SHAPES[k].0, gradient(rank, step, k))?;
            }
            let names = SHAPES.iter().map(|(name, _)| *name);
            opt.finish(names.zip(params.iter_mut()))?;
        }
        let bits = params
            .iter()
            .map(|p| {
                p.to_vec::<f32>()
                    .unwrap()
                    .into_iter()
                    .map(f32::to_bits)
                    .collect()
            })
            .collect();
        let order = opt.bucket_order().into_iter().map(str::to_string).collect();
        Ok::<Run, OptimError>((bits, order, opt.checkpoint()?))
    })
    .unwrap()
    .into_iter()
    .map(Result::unwrap)
    .collect()
}

/// [`run`] of `strategy`, declared in order, each rank pushing in
/// [`push_order`].
fn pushed(
    world: usize,
    strategy: StrategyConfig,
    steps: std::ops::Range<usize>,
    from: Option<&[Saved]>,
) -> Vec<Run> {
    let declared: Vec<usize> = (0..SHAPES.len()).collect();
    run(
        world,
        strategy,
        BucketOrder::Pushed,
        &declared,
        push_order,
        steps,
        from,
    )
}

fn names(order: &[usize]) -> Vec<String> {
    order.iter().map(|&k| SHAPES[k].0.to_string()).collect()
}

#[test]
fn buckets_follow_rank_zeros_push_order_on_every_rank() {
    for strategy in [StrategyConfig::Dense, "topk:0.3".parse().unwrap()] {
        for world in 1..=4 {
            let runs = pushed(world, strategy, 0..3, None);
            // The same buckets everywhere: rank 0's order.
            for (rank, (bits, order, _)) in runs.iter().enumerate() {
                assert_eq!(
                    order,
                    &names(&push_order(0)),
                    "{strategy}, W = {world}, rank {rank}"
                );
                assert_eq!(
                    bits, &runs[0].0,
                    "{strategy}, W = {world}: rank {rank} differs"
                );
            }
            // Bitwise the run that declared them in that order.
            let fixed = run(
                world,
                strategy,
                BucketOrder::Declared,
                &push_order(0),
                |_| push_order(0),
                0..3,
                None,
            );
            assert_eq!(runs[0].0, fixed[0].0, "{strategy}, W = {world}");
        }
    }
}

#[test]
fn the_declared_order_pushed_changes_nothing() {
    let declared: Vec<usize> = (0..SHAPES.len()).collect();
    let strategy: StrategyConfig = "topk:0.3".parse().unwrap();
    let in_order = |_| (0..SHAPES.len()).collect::<Vec<_>>();
    let pushed = run(
        3,
        strategy,
        BucketOrder::Pushed,
        &declared,
        in_order,
        0..3,
        None,
    );
    let fixed = run(
        3,
        strategy,
        BucketOrder::Declared,
        &declared,
        in_order,
        0..3,
        None,
    );
    assert_eq!(pushed[0].0, fixed[0].0);
    assert_eq!(pushed[0].1, names(&declared));
    // A declared order fixed by the user stays, whatever the pushes.
    let kept = run(
        3,
        strategy,
        BucketOrder::Declared,
        &declared,
        push_order,
        0..3,
        None,
    );
    assert_eq!(kept[0].1, names(&declared));
}

#[test]
fn a_checkpoint_keeps_the_order_and_resumes_bitwise() {
    let strategy: StrategyConfig = "topk:0.3".parse().unwrap();
    let world = 3;
    let straight = pushed(world, strategy, 0..4, None);
    let first = pushed(world, strategy, 0..2, None);
    let saved: Vec<_> = first
        .into_iter()
        .map(|(bits, _, ckpt)| (bits, ckpt))
        .collect();
    let resumed = pushed(world, strategy, 2..4, Some(&saved));
    for (rank, (a, b)) in straight.iter().zip(&resumed).enumerate() {
        assert_eq!(a.0, b.0, "rank {rank}: the resumed run differs");
        assert_eq!(b.1, names(&push_order(0)));
    }
}

/// A checkpoint taken before any step decided the order: the resumed run
/// decides at its first step, as the straight run did (once, the restore
/// fixed the declared order).
#[test]
fn a_checkpoint_before_the_order_is_decided_resumes_bitwise() {
    let strategy: StrategyConfig = "topk:0.3".parse().unwrap();
    for world in 1..=3 {
        let straight = pushed(world, strategy, 0..3, None);
        let saved: Vec<_> = pushed(world, strategy, 0..0, None)
            .into_iter()
            .map(|(bits, _, ckpt)| (bits, ckpt))
            .collect();
        let resumed = pushed(world, strategy, 0..3, Some(&saved));
        for (rank, (a, b)) in straight.iter().zip(&resumed).enumerate() {
            assert_eq!(b.1, names(&push_order(0)), "W = {world}, rank {rank}");
            assert_eq!(
                a.0, b.0,
                "W = {world}, rank {rank}: the resumed run differs"
            );
        }
    }
}

/// At another world size: the new ranks take up the saved order with the
/// resharded state, and train on alike.
#[test]
fn a_resharded_checkpoint_keeps_the_order() {
    let declared: Vec<usize> = (0..SHAPES.len()).collect();
    let strategy: StrategyConfig = "topk:0.3".parse().unwrap();
    let first = pushed(3, strategy, 0..2, None);
    let saved: Vec<Checkpoint> = first.iter().map(|(_, _, c)| c.clone()).collect();
    let out = local::run(2, |comm: LocalComm| {
        let rank = comm.rank();
        let sgd = Sgd::new(SgdConfig::default().lr(0.1).momentum(0.9))?;
        let specs = declared.iter().map(|&k| spec(k)).collect();
        let mut opt = DistOpt::new(sgd, comm, specs, small_buckets(strategy, 1))?;
        let ckpt = opt.resharded(&saved)?;
        opt.restore(&ckpt)?;
        let order: Vec<String> = opt.bucket_order().into_iter().map(str::to_string).collect();
        let mut params: Vec<Tensor> = (0..SHAPES.len())
            .map(|k| Tensor::zeros(SHAPES[k].1.to_vec(), DType::F32, Device::Cpu).unwrap())
            .collect();
        for k in push_order(rank) {
            opt.push(SHAPES[k].0, gradient(rank, 2, k))?;
        }
        opt.finish(SHAPES.iter().map(|(name, _)| *name).zip(params.iter_mut()))?;
        let bits: Vec<u32> = params
            .iter()
            .flat_map(|p| p.to_vec::<f32>().unwrap())
            .map(f32::to_bits)
            .collect();
        Ok::<_, OptimError>((order, bits))
    })
    .unwrap();
    let out: Vec<_> = out.into_iter().map(Result::unwrap).collect();
    for (order, bits) in &out {
        assert_eq!(order, &names(&push_order(0)));
        assert_eq!(bits, &out[0].1);
    }
}

/// A checkpoint whose buckets follow rank 0's push order does not restore
/// into a front end whose order is fixed otherwise (the declared one): a
/// `StateMismatch`, and the front end trains on as it was.
#[test]
fn another_order_is_a_state_mismatch() {
    let strategy: StrategyConfig = "topk:0.3".parse().unwrap();
    let saved: Vec<Checkpoint> = pushed(2, strategy, 0..1, None)
        .into_iter()
        .map(|(_, _, c)| c)
        .collect();
    let out = local::run(2, |comm: LocalComm| {
        let rank = comm.rank();
        let config = gradwire_optim::DistOptConfig {
            bucket_order: BucketOrder::Declared,
            ..small_buckets(strategy, 1)
        };
        let sgd = Sgd::new(SgdConfig::default().lr(0.1))?;
        let specs = (0..SHAPES.len()).map(spec).collect();
        let mut opt = DistOpt::new(sgd, comm, specs, config)?;
        let refused = opt.restore(&saved[rank]);
        let mut params: Vec<Tensor> = (0..SHAPES.len())
            .map(|k| Tensor::zeros(SHAPES[k].1.to_vec(), DType::F32, Device::Cpu).unwrap())
            .collect();
        for k in push_order(rank) {
            opt.push(SHAPES[k].0, gradient(rank, 0, k))?;
        }
        opt.finish(SHAPES.iter().map(|(name, _)| *name).zip(params.iter_mut()))?;
        let order: Vec<String> = opt.bucket_order().into_iter().map(str::to_string).collect();
        Ok::<_, OptimError>((refused, order))
    })
    .unwrap();
    for result in out {
        let (refused, order) = result.unwrap();
        assert!(
            matches!(refused, Err(OptimError::StateMismatch(ref m)) if m.contains("another parameter order")),
            "{refused:?}"
        );
        assert_eq!(order, names(&(0..SHAPES.len()).collect::<Vec<_>>()));
    }
}
