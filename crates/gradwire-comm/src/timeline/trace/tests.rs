//! The merge's tests: clocks aligned, waits named, codec gaps, nesting.

use super::super::{Log, SpanEvent};
use super::*;
use std::borrow::Cow;

fn call(seq: u64, entered_us: u64, agreed_us: u64, done_us: Option<u64>) -> CollectiveEvent {
    CollectiveEvent {
        track: 0,
        seq,
        op: Cow::Borrowed("all_reduce"),
        elem: Some(Cow::Borrowed("f32")),
        len: 3,
        entered_us,
        agreed_us,
        done_us,
        failed: false,
    }
}

fn log(rank: usize, collectives: Vec<CollectiveEvent>) -> RankLog<'static> {
    RankLog {
        rank,
        tracks: Cow::Owned(vec!["collectives".into()]),
        log: Cow::Owned(Log {
            collectives: collectives.into(),
            spans: Default::default(),
            dropped: 0,
        }),
    }
}

/// Rank 1's clock runs 1000 us behind rank 0's; on the merged clock
/// rank 1 entered collective 0 at 1500, 500 us after rank 0, which
/// waited for it, agreed at 1600 and moved the data until 1900.
#[test]
fn clocks_are_aligned_and_the_wait_is_named() {
    let logs = [
        log(0, vec![call(0, 1000, 1600, Some(1900))]),
        log(1, vec![call(0, 500, 610, Some(900))]),
    ];
    let trace = merge(&logs, &[0, -1000]);
    assert_eq!(trace.overlapping(), None);
    let on = |pid: usize, name: &str| -> (i64, i64) {
        let e = trace
            .spans()
            .find(|e| e.pid == pid && e.name == name)
            .unwrap_or_else(|| panic!("rank {pid}: no {name}"));
        (e.ts, e.ts + e.dur.unwrap())
    };
    // Rank 1's times are shifted by +1000 onto rank 0's clock.
    assert_eq!(on(0, "all_reduce"), (1000, 1900));
    assert_eq!(on(1, "all_reduce"), (1500, 1900));
    assert_eq!(on(0, "wait for rank 1"), (1000, 1500));
    assert_eq!(on(0, "agree"), (1500, 1600));
    assert_eq!(on(0, "transfer"), (1600, 1900));
    assert_eq!(on(1, "agree"), (1500, 1610));
    assert!(
        !trace
            .spans()
            .any(|e| e.pid == 1 && e.name.starts_with("wait"))
    );
    let call0 = trace.spans().find(|e| e.cat == "collective").unwrap();
    assert_eq!(call0.args["last"], 1);
    assert_eq!(call0.args["late_us"], 500);
    assert_eq!(trace.last_arrivals, vec![(0, 0), (1, 500)]);
    let matched = trace.collectives();
    assert_eq!(matched.len(), 1);
    let c = &matched[&("collectives".to_string(), 0)];
    assert_eq!((c.op.as_str(), c.ranks.len()), ("all_reduce", 2));
}

#[test]
fn a_combination_shows_its_codec_work_between_its_collectives() {
    let mut rank = log(0, vec![call(0, 20, 25, Some(40)), call(1, 60, 61, None)]);
    rank.log.to_mut().spans.push_back(SpanEvent {
        track: 0,
        cat: Cow::Borrowed("combine"),
        name: Cow::Borrowed("combine"),
        index: None,
        start_us: 10,
        end_us: 70,
    });
    let trace = merge(&[rank], &[0]);
    assert_eq!(trace.overlapping(), None);
    let codec: Vec<(i64, i64)> = trace
        .spans()
        .filter(|e| e.cat == "codec")
        .map(|e| (e.ts, e.ts + e.dur.unwrap()))
        .collect();
    assert_eq!(codec, [(10, 20), (40, 60), (61, 70)]);
}

#[test]
fn overlapping_events_of_one_track_are_found() {
    let event = |ts: i64, dur: i64, tid: u32| TraceEvent {
        name: format!("{ts}"),
        cat: "step".into(),
        ph: "X",
        ts,
        dur: Some(dur),
        pid: 0,
        tid,
        args: Map::new(),
    };
    let nested = Trace {
        events: vec![
            event(0, 10, 0),
            event(2, 3, 0),
            event(10, 5, 0),
            event(5, 20, 1),
        ],
        last_arrivals: vec![],
        dropped: 0,
    };
    assert_eq!(nested.overlapping(), None);
    let crossed = Trace {
        events: vec![event(0, 10, 0), event(5, 10, 0)],
        ..nested
    };
    let (a, b) = crossed.overlapping().unwrap();
    assert_eq!((a.ts, b.ts), (0, 5));
}
