//! The flight recorder on LocalComm: where a deadline or a lost peer
//! stopped the ranks, in memory and in the files it writes, naming the rank
//! that left.

use gradwire_comm::{
    CommError, Communicator, FlightPhase, FlightRecord, LocalComm, LocalConfig, ReduceOp, local,
};
use serde_json::Value;
use std::path::Path;
use std::sync::Barrier;
use std::time::Duration;

/// Settings whose records go to `dir`, with a short deadline.
fn config(dir: &Path) -> LocalConfig {
    LocalConfig {
        timeout: Some(Duration::from_millis(400)),
        flight_recorder: Some(dir.to_path_buf()),
        timeline: false,
    }
}

/// `(seq, op, phase)` of each record.
fn summary(records: &[FlightRecord]) -> Vec<(u64, &'static str, FlightPhase)> {
    records.iter().map(|r| (r.seq, r.op, r.phase)).collect()
}

/// The flight record file `dir/flight-rank<rank>.json`, parsed.
fn file_of(dir: &Path, rank: usize) -> Value {
    let path = dir.join(format!("flight-rank{rank}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

/// The files in `dir`, sorted.
fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Rank 2 stops after two collectives while keeping its communicator: the
/// others' third times out naming it, their records end there, failed,
/// and are written; rank 2's end one collective earlier, agreed, and
/// nothing of it is written (it never failed).
#[test]
fn a_deadline_writes_where_each_rank_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let failed = Barrier::new(3);
    let outcomes = local::run_with(3, &config(dir.path()), |comm: LocalComm| {
        let mut buf = [1.0f32; 5];
        comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        comm.barrier().unwrap();
        let err = if comm.rank() == 2 {
            None
        } else {
            Some(comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err())
        };
        // Rank 2 holds its communicator until the others have failed.
        failed.wait();
        (err, comm.flight_records())
    })
    .unwrap();
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let (err, records) = outcome.unwrap();
        if rank == 2 {
            assert!(err.is_none());
            assert_eq!(
                summary(&records),
                [
                    (0, "all_reduce", FlightPhase::Agreed),
                    (1, "barrier", FlightPhase::Agreed)
                ]
            );
            continue;
        }
        let err = err.unwrap();
        assert!(
            matches!(&err, CommError::Timeout { missing, .. } if missing == &[2]),
            "{err}"
        );
        assert_eq!(
            summary(&records),
            [
                (0, "all_reduce", FlightPhase::Agreed),
                (1, "barrier", FlightPhase::Agreed),
                (2, "all_reduce", FlightPhase::Failed)
            ]
        );
        let last = &records[2];
        assert_eq!((last.elem, last.len), (Some("f32"), 5));
        assert_eq!(last.error.as_deref(), Some(err.to_string().as_str()));
        assert!(last.ended_us.unwrap() >= last.entered_us);
        let file = file_of(dir.path(), rank);
        assert_eq!(file["rank"], rank);
        assert_eq!(file["world"], 3);
        assert_eq!(file["error"], err.to_string());
        let written = file["records"].as_array().unwrap();
        assert_eq!(written.len(), 3);
        assert_eq!(written[2]["seq"], 2);
        assert_eq!(written[2]["phase"], "failed");
        assert_eq!(written[2]["op"], "all_reduce");
    }
    assert_eq!(
        files_in(dir.path()),
        ["flight-rank0.json", "flight-rank1.json"]
    );
}

/// Rank 2 leaves (drops its communicator): the others' next collective
/// fails at once with `PeerLost` naming it, and their records say so.
#[test]
fn a_lost_peer_is_named_in_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let outcomes = local::run_with(3, &config(dir.path()), |comm: LocalComm| {
        comm.barrier().unwrap();
        if comm.rank() == 2 {
            drop(comm);
            return None;
        }
        let err = comm.barrier().unwrap_err();
        Some((err, comm.flight_records()))
    })
    .unwrap();
    for (rank, outcome) in outcomes.into_iter().enumerate().take(2) {
        let (err, records) = outcome.unwrap().unwrap();
        assert!(
            matches!(&err, CommError::PeerLost { ranks, .. } if ranks == &[2]),
            "{err}"
        );
        assert_eq!(
            summary(&records),
            [
                (0, "barrier", FlightPhase::Agreed),
                (1, "barrier", FlightPhase::Failed)
            ]
        );
        let file = file_of(dir.path(), rank);
        assert_eq!(file["error"], err.to_string());
        assert!(file["error"].as_str().unwrap().contains("[2]"));
    }
    assert_eq!(
        files_in(dir.path()),
        ["flight-rank0.json", "flight-rank1.json"]
    );
}

/// Without a directory nothing is written, and the records are kept all
/// the same.
#[test]
fn without_a_directory_the_records_stay_in_memory() {
    let config = LocalConfig {
        timeout: Some(Duration::from_secs(60)),
        flight_recorder: None,
        timeline: false,
    };
    let records = local::run_with(2, &config, |comm: LocalComm| {
        for _ in 0..3 {
            comm.barrier().unwrap();
        }
        comm.flight_records()
    })
    .unwrap();
    for r in records {
        assert_eq!(r.unwrap().len(), 3);
    }
}
