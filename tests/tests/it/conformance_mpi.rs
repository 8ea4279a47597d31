//! The conformance suite on MpiComm: starts the `gradwire-mpi-conformance`
//! binary (built with `--features mpi`) under
//! `mpirun --oversubscribe -np W` for W = 1, 2, 3, 4, on this host only, and
//! fails unless every rank of every run passed every case.
//!
//! Without MPI (the binary was not built, or `mpirun` is not on the PATH)
//! the test prints a loud SKIP line and passes; with `GRADWIRE_REQUIRE_MPI=1`
//! (CI sets it, through `cargo xtask test`) a missing MPI is a failure.

use gradwire_tests::mpirun;
use std::path::Path;
use std::time::Duration;

/// The binary, which cargo builds only with feature `mpi` (cargo names its
/// path even when it does not build it, so the feature decides).
#[cfg(feature = "mpi")]
const BINARY: Option<&str> = Some(env!("CARGO_BIN_EXE_gradwire-mpi-conformance"));
#[cfg(not(feature = "mpi"))]
const BINARY: Option<&str> = None;

/// One run's limit: a hang is a failure, not a stuck CI job.
const DEADLINE: Duration = Duration::from_secs(600);

/// Skips loudly, or fails when MPI is required.
fn unavailable(why: &str) {
    let run = "run `cargo test -p gradwire-tests --features mpi --test it -- conformance_mpi`";
    assert!(
        mpirun::skip("MPI conformance suite", why, run),
        "GRADWIRE_REQUIRE_MPI=1 but the MPI conformance suite cannot run: {why}"
    );
}

#[test]
fn conformance_suite_under_mpirun_on_1_to_4_ranks() {
    let Some(binary) = BINARY else {
        unavailable("gradwire-tests was built without feature `mpi`");
        return;
    };
    let Some(mpirun) = mpirun::mpirun() else {
        unavailable("`mpirun` is not on the PATH (Debian: apt-get install openmpi-bin)");
        return;
    };
    for world in 1..=4 {
        let mpirun::Run { ok, output, .. } =
            mpirun::run(&mpirun, Path::new(binary), &[], world, DEADLINE);
        println!("--- mpirun -np {world} ---\n{output}");
        assert!(ok, "the suite failed on {world} rank(s):\n{output}");
        let passed = format!("passed on {world} rank(s)");
        assert!(
            output.contains(&passed),
            "no pass line from rank 0 on {world} rank(s):\n{output}"
        );
    }
}
