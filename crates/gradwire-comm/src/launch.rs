//! Where this process sits in a job, read from the launcher's environment.
//!
//! `mpirun` (Open MPI), Hydra (MPICH) and Slurm's `srun` tell every process
//! its rank, the world size and its rank among the processes of its host in
//! environment variables, before MPI is initialized. Reading them needs no
//! MPI library, so this module is always built: a backend that must choose a
//! GPU or a port before it creates a communicator (NCCL) starts here. Once a
//! communicator exists, `MpiComm::local_rank` asks MPI itself (a shared-memory
//! split), which is authoritative.

use crate::error::{CommError, Result};

/// Rank, world size and node-local placement of this process, as its
/// launcher announced them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchEnv {
    /// This process's rank in the job, in `0..world_size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// This process's rank among the processes on its host, if announced.
    pub local_rank: Option<usize>,
    /// Number of processes on this host, if announced.
    pub local_size: Option<usize>,
    /// Which launcher's variables were read ("open-mpi", "mpich", "slurm").
    pub launcher: &'static str,
}

/// The variables of one launcher: rank, size, local rank, local size.
struct Scheme {
    launcher: &'static str,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    local_size: &'static str,
}

/// Checked in this order: a Slurm job step started by `mpirun` carries both
/// Slurm's and Open MPI's variables, and the MPI launcher's are the ones that
/// describe the MPI world.
const SCHEMES: &[Scheme] = &[
    Scheme {
        launcher: "open-mpi",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: "OMPI_COMM_WORLD_LOCAL_SIZE",
    },
    Scheme {
        launcher: "mpich",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: "MPI_LOCALNRANKS",
    },
    Scheme {
        launcher: "slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_size: "SLURM_NTASKS_PER_NODE",
    },
];

impl LaunchEnv {
    /// Reads the process environment. `Ok(None)` when no known launcher
    /// started this process (a plain `cargo run`); an error when a launcher's
    /// variables are present but malformed or inconsistent.
    pub fn from_env() -> Result<Option<LaunchEnv>> {
        LaunchEnv::from_vars(|name| std::env::var(name).ok())
    }

    /// [`LaunchEnv::from_env`] over any source of variables (for tests and
    /// for environments passed around as maps).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchEnv>> {
        for scheme in SCHEMES {
            let (Some(rank), Some(size)) = (var(scheme.rank), var(scheme.size)) else {
                continue;
            };
            let rank = parse(scheme.rank, &rank)?;
            let world_size = parse(scheme.size, &size)?;
            let local_rank = var(scheme.local_rank)
                .map(|v| parse(scheme.local_rank, &v))
                .transpose()?;
            // Slurm's per-node task count may read "4(x2)"; only a plain
            // number is a size this process can rely on.
            let local_size = var(scheme.local_size).and_then(|v| v.trim().parse::<usize>().ok());
            if rank >= world_size {
                return Err(CommError::InvalidArgument(format!(
                    "{}={rank} is out of range for {}={world_size}",
                    scheme.rank, scheme.size
                )));
            }
            if let (Some(lr), Some(ls)) = (local_rank, local_size)
                && (lr >= ls || ls > world_size)
            {
                return Err(CommError::InvalidArgument(format!(
                    "{}={lr} and {}={ls} are inconsistent with a world of {world_size}",
                    scheme.local_rank, scheme.local_size
                )));
            }
            return Ok(Some(LaunchEnv {
                rank,
                world_size,
                local_rank,
                local_size,
                launcher: scheme.launcher,
            }));
        }
        Ok(None)
    }
}

fn parse(name: &str, value: &str) -> Result<usize> {
    value.trim().parse().map_err(|_| {
        CommError::InvalidArgument(format!("{name}={value:?} is not a non-negative integer"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn open_mpi_variables_are_read() {
        let got = LaunchEnv::from_vars(env(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
        ]))
        .unwrap();
        assert_eq!(
            got,
            Some(LaunchEnv {
                rank: 3,
                world_size: 8,
                local_rank: Some(1),
                local_size: Some(2),
                launcher: "open-mpi",
            })
        );
    }

    #[test]
    fn nothing_set_is_none_and_garbage_is_an_error() {
        assert_eq!(LaunchEnv::from_vars(env(&[])).unwrap(), None);
        for bad in [
            &[("PMI_RANK", "x"), ("PMI_SIZE", "2")][..],
            &[("PMI_RANK", "2"), ("PMI_SIZE", "2")],
            &[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_LOCALID", "2"),
                ("SLURM_NTASKS_PER_NODE", "2"),
            ],
        ] {
            assert!(
                matches!(
                    LaunchEnv::from_vars(env(bad)),
                    Err(CommError::InvalidArgument(_))
                ),
                "{bad:?}"
            );
        }
        let slurm = LaunchEnv::from_vars(env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_NTASKS_PER_NODE", "2(x2)"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((slurm.rank, slurm.local_size), (1, None));
    }
}
