//! Every rank's timeline merged into one Chrome trace (the JSON that
//! Perfetto and `chrome://tracing` open): [`gather_trace`].
//!
//! The ranks' clocks are aligned on rank 0's as NTP and Cristian's algorithm
//! do: rank 0 sends each rank its clock's reading, the rank answers with
//! its own, and rank 0 takes the answer as read halfway through the round
//! trip; of [`ALIGNMENT_ROUNDS`] trips the shortest decides (its error is at
//! most half of it: microseconds on one host, a network latency across
//! hosts). A barrier's exits would not do: a rank woken late by its
//! scheduler would read a late clock and seem to arrive late everywhere. A
//! collective
//! matched across ranks by its track and sequence number is drawn on each
//! rank as its whole call, and within it: the wait for the rank that
//! arrived last (named), the agreement, and the transfer. A strategy's
//! combination of a bucket (`combine` spans) shows its own work between
//! its collectives as `codec`.

use super::{CollectiveEvent, RankLog};
use crate::communicator::Communicator;
use crate::error::{CommError, Result};
use serde::Serialize;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A Chrome trace: every rank's timeline on one clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The events: metadata (`ph` `"M"`: the names of processes, which are
    /// ranks, and of threads, which are tracks), then complete events (`ph`
    /// `"X"`).
    pub events: Vec<TraceEvent>,
    /// For each rank, how many collectives it arrived at last (of those
    /// every rank of its communicator logged, with a spread), and how many
    /// microseconds it kept the first arrival waiting in them, summed.
    pub last_arrivals: Vec<(u64, u64)>,
    /// Events the ranks' logs dropped to stay bounded (the oldest).
    pub dropped: u64,
}

/// One event of a [`Trace`], in Chrome's trace event format.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceEvent {
    /// What it is: a collective (`all_reduce`), one of its phases (`wait
    /// for rank 2`, `agree`, `transfer`), a span (`bucket 3`, `optimizer`,
    /// `codec`), or, for metadata, `process_name` / `thread_name`.
    pub name: String,
    /// Its category: `collective`, `phase`, or the span's.
    pub cat: String,
    /// `"X"` (a complete event) or `"M"` (metadata).
    pub ph: &'static str,
    /// Its start, microseconds on the merged clock.
    pub ts: i64,
    /// Its length in microseconds (complete events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dur: Option<i64>,
    /// The rank.
    pub pid: usize,
    /// The track (a communicator of the rank).
    pub tid: u32,
    /// Details: a collective's `seq`, `len`, `elem`, the rank that arrived
    /// `last` and by how much (`late_us`).
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub args: Map<String, Value>,
}

impl Trace {
    /// The trace as Chrome's JSON object format, written straight from the
    /// events (no JSON tree of them first).
    pub fn to_json(&self) -> Result<String> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct ChromeFile<'a> {
            trace_events: &'a [TraceEvent],
            display_time_unit: &'static str,
            other_data: Value,
        }
        let last: Vec<Value> = self
            .last_arrivals
            .iter()
            .enumerate()
            .map(|(rank, &(count, late_us))| json!({"rank": rank, "last": count, "late_us": late_us}))
            .collect();
        let file = ChromeFile {
            trace_events: &self.events,
            display_time_unit: "ms",
            other_data: json!({"last_arrivals": last, "dropped": self.dropped}),
        };
        serde_json::to_string(&file)
            .map_err(|e| CommError::InvalidArgument(format!("the trace could not be encoded: {e}")))
    }

    /// The complete events (`ph` `"X"`).
    pub fn spans(&self) -> impl Iterator<Item = &TraceEvent> {
        self.events.iter().filter(|e| e.ph == "X")
    }

    /// The name of track `tid` of rank `pid` (its `thread_name`).
    pub fn track_name(&self, pid: usize, tid: u32) -> Option<&str> {
        self.events
            .iter()
            .find(|e| e.ph == "M" && e.name == "thread_name" && e.pid == pid && e.tid == tid)
            .and_then(|e| e.args.get("name")?.as_str())
    }

    /// Every collective, matched across ranks by its track's name and its
    /// sequence number: its kind and the ranks that logged it. A collective
    /// some rank of its communicator lacks is where the ranks diverged.
    pub fn collectives(&self) -> BTreeMap<(String, u64), MatchedCollective> {
        let names: HashMap<(usize, u32), &str> = self
            .events
            .iter()
            .filter(|e| e.ph == "M" && e.name == "thread_name")
            .filter_map(|e| Some(((e.pid, e.tid), e.args.get("name")?.as_str()?)))
            .collect();
        let mut out: BTreeMap<(String, u64), MatchedCollective> = BTreeMap::new();
        for e in self.spans().filter(|e| e.cat == "collective") {
            let Some(seq) = e.args.get("seq").and_then(Value::as_u64) else {
                continue;
            };
            let track = names.get(&(e.pid, e.tid)).copied().unwrap_or("?");
            out.entry((track.to_string(), seq))
                .or_insert_with(|| MatchedCollective {
                    op: e.name.clone(),
                    ranks: BTreeSet::new(),
                })
                .ranks
                .insert(e.pid);
        }
        out
    }

    /// Two complete events of one track that overlap without one holding
    /// the other (the first such pair), which Chrome's format does not
    /// allow; `None` for a well-nested trace.
    pub fn overlapping(&self) -> Option<(&TraceEvent, &TraceEvent)> {
        let mut by_track: BTreeMap<(usize, u32), Vec<&TraceEvent>> = BTreeMap::new();
        for e in self.spans() {
            by_track.entry((e.pid, e.tid)).or_default().push(e);
        }
        let end = |e: &TraceEvent| e.ts + e.dur.unwrap_or(0);
        for mut events in by_track.into_values() {
            // Parents first: the earlier start, then the longer.
            events.sort_by_key(|e| (e.ts, std::cmp::Reverse(e.dur.unwrap_or(0))));
            let mut open: Vec<&TraceEvent> = Vec::new();
            for e in events {
                while open.last().is_some_and(|p| end(p) <= e.ts) {
                    open.pop();
                }
                if let Some(parent) = open.last()
                    && end(e) > end(parent)
                {
                    return Some((parent, e));
                }
                open.push(e);
            }
        }
        None
    }
}

/// A collective of a [`Trace`], matched across ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchedCollective {
    /// Its kind (`all_reduce`, ...).
    pub op: String,
    /// The ranks that logged it.
    pub ranks: BTreeSet<usize>,
}

/// Round trips that align a rank's clock on rank 0's.
pub const ALIGNMENT_ROUNDS: usize = 8;

/// Gathers every rank's timeline (collective over `comm`: a barrier, the
/// clocks' alignment by round trips to rank 0 and a broadcast, then an
/// all-gather of the logs) and returns the merged trace on every rank. A
/// rank without a timeline makes it [`CommError::InvalidArgument`] on
/// every rank.
pub fn gather_trace<C: Communicator>(comm: &C) -> Result<Trace> {
    let track = comm.timeline();
    comm.barrier()?;
    // A rank without a timeline still answers (on a clock of its own), so
    // that every rank makes the same calls and the refusal is agreed.
    let own = std::time::Instant::now();
    let now = || match track {
        Some(t) => t.now_us(),
        None => u64::try_from(own.elapsed().as_micros()).unwrap_or(u64::MAX),
    };
    let offsets = align(comm, now)?;
    let mine = track.and_then(|t| t.encode().ok()).unwrap_or_default();
    let gathered = comm.all_gather_varied::<u8>(&mine)?;
    let mut logs = Vec::with_capacity(comm.world_size());
    let mut missing = Vec::new();
    for rank in 0..comm.world_size() {
        let bytes = gathered
            .range(rank)
            .and_then(|r| gathered.data().get(r))
            .unwrap_or_default();
        if bytes.is_empty() {
            missing.push(rank);
            continue;
        }
        let log: RankLog<'static> = serde_json::from_slice(bytes).map_err(|e| {
            CommError::InvalidArgument(format!("rank {rank}'s timeline could not be read: {e}"))
        })?;
        logs.push(log);
    }
    if !missing.is_empty() {
        return Err(CommError::InvalidArgument(format!(
            "ranks {missing:?} keep no timeline (their communicator's `timeline` setting is off)"
        )));
    }
    Ok(merge(&logs, &offsets))
}

/// Each rank's clock minus rank 0's, in microseconds, on every rank
/// (Cristian's algorithm; see the module docs).
fn align<C: Communicator>(comm: &C, now: impl Fn() -> u64) -> Result<Vec<i64>> {
    let mut offsets = vec![0i64; comm.world_size()];
    if comm.rank() == 0 {
        for (peer, offset) in offsets.iter_mut().enumerate().skip(1) {
            let mut best = u64::MAX;
            for _ in 0..ALIGNMENT_ROUNDS {
                let sent = now();
                comm.send(&[sent], peer)?;
                let mut answer = [0u64];
                comm.recv(&mut answer, peer)?;
                let back = now();
                let trip = back.saturating_sub(sent);
                if trip < best {
                    best = trip;
                    let halfway = as_i64(sent) + as_i64(trip) / 2;
                    *offset = as_i64(answer[0]) - halfway;
                }
            }
        }
    } else {
        for _ in 0..ALIGNMENT_ROUNDS {
            let mut ping = [0u64];
            comm.recv(&mut ping, 0)?;
            comm.send(&[now()], 0)?;
        }
    }
    comm.broadcast(&mut offsets, 0)?;
    Ok(offsets)
}

/// A complete event.
fn complete(
    name: String,
    cat: &str,
    pid: usize,
    tid: u32,
    start: i64,
    end: i64,
    args: Map<String, Value>,
) -> TraceEvent {
    TraceEvent {
        name,
        cat: cat.to_string(),
        ph: "X",
        ts: start,
        dur: Some((end - start).max(0)),
        pid,
        tid,
        args,
    }
}

fn metadata(name: &str, pid: usize, tid: u32, args: Value) -> TraceEvent {
    TraceEvent {
        name: name.to_string(),
        cat: "__metadata".to_string(),
        ph: "M",
        ts: 0,
        dur: None,
        pid,
        tid,
        args: match args {
            Value::Object(map) => map,
            _ => Map::new(),
        },
    }
}

fn as_i64(us: u64) -> i64 {
    i64::try_from(us).unwrap_or(i64::MAX)
}

/// Who arrived last at a collective and when, on the merged clock.
struct Arrivals {
    first: i64,
    last: i64,
    last_rank: usize,
    ranks: usize,
}

/// The logs of every rank (in rank order) merged, rank r's clock ahead of
/// rank 0's by `offsets[r]` microseconds.
fn merge(logs: &[RankLog<'_>], offsets: &[i64]) -> Trace {
    // Each rank's times on rank 0's clock, then all shifted so that the
    // earliest a rank's clock can read (its 0) is at or after 0.
    let shifts: Vec<i64> = (0..logs.len())
        .map(|r| -offsets.get(r).copied().unwrap_or(0))
        .collect();
    let base = shifts.iter().copied().min().unwrap_or(0);
    let at = |rank: usize, us: u64| as_i64(us) + shifts[rank] - base;
    let track_name = |rank: usize, track: u32| -> &str {
        logs[rank]
            .tracks
            .get(track as usize)
            .map_or("?", String::as_str)
    };

    // Arrivals per (track name, seq), over the ranks that logged it.
    let mut arrivals: HashMap<(&str, u64), Arrivals> = HashMap::new();
    for (rank, log) in logs.iter().enumerate() {
        for c in &log.log.collectives {
            let entered = at(rank, c.entered_us);
            let a = arrivals
                .entry((track_name(rank, c.track), c.seq))
                .or_insert(Arrivals {
                    first: entered,
                    last: entered,
                    last_rank: rank,
                    ranks: 0,
                });
            a.ranks += 1;
            a.first = a.first.min(entered);
            if entered > a.last {
                a.last = entered;
                a.last_rank = rank;
            }
        }
    }

    let mut events = Vec::new();
    let mut last_arrivals = vec![(0u64, 0u64); logs.len()];
    for (rank, log) in logs.iter().enumerate() {
        events.push(metadata(
            "process_name",
            rank,
            0,
            json!({"name": format!("rank {}", log.rank)}),
        ));
        events.push(metadata(
            "process_sort_index",
            rank,
            0,
            json!({"sort_index": rank}),
        ));
        for (tid, name) in log.tracks.iter().enumerate() {
            let tid = u32::try_from(tid).unwrap_or(u32::MAX);
            events.push(metadata("thread_name", rank, tid, json!({"name": name})));
            events.push(metadata(
                "thread_sort_index",
                rank,
                tid,
                json!({"sort_index": tid}),
            ));
        }
    }
    for (rank, log) in logs.iter().enumerate() {
        for c in &log.log.collectives {
            let key = (track_name(rank, c.track), c.seq);
            let a = &arrivals[&key];
            if a.last_rank == rank && a.last > a.first && a.ranks > 1 {
                last_arrivals[rank].0 += 1;
                last_arrivals[rank].1 += u64::try_from(a.last - a.first).unwrap_or(0);
            }
            collective_events(&mut events, rank, c, a, &at);
        }
        let mut by_track: HashMap<u32, Vec<(i64, i64)>> = HashMap::new();
        for c in &log.log.collectives {
            let start = at(rank, c.entered_us);
            let end = at(rank, c.done_us.unwrap_or(c.agreed_us));
            by_track.entry(c.track).or_default().push((start, end));
        }
        for calls in by_track.values_mut() {
            calls.sort_unstable();
        }
        for s in &log.log.spans {
            let (start, end) = (at(rank, s.start_us), at(rank, s.end_us));
            let name = match s.index {
                Some(i) => format!("{} {i}", s.name),
                None => s.name.to_string(),
            };
            events.push(complete(
                name,
                &s.cat,
                rank,
                s.track,
                start,
                end,
                Map::new(),
            ));
            if s.cat == "combine" {
                let calls = by_track.get(&s.track).map_or(&[][..], Vec::as_slice);
                codec_gaps(&mut events, rank, s.track, start, end, calls);
            }
        }
    }
    Trace {
        events,
        last_arrivals,
        dropped: logs.iter().map(|l| l.log.dropped).sum(),
    }
}

/// A collective on `rank`: the whole call, the wait for the last rank, the
/// agreement and the transfer.
fn collective_events(
    events: &mut Vec<TraceEvent>,
    rank: usize,
    c: &CollectiveEvent,
    a: &Arrivals,
    at: &impl Fn(usize, u64) -> i64,
) {
    let entered = at(rank, c.entered_us);
    let agreed = at(rank, c.agreed_us).max(entered);
    let done = c.done_us.map_or(agreed, |d| at(rank, d).max(agreed));
    let mut args = Map::new();
    args.insert("seq".into(), json!(c.seq));
    args.insert("len".into(), json!(c.len));
    if let Some(elem) = &c.elem {
        args.insert("elem".into(), json!(elem));
    }
    args.insert("last".into(), json!(a.last_rank));
    args.insert("late_us".into(), json!(a.last - a.first));
    if c.failed {
        args.insert("failed".into(), json!(true));
    }
    events.push(complete(
        c.op.to_string(),
        "collective",
        rank,
        c.track,
        entered,
        done,
        args,
    ));
    // The last rank's arrival, as this rank's clock has it (the alignment
    // is good to about a message's latency); the last rank itself waited
    // for nobody (its own arrival is `entered`).
    let waited_until = a.last.clamp(entered, agreed);
    let phases = [
        (
            format!("wait for rank {}", a.last_rank),
            entered,
            waited_until,
        ),
        ("agree".to_string(), waited_until, agreed),
        ("transfer".to_string(), agreed, done),
    ];
    for (name, start, end) in phases {
        if end > start {
            events.push(complete(
                name,
                "phase",
                rank,
                c.track,
                start,
                end,
                Map::new(),
            ));
        }
    }
}

/// A `combine` span's time outside its collectives (`calls`, sorted: this
/// track's collectives as `(start, end)`): the strategy's own work, its
/// codec.
fn codec_gaps(
    events: &mut Vec<TraceEvent>,
    rank: usize,
    track: u32,
    start: i64,
    end: i64,
    calls: &[(i64, i64)],
) {
    let first = calls.partition_point(|&(s, _)| s < start);
    let mut cursor = start;
    for &(s, e) in calls[first..].iter().take_while(|&&(s, _)| s < end) {
        if s > cursor {
            let codec = "codec".to_string();
            events.push(complete(codec, "codec", rank, track, cursor, s, Map::new()));
        }
        cursor = cursor.max(e);
    }
    if end > cursor {
        let codec = "codec".to_string();
        events.push(complete(
            codec,
            "codec",
            rank,
            track,
            cursor,
            end,
            Map::new(),
        ));
    }
}

#[cfg(test)]
mod tests;
