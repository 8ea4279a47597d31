//! The collectives of the training loops that are not "combine every
//! bucket's gradient every step": DimReduce's step, DiLoCo's rounds and
//! Streaming DiLoCo's fragments, partial averaging, delta weight. Each
//! follows its loop in gradwire-optim's `distopt/` (`dimreduce.rs`,
//! `outer.rs` and `streaming.rs`, `partial.rs`, `delta_weight.rs`), with
//! [`Bucket::calls`] for what a bucket's codec sends inside it.

use super::collectives::{Collective, CollectiveCall};
use super::fragments::fragment_ranges;
use super::strategies::{Bucket, Bucketing, StrategySpec, plan_buckets};
use crate::error::{AlgoError, Result};
use crate::handle::Traffic;
use gradwire_comm::chunk_range;

/// `strategy`'s calls for one step when it is a loop of its own (`None`
/// for a per-bucket gradient strategy), for parameters of element counts
/// `lens` and `shapes` on `world` ranks.
pub(super) fn loop_collectives(
    strategy: &StrategySpec,
    lens: &[usize],
    shapes: &[Vec<usize>],
    world: usize,
    bucketing: &Bucketing,
) -> Result<Option<Vec<CollectiveCall>>> {
    let mut calls = Vec::new();
    match strategy {
        &StrategySpec::DimReduce { components, trials } => {
            let m = lens
                .iter()
                .try_fold(0usize, |sum, &n| sum.checked_add(n))
                .ok_or_else(|| AlgoError::InvalidArgument("the model overflows usize".into()))?;
            dimreduce(&mut calls, m, components, trials, world);
        }
        StrategySpec::Outer {
            sync_every,
            fragments,
            delay,
            codec,
        } => outer(
            &mut calls,
            (*sync_every, *fragments, *delay),
            codec,
            lens,
            shapes,
            world,
            bucketing,
        )?,
        &StrategySpec::Partial { state_buffers } => {
            // The agreement that opens the local step.
            calls.push(CollectiveCall::new(Collective::Barrier, world, 0));
            let buckets = plan_buckets(lens, bucketing.fusion_threshold, bucketing.capacity)?;
            let k = buckets.len() as u64;
            for (b, range) in buckets.into_iter().enumerate() {
                let n: usize = lens[range].iter().sum();
                let mut averaged = vec![CollectiveCall::all_reduce(4 * n, world)];
                if state_buffers > 0 {
                    averaged.push(CollectiveCall::all_reduce(4 * n * state_buffers, world));
                }
                calls.extend(averaged.into_iter().map(|c| {
                    c.once_every(k)
                        .in_exchange(b as u32, 0)
                        .first_counted_at(b as u64)
                }));
            }
        }
        StrategySpec::DeltaWeight { codec } => {
            calls.push(CollectiveCall::new(Collective::Barrier, world, 0));
            for range in plan_buckets(lens, bucketing.fusion_threshold, bucketing.capacity)? {
                Bucket::of(range, lens, shapes, world).calls(codec, &mut calls)?;
            }
        }
        _ => return Ok(None),
    }
    Ok(Some(calls))
}

/// DiLoCo's round, or Streaming DiLoCo's fragments: the buckets planned
/// inside each fragment, as the engine plans them; fragment `k`'s calls
/// once every `H` steps, counted at its merge: `τ` steps after inner step
/// `k H / F` (counting from 1; `H` for fragment 0).
fn outer(
    calls: &mut Vec<CollectiveCall>,
    (sync_every, fragments, delay): (u32, u32, u32),
    codec: &StrategySpec,
    lens: &[usize],
    shapes: &[Vec<usize>],
    world: usize,
    bucketing: &Bucketing,
) -> Result<()> {
    let h = u64::from(sync_every);
    let stride = h / u64::from(fragments.max(1));
    let cuts = fragment_ranges(lens, fragments as usize).ok_or_else(|| {
        AlgoError::InvalidArgument(format!(
            "{fragments} fragments need at least as many parameters, {} are given",
            lens.len()
        ))
    })?;
    for (k, cut) in cuts.into_iter().enumerate() {
        let mut exchange = Vec::new();
        let planned = plan_buckets(
            &lens[cut.clone()],
            bucketing.fusion_threshold,
            bucketing.capacity,
        )?;
        for range in planned {
            let range = range.start + cut.start..range.end + cut.start;
            Bucket::of(range, lens, shapes, world).calls(codec, &mut exchange)?;
        }
        let launched = if k == 0 { h } else { k as u64 * stride };
        let merged = launched + u64::from(delay) - 1;
        calls.extend(exchange.into_iter().map(|c| {
            c.once_every(h)
                .in_exchange(k as u32, delay)
                .first_counted_at(merged)
        }));
    }
    Ok(())
}

/// `DimReduce::step` and DistOpt's trial all-reduces, from rank 0 (which
/// holds the largest slice, `chunk_range(m, W, 0)`).
fn dimreduce(
    out: &mut Vec<CollectiveCall>,
    m: usize,
    components: usize,
    trials: usize,
    world: usize,
) {
    let cols = chunk_range(m, world, 0).len();
    let slice_sent = Traffic::all_gather(4 * cols, 4 * m, world).sent;
    out.push(CollectiveCall::new(
        Collective::ReduceScatter { bytes: 4 * m },
        world,
        slice_sent,
    ));
    out.push(CollectiveCall::all_reduce(8 * (components + 2), world));
    for _ in 0..2 {
        out.push(CollectiveCall::new(
            Collective::AllGatherVaried {
                largest: 4 * cols,
                total: 4 * m,
            },
            world,
            slice_sent,
        ));
    }
    // One 8-byte all-reduce per trial; DistOpt counts them together as
    // one all-reduce of 8 x trials bytes (its rounding), so the first
    // call carries that count and the others none.
    let counted = Traffic::all_reduce(8 * trials, world).sent;
    for t in 0..trials {
        out.push(CollectiveCall::new(
            Collective::AllReduce { bytes: 8 },
            world,
            if t == 0 { counted } else { 0 },
        ));
    }
    // The agreement on the loss closure's outcome (`agree_after`).
    out.push(CollectiveCall::new(Collective::Barrier, world, 0));
}
