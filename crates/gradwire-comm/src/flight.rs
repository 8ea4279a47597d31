//! The flight recorder (PyTorch's for its NCCL process groups, Horovod's
//! stall inspector): every communicator keeps its last [`FLIGHT_RECORDS`]
//! collectives (sequence number, kind, element type, length, how far each
//! got, when), and writes them to a file when a deadline expires or a peer
//! is lost, so that a hang shows where the ranks diverged: the rank that
//! left stops at an earlier sequence number than the others, who wait in
//! the next collective.
//!
//! The sequence number counts a communicator's collectives from 0 and is
//! the same on every rank for the same collective (every rank makes the
//! same sequence of calls: the agreement checks it). Recording is a few
//! stores into a ring that is allocated once; a write happens only on the
//! failure, once per communicator, into the directory its configuration
//! names (`flight_recorder`, by default `$GRADWIRE_FLIGHT_RECORDER`), as
//! `flight-rank<R>.json` (`-2`, `-3`, ... for a rank's further
//! communicators: its asynchronous lane, a split), written whole under a
//! temporary name and linked into place, never over an existing file.
//! Recording allocates nothing (the steady-state invariant).

use crate::call::Call;
use crate::error::CommError;
use crate::timeline::TimelineTrack;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// Collectives a communicator remembers.
pub const FLIGHT_RECORDS: usize = 64;

/// The environment variable naming the directory flight records are written
/// to by default.
pub const FLIGHT_RECORDER_ENV: &str = "GRADWIRE_FLIGHT_RECORDER";

/// The default directory for flight records: `$GRADWIRE_FLIGHT_RECORDER`,
/// if set and not empty.
pub fn flight_dir_from_env() -> Option<PathBuf> {
    std::env::var_os(FLIGHT_RECORDER_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// How far a recorded collective got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlightPhase {
    /// This rank arrived and waits for the others (the agreement).
    Waiting,
    /// Every rank arrived and agreed; its data moved (or moves).
    Agreed,
    /// It failed on this rank (the record's `error`).
    Failed,
}

/// One collective as the flight recorder remembers it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlightRecord {
    /// The communicator's collective count at this call, from 0: the same
    /// on every rank for the same collective.
    pub seq: u64,
    /// The collective (`all_reduce`, `barrier`, ...).
    pub op: &'static str,
    /// Its element type (`f32`, ...), if it moves data.
    pub elem: Option<&'static str>,
    /// Its length in elements (this rank's).
    pub len: usize,
    /// How far it got.
    pub phase: FlightPhase,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// When this rank entered it, microseconds after the communicator was
    /// made (with a timeline, after the rank's timeline began).
    pub entered_us: u64,
    /// When it was agreed or failed, on the same clock.
    pub ended_us: Option<u64>,
}

/// What a flight record file holds.
#[derive(Serialize)]
struct FlightFile<'a> {
    rank: usize,
    world: usize,
    error: String,
    records: &'a [FlightRecord],
}

/// A communicator's flight recorder.
pub(crate) struct FlightRecorder {
    rank: usize,
    world: usize,
    start: Instant,
    /// The next sequence number of [`FlightRecorder::enter`] (the
    /// protocol's backends; LocalComm numbers its own rounds).
    #[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
    next: AtomicU64,
    ring: Mutex<VecDeque<FlightRecord>>,
    dir: Option<PathBuf>,
    written: AtomicBool,
    /// The communicator's track on its rank's timeline, when that is on:
    /// every collective that ends is also logged there.
    timeline: Option<TimelineTrack>,
}

impl std::fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightRecorder")
            .field("rank", &self.rank)
            .field("dir", &self.dir)
            .finish()
    }
}

impl FlightRecorder {
    /// The recorder of rank `rank` of `world`, writing into `dir` on a
    /// deadline or a lost peer, and logging to `timeline` if given (whose
    /// clock it then reads).
    pub(crate) fn new(
        rank: usize,
        world: usize,
        dir: Option<PathBuf>,
        timeline: Option<TimelineTrack>,
    ) -> FlightRecorder {
        FlightRecorder {
            rank,
            world,
            start: timeline
                .as_ref()
                .map_or_else(Instant::now, TimelineTrack::origin),
            next: AtomicU64::new(0),
            ring: Mutex::new(VecDeque::with_capacity(FLIGHT_RECORDS)),
            dir,
            written: AtomicBool::new(false),
            timeline,
        }
    }

    /// The communicator's timeline track, if its timeline is on.
    pub(crate) fn timeline(&self) -> Option<&TimelineTrack> {
        self.timeline.as_ref()
    }

    /// Records that collective `seq` moved its data (the timeline's end of
    /// its transfer; the ring keeps when it was agreed).
    pub(crate) fn done(&self, seq: u64) {
        if let Some(track) = &self.timeline {
            track.done(seq, self.now_us(), false);
        }
    }

    /// A guard over one call of the protocol's backends: when it drops, the
    /// collective the call agreed on (if it reached an agreement:
    /// [`FlightRecorder::enter`] numbered one) has moved its data.
    #[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
    pub(crate) fn call(&self) -> CallGuard<'_> {
        CallGuard {
            flight: self,
            first: self.next.load(Ordering::Relaxed),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Records this rank's arrival at `call`, numbered by the recorder's
    /// own count; returns the number.
    #[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
    pub(crate) fn enter(&self, call: &Call) -> u64 {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        self.enter_as(seq, call);
        seq
    }

    /// Records this rank's arrival at `call`, number `seq` (the backend's
    /// own count).
    pub(crate) fn enter_as(&self, seq: u64, call: &Call) {
        let record = FlightRecord {
            seq,
            op: call.kind.name(),
            elem: call.elem.map(|e| e.as_str()),
            len: call.len,
            phase: FlightPhase::Waiting,
            error: None,
            entered_us: self.now_us(),
            ended_us: None,
        };
        let mut ring = self.ring.lock();
        if ring.len() == FLIGHT_RECORDS {
            ring.pop_front();
        }
        ring.push_back(record);
    }

    /// Records that collective `seq` was agreed.
    pub(crate) fn agreed(&self, seq: u64) {
        self.end(seq, FlightPhase::Agreed, None);
    }

    /// Records that collective `seq` failed with `err`; a deadline, a lost
    /// peer or a lost lane writes the records (once per recorder).
    pub(crate) fn failed(&self, seq: u64, err: &CommError) {
        self.end(seq, FlightPhase::Failed, Some(err.to_string()));
        let stalled = matches!(err, CommError::Timeout { .. } | CommError::PeerLost { .. })
            || err.is_lane_lost();
        if stalled
            && let Some(dir) = &self.dir
            && !self.written.swap(true, Ordering::AcqRel)
        {
            // The error the caller gets is the collective's; a record that
            // cannot be written is said on stderr, not in place of it.
            if let Err(e) = self.write(dir, err) {
                eprintln!(
                    "gradwire: rank {}: the flight record could not be written to {}: {e}",
                    self.rank,
                    dir.display()
                );
            }
        }
    }

    fn end(&self, seq: u64, phase: FlightPhase, error: Option<String>) {
        let now = self.now_us();
        let mut ring = self.ring.lock();
        let Some(r) = ring.iter_mut().rev().find(|r| r.seq == seq) else {
            return;
        };
        let was = r.phase;
        r.phase = phase;
        r.error = error;
        r.ended_us = Some(now);
        let Some(track) = &self.timeline else {
            return;
        };
        let failed = phase == FlightPhase::Failed;
        if was == FlightPhase::Waiting {
            track.collective(r, now, failed);
        } else if failed {
            // Agreed, then failed moving its data.
            track.done(seq, now, true);
        }
    }

    /// The remembered collectives, oldest first.
    pub(crate) fn records(&self) -> Vec<FlightRecord> {
        self.ring.lock().iter().cloned().collect()
    }

    /// Writes the records and `err` into `dir` as this rank's first free
    /// `flight-rank<R>[-k].json`, whole or not at all.
    fn write(&self, dir: &Path, err: &CommError) -> std::io::Result<PathBuf> {
        let records = self.records();
        let text = serde_json::to_string_pretty(&FlightFile {
            rank: self.rank,
            world: self.world,
            error: err.to_string(),
            records: &records,
        })
        .map_err(std::io::Error::other)?;
        std::fs::create_dir_all(dir)?;
        let temp = dir.join(format!(
            ".flight-rank{}-{}-{:p}.tmp",
            self.rank,
            std::process::id(),
            self
        ));
        std::fs::write(&temp, text)?;
        std::fs::File::open(&temp)?.sync_all()?;
        let mut k = 1;
        let result = loop {
            let name = if k == 1 {
                format!("flight-rank{}.json", self.rank)
            } else {
                format!("flight-rank{}-{k}.json", self.rank)
            };
            let target = dir.join(name);
            match std::fs::hard_link(&temp, &target) {
                Ok(()) => break Ok(target),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && k < 1000 => k += 1,
                Err(e) => break Err(e),
            }
        };
        let _ = std::fs::remove_file(&temp);
        result
    }
}

/// See [`FlightRecorder::call`].
#[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
pub(crate) struct CallGuard<'a> {
    flight: &'a FlightRecorder,
    first: u64,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if self.flight.timeline.is_some() {
            let next = self.flight.next.load(Ordering::Relaxed);
            if next > self.first {
                self.flight.done(next - 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::Kind;
    use crate::element::ElemType;
    use std::time::Duration;

    fn all_reduce(len: usize) -> Call {
        Call {
            elem: Some(ElemType::F32),
            len,
            ..Call::new(Kind::AllReduce)
        }
    }

    #[test]
    fn the_ring_keeps_the_last_collectives_in_order() {
        let recorder = FlightRecorder::new(1, 3, None, None);
        for n in 0..100 {
            let seq = recorder.enter(&all_reduce(n));
            if n < 99 {
                recorder.agreed(seq);
            }
        }
        let records = recorder.records();
        assert_eq!(records.len(), FLIGHT_RECORDS);
        let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, (100 - FLIGHT_RECORDS as u64..100).collect::<Vec<_>>());
        assert!(
            records[..FLIGHT_RECORDS - 1]
                .iter()
                .all(|r| r.phase == FlightPhase::Agreed)
        );
        let last = records.last().unwrap();
        assert_eq!(
            (last.phase, last.op, last.len),
            (FlightPhase::Waiting, "all_reduce", 99)
        );
        assert_eq!(last.elem, Some("f32"));
    }

    #[test]
    fn a_deadline_writes_the_records_once_and_a_mismatch_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let recorder = FlightRecorder::new(2, 3, Some(dir.path().join("records")), None);
        let seq = recorder.enter(&all_reduce(4));
        recorder.failed(
            seq,
            &CommError::Mismatch {
                detail: "lengths".into(),
            },
        );
        assert!(!dir.path().join("records").exists());
        let seq = recorder.enter(&all_reduce(4));
        let timeout = CommError::Timeout {
            op: "all_reduce",
            waited: Duration::from_millis(5),
            missing: vec![0],
        };
        recorder.failed(seq, &timeout);
        recorder.failed(seq, &timeout);
        let files: Vec<_> = std::fs::read_dir(dir.path().join("records"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(files, ["flight-rank2.json"]);
        let text = std::fs::read_to_string(dir.path().join("records/flight-rank2.json")).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["rank"], 2);
        assert_eq!(value["error"], timeout.to_string());
        let records = value["records"].as_array().unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[1]["phase"], "failed");
        assert_eq!(records[1]["seq"], 1);
        // A second communicator of the same rank: a file of its own.
        let other = FlightRecorder::new(2, 3, Some(dir.path().join("records")), None);
        let seq = other.enter(&all_reduce(1));
        other.failed(
            seq,
            &CommError::PeerLost {
                op: "all_reduce",
                ranks: vec![0],
            },
        );
        assert!(dir.path().join("records/flight-rank2-2.json").is_file());
    }
}
