//! The conformance case `timeline`: with the timeline on (every harness
//! makes its world with it), a backend logs every collective of every
//! communicator of a rank (the world's, the asynchronous lane's, a
//! split's) under the sequence number every rank gives it, and the merged
//! trace is well nested.

use super::{CaseError, Checks};
use gradwire_comm::timeline::span;
use gradwire_comm::{Communicator, ReduceOp, gather_trace};
use std::collections::BTreeSet;

/// The case body.
pub(super) fn timeline<C: Communicator + 'static>(
    comm: &C,
    checks: &mut Checks,
) -> Result<(), CaseError> {
    let (w, rank) = (comm.world_size(), comm.rank());
    let Some(track) = comm.timeline() else {
        checks.check(false, || {
            "the harness's communicator keeps no timeline".into()
        });
        return Ok(());
    };
    // This case's window only: the earlier cases' events go.
    track.clear();
    for (i, len) in [0usize, 1, 7, 13].into_iter().enumerate() {
        let _step = span(comm.timeline(), "step", "step", Some(i as u64));
        let mut buf = vec![rank as f32; len];
        comm.all_reduce(&mut buf, ReduceOp::Sum)?;
        comm.broadcast(&mut buf, i % w)?;
        comm.all_gather_varied(&vec![1u8; rank + len])?;
    }
    let lane = comm.run_async(|lane: &C| {
        let _bucket = span(lane.timeline(), "bucket", "bucket", Some(0));
        let _combine = span(lane.timeline(), "combine", "combine", None);
        let mut buf = vec![1.0f32; 11];
        lane.all_reduce(&mut buf, ReduceOp::Sum)?;
        Ok(buf)
    })?;
    let summed = lane.wait()?;
    checks.check(summed == vec![w as f32; 11], || {
        format!("timeline: the lane's all-reduce gave {summed:?}")
    });
    if let Some(half) = comm.split(Some((rank % 2) as u32), 0)? {
        let mut buf = vec![1u32; 3];
        half.all_reduce(&mut buf, ReduceOp::Sum)?;
    }
    let trace = gather_trace(comm)?;

    if let Some((a, b)) = trace.overlapping() {
        checks.check(false, || {
            format!("timeline: {} and {} overlap on one track", a.name, b.name)
        });
    }
    let calls = trace.collectives();
    let on = |track: &str| -> Vec<(u64, &str, &BTreeSet<usize>)> {
        calls
            .iter()
            .filter(|((t, _), _)| t == track)
            .map(|((_, seq), c)| (*seq, c.op.as_str(), &c.ranks))
            .collect()
    };
    let all: BTreeSet<usize> = (0..w).collect();
    // The world's: 4 rounds of 3, the split, and the trace's barrier and
    // broadcast of the clocks' offsets, with consecutive numbers, on every
    // rank.
    let world = on("collectives");
    let ops: Vec<&str> = world.iter().map(|&(_, op, _)| op).collect();
    let mut want = ["all_reduce", "broadcast", "all_gather_varied"].repeat(4);
    want.extend(["split", "barrier", "broadcast"]);
    checks.check(ops == want, || {
        format!("timeline: the world's collectives {ops:?}, not {want:?}")
    });
    let first = world.first().map_or(0, |&(seq, _, _)| seq);
    for (k, &(seq, op, ranks)) in world.iter().enumerate() {
        checks.check(seq == first + k as u64 && *ranks == all, || {
            format!(
                "timeline: {op} numbered {seq} (not {}) on ranks {ranks:?}",
                first + k as u64
            )
        });
    }
    let lane_calls = on("collectives (communication thread)");
    checks.check(
        lane_calls.len() == 1
            && lane_calls
                .iter()
                .all(|&(_, op, r)| op == "all_reduce" && *r == all),
        || format!("timeline: the lane's collectives {lane_calls:?}"),
    );
    let splits: Vec<String> = calls
        .keys()
        .map(|(t, _)| t.clone())
        .filter(|t| t.starts_with("split "))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    for color in 0..w.min(2) {
        let members: BTreeSet<usize> = (0..w).filter(|r| r % 2 == color).collect();
        let suffix = format!(", color {color}");
        let group: Vec<_> = splits
            .iter()
            .filter(|t| t.ends_with(&suffix))
            .flat_map(|t| on(t))
            .collect();
        checks.check(
            group.len() == 1 && group.iter().all(|&(_, _, r)| *r == members),
            || format!("timeline: color {color}'s collectives {group:?}"),
        );
    }
    let steps = trace
        .spans()
        .filter(|e| e.pid == rank && e.cat == "step")
        .count();
    let codec = trace
        .spans()
        .filter(|e| e.pid == rank && e.cat == "combine")
        .count();
    checks.check(steps == 4 && codec == 1, || {
        format!("timeline: rank {rank} has {steps} step and {codec} combine spans, not 4 and 1")
    });
    Ok(())
}
