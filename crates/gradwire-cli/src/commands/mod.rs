//! What each subcommand does with its parsed flags: the calls into the
//! `gradwire_experiments` library and the printing of what they return, one file
//! per subcommand; here what several share (the messages of a build
//! without a backend, and `--network`'s re-launch).

pub(crate) mod bench;
pub(crate) mod compare;
pub(crate) mod faults;
pub(crate) mod train;

use gradwire_experiments::ExperimentError;
use gradwire_experiments::network::{self, MpiLaunch, Rate, ShapedNetwork};
use std::ffi::OsString;
use std::path::Path;

/// The error for `--backend nccl` in a build without NCCL support.
#[cfg(not(feature = "nccl"))]
pub(super) fn nccl_missing() -> ExperimentError {
    ExperimentError::Usage(
        "this gradwire was built without NCCL: cargo build --release -p gradwire-cli --features nccl"
            .into(),
    )
}

/// The error for `gradwire bench kernels` in a build without CUDA.
#[cfg(not(feature = "cuda"))]
pub(super) fn cuda_missing() -> ExperimentError {
    ExperimentError::Usage(
        "this gradwire was built without CUDA: cargo build --release -p gradwire-cli --features cuda"
            .into(),
    )
}

/// The error for `--backend mpi` in a build without MPI.
#[cfg(not(feature = "mpi"))]
pub(super) fn mpi_missing() -> ExperimentError {
    ExperimentError::Usage(
        "this gradwire was built without MPI: cargo build --release -p gradwire-cli --features mpi, \
         then run it under mpirun"
            .into(),
    )
}

/// `--network RATE`: this command again, as `world` MPI ranks on a shaped
/// network made for the run and removed after it (`out` made absolute: the
/// ranks may start elsewhere).
pub(super) fn over_network(
    rate: &str,
    world: usize,
    out: Option<&Path>,
) -> Result<(), ExperimentError> {
    let rate = Rate::parse(rate)?;
    if cfg!(not(feature = "mpi")) {
        return Err(ExperimentError::Usage(
            "--network starts MPI ranks: build with --features mpi".into(),
        ));
    }
    let program = std::env::current_exe().map_err(|source| ExperimentError::Io {
        path: "(this program)".into(),
        source,
    })?;
    let mut args = Vec::new();
    let mut given = std::env::args_os().skip(1);
    while let Some(arg) = given.next() {
        let text = arg.to_string_lossy();
        if ["--network", "--backend", "--link-rate", "--out"].contains(&text.as_ref()) {
            given.next();
        } else if ["--network=", "--backend=", "--link-rate=", "--out="]
            .iter()
            .any(|p| text.starts_with(p))
        {
        } else {
            args.push(arg);
        }
    }
    args.extend(["--backend", "mpi", "--link-rate"].map(OsString::from));
    args.push(rate.bits_per_s.to_string().into());
    if let Some(out) = out {
        let out = std::path::absolute(out).map_err(|source| ExperimentError::Io {
            path: out.display().to_string(),
            source,
        })?;
        args.push("--out".into());
        args.push(out.into_os_string());
    }
    let net = ShapedNetwork::create(world, rate)?;
    eprintln!(
        "shaped network: {world} ranks, one namespace each, linked to a bridge at {rate} each way (tc tbf); Open MPI over TCP"
    );
    network::run_under_mpi(
        &net,
        &MpiLaunch {
            program,
            args,
            env: Vec::new(),
        },
    )
}
