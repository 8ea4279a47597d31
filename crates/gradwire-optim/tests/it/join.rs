//! Uneven inputs through `GradSync::join` (DDP's `Join`): ranks whose
//! shards hold different numbers of steps train until each runs out, then
//! join; the others' combined gradient is the mean over the samples actually
//! seen, against an f64 reference, at W = 1..=5; every averaging strategy
//! runs while ranks have joined, the same combined gradient on every rank
//! still training; a rank joins between micro-batches; a fault on a rank
//! still training reaches the joined ones; strategies that do not average
//! refuse to join.

use crate::common::{named_specs, small_buckets};
use gradwire_comm::{Communicator, Fault, FaultKind, LocalComm, local};
use gradwire_optim::{DistOpt, GradSync, OptimError, ParamSpec, Sgd, SgdConfig, StrategyConfig};
use gradwire_tensor::{DType, Device, Tensor};

/// A length-1 vector, a prime-length vector and a matrix.
const SHAPES: &[&[usize]] = &[&[1], &[13], &[4, 7]];

fn specs() -> Vec<ParamSpec> {
    named_specs(SHAPES)
}

fn len(k: usize) -> usize {
    SHAPES[k].iter().product()
}

/// Steps rank `rank` has data for: uneven, the last rank the most.
fn steps_of(rank: usize) -> usize {
    2 + rank
}

/// Samples of rank `rank`'s micro-batch `micro` of step `step`.
fn samples(rank: usize, step: usize, micro: usize) -> u64 {
    ((rank * 3 + step * 5 + micro * 7) % 6) as u64 + 1
}

/// Rank `rank`'s mean gradient of parameter `k` on that micro-batch.
fn gradient(rank: usize, step: usize, micro: usize, k: usize) -> Vec<f32> {
    (0..len(k))
        .map(|i| (((rank * 131 + step * 17 + micro * 11 + k * 5 + i) as f32) * 0.37).sin() * 0.5)
        .collect()
}

/// The combined gradients a rank saw: per step, per parameter.
type Seen = Vec<Vec<Vec<f32>>>;

/// Rank `rank`'s run: its steps of `micro_batches` micro-batches each
/// (`stop_early`: the last step cut after its first micro-batch, then
/// join), the combined gradients it saw per step, and what `join`
/// returned.
fn run_rank(
    comm: LocalComm,
    strategy: StrategyConfig,
    micro_batches: usize,
    stop_early: bool,
) -> Result<(Seen, u64), OptimError> {
    let rank = comm.rank();
    let mut sync = GradSync::new(comm, specs(), small_buckets(strategy, micro_batches as u32))?;
    let mut seen = Vec::new();
    for step in 0..steps_of(rank) {
        let mut combined: Vec<Vec<f32>> = (0..SHAPES.len()).map(|k| vec![0.0; len(k)]).collect();
        for micro in 0..micro_batches {
            if stop_early && step + 1 == steps_of(rank) && micro == 1 {
                // Out of data between micro-batches: join with what it took.
                return Ok((seen, sync.join()?));
            }
            sync.set_samples(samples(rank, step, micro))?;
            for k in (0..SHAPES.len()).rev() {
                sync.push(k, &gradient(rank, step, micro, k))?;
            }
            let mut buffers: Vec<&mut [f32]> = combined.iter_mut().map(Vec::as_mut_slice).collect();
            sync.finish(&mut buffers)?;
        }
        seen.push(combined);
    }
    let joined = sync.join()?;
    Ok((seen, joined))
}

/// The mean over the samples the ranks still training saw at `step`
/// (with `cut`, the rank whose last step it is took only its first
/// micro-batch), in f64.
fn reference(world: usize, step: usize, micro_batches: usize, cut: bool, k: usize) -> Vec<f64> {
    let mut sum = vec![0f64; len(k)];
    let mut total = 0u64;
    for rank in (0..world).filter(|&r| steps_of(r) > step) {
        let last = step + 1 == steps_of(rank);
        let taken = if cut && last { 1 } else { micro_batches };
        for micro in 0..taken {
            let n = samples(rank, step, micro);
            total += n;
            for (s, g) in sum.iter_mut().zip(gradient(rank, step, micro, k)) {
                *s += n as f64 * f64::from(g);
            }
        }
    }
    sum.iter().map(|s| s / total as f64).collect()
}

#[test]
fn joined_ranks_leave_the_mean_to_the_samples_seen() {
    for world in 1..=5 {
        for (micro_batches, cut) in [(1, false), (2, false), (3, true)] {
            let out = local::run(world, |c| {
                run_rank(c, StrategyConfig::Dense, micro_batches, cut)
            })
            .unwrap();
            let most = steps_of(world - 1);
            for (rank, result) in out.into_iter().enumerate() {
                let at = format!("W = {world}, k = {micro_batches}, cut {cut}, rank {rank}");
                let (seen, joined) = result.unwrap_or_else(|e| panic!("{at}: {e}"));
                // It took part in the steps the others took after it
                // joined: its cut step included (finished by the others with
                // its part), none that no rank still took.
                let own = steps_of(rank) - usize::from(cut);
                assert_eq!(seen.len(), own, "{at}");
                let others_last = most - usize::from(cut);
                assert_eq!(
                    joined as usize,
                    others_last.saturating_sub(own),
                    "{at}: steps shadowed"
                );
                for (step, combined) in seen.iter().enumerate() {
                    for (k, got) in combined.iter().enumerate() {
                        let want = reference(world, step, micro_batches, cut, k);
                        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                            let bound = 1e-5 * (world * micro_batches) as f64 * (1.0 + w.abs());
                            assert!(
                                (f64::from(g) - w).abs() <= bound,
                                "{at}, step {step}, p{k}[{i}]: {g} against {w}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_averaging_strategy_runs_while_ranks_have_joined() {
    for text in [
        "fp16",
        "bf16",
        "topk:0.2",
        "sampled-topk:0.2",
        "powersgd:1",
        "uint8",
        "qsgd",
        "e3m0",
        "onebit",
    ] {
        let strategy: StrategyConfig = text.parse().unwrap();
        let world = 4;
        let out = local::run(world, |c| run_rank(c, strategy, 1, false)).unwrap();
        let runs: Vec<_> = out.into_iter().map(|r| r.unwrap()).collect();
        // At each step every rank still training saw the same combination.
        for step in 0..steps_of(world - 1) {
            let views: Vec<Vec<u32>> = runs
                .iter()
                .filter_map(|(seen, _)| seen.get(step))
                .map(|c| c.iter().flatten().map(|x| x.to_bits()).collect())
                .collect();
            assert!(
                views.windows(2).all(|w| w[0] == w[1]),
                "{text}, step {step}: ranks saw different combinations"
            );
            assert_eq!(
                views.len(),
                (0..world).filter(|&r| steps_of(r) > step).count()
            );
        }
    }
}

/// A bad gradient on a rank still training, while another has joined: the
/// step fails on every rank with that rank's fault, the joined rank's
/// `join` included; then the run goes on and the joined rank joins again.
#[test]
fn a_fault_after_a_rank_joined_reaches_it() {
    let outcomes = local::run(3, |comm: LocalComm| {
        let rank = comm.rank();
        let mut sync = GradSync::new(comm, specs(), small_buckets(StrategyConfig::Dense, 1))?;
        let mut combined: Vec<Vec<f32>> = (0..SHAPES.len()).map(|k| vec![0.0; len(k)]).collect();
        if rank == 0 {
            let first = sync.join(); // rank 1's fault, at the others' first step
            let second = sync.join()?; // the steps after it
            return Ok::<_, OptimError>((first.err(), second));
        }
        let mut fault = None;
        for step in 0..3 {
            sync.set_samples(1)?;
            for k in 0..SHAPES.len() {
                let mut g = gradient(rank, step, 0, k);
                if step == 0 && rank == 1 && k == 1 {
                    g.push(0.0); // one element too many
                }
                let _ = sync.push(k, &g);
            }
            let mut buffers: Vec<&mut [f32]> = combined.iter_mut().map(Vec::as_mut_slice).collect();
            if let Err(e) = sync.finish(&mut buffers) {
                fault.get_or_insert(e);
            }
        }
        Ok((fault, sync.join()?))
    })
    .unwrap();
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let (fault, joined) = outcome.unwrap();
        assert!(
            matches!(
                fault,
                Some(OptimError::Fault(Fault {
                    rank: Some(1),
                    kind: FaultKind::InvalidArgument,
                    ..
                }))
            ),
            "rank {rank}: {fault:?}"
        );
        // Rank 0 took part in the two steps after the failed one.
        assert_eq!(joined, if rank == 0 { 2 } else { 0 }, "rank {rank}");
    }
}

#[test]
fn strategies_that_do_not_average_refuse_to_join() {
    let comm = || LocalComm::create(1).unwrap().pop().unwrap();
    for text in ["adasum-grad", "partial", "adasum-delta", "diloco:4"] {
        let strategy: StrategyConfig = text.parse().unwrap();
        let mut sync = GradSync::new(comm(), specs(), small_buckets(strategy, 1)).unwrap();
        match sync.join() {
            Err(OptimError::InvalidArgument(m)) => assert!(m.starts_with("join:"), "{text}: {m}"),
            other => panic!("{text}: {other:?}"),
        }
    }
}

/// DistOpt's own `set_samples` and `join` (the tensor front end): ranks of
/// uneven shards train with sample weights, then join; every step's update
/// is SGD on the mean over the samples seen (against an f64 reference),
/// and the joined ranks, which apply the others' combined gradients as
/// they do, end bitwise equal to them, at W = 1..=5.
#[test]
fn distopt_joins_and_stays_a_replica() {
    const LR: f64 = 0.1;
    for world in 1..=5 {
        let out = local::run(world, |comm: LocalComm| {
            let rank = comm.rank();
            let sgd = Sgd::new(SgdConfig::default().lr(LR)).unwrap();
            let mut opt =
                DistOpt::new(sgd, comm, specs(), small_buckets(StrategyConfig::Dense, 1))?;
            let mut params: Vec<Tensor> = SHAPES
                .iter()
                .map(|d| Tensor::zeros(d.to_vec(), DType::F32, Device::Cpu).unwrap())
                .collect();
            let names: Vec<String> = specs().into_iter().map(|s| s.name).collect();
            for step in 0..steps_of(rank) {
                opt.set_samples(samples(rank, step, 0))?;
                for k in (0..SHAPES.len()).rev() {
                    let g = Tensor::from_vec(gradient(rank, step, 0, k), SHAPES[k].to_vec())?;
                    opt.push(&names[k], g)?;
                }
                opt.finish(names.iter().map(String::as_str).zip(params.iter_mut()))?;
            }
            let mut named: Vec<(&str, &mut Tensor)> = names
                .iter()
                .map(String::as_str)
                .zip(params.iter_mut())
                .collect();
            let joined = opt.join(&mut named)?;
            Ok::<_, OptimError>((params, joined))
        })
        .unwrap();
        let most = steps_of(world - 1);
        let mut want: Vec<Vec<f64>> = (0..SHAPES.len()).map(|k| vec![0.0; len(k)]).collect();
        for step in 0..most {
            for (k, w) in want.iter_mut().enumerate() {
                for (p, g) in w.iter_mut().zip(reference(world, step, 1, false, k)) {
                    *p -= LR * g;
                }
            }
        }
        let runs: Vec<(Vec<Tensor>, u64)> = out.into_iter().map(|r| r.unwrap()).collect();
        let bits = |ps: &[Tensor]| -> Vec<u32> {
            ps.iter()
                .flat_map(|t| t.to_vec::<f32>().unwrap())
                .map(f32::to_bits)
                .collect()
        };
        for (rank, (params, joined)) in runs.iter().enumerate() {
            assert_eq!(
                *joined as usize,
                most - steps_of(rank),
                "W = {world}, rank {rank}"
            );
            assert_eq!(
                bits(params),
                bits(&runs[0].0),
                "W = {world}: rank {rank} is no replica"
            );
            for (k, (got, w)) in params.iter().zip(&want).enumerate() {
                for (i, (g, w)) in got.to_vec::<f32>().unwrap().iter().zip(w).enumerate() {
                    let bound = 1e-5 * (world * most) as f64 * (1.0 + w.abs());
                    assert!(
                        (f64::from(*g) - w).abs() <= bound,
                        "W = {world}, p{k}[{i}]: {g} against {w}"
                    );
                }
            }
        }
    }
}
