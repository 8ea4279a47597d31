//! The conformance suite ([`gradwire_tests::conformance`]) on LocalComm:
//! every case on worlds of 1 to 4 in-process ranks. The same bodies run on
//! MpiComm in `conformance_mpi.rs`.

use gradwire_comm::{LocalComm, LocalConfig, local};
use gradwire_tests::conformance::{Case, assert_passed, cases, run_case};

/// Runs the case called `name` on worlds of 1..=4 ranks and fails with every
/// rank's failures.
fn conform(name: &str) {
    let all = cases::<LocalComm>();
    let case: &Case<LocalComm> = all
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name}"));
    // With the timeline on, as every harness (the case `timeline` reads it).
    let config = LocalConfig {
        timeline: true,
        ..LocalConfig::default()
    };
    for world in 1..=4 {
        let verdicts = local::run_with(world, &config, |comm| run_case(&comm, case))
            .expect("ranks ran")
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .expect("no rank panicked");
        assert_passed(name, world, verdicts);
    }
}

gradwire_tests::conformance_tests!(conform);
