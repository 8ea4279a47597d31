//! The timeline (Horovod's timeline, PyTorch's profiler traces): with it
//! switched on (`timeline: true` in [`crate::LocalConfig`],
//! `MpiConfig` or `NcclConfig`), every collective of every communicator
//! of a rank (the world's, its asynchronous lane's, a split's) is logged
//! with its phases (entered, agreed by every rank, data moved), and the
//! layers above add spans of their own through
//! [`crate::Communicator::timeline`] (a bucket's job, its strategy's
//! combination, the optimizer, a step). [`gather_trace`] merges every
//! rank's log onto rank 0's clock and returns a Chrome trace (`trace.rs`), which
//! Perfetto and `chrome://tracing` draw: one process per rank, one track per
//! communicator, each collective split into the wait for the last rank, the
//! agreement and the transfer, named by its sequence number (the same on
//! every rank, as in the flight recorder).
//!
//! A track is one communicator, used from one thread at a time, so its
//! spans are nested by construction (a span opened around a collective
//! encloses its phases: both are read from the rank's one clock, floored to
//! microseconds). Off (the default), nothing is recorded and a
//! [`span`] costs a branch. On, the log grows by an event per collective or
//! span, up to [`TIMELINE_EVENTS`] of each, past which the oldest go; the
//! flight recorder's ring is kept either way.

mod trace;

pub use trace::{ALIGNMENT_ROUNDS, MatchedCollective, Trace, TraceEvent, gather_trace};

use crate::flight::FlightRecord;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Collectives (and, apart, spans) a rank's timeline keeps; older ones go.
pub const TIMELINE_EVENTS: usize = 1 << 18;

/// One rank's timeline: its clock, its tracks and what they logged.
struct Timeline {
    rank: usize,
    origin: Instant,
    /// Track names, by track number.
    tracks: Mutex<Vec<String>>,
    /// Splits made so far: names a split's track alike on every rank.
    splits: AtomicU64,
    log: Mutex<Log>,
}

/// What a rank's tracks logged.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Log {
    collectives: VecDeque<CollectiveEvent>,
    spans: VecDeque<SpanEvent>,
    /// Events dropped to keep within [`TIMELINE_EVENTS`] (the oldest).
    dropped: u64,
}

/// A collective as the timeline logs it (times in microseconds on the
/// rank's clock).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CollectiveEvent {
    track: u32,
    seq: u64,
    op: Cow<'static, str>,
    elem: Option<Cow<'static, str>>,
    len: usize,
    entered_us: u64,
    /// When every rank's call was agreed (or it failed).
    agreed_us: u64,
    /// When its data had moved (none without a data phase, or on failure).
    done_us: Option<u64>,
    failed: bool,
}

/// A span the layers above recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SpanEvent {
    track: u32,
    cat: Cow<'static, str>,
    name: Cow<'static, str>,
    index: Option<u64>,
    start_us: u64,
    end_us: u64,
}

fn push_capped<T>(queue: &mut VecDeque<T>, event: T, dropped: &mut u64) {
    if queue.len() == TIMELINE_EVENTS {
        queue.pop_front();
        *dropped += 1;
    }
    queue.push_back(event);
}

/// One communicator's track on its rank's timeline: what the layers above
/// record their spans on ([`crate::Communicator::timeline`]).
#[derive(Clone)]
pub struct TimelineTrack {
    timeline: Arc<Timeline>,
    id: u32,
}

impl std::fmt::Debug for TimelineTrack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimelineTrack")
            .field("rank", &self.timeline.rank)
            .field("track", &self.id)
            .finish()
    }
}

impl TimelineTrack {
    /// The first track of a new timeline for `rank`: its world
    /// communicator's.
    pub(crate) fn world(rank: usize) -> TimelineTrack {
        let timeline = Arc::new(Timeline {
            rank,
            origin: Instant::now(),
            tracks: Mutex::new(vec!["collectives".to_string()]),
            splits: AtomicU64::new(0),
            log: Mutex::new(Log::default()),
        });
        TimelineTrack { timeline, id: 0 }
    }

    fn sibling(&self, name: String) -> TimelineTrack {
        let mut tracks = self.timeline.tracks.lock();
        let id = u32::try_from(tracks.len()).unwrap_or(u32::MAX);
        tracks.push(name);
        TimelineTrack {
            timeline: Arc::clone(&self.timeline),
            id,
        }
    }

    /// The track of this communicator's asynchronous lane.
    pub(crate) fn lane(&self) -> TimelineTrack {
        let name = format!("{} (communication thread)", self.name());
        self.sibling(name)
    }

    /// Numbers a split of this rank's communicators: splits are collective,
    /// so the k-th split is the same one on every rank (taken by every
    /// rank that calls the split, a member of a new group or not).
    pub(crate) fn next_split(&self) -> u64 {
        self.timeline.splits.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The track of a communicator from split `number` with `color`: the
    /// same name on every rank of that group.
    pub(crate) fn split(&self, number: u64, color: Option<u32>) -> TimelineTrack {
        let name = match color {
            Some(c) => format!("split {number}, color {c}"),
            None => format!("split {number}"),
        };
        self.sibling(name)
    }

    /// This track's name.
    pub fn name(&self) -> String {
        let tracks = self.timeline.tracks.lock();
        tracks
            .get(self.id as usize)
            .cloned()
            .unwrap_or_else(|| format!("track {}", self.id))
    }

    /// The rank whose timeline this is.
    pub fn rank(&self) -> usize {
        self.timeline.rank
    }

    /// The rank's clock origin (flight records share it).
    pub(crate) fn origin(&self) -> Instant {
        self.timeline.origin
    }

    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(
            at.saturating_duration_since(self.timeline.origin)
                .as_micros(),
        )
        .unwrap_or(u64::MAX)
    }

    /// Records a span of category `cat` (`"bucket"`, `"combine"`,
    /// `"optimizer"`, `"step"`, ...) from `start` to `end`; `index` tells
    /// apart spans of one name (a bucket's number).
    pub fn record(
        &self,
        cat: &'static str,
        name: &'static str,
        index: Option<u64>,
        start: Instant,
        end: Instant,
    ) {
        let event = SpanEvent {
            track: self.id,
            cat: Cow::Borrowed(cat),
            name: Cow::Borrowed(name),
            index,
            start_us: self.micros(start),
            end_us: self.micros(end),
        };
        let mut log = self.timeline.log.lock();
        let Log { spans, dropped, .. } = &mut *log;
        push_capped(spans, event, dropped);
    }

    /// Logs the collective `record` describes, ended (agreed, or failed)
    /// at `ended_us`.
    pub(crate) fn collective(&self, record: &FlightRecord, ended_us: u64, failed: bool) {
        let event = CollectiveEvent {
            track: self.id,
            seq: record.seq,
            op: Cow::Borrowed(record.op),
            elem: record.elem.map(Cow::Borrowed),
            len: record.len,
            entered_us: record.entered_us,
            agreed_us: ended_us,
            done_us: None,
            failed,
        };
        let mut log = self.timeline.log.lock();
        let Log {
            collectives,
            dropped,
            ..
        } = &mut *log;
        push_capped(collectives, event, dropped);
    }

    /// Notes that collective `seq` of this track moved its data by `done_us`
    /// (or, with `failed`, failed in its data phase).
    pub(crate) fn done(&self, seq: u64, done_us: u64, failed: bool) {
        let mut log = self.timeline.log.lock();
        if let Some(event) = log
            .collectives
            .iter_mut()
            .rev()
            .find(|e| e.track == self.id && e.seq == seq)
            && event.done_us.is_none()
            && !event.failed
        {
            event.done_us = Some(done_us);
            event.failed = failed;
        }
    }

    /// Empties the rank's log (every track's), to trace a window of a run
    /// from here on: the tracks and the sequence numbers go on.
    pub fn clear(&self) {
        let mut log = self.timeline.log.lock();
        log.collectives.clear();
        log.spans.clear();
    }

    /// Microseconds on the rank's clock now.
    pub(crate) fn now_us(&self) -> u64 {
        self.micros(Instant::now())
    }
}

/// A span open on a track, recorded when dropped: `let _bucket =
/// span(comm.timeline(), "bucket", "bucket", Some(b));`. Without a track
/// (the timeline off) it records nothing and reads no clock.
#[derive(Debug)]
#[must_use = "a span is recorded when dropped"]
pub struct Span<'a> {
    open: Option<(&'a TimelineTrack, Instant)>,
    cat: &'static str,
    name: &'static str,
    index: Option<u64>,
}

/// Opens a span of `cat` named `name` on `track`, if there is one.
pub fn span<'a>(
    track: Option<&'a TimelineTrack>,
    cat: &'static str,
    name: &'static str,
    index: Option<u64>,
) -> Span<'a> {
    Span {
        open: track.map(|t| (t, Instant::now())),
        cat,
        name,
        index,
    }
}

impl Drop for Span<'_> {
    fn drop(&mut self) {
        if let Some((track, start)) = self.open.take() {
            track.record(self.cat, self.name, self.index, start, Instant::now());
        }
    }
}

/// A rank's log as [`gather_trace`] sends it to the others: borrowed
/// from the rank's timeline to be encoded, owned once decoded.
#[derive(Debug, Serialize, Deserialize)]
struct RankLog<'a> {
    rank: usize,
    tracks: Cow<'a, [String]>,
    log: Cow<'a, Log>,
}

impl TimelineTrack {
    /// The rank's log, encoded as JSON straight from the timeline (no
    /// copy of it first).
    fn encode(&self) -> serde_json::Result<Vec<u8>> {
        let tracks = self.timeline.tracks.lock();
        let log = self.timeline.log.lock();
        serde_json::to_vec(&RankLog {
            rank: self.timeline.rank,
            tracks: Cow::Borrowed(&tracks),
            log: Cow::Borrowed(&log),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flight::FlightPhase;

    #[test]
    fn spans_and_collectives_land_on_their_tracks() {
        let world = TimelineTrack::world(3);
        let lane = world.lane();
        let number = world.next_split();
        let split = world.split(number, Some(1));
        assert_eq!(world.name(), "collectives");
        assert_eq!(lane.name(), "collectives (communication thread)");
        assert_eq!(split.name(), "split 1, color 1");
        {
            let _s = span(Some(&lane), "bucket", "bucket", Some(2));
            let record = FlightRecord {
                seq: 0,
                op: "all_reduce",
                elem: Some("f32"),
                len: 7,
                phase: FlightPhase::Waiting,
                error: None,
                entered_us: 1,
                ended_us: None,
            };
            lane.collective(&record, 2, false);
            lane.done(0, 3, false);
        }
        let _none = span(None, "bucket", "bucket", None);
        let snap: RankLog<'static> = serde_json::from_slice(&world.encode().unwrap()).unwrap();
        assert_eq!(snap.rank, 3);
        assert_eq!(snap.tracks.len(), 3);
        assert_eq!(snap.log.spans.len(), 1);
        assert_eq!(snap.log.spans[0].track, 1);
        assert_eq!(snap.log.spans[0].index, Some(2));
        let c = &snap.log.collectives[0];
        assert_eq!(
            (c.track, c.seq, c.done_us, c.failed),
            (1, 0, Some(3), false)
        );
    }

    #[test]
    fn the_log_keeps_the_newest_events() {
        let world = TimelineTrack::world(0);
        let now = Instant::now();
        for _ in 0..TIMELINE_EVENTS + 3 {
            world.record("step", "step", None, now, now);
        }
        let snap: RankLog<'static> = serde_json::from_slice(&world.encode().unwrap()).unwrap();
        assert_eq!(snap.log.spans.len(), TIMELINE_EVENTS);
        assert_eq!(snap.log.dropped, 3);
    }
}
