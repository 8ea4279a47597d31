//! `gradwire faults`'s flags ([`FaultsArgs`]) and the matrix they ask for,
//! on LocalComm threads or MPI processes, printed and judged against the
//! failure model.

use super::{run_local, run_local_terminal, table, terminal_table};
use crate::config::BackendKind;
use crate::error::{ExperimentError, Result};
use std::time::Duration;

/// `gradwire faults`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct FaultsArgs {
    /// Ranks (threads of the in-process backend).
    #[arg(long, short = 'w', default_value_t = 4)]
    pub world: usize,
    /// The communicator's deadline, in seconds.
    #[arg(long, default_value_t = 60)]
    pub deadline: u64,
    /// Where the ranks run: `local` threads (`--world` of them), or `mpi`
    /// processes under `mpirun` (build with `--features mpi`; rank 0
    /// prints; the terminal faults, which end a process, run on `local`
    /// only).
    #[arg(long, value_enum, default_value_t = BackendKind::Local)]
    pub backend: BackendKind,
}

impl FaultsArgs {
    /// Runs the fault matrix the flags ask for and prints its tables; an
    /// error (a usage error, exit code 2) if a scenario breaks the failure
    /// model.
    pub fn run(&self) -> Result<()> {
        let deadline = Duration::from_secs(self.deadline);
        match self.backend {
            BackendKind::Local => {}
            BackendKind::Mpi => return run_mpi(deadline),
            BackendKind::Nccl => {
                return Err(ExperimentError::Usage(
                    "faults runs on --backend local or mpi".into(),
                ));
            }
        }
        let reports = run_local(self.world, deadline)?;
        println!("{}", table(&reports, "local", self.world));
        let terminal = run_local_terminal(self.world, deadline)?;
        println!("{}", terminal_table(&terminal, "local", self.world));
        let total = reports.len() + terminal.len();
        let broken = reports.iter().filter(|r| !r.holds()).count()
            + terminal.iter().filter(|r| !r.holds()).count();
        if broken > 0 {
            return Err(ExperimentError::Usage(format!(
                "{broken} of {total} scenarios break the failure model"
            )));
        }
        println!("all {total} scenarios keep the failure model");
        Ok(())
    }
}

/// The fault matrix on `MpiComm::world()` under mpirun; rank 0 prints.
#[cfg(feature = "mpi")]
fn run_mpi(deadline: Duration) -> Result<()> {
    use gradwire_comm::{Communicator, MpiComm, MpiConfig};
    let comm = MpiComm::world_with(&MpiConfig::with_timeout(Some(deadline)))?;
    let reports = super::run_on(&comm)?;
    let broken = reports.iter().filter(|r| !r.holds()).count();
    if comm.rank() == 0 {
        println!("{}", table(&reports, "mpi", comm.world_size()));
    }
    if broken > 0 {
        return Err(ExperimentError::Usage(format!(
            "{broken} of {} scenarios break the failure model",
            reports.len()
        )));
    }
    if comm.rank() == 0 {
        println!("all {} scenarios keep the failure model", reports.len());
    }
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: Duration) -> Result<()> {
    Err(ExperimentError::mpi_missing())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MPI in a build without it names the feature; NCCL is no backend of
    /// the matrix.
    #[test]
    fn backends_built_without_or_unfit_for_the_matrix_are_usage_errors() {
        let args = |backend| FaultsArgs {
            world: 2,
            deadline: 60,
            backend,
        };
        if !cfg!(feature = "mpi") {
            assert!(
                args(BackendKind::Mpi)
                    .run()
                    .is_err_and(|e| e.is_built_without("mpi"))
            );
        }
        assert!(matches!(
            args(BackendKind::Nccl).run(),
            Err(ExperimentError::Usage(m)) if m.contains("local or mpi")
        ));
    }
}
