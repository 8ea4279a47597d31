//! Streaming DiLoCo against an f64 reference written from the paper's rules
//! (Douillard et al., 2025, as the project's specification states them),
//! not from the code: F
//! fragments synchronised one every H / F inner steps, merged τ steps after
//! they leave with `θ_local = α θ_local + (1 - α) θ_global`; its failure
//! model, its checkpoints with a fragment between its exchange and its
//! merge, and its settings.

use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_optim::{DiLoCoConfig, DistOptConfig, LocalSteps, OptimError, StrategyConfig};

use crate::common::{BATCH, BLOCKS, initial, specs};
use crate::diloco::{
    INNER_LR, checkpoint_and_resume, flat, gradient64, inner_sgd, outcome, run_with, step, tensors,
};

const LR: f64 = 0.7;
const MU: f64 = 0.9;

fn streaming(h: u32, fragments: u32, delay: u32, alpha: f32) -> StrategyConfig {
    StrategyConfig::DiLoCo(DiLoCoConfig {
        sync_every: h,
        fragments,
        delay,
        alpha,
        ..DiLoCoConfig::DEFAULT
    })
}

/// Every tensor its own bucket (fusion threshold 0): the buckets follow
/// the fragments.
fn config(strategy: StrategyConfig) -> DistOptConfig {
    DistOptConfig {
        strategy,
        fusion_threshold: 0,
        ..DistOptConfig::default()
    }
}

/// The fragment of each entry of the flat model (blocks in `BLOCKS` order):
/// the declared tensors (`specs` declares the blocks last first) cut into
/// F contiguous runs, each ending where the running count of entries first
/// reaches its share `(k + 1) / F` of the total (or where the later
/// fragments need every tensor left).
fn fragment_of_entries(fragments: usize) -> Vec<usize> {
    let n = BLOCKS.len();
    let declared: Vec<usize> = (0..n).map(|i| BLOCKS[n - 1 - i]).collect();
    let total: usize = declared.iter().sum();
    let mut of_declared = vec![0; n];
    let (mut k, mut running) = (0, 0);
    for (i, &len) in declared.iter().enumerate() {
        of_declared[i] = k;
        running += len;
        let last = k + 1 == fragments;
        if !last && (n - (i + 1) == fragments - (k + 1) || running * fragments >= total * (k + 1)) {
            k += 1;
        }
    }
    BLOCKS
        .iter()
        .enumerate()
        .flat_map(|(b, &len)| std::iter::repeat_n(of_declared[n - 1 - b], len))
        .collect()
}

/// The reference: every rank's flat parameters after each of `steps`
/// inner steps of plain SGD: `warmup` steps each followed by every rank
/// taking the mean of the parameters (`θ_global -= mean Δ`), then the
/// fragments' exchanges and merges as the paper has them, counted from
/// the warm-up's end, with an outer SGD with Nesterov momentum.
fn reference(
    world: usize,
    warmup: usize,
    (h, fragments, delay, alpha): (usize, usize, usize, f64),
    steps: usize,
) -> Vec<Vec<Vec<f64>>> {
    let of = fragment_of_entries(fragments);
    let mut global: Vec<f64> = initial().into_iter().flatten().map(f64::from).collect();
    let d = global.len();
    let mut momentum = vec![0.0; d];
    let mut w: Vec<Vec<f64>> = vec![global.clone(); world];
    let shard = BATCH / world;
    let stride = h / fragments;
    // (fragment, merge at, mean pseudo-gradient)
    let mut pending: Option<(usize, usize, Vec<f64>)> = None;
    let mut out = Vec::new();
    for step in 1..=steps {
        for (rank, w) in w.iter_mut().enumerate() {
            let g = gradient64(w, rank * shard..(rank + 1) * shard);
            for (wj, gj) in w.iter_mut().zip(g) {
                *wj -= INNER_LR * gj;
            }
        }
        if step <= warmup {
            for j in 0..d {
                global[j] -= w.iter().map(|w| global[j] - w[j]).sum::<f64>() / world as f64;
            }
            for w in w.iter_mut() {
                w.copy_from_slice(&global);
            }
            out.push(w.clone());
            continue;
        }
        let t = step - warmup;
        let merge = |(p, _, delta): (usize, usize, Vec<f64>),
                     global: &mut [f64],
                     momentum: &mut [f64],
                     w: &mut [Vec<f64>]| {
            for j in (0..d).filter(|&j| of[j] == p) {
                momentum[j] = MU * momentum[j] + delta[j];
                global[j] -= LR * (delta[j] + MU * momentum[j]);
                for w in w.iter_mut() {
                    w[j] = alpha * w[j] + (1.0 - alpha) * global[j];
                }
            }
        };
        if delay > 0 && pending.as_ref().is_some_and(|m| m.1 == t) {
            merge(pending.take().unwrap(), &mut global, &mut momentum, &mut w);
        }
        if t.is_multiple_of(stride) {
            let p = (t / stride) % fragments;
            let mut delta = vec![0.0; d];
            for j in (0..d).filter(|&j| of[j] == p) {
                delta[j] = w.iter().map(|w| global[j] - w[j]).sum::<f64>() / world as f64;
            }
            pending = Some((p, t + delay, delta));
            if delay == 0 {
                merge(pending.take().unwrap(), &mut global, &mut momentum, &mut w);
            }
        }
        out.push(w.clone());
    }
    out
}

/// Every rank's flat parameters after each of `steps` steps.
fn run(world: usize, strategy: StrategyConfig, steps: usize) -> Vec<Vec<Vec<f32>>> {
    run_with(world, config(strategy), steps)
}

#[test]
fn streaming_follows_the_papers_rules_for_2_to_4_fragments_and_delays_0_to_2() {
    follows_the_reference(0);
}

#[test]
fn a_warm_up_of_one_step_rounds_then_the_papers_rules() {
    follows_the_reference(3);
}

/// `warmup` rounds of one step (every fragment at once), then Streaming
/// DiLoCo at several settings on 1 to 3 ranks, against [`reference`].
fn follows_the_reference(warmup: usize) {
    let settings = [
        (4, 2, 0, 0.0),
        (4, 2, 1, 0.0),
        (6, 3, 1, 0.5),
        (8, 4, 1, 0.0),
        (8, 2, 2, 0.25),
        (12, 4, 2, 0.5),
    ];
    for (h, f, tau, alpha) in settings {
        for world in 1..=3 {
            let what = format!(
                "warm-up {warmup}, H = {h}, F = {f}, tau = {tau}, alpha = {alpha}, W = {world}"
            );
            let steps = warmup + 2 * h + tau + 1;
            let want = reference(world, warmup, (h, f, tau, f64::from(alpha)), steps);
            let strategy = match streaming(h as u32, f as u32, tau as u32, alpha) {
                StrategyConfig::DiLoCo(config) => StrategyConfig::DiLoCo(DiLoCoConfig {
                    warmup: warmup as u32,
                    ..config
                }),
                other => other,
            };
            let got = run(world, strategy, steps);
            let of = fragment_of_entries(f);
            for t in 0..steps {
                let scale = want[t][0].iter().fold(1.0f64, |m, v| m.max(v.abs()));
                // f32 arithmetic over t inner steps and their merges.
                let tol = 2e-5 * scale * (t + 1) as f64;
                for rank in 0..world {
                    for (j, (g, w)) in got[rank][t].iter().zip(&want[t][rank]).enumerate() {
                        assert!(
                            (f64::from(*g) - w).abs() <= tol,
                            "{what}, step {t}, rank {rank}, entry {j}: {g} against {w}"
                        );
                    }
                }
                // A warm-up step leaves every rank at the mean, and a
                // fragment merged with the global values alone is the same
                // bits on every rank.
                let same: Option<Option<usize>> = match t.checked_sub(warmup) {
                    None => Some(None),
                    Some(s) => {
                        let merged = s + 1 > tau && (s + 1 - tau) % (h / f) == 0;
                        (merged && alpha == 0.0).then(|| Some(((s + 1 - tau) / (h / f)) % f))
                    }
                };
                if let Some(fragment) = same {
                    for rank in 1..world {
                        for j in (0..of.len()).filter(|&j| fragment.is_none_or(|p| of[j] == p)) {
                            assert_eq!(
                                got[rank][t][j].to_bits(),
                                got[0][t][j].to_bits(),
                                "{what}, step {t}, rank {rank}, entry {j}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Rank 1's gradient holds a NaN at an inner step (index 2): that rank
/// takes no more local updates, and the next fragment to leave (fragment
/// 0, after step index 3, merged after index 4 with tau = 1) carries the
/// fault. Every rank skips that merge alike (or fails alike), the fragment
/// goes back to its global values on every rank, and the exchanges after
/// it work.
#[test]
fn a_non_finite_inner_step_skips_the_next_fragment_alike() {
    let strategy = streaming(4, 2, 1, 0.0);
    let world = 3;
    let steps = 10;
    for skip in [true, false] {
        let seen: Vec<Vec<(Vec<f32>, Option<bool>)>> = local::run(world, |comm: LocalComm| {
            let rank = comm.rank();
            let dist_config = DistOptConfig {
                skip_non_finite: skip,
                ..config(strategy)
            };
            let mut dist = LocalSteps::new(inner_sgd(), comm, specs(), dist_config)?;
            let mut w = tensors(&initial().concat());
            let mut seen = Vec::new();
            for s in 0..steps {
                let what = format!("skip {skip}, rank {rank}, step {s}");
                let outcome = outcome(&mut dist, &mut w, world, rank == 1 && s == 2, &what)?;
                seen.push((flat(&w), outcome));
            }
            Ok::<_, OptimError>(seen)
        })
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
        // Merges (stride 2, tau 1): fragment 1 after index 2, 0 after 4
        // (the lost one), 1 after 6, 0 after 8.
        let of = fragment_of_entries(2);
        for rank in 0..world {
            for (s, (_, outcome)) in seen[rank].iter().enumerate() {
                let wanted = match (s, skip) {
                    (4, true) => Some(true),
                    (4, false) => None,
                    _ => Some(false),
                };
                assert_eq!(*outcome, wanted, "skip {skip}, rank {rank}, step {s}");
            }
            // After the lost merge the fragment is its global values on
            // every rank (the same bits), and so after every later merge.
            for (s, p) in [(4, 0), (6, 1), (8, 0)] {
                for j in (0..of.len()).filter(|&j| of[j] == p) {
                    assert_eq!(
                        seen[rank][s].0[j].to_bits(),
                        seen[0][s].0[j].to_bits(),
                        "skip {skip}, rank {rank}, step {s}, entry {j}"
                    );
                }
            }
        }
    }
}

/// A checkpoint taken between a fragment's exchange and its merge holds
/// the exchange's mean: the resumed run merges it as the straight one.
#[test]
fn a_fragment_between_its_exchange_and_its_merge_resumes_bitwise() {
    let strategy = streaming(6, 3, 1, 0.5);
    let world = 3;
    let straight = run(world, strategy, 12);
    for at in [2, 4, 6, 7] {
        let resumed: Vec<Vec<Vec<f32>>> = local::run(world, |comm: LocalComm| {
            let comm2 = comm.split(Some(0), comm.rank() as i64)?.expect("a member");
            let mut dist = LocalSteps::new(inner_sgd(), comm, specs(), config(strategy))?;
            let mut w = tensors(&initial().concat());
            for _ in 0..at {
                step(&mut dist, &mut w, world, false)?;
            }
            let (mut again, mut w) =
                checkpoint_and_resume(dist, &w, comm2, config(strategy), inner_sgd())?;
            let mut after = Vec::new();
            for _ in at..12 {
                step(&mut again, &mut w, world, false)?;
                after.push(flat(&w));
            }
            Ok::<_, OptimError>(after)
        })
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
        for rank in 0..world {
            assert_eq!(
                resumed[rank],
                straight[rank][at..12].to_vec(),
                "checkpoint after step {at}, rank {rank}"
            );
        }
    }
}

#[test]
fn settings_print_parse_back_and_are_checked() {
    for text in [
        "streaming-diloco:8:4:tau=1:alpha=0.5:uint8",
        "streaming-diloco:50:2",
        "streaming-diloco:6:3:tau=1:adam:lr=0.01",
    ] {
        let parsed: StrategyConfig = text.parse().unwrap();
        assert_eq!(parsed.to_string(), text);
        assert_eq!(parsed.name(), "streaming-diloco");
    }
    let default: StrategyConfig = "streaming-diloco".parse().unwrap();
    assert_eq!(default, StrategyConfig::DiLoCo(DiLoCoConfig::STREAMING));
    // One fragment, no delay, no mixing: DiLoCo itself.
    let plain: StrategyConfig = "streaming-diloco:8:1".parse().unwrap();
    assert_eq!(plain.to_string(), "diloco:8");
    for (text, why) in [
        (
            "streaming-diloco:8:3",
            "must be a positive multiple of the fragments",
        ),
        (
            "streaming-diloco:8:0",
            "must be a positive multiple of the fragments",
        ),
        ("streaming-diloco:8:2:tau=4", "must be below H / F = 4"),
        ("streaming-diloco:8:2:alpha=1.5", "alpha must be in [0, 1]"),
        ("diloco:8:2", "is not a setting of diloco"),
    ] {
        let err = text.parse::<StrategyConfig>().unwrap_err();
        assert!(err.to_string().contains(why), "{text}: {err}");
    }
    // More fragments than buckets: refused when the loop is built.
    let made = local::run(1, |comm: LocalComm| {
        let config = DistOptConfig {
            strategy: streaming(8, 8, 0, 0.0),
            ..DistOptConfig::default()
        };
        LocalSteps::new(inner_sgd(), comm, specs(), config).map(|_| ())
    })
    .unwrap();
    assert!(
        matches!(&made[0], Err(OptimError::InvalidArgument(m)) if m.contains("8 fragments need at least as many parameters, 6 are declared")),
        "{made:?}"
    );
}
