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
//!   [`chunk_range`] of all W buffers in rank order with the same kernels as
//!   LocalComm (`element.rs`'s block kernels, through `rank_order.rs`). So
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

mod deadline;
use deadline::{NOTICE_TAG, Notice};
mod sys;

use crate::communicator::{Communicator, Gathered, chunk_range};
use crate::element::{ElemType, Element};
use crate::error::{CommError, Result};
use crate::header::{self, Call, Kind};
use crate::job_slot::{AsyncJob, JobSlot};
use crate::op::ReduceOp;
use crate::pending::Pending;
use crate::worker::{Lane, Worker};
use std::cell::{Cell, OnceCell, RefCell};
use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use sys::{Comm, Env, HalfKind, Layout, NativeOp, Outgoing, Wire};

pub use sys::ThreadLevel;

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

    /// The time this rank's calls have taken since the communicator was
    /// made: the network's share of a training step, beside the codecs'
    /// and the model's.
    pub fn time_in_calls(&self) -> CallTime {
        let read = |n: &AtomicU64| Duration::from_nanos(n.load(Ordering::Relaxed));
        CallTime {
            caller: read(&self.busy),
            jobs: read(&self.jobs_busy),
            waiting: read(&self.waiting) + read(&self.jobs_waiting),
        }
    }

    /// Open MPI's own `MPI_Allreduce` (its algorithm, its reduction order),
    /// for f32, f64 and the integer types, with `Sum`, `Max` or `Min`, and
    /// the sum of f16 and bf16:
    /// what Horovod and plain MPI programs call, so that a training loop
    /// can be measured against them. The call is agreed first like every
    /// collective here (mismatched lengths or types are a typed error on
    /// every rank, not undefined behaviour), but the sum is MPI's: it is
    /// the same on every rank in Open MPI's algorithms, yet not guaranteed
    /// bitwise equal to gradwire's rank-ordered [`Communicator::all_reduce`].
    ///
    /// f16 and bf16 are summed by a user-defined MPI operation (MPI cannot
    /// add them), each pair added in f32 and rounded once, as Horovod's
    /// float16 sum does (gradwire's own all-reduce accumulates in f32).
    ///
    /// # Errors
    /// [`CommError::Unsupported`] for `Avg` (MPI has no mean: sum and
    /// divide) and for `Max` or `Min` of f16 and bf16; the errors of any
    /// collective.
    pub fn library_all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let half = match T::TYPE {
            ElemType::F16 => Some(HalfKind::F16),
            ElemType::BF16 => Some(HalfKind::BF16),
            _ => None,
        };
        // Refused alike on every rank (the same op and type everywhere, or
        // the agreement below would have failed first) before any round.
        let supported = match (op, half) {
            (ReduceOp::Sum, Some(kind)) => Some(NativeOp::HalfSum(kind)),
            (_, Some(_)) | (ReduceOp::Avg, None) => None,
            (ReduceOp::Sum, None) => Some(NativeOp::Sum),
            (ReduceOp::Max, None) => Some(NativeOp::Max),
            (ReduceOp::Min, None) => Some(NativeOp::Min),
        };
        let _busy = self.busy();
        self.agree(Call {
            elem: Some(T::TYPE),
            op: Some(op),
            len: buf.len(),
            ..Call::new(Kind::LibraryAllReduce)
        })?;
        let native = supported.ok_or_else(|| {
            CommError::Unsupported(format!(
                "MPI_Allreduce of {:?} with {op:?} (it takes Sum, Max or Min of f32, f64 and \
                 integers, and Sum of f16 and bf16)",
                T::TYPE
            ))
        })?;
        if self.size == 1 || buf.is_empty() {
            return Ok(());
        }
        // MPI_IN_PLACE is not among rsmpi's handles: the input is staged.
        self.with_scratch::<T, _>(buf.len(), |send| {
            send.copy_from_slice(buf);
            sys::all_reduce(self.comm, wire::<T>(), send, buf, native)
        })
    }

    /// Counts the time until the guard drops into this rank's call time.
    fn busy(&self) -> BusyGuard<'_> {
        BusyGuard {
            total: &self.busy,
            ended: &self.call_ended,
            since: Instant::now(),
            _call: self.flight.call(),
        }
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

    /// The agreement on `call` ([`crate::protocol::agree`]) over this
    /// communicator's header exchange.
    fn agree(&self, call: Call) -> Result<Vec<Call>> {
        crate::protocol::agree(self, call)
    }

    /// Borrows the reusable staging area as `n` elements of `T`.
    fn with_scratch<T: Element, R>(&self, n: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
        let mut scratch = self.scratch.borrow_mut();
        let words = (n * std::mem::size_of::<T>()).div_ceil(8);
        if scratch.len() < words {
            scratch.resize(words, 0);
        }
        let all: &mut [T] = bytemuck::cast_slice_mut(&mut scratch[..words]);
        f(&mut all[..n])
    }

    /// The reduction both `all_reduce` and `reduce_scatter` are made of: this
    /// rank's chunk of every rank's `send` arrives (`MPI_Alltoallv`) and is
    /// reduced in rank order into `out` (this rank's chunk of the result).
    fn reduce_chunk<T: Element>(
        &self,
        send: &[T],
        op: ReduceOp,
        stage: &mut [T],
        out: &mut [T],
    ) -> Result<()> {
        let (w, me, len) = (self.size, self.rank, send.len());
        let mine = chunk_range(len, w, me);
        let n = mine.len();
        let mut send_counts = vec![0 as c_int; w];
        let mut send_displs = vec![0 as c_int; w];
        let mut recv_counts = vec![0 as c_int; w];
        let mut recv_displs = vec![0 as c_int; w];
        for q in 0..w {
            let theirs = chunk_range(len, w, q);
            send_displs[q] = sys::int("offset", theirs.start)?;
            recv_displs[q] = sys::int("offset", q * n)?;
            // This rank's own chunk is read in place, never sent to itself.
            if q != me {
                send_counts[q] = sys::int("chunk", theirs.len())?;
                recv_counts[q] = sys::int("chunk", n)?;
            }
        }
        sys::all_to_all_varied(
            self.comm,
            wire::<T>(),
            send,
            Layout {
                counts: &send_counts,
                displs: &send_displs,
            },
            stage,
            Layout {
                counts: &recv_counts,
                displs: &recv_displs,
            },
        )?;
        let own = send.get(mine).unwrap_or(&[]);
        let sources: Vec<&[T]> = (0..w)
            .map(|q| {
                if q == me {
                    own
                } else {
                    stage.get(q * n..(q + 1) * n).unwrap_or(&[])
                }
            })
            .collect();
        crate::rank_order::in_rank_order(&sources, op, w, out)
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

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank < self.size {
            Ok(())
        } else {
            Err(CommError::InvalidRank {
                rank,
                world_size: self.size,
            })
        }
    }
}

/// How elements of `T` travel: as themselves, the half types as 16-bit
/// words (MPI only moves them; gradwire reduces them).
fn wire<T: Element>() -> Wire {
    match T::TYPE {
        ElemType::F16 | ElemType::BF16 => Wire::U16,
        ElemType::F32 => Wire::F32,
        ElemType::F64 => Wire::F64,
        ElemType::U8 => Wire::U8,
        ElemType::U32 => Wire::U32,
        ElemType::U64 => Wire::U64,
        ElemType::I32 => Wire::I32,
        ElemType::I64 => Wire::I64,
    }
}

/// The tag a point-to-point message of `elem` travels with.
fn tag_of(elem: ElemType) -> c_int {
    ElemType::ALL
        .iter()
        .position(|&e| e == elem)
        .map_or(0, |i| i as c_int + 1)
}

fn elem_of(tag: c_int) -> Option<ElemType> {
    usize::try_from(tag)
        .ok()
        .and_then(|t| t.checked_sub(1))
        .and_then(|i| ElemType::ALL.get(i).copied())
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn flight_records(&self) -> Vec<crate::FlightRecord> {
        self.flight.records()
    }

    fn timeline(&self) -> Option<&crate::TimelineTrack> {
        self.flight.timeline()
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let _busy = self.busy();
        self.agree(Call {
            elem: Some(T::TYPE),
            op: Some(op),
            len: buf.len(),
            ..Call::new(Kind::AllReduce)
        })?;
        let (w, len) = (self.size, buf.len());
        // One rank: the result is the input, for every op (Avg: x / 1 == x).
        if w == 1 || len == 0 {
            return Ok(());
        }
        sys::int("all_reduce length", len)?;
        // Cut into segments that stay in cache from their arrival through
        // the reduction to their departure: an element's result does not
        // depend on the segment it is in (its rank-order reduction is the
        // same), so segmenting changes no bit, only the memory traffic.
        let seg_len = (self.segment_bytes / std::mem::size_of::<T>()).max(w);
        let most = chunk_range(seg_len.min(len), w, 0).len();
        self.with_scratch::<T, _>(w * most + most, |scratch| {
            let (stage, out) = scratch.split_at_mut(w * most);
            for start in (0..len).step_by(seg_len) {
                let seg = start..(start + seg_len).min(len);
                let Some(part) = buf.get_mut(seg) else {
                    break;
                };
                let seg_len = part.len();
                let n = chunk_range(seg_len, w, self.rank).len();
                // Same on every rank (validated length): everyone fails alike.
                let counts = (0..w)
                    .map(|q| sys::int("chunk", chunk_range(seg_len, w, q).len()))
                    .collect::<Result<Vec<_>>>()?;
                let displs = (0..w)
                    .map(|q| sys::int("offset", chunk_range(seg_len, w, q).start))
                    .collect::<Result<Vec<_>>>()?;
                let (stage, out) = (&mut stage[..w * n], &mut out[..n]);
                self.reduce_chunk(part, op, stage, out)?;
                sys::all_gather_varied(self.comm, wire::<T>(), out, part, &counts, &displs)?;
            }
            Ok(())
        })
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let _busy = self.busy();
        self.agree(Call {
            elem: Some(T::TYPE),
            len: buf.len(),
            root,
            ..Call::new(Kind::Broadcast)
        })?;
        sys::broadcast(self.comm, wire::<T>(), buf, root)
    }

    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let _busy = self.busy();
        self.agree(Call {
            elem: Some(T::TYPE),
            len: send.len(),
            recv_len: recv.len(),
            ..Call::new(Kind::AllGather)
        })?;
        sys::all_gather(self.comm, wire::<T>(), send, recv)
    }

    fn all_gather_varied<T: Element>(&self, send: &[T]) -> Result<Gathered<T>> {
        let _busy = self.busy();
        // The header exchange carries every rank's count: counts first.
        let calls = self.agree(Call {
            elem: Some(T::TYPE),
            len: send.len(),
            ..Call::new(Kind::AllGatherVaried)
        })?;
        let lens: Vec<usize> = calls.iter().map(|c| c.len).collect();
        let mut counts = Vec::with_capacity(lens.len());
        let mut displs = Vec::with_capacity(lens.len());
        let mut total = 0usize;
        for &l in &lens {
            displs.push(sys::int("all_gather_varied offset", total)?);
            counts.push(sys::int("all_gather_varied count", l)?);
            total += l;
        }
        sys::int("all_gather_varied total", total)?;
        let mut data = vec![T::zeroed(); total];
        sys::all_gather_varied(self.comm, wire::<T>(), send, &mut data, &counts, &displs)?;
        Gathered::new(data, &lens)
    }

    fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let _busy = self.busy();
        self.agree(Call {
            elem: Some(T::TYPE),
            op: Some(op),
            len: send.len(),
            recv_len: recv.len(),
            ..Call::new(Kind::ReduceScatter)
        })?;
        let n = recv.len();
        self.with_scratch::<T, _>(self.size * n, |stage| {
            self.reduce_chunk(send, op, stage, recv)
        })
    }

    fn send<T: Element>(&self, buf: &[T], dest: usize) -> Result<()> {
        let _busy = self.busy();
        self.check_rank(dest)?;
        self.enter("send")?;
        self.check_notice(None)?;
        let bytes = bytemuck::cast_slice::<T, u8>(buf).to_vec();
        let outgoing = sys::isend(self.comm, bytes, dest, tag_of(T::TYPE))?;
        self.outbox.borrow_mut().push(outgoing);
        Ok(())
    }

    fn recv<T: Element>(&self, buf: &mut [T], src: usize) -> Result<()> {
        let _busy = self.busy();
        self.check_rank(src)?;
        self.enter("recv")?;
        // What the sender sent before it left (or gave up) is still
        // received: a first look before the notices.
        let mut found = sys::improbe(self.comm, Some(src), None)?;
        if found.is_none()
            && let Err(err) = self.heed_notices(None)
        {
            // One last look, as `poll` takes: the message may have come
            // after the notice.
            found = sys::improbe(self.comm, Some(src), None)?;
            if found.is_none() {
                return Err(err);
            }
        }
        self.poll("recv", &[src], None, || {
            if found.is_none() {
                found = sys::improbe(self.comm, Some(src), None)?;
            }
            Ok(found.is_some())
        })?;
        let Some(probed) = found else {
            return Err(CommError::Mpi {
                op: "MPI_Improbe",
                code: -1,
                message: "a receive ended without a message".into(),
            });
        };
        if probed.tag == NOTICE_TAG {
            // The sender gave up or left before it sent what this rank
            // waits for; or the notice was for an earlier communicator of
            // this context, ignored: the message is still to come.
            self.take_notice(probed)?;
            self.heed_notices(None)?;
            return self.recv(buf, src);
        }
        let want = std::mem::size_of_val(buf);
        match elem_of(probed.tag) {
            Some(elem) if elem == T::TYPE && probed.bytes == want => {
                probed.receive(bytemuck::cast_slice_mut::<T, u8>(buf))
            }
            elem => {
                // Consume the message, as LocalComm does: the next recv must
                // not find it again.
                let bytes = probed.bytes;
                probed.receive(&mut vec![0u8; bytes])?;
                let (len, name) = match elem {
                    Some(e) => (bytes / e.size_in_bytes(), e.as_str()),
                    None => (bytes, "unknown elements"),
                };
                Err(CommError::Mismatch {
                    detail: format!(
                        "rank {src} sent {len} elements of {name} to rank {}, which receives {} of {}",
                        self.rank,
                        buf.len(),
                        T::TYPE
                    ),
                })
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
        // Sends are eager, so a ring of sendrecvs cannot deadlock.
        self.check_rank(src)?;
        self.send(send, dest)?;
        self.recv(recv, src)
    }

    fn barrier(&self) -> Result<()> {
        let _busy = self.busy();
        crate::protocol::barrier(self)
    }

    fn post_fault(&self, kind: crate::FaultKind) -> CommError {
        crate::protocol::post_fault(self, kind)
    }

    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Self>> {
        let number = self.timeline().map(crate::TimelineTrack::next_split);
        let plan = crate::protocol::split_plan(self, color, key)?;
        let (mpi_color, mpi_key) = plan.get(self.rank).copied().unwrap_or((None, 0));
        match sys::comm_split(self.comm, mpi_color, mpi_key)? {
            None => Ok(None),
            Some(comm) => self.adopt_sub(comm, number.map(|n| (n, color))).map(Some),
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

/// MpiComm's header exchange: a non-blocking all-gather (`MPI_Iallgather`,
/// polled with the deadline), so a rank that never arrives is a `Timeout`,
/// not a hang. Once it completed every rank is present, and the data phase
/// that follows uses MPI's blocking collectives; a peer that gave up on this
/// very round (its deadline passed just before a late rank arrived) has told
/// everyone in a notice, which is checked here before any data moves.
impl crate::protocol::HeaderTransport for MpiComm {
    fn gather_headers<R>(
        &self,
        op: &'static str,
        mine: [i64; header::WORDS],
        then: impl FnOnce(&[i64]) -> Result<R>,
    ) -> Result<R> {
        self.enter(op)?;
        let round = self.rounds.get();
        // A peer already said it will not come.
        self.check_notice(Some(round))?;
        self.rounds.set(round + 1);
        let mut gathering = sys::iallgather(self.comm, mine.to_vec(), self.size)?;
        self.poll(op, &[], Some(round), || gathering.test())?;
        self.heed_notices(Some(round))?;
        let all = gathering.received().ok_or_else(|| CommError::Mpi {
            op: "MPI_Iallgather",
            code: -1,
            message: "the header exchange completed without its data".into(),
        })?;
        then(all)
    }

    fn poison(&self, err: CommError) -> CommError {
        MpiComm::poison(self, err)
    }

    fn flight(&self) -> &crate::flight::FlightRecorder {
        &self.flight
    }

    fn away(&self) -> Option<Duration> {
        Some(self.call_ended.get()?.elapsed())
    }

    fn waited(&self, wait: Duration) {
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.waiting.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl MpiComm {
    /// The rank's asynchronous lane, started on first use.
    fn lane_worker(&self) -> Result<&Worker<MpiComm>> {
        if let Some(worker) = self.worker.get() {
            return Ok(worker);
        }
        let worker = self.start_worker()?;
        Ok(self.worker.get_or_init(|| worker))
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

/// What [`MpiComm::time_in_calls`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallTime {
    /// In the calls made on the communicator itself.
    pub caller: Duration,
    /// In the calls of its asynchronous jobs (DistOpt's buckets).
    pub jobs: Duration,
    /// Of both, the time this rank waited in the calls' agreements for the
    /// last rank to arrive: how much longer than this rank the last one was
    /// away from the communicator before each call (every rank sends its
    /// time away in the call's header). What remains of the calls' time is
    /// the network's.
    pub waiting: Duration,
}

/// Adds the time from its making to its drop to a communicator's total.
struct BusyGuard<'a> {
    total: &'a AtomicU64,
    /// Set to the call's end.
    ended: &'a Cell<Option<Instant>>,
    since: Instant,
    /// Ends the call's collective on the timeline (its data moved).
    _call: crate::flight::CallGuard<'a>,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        let now = Instant::now();
        let nanos = u64::try_from((now - self.since).as_nanos()).unwrap_or(u64::MAX);
        self.total.fetch_add(nanos, Ordering::Relaxed);
        self.ended.set(Some(now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_name_element_types() {
        for e in ElemType::ALL {
            assert_eq!(elem_of(tag_of(e)), Some(e));
        }
        assert_eq!(elem_of(0), None);
        assert_eq!(elem_of(99), None);
        assert_eq!(elem_of(NOTICE_TAG), None);
    }
}
