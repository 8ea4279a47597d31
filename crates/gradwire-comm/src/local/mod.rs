//! `LocalComm`: W ranks as threads of one process, sharing memory.
//!
//! The embedded default backend and the one the test suites run on. Ranks
//! meet in a rendezvous per collective (`group.rs`), then work on each other's
//! buffers directly: an all-reduce has each rank reduce its own chunk of all W
//! buffers in cache-sized blocks and write the result straight back into all
//! of them, so every byte is read once and written once and all ranks work in
//! parallel. There is no per-element channel traffic and no copy into a
//! staging buffer.
//!
//! Guarantees:
//! - Deterministic: sums are taken in rank order; every rank receives the same
//!   bits, run after run.
//! - Safe: a collective whose kind, element type, length, op or root differs
//!   across ranks returns [`CommError::Mismatch`] on every rank, and the
//!   communicator stays usable. A rank that panics or drops its communicator
//!   makes the others' pending and later calls return [`CommError::PeerLost`];
//!   a rank that does not arrive within the deadline makes them return
//!   [`CommError::Timeout`] naming it. After a timeout or a lost peer every
//!   call on that group fails with the same error.
//! - Isolated: sub-groups from [`Communicator::split`] and the duplicate group
//!   used by asynchronous jobs have their own rendezvous and mailboxes.
//! - Asynchronous jobs run on the worker every backend shares (`worker.rs`),
//!   on a member of the duplicate group. A job that panics loses the lane
//!   (see [`Communicator::run_async`]): its rank poisons the duplicate group
//!   with [`CommError::Fault`] of kind `LaneLost`, which fails at
//!   once the round a peer waits in, a peer's waiting receive, and every
//!   later call of the group, on every rank.
//!
//! ```
//! use gradwire_comm::{Communicator, ReduceOp, local};
//!
//! let sums = local::run(4, |comm| {
//!     let mut grad = vec![comm.rank() as f32; 3];
//!     comm.all_reduce(&mut grad, ReduceOp::Sum).map(|()| grad)
//! })
//! .unwrap();
//! for grad in sums {
//!     assert_eq!(grad.unwrap(), vec![6.0; 3]);
//! }
//! ```

mod data;
mod group;
mod mailbox;

use crate::communicator::{Communicator, Gathered};
use crate::element::Element;
use crate::error::{CommError, Result};
use crate::flight::{FlightRecord, FlightRecorder};
use crate::job_slot::{AsyncJob, JobSlot};
use crate::op::ReduceOp;
use crate::pending::Pending;
use crate::timeline::TimelineTrack;
use crate::worker::{Interrupter, Lane, Worker};
use data::Pieces;
use group::{Group, Kind, Outcome, Post, Progress, RawBuf};
use mailbox::Message;
use std::cell::{Cell, OnceCell};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Settings of a local world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalConfig {
    /// How long a rank waits for the others to arrive at a collective (or for
    /// a message in `recv`) before the call fails with
    /// [`CommError::Timeout`]. `None` waits forever. Default: 10 minutes, as
    /// PyTorch's NCCL process groups.
    pub timeout: Option<Duration>,
    /// Where each rank writes its flight record (its last collectives,
    /// [`crate::FlightRecord`]) when a deadline expires or a peer is lost.
    /// `None` keeps them in memory only
    /// ([`Communicator::flight_records`]). Default:
    /// `$GRADWIRE_FLIGHT_RECORDER`.
    pub flight_recorder: Option<PathBuf>,
    /// Whether each rank keeps a timeline of its collectives and of the
    /// spans the layers above record ([`crate::timeline`]). Default: off.
    pub timeline: bool,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            timeout: Some(Duration::from_secs(600)),
            flight_recorder: crate::flight::flight_dir_from_env(),
            timeline: false,
        }
    }
}

impl LocalConfig {
    /// The default settings with another deadline.
    pub fn with_timeout(timeout: Option<Duration>) -> Self {
        LocalConfig {
            timeout,
            ..LocalConfig::default()
        }
    }
}

/// One rank of an in-process group. `Send` (move it to the rank's thread) but
/// not `Sync`: one rank's calls must happen in order, from one thread.
pub struct LocalComm {
    group: Arc<Group>,
    rank: usize,
    /// Number of collectives this rank has started on `group`.
    seq: Cell<u64>,
    /// Its last collectives (`seq` numbers them).
    flight: FlightRecorder,
    /// The communication thread for asynchronous jobs (the shared worker,
    /// on a member of the duplicate group), started on first use.
    worker: OnceCell<Worker<LocalComm>>,
}

impl std::fmt::Debug for LocalComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalComm")
            .field("rank", &self.rank)
            .field("world_size", &self.group.size)
            .field("timeout", &self.group.timeout)
            .finish()
    }
}

/// Runs `f` on `world_size` ranks, each on its own thread with its own
/// [`LocalComm`], and returns what each rank returned, in rank order.
///
/// A rank that panics becomes [`CommError::RankPanicked`] (the first one, by
/// rank); the other ranks see [`CommError::PeerLost`] in their collectives.
pub fn run<R, F>(world_size: usize, f: F) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(LocalComm) -> R + Sync,
{
    run_with(world_size, &LocalConfig::default(), f)?
        .into_iter()
        .collect()
}

/// [`run`] with settings, returning each rank's outcome separately: a rank
/// that panicked is `Err(CommError::RankPanicked)` and the others' results
/// are still there (fault tests need both); a rank whose thread could not
/// start is `Err(CommError::InvalidArgument)`, and the others see it lost.
pub fn run_with<R, F>(world_size: usize, config: &LocalConfig, f: F) -> Result<Vec<Result<R>>>
where
    R: Send,
    F: Fn(LocalComm) -> R + Sync,
{
    let comms = LocalComm::create_with(world_size, config)?;
    Ok(crate::rank_threads::on_rank_threads(
        comms,
        "gradwire-rank",
        f,
    ))
}

impl LocalComm {
    /// The `world_size` communicators of a new group with default settings,
    /// for callers that run the ranks on threads of their own.
    pub fn create(world_size: usize) -> Result<Vec<LocalComm>> {
        LocalComm::create_with(world_size, &LocalConfig::default())
    }

    /// [`LocalComm::create`] with settings.
    pub fn create_with(world_size: usize, config: &LocalConfig) -> Result<Vec<LocalComm>> {
        if world_size == 0 {
            return Err(CommError::InvalidArgument(
                "a world needs at least one rank".into(),
            ));
        }
        let group = Group::new(world_size, config.timeout, config.flight_recorder.clone());
        Ok((0..world_size)
            .map(|rank| {
                let track = config.timeline.then(|| TimelineTrack::world(rank));
                LocalComm::member(Arc::clone(&group), rank, track)
            })
            .collect())
    }

    fn member(group: Arc<Group>, rank: usize, track: Option<TimelineTrack>) -> LocalComm {
        let flight = FlightRecorder::new(rank, group.size, group.flight_dir.clone(), track);
        LocalComm {
            group,
            rank,
            seq: Cell::new(0),
            worker: OnceCell::new(),
            flight,
        }
    }

    /// The deadline of this group's calls.
    pub fn timeout(&self) -> Option<Duration> {
        self.group.timeout
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank < self.group.size {
            Ok(())
        } else {
            Err(CommError::InvalidRank {
                rank,
                world_size: self.group.size,
            })
        }
    }

    /// Starts a collective: posts this rank's call and waits for the round's
    /// outcome. Returns the round number (for the completion barrier).
    fn start(&self, post: Post) -> Result<(u64, Outcome)> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        self.flight.enter_as(seq, &post.call());
        match self.group.rendezvous(self.rank, seq, post) {
            Ok(outcome) => {
                self.flight.agreed(seq);
                Ok((seq, outcome))
            }
            Err(err) => {
                self.flight.failed(seq, &err);
                Err(err)
            }
        }
    }

    /// Runs a round with a data phase of `units` units of work: `work` gets
    /// every rank's post and this rank's [`Progress`]; the completion barrier
    /// follows (also when `work` unwinds, through `Progress`'s drop).
    fn data_round<R>(
        &self,
        post: Post,
        units: usize,
        work: impl FnOnce(&[Post], &Progress<'_>) -> R,
    ) -> Result<R> {
        let kind = post.kind;
        let (seq, outcome) = self.start(post)?;
        let Outcome::Go(posts) = outcome else {
            return Err(CommError::Mismatch {
                detail: format!("{} resolved without a data phase", kind.name()),
            });
        };
        let progress = self.group.progress(self.rank, seq, units, kind.name());
        let value = work(&posts, &progress);
        if let Err(err) = progress.complete() {
            self.flight.failed(seq, &err);
            return Err(err);
        }
        self.flight.done(seq);
        Ok(value)
    }

    /// A round in which each rank does one unit of work, its own (the
    /// copies: broadcast and the all-gathers).
    fn own_data_round<R>(&self, post: Post, work: impl FnOnce(&[Post]) -> R) -> Result<R> {
        self.data_round(post, self.group.size, |posts, progress| {
            progress.hold();
            let value = work(posts);
            progress.finish();
            value
        })
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn flight_records(&self) -> Vec<FlightRecord> {
        self.flight.records()
    }

    fn timeline(&self) -> Option<&TimelineTrack> {
        self.flight.timeline()
    }

    fn world_size(&self) -> usize {
        self.group.size
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let post = Post {
            elem: Some(T::TYPE),
            op: Some(op),
            len: buf.len(),
            recv: RawBuf(buf.as_mut_ptr().cast()),
            ..Post::new(Kind::AllReduce)
        };
        let world = self.group.size;
        // One rank: the result is the input, for every op (Avg: x / 1 == x).
        let pieces = Pieces::new(buf.len(), world);
        let units = if world == 1 { 0 } else { pieces.count() };
        // SAFETY: the round validated that every rank posted a live buffer of
        // `len` elements of T; `data_round` holds them until all are done.
        self.data_round(post, units, |posts, progress| unsafe {
            data::all_reduce::<T>(posts, &pieces, op, progress)
        })
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let post = Post {
            elem: Some(T::TYPE),
            len: buf.len(),
            root,
            recv: RawBuf(buf.as_mut_ptr().cast()),
            ..Post::new(Kind::Broadcast)
        };
        let rank = self.rank;
        // From here on `buf` is touched only through the post (see
        // `data::broadcast`).
        self.own_data_round(post, |posts| {
            if rank != root {
                // SAFETY: validated round; the root's buffer is only read, and
                // this rank's buffer is written only by this rank.
                unsafe { data::broadcast::<T>(posts, root, rank) }
            }
        })
    }

    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let post = Post {
            elem: Some(T::TYPE),
            len: send.len(),
            recv_len: recv.len(),
            send: RawBuf(send.as_ptr().cast_mut().cast()),
            ..Post::new(Kind::AllGather)
        };
        // SAFETY: validated round (recv holds world * len elements).
        self.own_data_round(post, |posts| unsafe { data::all_gather(posts, recv) })
    }

    fn all_gather_varied<T: Element>(&self, send: &[T]) -> Result<Gathered<T>> {
        let mut out = Gathered::default();
        self.all_gather_varied_into(send, &mut out)?;
        Ok(out)
    }

    fn all_gather_varied_into<T: Element>(&self, send: &[T], out: &mut Gathered<T>) -> Result<()> {
        let post = Post {
            elem: Some(T::TYPE),
            len: send.len(),
            send: RawBuf(send.as_ptr().cast_mut().cast()),
            ..Post::new(Kind::AllGatherVaried)
        };
        self.own_data_round(post, |posts| {
            // SAFETY: validated round; send buffers are only read.
            unsafe { data::all_gather_varied_into::<T>(posts, out) }
        })
    }

    fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let post = Post {
            elem: Some(T::TYPE),
            op: Some(op),
            len: send.len(),
            recv_len: recv.len(),
            send: RawBuf(send.as_ptr().cast_mut().cast()),
            recv: RawBuf(recv.as_mut_ptr().cast()),
            ..Post::new(Kind::ReduceScatter)
        };
        let pieces = Pieces::new(send.len(), self.group.size);
        // SAFETY: validated round (every recv holds its rank's chunk); this
        // rank's `recv` is only written through its post from here on.
        self.data_round(post, pieces.count(), |posts, progress| unsafe {
            data::reduce_scatter::<T>(posts, &pieces, op, progress)
        })
    }

    fn send<T: Element>(&self, buf: &[T], dest: usize) -> Result<()> {
        self.check_rank(dest)?;
        if let Some(err) = self.group.poison_error() {
            return Err(err);
        }
        if self.group.is_gone(dest) {
            return Err(CommError::PeerLost {
                op: "send",
                ranks: vec![dest],
            });
        }
        let Some(mailbox) = self.group.mail.of(dest) else {
            return Err(CommError::InvalidRank {
                rank: dest,
                world_size: self.group.size,
            });
        };
        let mut queues = mailbox.queues.lock();
        let message = Message {
            elem: T::TYPE,
            len: buf.len(),
            bytes: queues.copy_of(self.rank, bytemuck::cast_slice(buf)),
        };
        queues.from[self.rank].push_back(message);
        mailbox.arrived.notify_all();
        Ok(())
    }

    fn recv<T: Element>(&self, buf: &mut [T], src: usize) -> Result<()> {
        self.check_rank(src)?;
        let Some(mailbox) = self.group.mail.of(self.rank) else {
            return Err(CommError::InvalidRank {
                rank: self.rank,
                world_size: self.group.size,
            });
        };
        let deadline = self
            .group
            .timeout
            .and_then(|t| Instant::now().checked_add(t));
        let mut queues = mailbox.queues.lock();
        loop {
            if let Some(message) = queues.from[src].pop_front() {
                drop(queues);
                if message.elem != T::TYPE || message.len != buf.len() {
                    return Err(CommError::Mismatch {
                        detail: format!(
                            "rank {} sent {} elements of {} to rank {}, which receives {} of {}",
                            src,
                            message.len,
                            message.elem,
                            self.rank,
                            buf.len(),
                            T::TYPE
                        ),
                    });
                }
                bytemuck::cast_slice_mut::<T, u8>(buf).copy_from_slice(&message.bytes);
                mailbox.queues.lock().recycle(src, message.bytes);
                return Ok(());
            }
            // A poisoned group's error first: it is what every rank gets.
            if let Some(err) = self.group.poison_error() {
                return Err(err);
            }
            if self.group.is_gone(src) {
                return Err(CommError::PeerLost {
                    op: "recv",
                    ranks: vec![src],
                });
            }
            match (deadline, self.group.timeout) {
                (Some(deadline), Some(waited)) => {
                    if mailbox
                        .arrived
                        .wait_until(&mut queues, deadline)
                        .timed_out()
                        && queues.from[src].is_empty()
                    {
                        drop(queues);
                        let err = CommError::Timeout {
                            op: "recv",
                            waited,
                            missing: vec![src],
                        };
                        // A message arriving after its receiver gave up would be
                        // taken by the next recv: the group cannot be trusted.
                        self.group.poison(err.clone());
                        return Err(err);
                    }
                }
                _ => mailbox.arrived.wait(&mut queues),
            }
        }
    }

    fn sendrecv<T: Element>(
        &self,
        send: &[T],
        dest: usize,
        recv: &mut [T],
        src: usize,
    ) -> Result<()> {
        self.check_rank(src)?;
        self.send(send, dest)?;
        self.recv(recv, src)
    }

    fn barrier(&self) -> Result<()> {
        self.start(Post::new(Kind::Barrier)).map(|_| ())
    }

    fn post_fault(&self, kind: crate::FaultKind) -> CommError {
        let post = Post {
            key: i64::from(kind.code()),
            ..Post::new(Kind::Fault)
        };
        match self.start(post) {
            Err(err) => err,
            // Unreachable: a round with a fault in it always fails.
            Ok(_) => CommError::Fault(crate::Fault::posted(self.rank, kind)),
        }
    }

    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Self>> {
        let post = Post {
            color,
            key,
            ..Post::new(Kind::Split)
        };
        let number = self.timeline().map(TimelineTrack::next_split);
        match self.start(post)?.1 {
            Outcome::Split(groups) => {
                Ok(groups
                    .get(self.rank)
                    .cloned()
                    .flatten()
                    .map(|(group, rank)| {
                        let track = self.timeline().zip(number).map(|(t, n)| t.split(n, color));
                        LocalComm::member(group, rank, track)
                    }))
            }
            _ => Err(CommError::Mismatch {
                detail: "split resolved without groups".into(),
            }),
        }
    }

    fn run_async<R, F>(&self, job: F) -> Result<Pending<R>>
    where
        R: Send + 'static,
        F: FnOnce(&Self) -> Result<R> + Send + 'static,
    {
        self.lane_worker()?.submit(job)
    }

    fn run_job<J: AsyncJob<Self>>(
        &self,
        slot: &mut JobSlot<J, J::Output>,
        job: J,
    ) -> Result<Pending<J::Output>> {
        self.lane_worker()?.submit_slot(slot, job)
    }
}

impl LocalComm {
    /// The rank's asynchronous lane, started on first use.
    fn lane_worker(&self) -> Result<&Worker<LocalComm>> {
        if let Some(worker) = self.worker.get() {
            return Ok(worker);
        }
        // A lane's own communicator has no duplicate group.
        let shadow = self.group.shadow.clone().ok_or_else(|| {
            CommError::InvalidArgument(
                "asynchronous jobs cannot start further asynchronous jobs".into(),
            )
        })?;
        let lane = LocalComm::member(shadow, self.rank, self.timeline().map(TimelineTrack::lane));
        let worker = Worker::start(format!("gradwire-comm-{}", self.rank), self.rank, lane)?;
        Ok(self.worker.get_or_init(|| worker))
    }
}

/// The lane is the duplicate group: a lost lane poisons it, which fails the
/// round any peer waits in (and wakes its receives) and every later call of
/// every rank, at once.
impl Lane for LocalComm {
    fn poisoned(&self) -> Option<CommError> {
        self.group.poison_error()
    }

    fn announce_lost(&self, lost: &CommError) {
        self.group.poison(lost.clone());
    }

    fn interrupter(&self) -> Interrupter {
        let group = Arc::clone(&self.group);
        Box::new(move |err| group.poison(err))
    }
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        // Leave the group first: peers blocked on this rank fail now rather
        // than after this rank's queued asynchronous jobs.
        self.group.depart(self.rank);
        match (self.worker.take(), &self.group.shadow) {
            // The worker's own communicator leaves the duplicate group when the
            // worker has run the jobs already queued; a panicking rank does not
            // make its peers wait for those.
            (Some(worker), shadow) => {
                if let (true, Some(shadow)) = (std::thread::panicking(), shadow) {
                    shadow.poison(CommError::PeerLost {
                        op: "async job",
                        ranks: vec![self.rank],
                    });
                }
                drop(worker);
            }
            // No worker ever started: leave the duplicate group directly, so
            // peers waiting there for this rank's jobs learn it never comes.
            (None, Some(shadow)) => shadow.depart(self.rank),
            (None, None) => {}
        }
    }
}
