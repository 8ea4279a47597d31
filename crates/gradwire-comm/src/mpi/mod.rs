//! `MpiComm`: the [`Communicator`] over MPI processes (feature `mpi`).
//!
//! Processes are started by `mpirun` (or `srun`), one rank each, on one host
//! or many; [`MpiComm::world`] initializes MPI and returns this process's
//! communicator. It keeps every promise [`LocalComm`](crate::LocalComm)
//! makes, with MPI doing the transport:
//!
//! - **Checked calls.** Before each collective the ranks all-gather a
//!   72-byte header: a description of their call (kind, element type, op,
//!   lengths, root) and their time away since their previous call, from
//!   which each rank learns its wait for the last one (`header.rs`). Every
//!   rank validates the same descriptions, so a mismatch (lengths, element
//!   types, ops, roots, even a different collective) is
//!   [`CommError::Mismatch`] on every rank, before any data moves, instead
//!   of MPI's undefined behaviour; the communicator stays usable.
//!   Communicators use `MPI_ERRORS_RETURN`, and a failing MPI call becomes
//!   [`CommError::Mpi`] with MPI's message.
//! - **Deterministic reductions, bitwise equal to LocalComm.** MPI only moves
//!   bytes (`MPI_Alltoallv`, then `MPI_Allgatherv`); each rank reduces its
//!   [`chunk_range`](crate::chunk_range) of all W buffers in rank order
//!   with the same kernels as LocalComm (`element.rs`'s block kernels,
//!   through `rank_order.rs`). So
//!   `all_reduce` and `reduce_scatter` give the same bits on every rank, in
//!   every run, whatever algorithm MPI's tuning picks, and the same bits as
//!   LocalComm for the same inputs. This is also how f16 and bf16 are
//!   reduced (MPI has no half types): accumulated in
//!   f32, rounded once. `Avg` is the sum divided by W in the accumulator's
//!   precision (f32 for the half types, the type itself otherwise), then
//!   rounded; it is refused for integers, as on every backend.
//! - **Eager sends.** [`Communicator::send`] copies the message and starts an
//!   `MPI_Isend`, so it returns at once even for large messages (a ring of
//!   sends followed by receives cannot deadlock); the element type travels in
//!   the tag, and [`Communicator::recv`] matches the message with
//!   `MPI_Improbe` and checks its type and length before it receives it
//!   (`Mismatch` otherwise, the message consumed, as LocalComm does).
//! - **Asynchronous jobs on their own thread.** MPI is initialized with
//!   `MPI_THREAD_MULTIPLE`. Every communicator is created with a duplicate
//!   (`MPI_Comm_dup`, made at construction because it is collective);
//!   [`Communicator::run_async`] runs jobs in order on a communication thread
//!   (the worker every backend shares) that owns the duplicate, concurrently
//!   with the caller's blocking calls on the original. A job that panics
//!   loses the lane on every rank: its rank poisons the duplicate and sends
//!   each peer a notice ([`CommError::Fault`] of kind `LaneLost`),
//!   which ends the lane's collective or `recv` a peer waits in, or its
//!   next one. Funnelling every call through one thread would also
//!   work at `MPI_THREAD_FUNNELED`, but then a blocking call queued behind a
//!   job would make the two interleave in program order, which ranks need
//!   not share (LocalComm's async group is independent of the blocking one):
//!   it could deadlock where LocalComm does not. When MPI grants less than
//!   `MPI_THREAD_MULTIPLE`, `run_async` returns [`CommError::Unsupported`]
//!   and the blocking calls still work (from the initializing thread only,
//!   below `MPI_THREAD_SERIALIZED`).
//!
//! - **A deadline instead of a hang.** [`MpiConfig::timeout`] (10 minutes
//!   by default, [`MpiComm::world_with`] to change it; split communicators
//!   inherit it) bounds every wait for a peer. The header exchange is a
//!   non-blocking `MPI_Iallgather` and `recv` looks for its message with
//!   `MPI_Improbe`, both polled: a short spin, then yields, then sleeps of
//!   at most a 64th of the time already waited (1 ms at most), so a short
//!   wait pays no sleep and a long one little CPU. Past the deadline the
//!   call returns [`CommError::Timeout`] (naming the sender a `recv` waited
//!   for; MPI cannot tell who is missing from a collective) and the
//!   communicator is *poisoned*: every later call returns the same error.
//!   The rank also tells every peer, in a *notice* (a point-to-point message
//!   with a tag of its own, naming the first collective it will not take
//!   part in), and every wait watches for notices: so the peers' calls fail
//!   with the same error, at once, instead of at their own deadlines, as
//!   LocalComm's shared group does. A rank that arrives at a collective after
//!   its peers gave up on it finds their notices right after its header
//!   exchange, before any data moves.
//!
//!   The data phase after a completed header exchange uses MPI's blocking
//!   collectives (every rank has arrived, and they cannot be cancelled
//!   anyway). One race remains: a rank whose deadline passes at the very
//!   moment the last rank arrives may give up on a round the others
//!   complete; their data phase then waits for it, and a notice cannot
//!   reach a blocking MPI call. Give every rank the same deadline, far
//!   longer than any step. A header exchange that timed out leaves its
//!   request behind (MPI can neither cancel nor free a collective request)
//!   with its buffers, leaked on purpose, until MPI is finalized.
//!
//!   A *process* that dies makes `mpirun` end the whole job. A rank that
//!   unwinds (panics) while it holds a communicator calls `MPI_Abort`, which
//!   ends the job at once rather than at the peers' deadlines.
//!
//! MPI is finalized when the last `MpiComm` (and the duplicates behind their
//! asynchronous jobs) is dropped, if this crate initialized it. MPI allows one
//! initialization per process: keep the world communicator alive for as long
//! as the program uses MPI, and drop it on the thread that created it.
//!
//! ```no_run
//! use gradwire_comm::{Communicator, ReduceOp, mpi::MpiComm};
//!
//! // mpirun -np 4 ./my-program
//! let comm = MpiComm::world()?;
//! let mut grad = vec![comm.rank() as f32; 3];
//! comm.all_reduce(&mut grad, ReduceOp::Sum)?;
//! assert_eq!(grad, vec![6.0; 3]);
//! # Ok::<(), gradwire_comm::CommError>(())
//! ```

mod collectives;
mod deadline;
mod lane;
mod sys;
mod timing;

use crate::communicator::Communicator;
use crate::error::{CommError, Result};
use crate::header::{Call, Kind};
use crate::worker::Worker;
use deadline::Notice;
use std::cell::{Cell, OnceCell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use sys::{Comm, Env, Outgoing};

pub use sys::ThreadLevel;
pub use timing::CallTime;

/// Settings of an [`MpiComm`] (and of the communicators split from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiConfig {
    /// How long a rank waits for the others in a collective's header
    /// exchange, or for a message in `recv`, before the call fails with
    /// [`CommError::Timeout`] and the communicator is poisoned. `None` waits
    /// forever. Default: 10 minutes, as LocalComm's and NcclComm's.
    pub timeout: Option<Duration>,
    /// Bytes of each segment of an all-reduce (each segment is a
    /// reduce-scatter and an all-gather; no bit of the result depends on
    /// it). `None`, the default, chooses when the communicator is made:
    /// 1 MiB when every rank shares this host (shared memory: a segment
    /// stays in cache from arrival to departure), 16 MiB when the ranks
    /// span hosts (a network: each segment costs two collectives'
    /// latency, milliseconds over TCP, so fewer and larger is faster).
    pub segment_bytes: Option<usize>,
    /// Where the flight record is written when a deadline expires or a
    /// peer is lost (see [`crate::LocalConfig::flight_recorder`]).
    /// Default: `$GRADWIRE_FLIGHT_RECORDER`.
    pub flight_recorder: Option<std::path::PathBuf>,
    /// Whether the rank keeps a timeline (see
    /// [`crate::LocalConfig::timeline`]). Default: off.
    pub timeline: bool,
}

impl Default for MpiConfig {
    fn default() -> Self {
        MpiConfig {
            timeout: Some(Duration::from_secs(600)),
            segment_bytes: None,
            flight_recorder: crate::flight::flight_dir_from_env(),
            timeline: false,
        }
    }
}

impl MpiConfig {
    /// The default settings with another deadline.
    pub fn with_timeout(timeout: Option<Duration>) -> Self {
        MpiConfig {
            timeout,
            ..MpiConfig::default()
        }
    }
}

/// One rank of an MPI communicator. `Send` (it may move to another thread
/// at `MPI_THREAD_MULTIPLE`) but not `Sync`: one rank's calls happen in
/// order, from one thread, as the trait requires.
pub struct MpiComm {
    comm: Comm,
    rank: usize,
    size: usize,
    config: MpiConfig,
    /// Header exchanges started on this communicator: every rank counts the
    /// same rounds, so a round number means the same collective everywhere.
    rounds: Cell<u64>,
    /// This communicator's serial, agreed by its ranks when it was made
    /// (an asynchronous jobs' communicator takes its parent's), larger than
    /// any earlier one of this process: its notices carry it, so that one
    /// for an earlier communicator is never taken for this one's.
    serial: u64,
    /// Whether dropping it tells the peers (a communicator over the whole
    /// job, [`MpiComm::world`], and its asynchronous jobs' one). Such a
    /// communicator is then left to MPI, never freed: a notice a peer does
    /// not receive must not stay in a context that MPI could give to a
    /// later communicator, where it would upset MPI's own ordering of
    /// messages. Sub-communicators (splits) are freed and send nothing.
    departs: bool,
    /// Set when this rank gave up (a timeout) or learned that a peer did:
    /// every later call fails with it.
    poison: RefCell<Option<CommError>>,
    /// The earliest round a peer said it will not take part in.
    notice: RefCell<Option<Notice>>,
    /// The duplicate that asynchronous jobs run on, until the worker takes
    /// it (`None` for a worker's own communicator: no nested jobs).
    shadow: Cell<Option<Comm>>,
    worker: OnceCell<Worker<MpiComm>>,
    /// Sends in flight (eager sends own their bytes until MPI is done).
    outbox: RefCell<Vec<Outgoing>>,
    /// All-reduce segments' size ([`MpiConfig::segment_bytes`], decided).
    segment_bytes: usize,
    /// Staging for reductions, kept between calls: a fresh multi-megabyte
    /// allocation per call would page-fault on every first touch. Stored as
    /// u64 so that it is aligned for every element type.
    scratch: RefCell<Vec<u64>>,
    /// Nanoseconds this communicator's calls spent (MPI and the reductions
    /// between its calls), and those of its asynchronous jobs'
    /// communicator: [`MpiComm::time_in_calls`].
    busy: Arc<AtomicU64>,
    jobs_busy: Arc<AtomicU64>,
    /// Nanoseconds of those calls this rank waited in the agreement for
    /// the last rank to arrive, and those of its asynchronous jobs'.
    waiting: Arc<AtomicU64>,
    jobs_waiting: Arc<AtomicU64>,
    /// When this communicator's previous call ended (the header's time
    /// away is counted from it).
    call_ended: Cell<Option<Instant>>,
    /// Its last collectives.
    flight: crate::flight::FlightRecorder,
    /// Held last: MPI is finalized when the last holder drops it.
    env: Arc<Env>,
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("world_size", &self.size)
            .field("threading", &self.env.level)
            .finish_non_exhaustive()
    }
}

impl MpiComm {
    /// This process's communicator over every process of the job (a
    /// duplicate of `MPI_COMM_WORLD`, so gradwire's traffic never mixes with
    /// the application's). Initializes MPI (`MPI_THREAD_MULTIPLE`) on first
    /// use. Collective: every process of the job must call it.
    pub fn world() -> Result<MpiComm> {
        MpiComm::world_with(&MpiConfig::default())
    }

    /// [`MpiComm::world`] with settings (a deadline). Each call makes a new
    /// duplicate of `MPI_COMM_WORLD`: a program may hold several, with
    /// different deadlines.
    pub fn world_with(config: &MpiConfig) -> Result<MpiComm> {
        let env = Env::get()?;
        env.check_thread("world")?;
        let comm = sys::dup_world()?;
        let mut world = MpiComm::adopt(env, comm, config.clone(), true, None, None, true)?;
        if config.timeline {
            world.attach_timeline(crate::TimelineTrack::world(world.rank));
        }
        Ok(world)
    }

    /// Logs this communicator's collectives on `track` (before its first).
    fn attach_timeline(&mut self, track: crate::TimelineTrack) {
        self.flight = crate::flight::FlightRecorder::new(
            self.rank,
            self.size,
            self.config.flight_recorder.clone(),
            Some(track),
        );
    }

    /// The deadline of this communicator's calls.
    pub fn timeout(&self) -> Option<Duration> {
        self.config.timeout
    }

    /// The all-reduce segment this communicator uses (see
    /// [`MpiConfig::segment_bytes`]).
    pub fn segment_bytes(&self) -> usize {
        self.segment_bytes
    }

    /// Wraps a communicator this crate created (and will free), with a
    /// duplicate for asynchronous jobs when `with_shadow`.
    ///
    /// Collective over `comm` unless the segment size and the serial are
    /// given (a worker's communicator takes its parent's): an automatic
    /// segment is decided by a shared-memory split, the same on every rank,
    /// and the serial by an all-reduce.
    fn adopt(
        env: Arc<Env>,
        comm: Comm,
        config: MpiConfig,
        with_shadow: bool,
        segment_bytes: Option<usize>,
        serial: Option<u64>,
        departs: bool,
    ) -> Result<MpiComm> {
        let decided = sys::rank_and_size(comm).and_then(|(rank, size)| {
            let segment = match segment_bytes.or(config.segment_bytes) {
                Some(bytes) => bytes.max(1),
                None if spans_hosts(comm, rank, size)? => NETWORK_SEGMENT_BYTES,
                None => SEGMENT_BYTES,
            };
            let serial = match serial {
                Some(serial) => serial,
                None => agree_serial(comm)?,
            };
            Ok((rank, size, segment, serial))
        });
        let (rank, size, segment_bytes, serial) = match decided {
            Ok(decided) => decided,
            Err(e) => {
                sys::comm_free(comm);
                return Err(e);
            }
        };
        let shadow = if with_shadow {
            match sys::comm_dup(comm) {
                Ok(s) => Some(s),
                Err(e) => {
                    sys::comm_free(comm);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let flight =
            crate::flight::FlightRecorder::new(rank, size, config.flight_recorder.clone(), None);
        Ok(MpiComm {
            flight,
            comm,
            rank,
            size,
            config,
            rounds: Cell::new(0),
            serial,
            departs,
            poison: RefCell::new(None),
            notice: RefCell::new(None),
            shadow: Cell::new(shadow),
            worker: OnceCell::new(),
            outbox: RefCell::new(Vec::new()),
            scratch: RefCell::new(Vec::new()),
            segment_bytes,
            busy: Arc::default(),
            jobs_busy: Arc::default(),
            waiting: Arc::default(),
            jobs_waiting: Arc::default(),
            call_ended: Cell::new(None),
            env,
        })
    }

    /// The thread support MPI granted.
    pub fn threading(&self) -> ThreadLevel {
        self.env.level
    }

    /// The processes that share this one's host (`MPI_Comm_split_type` with
    /// `MPI_COMM_TYPE_SHARED`), ordered by their rank here: its rank is this
    /// process's local rank. The NCCL backend picks a GPU with it and
    /// broadcasts its unique id over it. Collective.
    pub fn node(&self) -> Result<MpiComm> {
        self.agree(Call::new(Kind::SplitShared))?;
        let key = sys::int("rank", self.rank)?;
        let comm = sys::comm_split_shared(self.comm, key)?;
        // A host's group is set-up, not training: no timeline track.
        self.adopt_sub(comm, None)
    }

    /// Wraps `comm`, a sub-communicator just split from this one (a split
    /// or a node's): collective over it; freed when dropped, without a
    /// departure notice. With this rank's timeline on, its track is the
    /// split's `(number, color)`.
    fn adopt_sub(&self, comm: Comm, split: Option<(u64, Option<u32>)>) -> Result<MpiComm> {
        let mut sub = MpiComm::adopt(
            Arc::clone(&self.env),
            comm,
            self.config.clone(),
            true,
            None,
            None,
            false,
        )?;
        if let (Some(track), Some((number, color))) = (self.timeline(), split) {
            sub.attach_timeline(track.split(number, color));
        }
        Ok(sub)
    }

    /// This process's rank among those on its host, and how many there are,
    /// asked of MPI (a shared-memory split, freed again). Collective. Before
    /// MPI is up, [`crate::LaunchEnv`] reads the launcher's announcement.
    pub fn local_rank(&self) -> Result<(usize, usize)> {
        let node = self.node()?;
        Ok((node.rank, node.size))
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Peers would wait for this rank in their next collective forever
            // (MPI has no deadline): end the job now, loudly.
            eprintln!(
                "gradwire: rank {} unwound while holding an MpiComm; aborting the MPI job",
                self.rank
            );
            sys::abort(self.comm, 70);
        }
        // Queued jobs are collectives the peers also run: let them finish
        // (the jobs' communicator then departs from its own context).
        drop(self.worker.take());
        // A peer still calling (this rank returned early, on an error)
        // fails at once with `PeerLost` instead of waiting out its deadline.
        if self.departs {
            self.depart();
        }
        for mut outgoing in self.outbox.take() {
            // A send nobody received is left to MPI (its buffer leaked)
            // rather than waited for.
            if !outgoing.test().unwrap_or(false) {
                outgoing.abandon();
            }
        }
        if let Some(shadow) = self.shadow.take() {
            // No job ever ran on it (the worker takes it): nothing in flight.
            sys::comm_free(shadow);
        }
        // A departed communicator stays allocated until MPI is finalized
        // (see `departs`).
        if !self.departs {
            sys::comm_free(self.comm);
        }
        // `env` drops after this body: MPI is finalized after the frees.
    }
}

/// Bytes of an all-reduce segment (see `all_reduce`): small enough that a
/// segment's chunks stay in a core's L2 between the exchange and the
/// reduction, large enough that per-call latency is amortised.
const SEGMENT_BYTES: usize = 1 << 20;

/// The segment of communicators that span hosts (see
/// [`MpiConfig::segment_bytes`]): on TCP between namespaces at 1 Gbit/s, a
/// 16 MiB all-reduce of 4 ranks took 596 ms in 1 MiB segments, 416 ms in
/// one (MPI_Allreduce: 415 ms).
const NETWORK_SEGMENT_BYTES: usize = 16 << 20;

/// Whether the ranks of `comm` are on more than one host (a shared-memory
/// split smaller than the communicator; the same answer on every rank).
/// Collective.
fn spans_hosts(comm: Comm, rank: usize, size: usize) -> Result<bool> {
    let node = sys::comm_split_shared(comm, sys::int("rank", rank)?)?;
    let local = sys::rank_and_size(node).map(|(_, local)| local);
    sys::comm_free(node);
    Ok(local? < size)
}

/// The last serial this process gave a communicator.
static LAST_SERIAL: AtomicU64 = AtomicU64::new(0);

/// A serial for the new communicator `comm`, the same on all its ranks and
/// larger than any this process gave before: the maximum over the ranks of
/// each one's next (one all-reduce). Collective over `comm`.
fn agree_serial(comm: Comm) -> Result<u64> {
    let next = [LAST_SERIAL.load(Ordering::Relaxed) + 1];
    let mut agreed = [0u64];
    sys::all_reduce(comm, sys::Wire::U64, &next, &mut agreed, sys::NativeOp::Max)?;
    LAST_SERIAL.fetch_max(agreed[0], Ordering::Relaxed);
    Ok(agreed[0])
}
