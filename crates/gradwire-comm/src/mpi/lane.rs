//! MpiComm's asynchronous lane: the communication thread that runs jobs on
//! the duplicate communicator, and how a lost lane is announced.

use super::{MpiComm, ThreadLevel};
use crate::communicator::Communicator;
use crate::error::{CommError, Result};
use crate::worker::{Lane, Worker};
use std::sync::Arc;

impl MpiComm {
    /// The rank's asynchronous lane, started on first use.
    pub(super) fn lane_worker(&self) -> Result<&Worker<MpiComm>> {
        if let Some(worker) = self.worker.get() {
            return Ok(worker);
        }
        let worker = self.start_worker()?;
        Ok(self.worker.get_or_init(|| worker))
    }

    /// Spawns the communication thread on the duplicate communicator.
    fn start_worker(&self) -> Result<Worker<MpiComm>> {
        if self.env.level < ThreadLevel::Multiple {
            return Err(CommError::Unsupported(format!(
                "asynchronous jobs need MPI_THREAD_MULTIPLE; MPI granted {:?}",
                self.env.level
            )));
        }
        let shadow = self.shadow.take().ok_or_else(|| {
            CommError::InvalidArgument(
                "asynchronous jobs cannot start further asynchronous jobs".into(),
            )
        })?;
        let mut comm = MpiComm::adopt(
            Arc::clone(&self.env),
            shadow,
            self.config.clone(),
            false,
            Some(self.segment_bytes),
            Some(self.serial),
            self.departs,
        )?;
        comm.busy = Arc::clone(&self.jobs_busy);
        comm.waiting = Arc::clone(&self.jobs_waiting);
        if let Some(track) = self.timeline() {
            comm.attach_timeline(track.lane());
        }
        Worker::start(format!("gradwire-mpi-{}", self.rank), self.rank, comm)
    }
}

/// A lost lane is announced like a timeout: the lane is poisoned and every
/// peer gets a notice that this rank takes part in no collective from its
/// next one on, which ends the call a peer waits in (a collective of the
/// lane, or a receive: every wait watches for notices), or its next one.
impl Lane for MpiComm {
    fn poisoned(&self) -> Option<CommError> {
        self.poison.borrow().clone()
    }

    fn announce_lost(&self, lost: &CommError) {
        self.give_up(lost.clone(), self.rounds.get());
    }
}
