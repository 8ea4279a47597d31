//! `gradwire faults`: the fault matrix on LocalComm threads or MPI
//! processes, judged against the failure model.

use crate::{Backend, FaultsArgs};
use gradwire_experiments::ExperimentError;

/// Runs `gradwire faults` with its flags.
pub(crate) fn run(args: FaultsArgs) -> Result<(), ExperimentError> {
    use gradwire_experiments::faults;
    let deadline = std::time::Duration::from_secs(args.deadline);
    match args.backend {
        Backend::Local => {}
        Backend::Mpi => return faults_mpi(deadline),
        Backend::Nccl => {
            return Err(ExperimentError::Usage(
                "faults runs on --backend local or mpi".into(),
            ));
        }
    }
    let reports = faults::run_local(args.world, deadline)?;
    println!("{}", faults::table(&reports, "local", args.world));
    let terminal = faults::run_local_terminal(args.world, deadline)?;
    println!("{}", faults::terminal_table(&terminal, "local", args.world));
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

/// The fault matrix on `MpiComm::world()` under mpirun; rank 0 prints.
#[cfg(feature = "mpi")]
fn faults_mpi(deadline: std::time::Duration) -> Result<(), ExperimentError> {
    use gradwire_comm::{Communicator, MpiComm, MpiConfig};
    use gradwire_experiments::faults;
    let comm = MpiComm::world_with(&MpiConfig::with_timeout(Some(deadline)))?;
    let reports = faults::run_on(&comm)?;
    let broken = reports.iter().filter(|r| !r.holds()).count();
    if comm.rank() == 0 {
        println!("{}", faults::table(&reports, "mpi", comm.world_size()));
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
fn faults_mpi(_: std::time::Duration) -> Result<(), ExperimentError> {
    Err(super::mpi_missing())
}
