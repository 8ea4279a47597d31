//! The timeline on LocalComm: every collective of every rank on one clock,
//! matched across ranks by its sequence number, its phases nested in it,
//! the rank that arrived last named, and the spans of the layers above.

use gradwire_comm::timeline::{Trace, TraceEvent, span};
use gradwire_comm::{
    CommError, Communicator, LocalComm, LocalConfig, ReduceOp, gather_trace, local,
};
use std::collections::BTreeSet;
use std::time::Duration;

fn with_timeline() -> LocalConfig {
    LocalConfig {
        timeline: true,
        ..LocalConfig::with_timeout(Some(Duration::from_secs(60)))
    }
}

/// Asserts that the complete events of each (rank, track) are well nested.
fn assert_nested(trace: &Trace) {
    if let Some((a, b)) = trace.overlapping() {
        panic!("{a:?} and {b:?} overlap");
    }
}

/// Each rank: collectives of several kinds and lengths on the world, a
/// job on its lane that combines "a bucket" (work around an all-reduce),
/// a split by parity, and step spans around some of it.
fn workload(comm: &LocalComm) -> Result<Trace, CommError> {
    let w = comm.world_size();
    for (i, len) in [0usize, 1, 7, 13].into_iter().enumerate() {
        let _step = span(comm.timeline(), "step", "step", Some(i as u64));
        let mut buf = vec![comm.rank() as f32; len];
        comm.all_reduce(&mut buf, ReduceOp::Sum)?;
        comm.broadcast(&mut buf, i % w)?;
        comm.all_gather_varied(&vec![1u8; comm.rank() + len])?;
    }
    comm.barrier()?;
    let job = comm.run_async(|lane: &LocalComm| {
        let _bucket = span(lane.timeline(), "bucket", "bucket", Some(0));
        let _combine = span(lane.timeline(), "combine", "combine", None);
        // The strategy's own work before and after its collective.
        std::thread::sleep(Duration::from_millis(2));
        let mut buf = vec![1.0f32; 11];
        lane.all_reduce(&mut buf, ReduceOp::Sum)?;
        std::thread::sleep(Duration::from_millis(2));
        Ok(buf)
    })?;
    let summed = job.wait()?;
    assert_eq!(summed, vec![w as f32; 11]);
    if let Some(half) = comm.split(Some((comm.rank() % 2) as u32), 0)? {
        let mut buf = vec![1u32; 3];
        half.all_reduce(&mut buf, ReduceOp::Sum)?;
    }
    gather_trace(comm)
}

#[test]
fn every_collective_appears_on_every_rank_with_its_sequence_number_and_nests() {
    for w in 1..=5 {
        let traces: Vec<Trace> = local::run_with(w, &with_timeline(), |comm| workload(&comm))
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap().unwrap())
            .collect();
        // Every rank merged the same logs into the same trace.
        assert!(traces.iter().all(|t| *t == traces[0]), "W = {w}");
        let trace = &traces[0];
        assert_nested(trace);
        let all: BTreeSet<usize> = (0..w).collect();
        let calls = trace.collectives();
        let on = |track: &str| -> Vec<(u64, &String, &BTreeSet<usize>)> {
            calls
                .iter()
                .filter(|((t, _), _)| t == track)
                .map(|((_, seq), c)| (*seq, &c.op, &c.ranks))
                .collect()
        };
        // The world: 4 rounds of 3, the barrier, the split, and the
        // trace's own barrier and broadcast of the clocks' offsets,
        // numbered from 0 on every rank.
        let world = on("collectives");
        assert_eq!(world.len(), 4 * 3 + 4, "W = {w}");
        for (k, &(seq, _, ranks)) in world.iter().enumerate() {
            assert_eq!(seq, k as u64);
            assert_eq!(ranks, &all, "W = {w}, seq {seq}");
        }
        let ops: Vec<&str> = world.iter().map(|(_, op, _)| op.as_str()).collect();
        assert_eq!(
            &ops[..4],
            ["all_reduce", "broadcast", "all_gather_varied", "all_reduce"]
        );
        assert_eq!(&ops[12..], ["barrier", "split", "barrier", "broadcast"]);
        // The lane's all-reduce, on every rank.
        let lane = on("collectives (communication thread)");
        assert_eq!(lane.len(), 1);
        assert_eq!(lane[0].2, &all);
        // Each split group's all-reduce, on that group's ranks.
        for color in 0..w.min(2) {
            let group = on(&format!("split 1, color {color}"));
            let members: BTreeSet<usize> = (0..w).filter(|r| r % 2 == color).collect();
            assert_eq!(group.len(), 1, "W = {w}, color {color}");
            assert_eq!(group[0].2, &members);
        }
        // The spans: 4 steps a rank on the world's track, a bucket and
        // its combination on the lane's, with the codec work around the
        // collective shown inside it.
        for rank in 0..w {
            let spans_of = |cat: &str| -> Vec<&TraceEvent> {
                trace
                    .spans()
                    .filter(|e| e.pid == rank && e.cat == cat)
                    .collect()
            };
            assert_eq!(spans_of("step").len(), 4);
            assert!(
                spans_of("step")
                    .iter()
                    .all(|e| trace.track_name(rank, e.tid) == Some("collectives"))
            );
            let codec = spans_of("codec");
            assert_eq!(codec.len(), 2, "rank {rank}: before and after");
            assert!(codec.iter().all(|e| e.dur.unwrap() >= 1_000));
            let combine = &spans_of("combine")[0];
            assert_eq!(
                trace.track_name(rank, combine.tid),
                Some("collectives (communication thread)")
            );
        }
        // The JSON Chrome and Perfetto read.
        let json: serde_json::Value = serde_json::from_str(&trace.to_json().unwrap()).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        assert_eq!(events.len(), trace.events.len());
        assert!(
            events
                .iter()
                .any(|e| e["name"] == "process_name"
                    && e["args"]["name"] == format!("rank {}", w - 1))
        );
    }
}

/// Ranks 0 and 1 tell rank 2 they are on their way, then enter an
/// all-reduce; rank 2 hears both, waits 250 ms (far beyond what a loaded
/// machine's scheduler delays a thread by), then enters: the others' wait
/// in it is named for rank 2, and rank 2 is counted last.
#[test]
fn the_wait_names_the_rank_that_arrived_last() {
    let traces = local::run_with(3, &with_timeline(), |comm: LocalComm| {
        let mut buf = [1.0f32; 4];
        comm.all_reduce(&mut buf, ReduceOp::Sum)?;
        if comm.rank() == 2 {
            let mut note = [0u8; 1];
            comm.recv(&mut note, 0)?;
            comm.recv(&mut note, 1)?;
            std::thread::sleep(Duration::from_millis(250));
        } else {
            comm.send(&[1u8], 2)?;
        }
        comm.all_reduce(&mut buf, ReduceOp::Sum)?;
        gather_trace(&comm)
    })
    .unwrap();
    let trace = traces.into_iter().next().unwrap().unwrap().unwrap();
    assert_nested(&trace);
    let late: Vec<&TraceEvent> = trace
        .spans()
        .filter(|e| e.cat == "collective" && e.args["seq"] == 1)
        .collect();
    assert_eq!(late.len(), 3);
    for call in &late {
        assert_eq!(call.args["last"], 2, "rank {}", call.pid);
        assert!(call.args["late_us"].as_i64().unwrap() >= 125_000);
    }
    let within = |call: &TraceEvent, e: &TraceEvent| {
        e.pid == call.pid
            && e.tid == call.tid
            && e.ts >= call.ts
            && e.ts < call.ts + call.dur.unwrap()
    };
    for call in late.iter().filter(|e| e.pid < 2) {
        let wait = trace
            .spans()
            .find(|e| e.name == "wait for rank 2" && within(call, e))
            .unwrap_or_else(|| panic!("rank {} waits for rank 2", call.pid));
        assert!(wait.dur.unwrap() >= 125_000, "rank {}: {wait:?}", call.pid);
    }
    // Rank 2 itself waited for nobody in it.
    let own = late.iter().find(|e| e.pid == 2).unwrap();
    assert!(
        !trace
            .spans()
            .any(|e| e.name.starts_with("wait for") && within(own, e))
    );
    assert!(trace.last_arrivals[2].0 >= 1);
    assert!(trace.last_arrivals[2].1 >= 125_000);
}

#[test]
fn without_a_timeline_the_trace_is_refused_on_every_rank() {
    let config = LocalConfig::with_timeout(Some(Duration::from_secs(60)));
    let outcomes = local::run_with(3, &config, |comm: LocalComm| {
        assert!(comm.timeline().is_none());
        // The communicator stays usable after the refusal.
        let refused = gather_trace(&comm).map(|_| ());
        comm.barrier().map(|()| refused)
    })
    .unwrap();
    for outcome in outcomes {
        match outcome.unwrap().unwrap() {
            Err(CommError::InvalidArgument(detail)) => assert!(detail.contains("[0, 1, 2]")),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}
