//! The conformance suite on NcclComm over [`HostTransport`]: every line of
//! NcclComm's own protocol (header exchange, collectives, point to point,
//! rank-ordered reduction, owner thread, watchdog, asynchronous lane,
//! departure notice) against a transport that enforces NCCL's rules on the
//! CPU, on worlds of 1 to 4 ranks, under both reductions. Runs in every CI
//! run, where the GPU suite (`conformance_nccl.rs`) can only skip.

#![cfg(feature = "nccl")]

use std::time::Duration;

use gradwire_comm::nccl::{self, HostTransport, NcclComm, NcclConfig, NcclReduction};
use gradwire_tests::conformance::{Case, Reductions, assert_passed, cases, run_case_with};

/// A hang (a protocol NCCL would deadlock on) fails here within this.
const DEADLINE: Duration = Duration::from_secs(60);

fn config(reduction: NcclReduction) -> NcclConfig {
    NcclConfig {
        timeout: Some(DEADLINE),
        reduction,
        timeline: true,
        ..NcclConfig::default()
    }
}

fn conform(name: &str) {
    for (reduction, reductions) in [
        (NcclReduction::Native, Reductions::Library),
        (NcclReduction::RankOrdered, Reductions::RankOrdered),
    ] {
        for world in 1..=4 {
            let verdicts = nccl::host::run(world, config(reduction), |comm| {
                let all = cases::<NcclComm<HostTransport>>();
                let case: &Case<NcclComm<HostTransport>> =
                    all.iter().find(|c| c.name == name).ok_or_else(|| {
                        gradwire_comm::CommError::InvalidArgument(format!("no case {name}"))
                    })?;
                run_case_with(&comm, case, reductions)
            })
            .unwrap_or_else(|e| panic!("{name} ({reduction:?}), world {world}: {e}"));
            assert_passed(&format!("{name} ({reduction:?})"), world, verdicts);
        }
    }
}

gradwire_tests::conformance_tests!(conform);

/// A rank that returns early (its NcclComm dropped, not unwinding) is
/// noticed by the peers' next collective as `PeerLost` naming it, not
/// after their deadline: the departure notice meets their header exchange.
/// The survivors' communicator stays poisoned with it.
#[test]
fn a_departed_rank_is_peer_lost_in_the_next_collective() {
    for world in 2..=4 {
        let gone = world - 1;
        let verdicts = nccl::host::run(world, config(NcclReduction::Native), |comm| {
            use gradwire_comm::{Communicator, ReduceOp};
            let mut v = [1f32; 5];
            comm.all_reduce(&mut v, ReduceOp::Sum)?;
            if comm.rank() == gone {
                drop(comm);
                return Ok(None);
            }
            let lost = comm.all_reduce(&mut v, ReduceOp::Sum);
            let after = comm.barrier();
            Ok(Some((lost, after)))
        })
        .expect("ranks ran");
        for (rank, verdict) in verdicts.into_iter().enumerate() {
            let verdict = verdict.unwrap_or_else(|e| panic!("world {world}, rank {rank}: {e}"));
            let Some((lost, after)) = verdict else {
                assert_eq!(rank, gone);
                continue;
            };
            let peer_lost = |r: &Result<(), gradwire_comm::CommError>| matches!(r, Err(gradwire_comm::CommError::PeerLost { ranks, .. }) if *ranks == [gone]);
            assert!(peer_lost(&lost), "world {world}, rank {rank}: {lost:?}");
            assert!(
                peer_lost(&after),
                "world {world}, rank {rank}, after: {after:?}"
            );
        }
    }
}
