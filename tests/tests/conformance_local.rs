//! The conformance suite ([`gradwire_tests::conformance`]) on LocalComm:
//! every case on worlds of 1 to 4 in-process ranks. The same bodies run on
//! MpiComm in `conformance_mpi.rs`.

use gradwire_comm::{LocalComm, local};
use gradwire_tests::conformance::{Case, cases, run_case};

/// Runs the case called `name` on worlds of 1..=4 ranks and fails with every
/// rank's failures.
fn conform(name: &str) {
    let all = cases::<LocalComm>();
    let case: &Case<LocalComm> = all
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name}"));
    for world in 1..=4 {
        let verdicts = local::run(world, |comm| run_case(&comm, case)).expect("ranks ran");
        for (rank, verdict) in verdicts.into_iter().enumerate() {
            let verdict = verdict.unwrap_or_else(|e| panic!("{name}, world {world}: {e}"));
            assert!(
                verdict.is_empty(),
                "{name}, world {world}, as seen by rank {rank}:\n{}",
                verdict
                    .iter()
                    .map(|(r, m)| format!("  rank {r}: {m}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}

macro_rules! conformance_tests {
    ($($name:ident),* $(,)?) => {
        $(#[test]
        fn $name() {
            conform(stringify!($name));
        })*

        /// Every case of the suite has a test here.
        #[test]
        fn every_case_is_instantiated() {
            let listed = [$(stringify!($name)),*];
            for case in cases::<LocalComm>() {
                assert!(listed.contains(&case.name), "{} has no test", case.name);
            }
        }
    };
}

conformance_tests!(
    all_reduce_floats,
    all_reduce_integers,
    broadcast,
    all_gather,
    reduce_scatter,
    point_to_point,
    split,
    async_forms,
    mismatches,
    invalid_arguments,
    distopt_equals_single_process,
    adasum_matches_reference,
    sparse_all_reduce,
    skipping_unwritten_gradients,
    training_runs_match_local,
);
