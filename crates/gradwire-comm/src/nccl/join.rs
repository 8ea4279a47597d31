//! The ways ranks find each other besides a [`UniqueId`] passed by hand:
//! a file every rank can read ([`NcclComm::from_file`]), an MPI
//! communicator (`NcclComm::from_mpi`, with the `mpi` feature), and
//! threads of one process, one per GPU ([`run`]).

use std::path::Path;
use std::time::{Duration, Instant};

use super::{CudaTransport, NcclComm, NcclConfig, UniqueId, device};
use crate::communicator::Communicator;
use crate::error::{CommError, Result};
use crate::rank_threads::on_rank_threads;

impl NcclComm<CudaTransport> {
    /// Joins through a file every rank can read (a shared file system, or
    /// one host's `/tmp`): rank 0 generates the id and publishes it at
    /// `path` atomically, the others wait for it (up to the configured
    /// timeout). The path must not exist when the job starts (rank 0 fails
    /// with `InvalidArgument` if it does: a stale id would make the ranks
    /// wait for a communicator that no longer exists); rank 0 removes it once
    /// every rank has joined. PyTorch's `FileStore` works the same way.
    pub fn from_file(
        path: impl AsRef<Path>,
        rank: usize,
        world: usize,
        ordinal: usize,
        config: NcclConfig,
    ) -> Result<NcclComm> {
        let path = path.as_ref();
        if world == 0 || rank >= world {
            return Err(CommError::InvalidRank {
                rank,
                world_size: world,
            });
        }
        let io = |what: &str, e: std::io::Error| {
            CommError::InvalidArgument(format!("{what} {}: {e}", path.display()))
        };
        let id = if rank == 0 {
            let id = UniqueId::generate()?;
            // Write a private file, then link it into place: the link fails
            // if the path exists, and readers never see a partial id.
            let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
            std::fs::write(&tmp, id.to_bytes()).map_err(|e| io("cannot write", e))?;
            let linked = std::fs::hard_link(&tmp, path);
            let _ = std::fs::remove_file(&tmp);
            linked.map_err(|e| io("cannot publish the NCCL id at", e))?;
            id
        } else {
            let start = Instant::now();
            loop {
                match std::fs::read(path) {
                    Ok(bytes) if bytes.len() == 128 => {
                        let mut id = [0u8; 128];
                        id.copy_from_slice(&bytes);
                        break UniqueId::from_bytes(id);
                    }
                    Ok(_) | Err(_) => {
                        if config.timeout.is_some_and(|limit| start.elapsed() > limit) {
                            return Err(CommError::Timeout {
                                op: "NcclComm::from_file",
                                waited: start.elapsed(),
                                missing: vec![0],
                            });
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        };
        let comm = NcclComm::from_id(&id, rank, world, ordinal, config)?;
        // Everyone has read the id once everyone has joined.
        comm.barrier()?;
        if rank == 0 {
            let _ = std::fs::remove_file(path);
        }
        Ok(comm)
    }

    /// Joins with the ranks of an MPI communicator (one process per GPU):
    /// rank 0 generates the id and broadcasts it over `mpi`. Collective over
    /// `mpi`; this rank's NCCL rank and world size are its MPI ones.
    #[cfg(feature = "mpi")]
    pub fn from_mpi(
        mpi: &crate::mpi::MpiComm,
        ordinal: usize,
        config: NcclConfig,
    ) -> Result<NcclComm> {
        // Every rank takes part in the broadcast even if it cannot make an
        // id, so no rank is left waiting; the failure then travels as a
        // flag, and every rank returns an error.
        let made = if mpi.rank() == 0 {
            UniqueId::generate()
        } else {
            Ok(UniqueId::from_bytes([0; 128]))
        };
        let mut bytes = [0u8; 129];
        if let Ok(id) = &made {
            bytes[..128].copy_from_slice(&id.to_bytes());
            bytes[128] = 1;
        }
        mpi.broadcast(&mut bytes, 0)?;
        made?;
        if bytes[128] != 1 {
            return Err(CommError::NcclUnavailable(
                "rank 0 could not generate an NCCL id".into(),
            ));
        }
        let mut id = [0u8; 128];
        id.copy_from_slice(&bytes[..128]);
        NcclComm::from_id(
            &UniqueId::from_bytes(id),
            mpi.rank(),
            mpi.world_size(),
            ordinal,
            config,
        )
    }
}

/// Runs `body` on one thread per CUDA device in `ordinals`, each with its
/// rank of one NcclComm (rank i on `ordinals[i]`), and returns the results
/// in rank order. The in-process counterpart of `local::run` (scoped
/// threads: `body` may borrow), for tests and single-host jobs. NCCL takes
/// one rank per device, so the ordinals must differ.
pub fn run<R, F>(ordinals: &[usize], config: NcclConfig, body: F) -> Result<Vec<Result<R>>>
where
    R: Send,
    F: Fn(NcclComm) -> Result<R> + Sync,
{
    if ordinals.is_empty() {
        return Err(CommError::InvalidArgument("no devices".into()));
    }
    let mut sorted = ordinals.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(CommError::InvalidArgument(format!(
            "devices {ordinals:?}: NCCL takes one rank per device"
        )));
    }
    // Every device must exist before any rank starts: a rank that failed
    // alone would leave the others in ncclCommInitRank until the deadline.
    for &ordinal in ordinals {
        device(ordinal)?;
    }
    let id = UniqueId::generate()?;
    let world = ordinals.len();
    let ranks = on_rank_threads((0..world).collect(), "gradwire-nccl-rank", |rank| {
        let comm = NcclComm::from_id(&id, rank, world, ordinals[rank], config.clone())?;
        body(comm)
    });
    Ok(ranks.into_iter().map(|rank| rank.and_then(|r| r)).collect())
}
