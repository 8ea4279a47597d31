//! `NcclComm`: the [`Communicator`] over NVIDIA GPUs with NCCL (feature
//! `nccl`).
//!
//! One rank per GPU, in one process (threads, [`run`]) or many (a shared
//! file, [`NcclComm::from_file`], or MPI, `NcclComm::from_mpi` with the `mpi`
//! feature too). NCCL and the CUDA driver are loaded at run time, so this
//! builds on any machine; without them every constructor returns
//! [`CommError::NcclUnavailable`]. It keeps the promises of
//! [`LocalComm`](crate::LocalComm) and `MpiComm` (feature `mpi`), with one
//! choice of its own, the arithmetic of reductions ([`NcclReduction`]):
//!
//! - **Checked calls.** Before each collective the ranks all-gather the same
//!   72-byte header as MpiComm's (`header.rs`, their call's description), so a
//!   mismatch is [`CommError::Mismatch`] on every rank before any data moves,
//!   never NCCL's undefined behaviour (a hang or a truncated buffer), and a
//!   fault a rank posts ([`Communicator::post_fault`]) ends that collective
//!   on every rank: a collective completes on every rank or fails on every
//!   rank.
//! - **NCCL's own collectives by default** ([`NcclReduction::Native`]):
//!   `ncclAllReduce` and `ncclReduceScatter` with NCCL's datatype and
//!   operator for the element type and [`ReduceOp`] (`Avg` is `ncclAvg`:
//!   each input scaled by 1/W in the element type, then summed), the
//!   fastest NCCL has (ring, tree or NVLink SHARP, as its tuning picks).
//!   The order of the additions is NCCL's and half-precision sums round in
//!   half precision, so results are not bitwise LocalComm's (they agree
//!   within the rounding of W additions) and may change with NCCL's version
//!   or the topology. Floating-point `Max` and `Min` take the rank-ordered
//!   path even here, because NCCL's drop a NaN and gradwire's propagate it;
//!   integer `Max`/`Min` are NCCL's (exact).
//! - **Deterministic reductions, bitwise equal to LocalComm, on request**
//!   ([`NcclReduction::RankOrdered`]): NCCL only moves bytes: each rank
//!   receives its [`chunk_range`](crate::chunk_range) of every rank's buffer (grouped
//!   `ncclSend`/`ncclRecv`), reduces the W chunks in rank order, and the
//!   reduced chunks are all-gathered. On host slices the reduction runs on
//!   the CPU with LocalComm's kernels (`rank_order.rs`); on CUDA tensors it
//!   runs on the GPU with `kernels/cuda/comm.cu`, which computes the same
//!   bits. The traffic is a ring all-reduce's, 2 (W-1)/W of the buffer per
//!   rank, in three NCCL calls instead of one.
//! - **Movement is NCCL's in both settings.** `broadcast` is
//!   `ncclBroadcast`, `all_gather` an in-place `ncclAllGather`, and
//!   `all_gather_varied` an `ncclAllGather` of blocks as long as the
//!   longest contribution (the lengths travel in the header exchange).
//! - **An owner thread per rank.** The NCCL communicator is used from one
//!   thread only: every NCCL call of a rank is issued there, in order. The
//!   caller's thread copies host data to and from the device and waits for
//!   the queued work in CUDA (a stream synchronisation), without sleeping.
//! - **A deadline instead of a hang.** A watchdog thread per communicator
//!   (`watchdog.rs`, as PyTorch's) watches every wait: past
//!   [`NcclConfig::timeout`] it aborts the communicator (`ncclCommAbort`,
//!   which ends the NCCL kernels and so the wait) and the call returns
//!   [`CommError::Timeout`]; errors NCCL reports asynchronously
//!   (`ncclCommGetAsyncError`: a peer's network failure, a remote abort)
//!   end the wait within milliseconds as [`CommError::Nccl`]. An aborted
//!   communicator returns that error from every later call.
//! - **No allocation per call.** Each communicator keeps one device
//!   scratch buffer (`scratch.rs`), grown to the largest call so far and
//!   reused: a host slice is uploaded into it once, reduced or moved there
//!   in place, and downloaded once.
//! - **Device tensors stay on the device.** `all_reduce_tensor` and
//!   `broadcast_tensor` (and their asynchronous forms) on a CUDA tensor call
//!   NCCL on the tensor's own buffer, ordered after the work queued on the
//!   tensor's stream and before anything queued on it later. The other
//!   `_tensor` methods take host tensors (a CUDA tensor is
//!   `DeviceMismatch`); move with `Tensor::to_device`.
//! - **Point to point with checked lengths.** A send carries a 16-byte
//!   header (element type and length) before its payload, so `recv` checks
//!   both and returns `Mismatch` (the message consumed) as LocalComm does.
//!   Unlike MPI's and LocalComm's eager sends, an NCCL send completes only
//!   when the peer receives ([`Communicator::eager_messages`] is `false`):
//!   `send` queues it and returns, but it holds the stream until then, so
//!   the receive must not sit behind the receiver's own blocking sends (see
//!   [`Communicator::send`]; [`Communicator::sendrecv`] exchanges both
//!   directions in one NCCL group). The connections to every peer are made
//!   when the communicator is (NCCL makes one inside the first group with
//!   a transfer to the peer, blocking until the peer joins one too). A
//!   message to the rank itself never goes through NCCL.
//! - **A rank that leaves is noticed.** Dropping an NcclComm (not while
//!   unwinding, which aborts it) takes part in the peers' next collective
//!   as a departure: theirs fails with `PeerLost` naming it, at once,
//!   instead of waiting out their deadline. The notice waits at most
//!   [`DEPARTURE_GRACE`] for the peers; one arriving later waits for its
//!   deadline, as does a peer blocked in a receive from it.
//! - **Asynchronous jobs on a second communicator.** Each NcclComm splits a
//!   duplicate of itself at construction (collective); `run_async` runs jobs
//!   in order on a thread that owns it (the worker every backend shares),
//!   concurrently with blocking calls. A job that panics loses the lane on
//!   every rank: its rank posts [`CommError::Fault`] of kind `LaneLost` in
//!   place of its next collective on the duplicate, which
//!   ends the collective the peers wait in (or their next), and every rank
//!   that sees it poisons its duplicate; a peer waiting in `recv` for the
//!   lost rank waits for its deadline.
//!
//! The files: `owner.rs` (the owner thread), `watchdog.rs` (deadline,
//! asynchronous errors, abort), `scratch.rs` (the cached device buffer),
//! `stream.rs` (queue, copy, wait), `collectives.rs` (the trait's
//! collectives and the header exchange), `p2p.rs` (send and receive),
//! `device.rs` (CUDA tensors), `rank_ordered.rs` (the deterministic
//! reduction), `transport.rs` (what all of these need from below),
//! `cuda.rs` over `sys.rs` (the only code that calls NCCL) and `host/`
//! (NCCL's rules on the CPU).
//!
//! Tested by the conformance suite twice: on every GPU present, in both
//! settings (`cargo test -p gradwire-tests --features nccl`, which prints
//! `SKIP` lines on a machine without GPUs unless `GRADWIRE_REQUIRE_GPU=1`),
//! and on [`HostTransport`] in every CI run, which runs all of NcclComm's
//! protocol against a transport that enforces NCCL's rules.

mod collectives;
mod cuda;
mod device;
pub mod host;
mod join;
mod library;
mod owner;
mod p2p;
mod rank_ordered;
mod scratch;
mod stream;
mod sys;
mod transport;
mod watchdog;

use std::cell::{OnceCell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::communicator::Communicator;
use crate::element::ElemType;
use crate::error::{CommError, Result};
use crate::flight::FlightRecorder;
use crate::op::ReduceOp;
use crate::worker::{Interrupter, Lane, Worker};
use owner::Owner;
use p2p::Loopback;
use scratch::Scratch;
use transport::{Imp, Native};

pub use cuda::CudaTransport;
pub use host::HostTransport;
pub use join::run;
pub use sys::UniqueId;
pub use transport::NcclTransport;

/// How an [`NcclComm`] reduces (`all_reduce`, `reduce_scatter` and their
/// tensor and asynchronous forms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NcclReduction {
    /// NCCL's own `ncclAllReduce` / `ncclReduceScatter`, one call each: the
    /// fastest, with NCCL's order of additions and NCCL's precision (half
    /// types add in half precision), so not bitwise LocalComm's. Element
    /// types and operators for which NCCL would break a promise of
    /// [`ReduceOp`] (floating-point `Max` and `Min`, whose NaN NCCL drops)
    /// take the rank-ordered path.
    #[default]
    Native,
    /// gradwire's rank-ordered reduction over NCCL's point-to-point
    /// transfers: bitwise LocalComm's and MpiComm's results on every rank
    /// and in every run, at the cost of three NCCL calls (and, for host
    /// slices, a reduction on the CPU).
    RankOrdered,
}

/// Settings of an [`NcclComm`].
#[derive(Debug, Clone, PartialEq)]
pub struct NcclConfig {
    /// How long one wait (a collective's queued work, a peer's message) may
    /// take before the communicator is aborted and the call returns
    /// [`CommError::Timeout`]. `None`: wait forever. Default 600 s, as
    /// LocalComm's and PyTorch's default.
    pub timeout: Option<Duration>,
    /// How reductions are computed. Default [`NcclReduction::Native`].
    /// Splits and the asynchronous lane inherit it.
    pub reduction: NcclReduction,
    /// Where the flight record is written when a deadline expires or a
    /// peer is lost (see [`crate::LocalConfig::flight_recorder`]).
    /// Default: `$GRADWIRE_FLIGHT_RECORDER`.
    pub flight_recorder: Option<std::path::PathBuf>,
    /// Whether the rank keeps a timeline (see
    /// [`crate::LocalConfig::timeline`]). Default: off.
    pub timeline: bool,
}

impl Default for NcclConfig {
    fn default() -> Self {
        NcclConfig {
            timeout: Some(Duration::from_secs(600)),
            reduction: NcclReduction::Native,
            flight_recorder: crate::flight::flight_dir_from_env(),
            timeline: false,
        }
    }
}

impl UniqueId {
    /// A fresh id (`ncclGetUniqueId`): made by one rank (it opens a listening
    /// socket there) and given to every other, which pass it to
    /// [`NcclComm::from_id`]. [`CommError::NcclUnavailable`] without NCCL.
    pub fn generate() -> Result<UniqueId> {
        UniqueId::new()
    }

    /// The id's 128 bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0
    }

    /// An id received from the rank that generated it.
    pub fn from_bytes(bytes: [u8; 128]) -> UniqueId {
        UniqueId(bytes)
    }
}

/// A send in flight: its device buffers, kept until the event fires.
type InFlight<T> = (<T as Imp>::Event, Vec<<T as Imp>::Buffer>);

/// One rank of an NCCL communicator, bound to one CUDA device (or, on
/// [`HostTransport`], to the host). `Send` (the NCCL handle itself stays on
/// the owner thread) but not `Sync`: one rank's calls happen in order, as
/// the trait requires.
pub struct NcclComm<T: NcclTransport = CudaTransport> {
    rank: usize,
    size: usize,
    config: NcclConfig,
    device: T::Device,
    /// The stream NCCL's work and this communicator's copies run on.
    stream: T::Stream,
    owner: Owner<T>,
    /// The device buffer every collective works in (after `owner`: freed
    /// once the communicator is destroyed).
    scratch: Scratch<T>,
    /// The duplicate asynchronous jobs run on, until the worker takes it.
    shadow: RefCell<Option<Box<NcclComm<T>>>>,
    worker: OnceCell<Worker<NcclComm<T>>>,
    /// Sends in flight: their device buffers stay alive until their event
    /// fires.
    outbox: RefCell<Vec<InFlight<T>>>,
    /// Whether dropping it posts a departure notice (see
    /// [`NcclComm::depart`]): every communicator but an asynchronous lane
    /// that never ran a job (no peer can be waiting in it for this rank).
    departs: bool,
    /// Messages this rank sent to itself, oldest first, never through
    /// NCCL: NCCL refuses a send to self without its receive in the same
    /// group (`ncclInvalidUsage`, which would abort the communicator).
    loopback: RefCell<VecDeque<Loopback>>,
    /// Its last collectives.
    flight: FlightRecorder,
    /// The event the stream waits on for a device tensor's earlier work,
    /// re-recorded each call instead of created (CUDA tensors only).
    joined: RefCell<Option<T::Event>>,
}

impl<T: NcclTransport> std::fmt::Debug for NcclComm<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("world_size", &self.size)
            .field("device", &T::ordinal(&self.device))
            .field("reduction", &self.config.reduction)
            .finish_non_exhaustive()
    }
}

/// Maps a gradwire-tensor error (device, copy, kernel) into the comm error.
fn cuda(e: gradwire_tensor::Error) -> CommError {
    CommError::Tensor(e)
}

/// A CUDA driver error of a copy or event, as a tensor error.
fn driver(call: &str, e: gradwire_tensor::cudarc::driver::DriverError) -> CommError {
    CommError::Tensor(gradwire_tensor::Error::Cuda(format!("{call}: {e:?}")))
}

/// The device of `ordinal`, or `NcclUnavailable` saying why there is none.
fn device(ordinal: usize) -> Result<Arc<gradwire_tensor::CudaDevice>> {
    gradwire_tensor::CudaDevice::get(ordinal).map_err(|e| match e {
        gradwire_tensor::Error::CudaUnavailable(why) => CommError::NcclUnavailable(why),
        other => CommError::Tensor(other),
    })
}

/// Where a reduction of `elem` by `op` runs under `reduction`: NCCL's own
/// collective (`Some`), or the rank-ordered path (`None`): always under
/// `RankOrdered`, and under `Native` for floating-point `Max` and `Min`,
/// whose NaN NCCL's `fmaxf` / `__hmax` drop and gradwire's propagate
/// (integer `Max` and `Min` are exact, so NCCL's are bitwise gradwire's).
fn native_reduction(reduction: NcclReduction, elem: ElemType, op: ReduceOp) -> Option<Native> {
    let nccl_keeps_the_promise = match op {
        ReduceOp::Sum | ReduceOp::Avg => true,
        ReduceOp::Max | ReduceOp::Min => !elem.is_float(),
    };
    (reduction == NcclReduction::Native && nccl_keeps_the_promise).then_some(Native { elem, op })
}

impl<T: NcclTransport> NcclComm<T> {
    /// The rank's asynchronous lane, started on first use.
    fn lane_worker(&self) -> Result<&Worker<NcclComm<T>>> {
        if let Some(worker) = self.worker.get() {
            return Ok(worker);
        }
        let mut shadow = self.shadow.borrow_mut().take().ok_or_else(|| {
            CommError::InvalidArgument(
                "asynchronous jobs cannot start further asynchronous jobs".into(),
            )
        })?;
        // A lane in use is one a peer may wait in.
        shadow.departs = true;
        let worker = Worker::start(
            format!("gradwire-nccl-async-{}", self.rank),
            self.rank,
            *shadow,
        )?;
        Ok(self.worker.get_or_init(|| worker))
    }

    /// Joins the communicator of `world` ranks identified by `id` as
    /// `rank` on `device`: the owner thread's collective init, then the
    /// duplicate for asynchronous jobs and the connections to every peer.
    fn join(
        id: T::Id,
        rank: usize,
        world: usize,
        device: T::Device,
        config: NcclConfig,
    ) -> Result<NcclComm<T>> {
        if world == 0 || rank >= world {
            return Err(CommError::InvalidRank {
                rank,
                world_size: world,
            });
        }
        T::load()?;
        let owner = Owner::start(rank, device.clone(), config.timeout, move || {
            T::init_rank(&id, world, rank)
        })?;
        let track = config.timeline.then(|| crate::TimelineTrack::world(rank));
        NcclComm::adopt(owner, rank, world, device, config, true, track)
    }

    /// Wraps a started owner; with `with_shadow`, splits the duplicate that
    /// asynchronous jobs will use (collective). Its collectives are logged
    /// on `track`, if given (the duplicate's on the track's lane).
    fn adopt(
        owner: Owner<T>,
        rank: usize,
        size: usize,
        device: T::Device,
        config: NcclConfig,
        with_shadow: bool,
        track: Option<crate::TimelineTrack>,
    ) -> Result<NcclComm<T>> {
        let stream = T::new_stream(&device)?;
        let lane = track
            .as_ref()
            .filter(|_| with_shadow)
            .map(crate::TimelineTrack::lane);
        let flight = FlightRecorder::new(rank, size, config.flight_recorder.clone(), track);
        let comm = NcclComm {
            rank,
            size,
            config,
            flight,
            device,
            stream,
            owner,
            scratch: Scratch::default(),
            shadow: RefCell::new(None),
            worker: OnceCell::new(),
            outbox: RefCell::new(Vec::new()),
            joined: RefCell::new(None),
            departs: with_shadow,
            loopback: RefCell::new(VecDeque::new()),
        };
        if with_shadow {
            let twin = comm.split_raw(Some(0), i32::try_from(rank).unwrap_or(i32::MAX))?;
            let twin = twin.ok_or_else(|| CommError::Nccl {
                op: "ncclCommSplit",
                code: 0,
                message: "the duplicate for asynchronous jobs came back empty".into(),
            })?;
            let shadow = NcclComm::adopt(
                twin,
                rank,
                size,
                comm.device.clone(),
                comm.config.clone(),
                false,
                lane,
            )?;
            *comm.shadow.borrow_mut() = Some(Box::new(shadow));
        }
        comm.connect_to_every_peer()?;
        Ok(comm)
    }

    /// The device ordinal of this rank (CUDA's; the host transport numbers
    /// its ranks' "devices" by rank).
    pub fn device_ordinal(&self) -> usize {
        T::ordinal(&self.device)
    }

    /// The settings this communicator was made with.
    pub fn config(&self) -> &NcclConfig {
        &self.config
    }

    /// Whether this communicator's reductions are bitwise LocalComm's:
    /// [`NcclReduction::RankOrdered`], or a world of one rank (nothing to
    /// add).
    pub fn reduces_in_rank_order(&self) -> bool {
        self.size == 1 || self.config.reduction == NcclReduction::RankOrdered
    }

    /// Where a reduction of `elem` by `op` runs on this communicator (see
    /// [`native_reduction`]).
    fn native(&self, elem: ElemType, op: ReduceOp) -> Option<Native> {
        native_reduction(self.config.reduction, elem, op)
    }
}

impl NcclComm<CudaTransport> {
    /// Joins the communicator of `world` ranks identified by `id` as `rank`,
    /// on CUDA device `ordinal`. Collective: every rank calls it with the
    /// same id and world size (each with its own rank and device), and it
    /// returns once all joined.
    pub fn from_id(
        id: &UniqueId,
        rank: usize,
        world: usize,
        ordinal: usize,
        config: NcclConfig,
    ) -> Result<NcclComm> {
        if world == 0 || rank >= world {
            return Err(CommError::InvalidRank {
                rank,
                world_size: world,
            });
        }
        sys::load()?;
        NcclComm::join(*id, rank, world, device(ordinal)?, config)
    }

    /// The NCCL version loaded (e.g. 22203 for 2.22.3).
    pub fn nccl_version() -> Result<i32> {
        sys::load()
    }
}

/// A lost lane is announced by a fault in place of this rank's next
/// collective on the lane: the peers' collective (the one they wait in, or
/// their next) ends with it on every rank, and each poisons its lane. NCCL
/// has no message a peer's `recv` could watch for: a peer waiting to
/// receive from the lost rank waits for its deadline.
impl<T: NcclTransport> Lane for NcclComm<T> {
    fn poisoned(&self) -> Option<CommError> {
        self.owner.aborted()
    }

    fn announce_lost(&self, lost: &CommError) {
        let _ = self.post_fault(crate::FaultKind::LaneLost);
        self.owner.poison(lost.clone());
    }

    fn interrupter(&self) -> Interrupter {
        let watch = Arc::clone(&self.owner.watch);
        Box::new(move |reason| watch.poison(reason))
    }
}

/// How long a dropping rank waits for its peers to meet its departure
/// notice in a collective before it aborts instead: a peer that arrives
/// later waits for its own deadline.
pub const DEPARTURE_GRACE: Duration = Duration::from_secs(10);

impl<T: NcclTransport> NcclComm<T> {
    /// Takes part in the peers' next collective as a rank that leaves
    /// (`protocol::depart`), so that a peer still calling fails at once
    /// with `PeerLost` naming this rank instead of waiting out its
    /// deadline. The wait is the watchdog's, capped at
    /// [`DEPARTURE_GRACE`]: past it the communicator is aborted.
    fn depart(&self) {
        self.owner.watch.cap_waits(DEPARTURE_GRACE);
        let _ = crate::protocol::depart(self);
    }
}

impl<T: NcclTransport> Drop for NcclComm<T> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The peers would wait for this rank until their deadline: abort
            // now, so their NCCL calls fail at once.
            eprintln!(
                "gradwire: rank {} unwound while holding an NcclComm; aborting it",
                self.rank
            );
            self.owner.abort();
        }
        // Queued asynchronous jobs are collectives the peers also run.
        drop(self.worker.take());
        drop(self.shadow.borrow_mut().take());
        if self.departs
            && !std::thread::panicking()
            && self.size > 1
            && self.owner.aborted().is_none()
        {
            self.depart();
        }
        // A send nobody received would keep its buffer in use forever:
        // abort rather than free memory NCCL may still read.
        let pending = self
            .outbox
            .borrow()
            .iter()
            .any(|(event, _)| !T::event_done(event).unwrap_or(false));
        if pending {
            self.owner.abort();
        }
        self.outbox.borrow_mut().clear();
        // `owner` drops after this body: its thread destroys the
        // communicator (unless aborted).
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without NCCL or a GPU (this project's CI), every way in
    /// is a typed error, never a panic inside the loader; with them, the
    /// constructors' argument checks still come first.
    #[test]
    fn constructors_fail_with_typed_errors() {
        let bad_rank = NcclComm::from_id(
            &UniqueId::from_bytes([0; 128]),
            3,
            2,
            0,
            NcclConfig::default(),
        );
        assert!(
            matches!(
                bad_rank,
                Err(CommError::InvalidRank {
                    rank: 3,
                    world_size: 2
                })
            ),
            "{bad_rank:?}"
        );
        if sys::load().is_err() {
            eprintln!("SKIP: no NCCL library: checking the typed errors only");
            assert!(matches!(
                UniqueId::generate(),
                Err(CommError::NcclUnavailable(_))
            ));
            assert!(matches!(
                NcclComm::nccl_version(),
                Err(CommError::NcclUnavailable(_))
            ));
            let ran = run(&[0], NcclConfig::default(), |comm| Ok(comm.rank()));
            assert!(matches!(ran, Err(CommError::NcclUnavailable(_))), "{ran:?}");
            let dir = tempfile::tempdir().expect("temp dir");
            let filed = NcclComm::from_file(dir.path().join("id"), 0, 1, 0, NcclConfig::default());
            assert!(
                matches!(filed, Err(CommError::NcclUnavailable(_))),
                "{filed:?}"
            );
        }
    }

    #[test]
    fn the_default_is_natives_with_a_ten_minute_deadline() {
        let config = NcclConfig::default();
        assert_eq!(config.reduction, NcclReduction::Native);
        assert_eq!(NcclReduction::default(), NcclReduction::Native);
        assert_eq!(config.timeout, Some(Duration::from_secs(600)));
    }

    #[test]
    fn reductions_take_nccls_collective_only_where_promised() {
        for elem in ElemType::ALL {
            for op in ReduceOp::ALL.into_iter().filter(|op| op.supports(elem)) {
                let ordered = native_reduction(NcclReduction::RankOrdered, elem, op);
                assert!(ordered.is_none(), "{elem} {op}");
                let native = native_reduction(NcclReduction::Native, elem, op);
                let nan_sensitive = elem.is_float() && matches!(op, ReduceOp::Max | ReduceOp::Min);
                assert_eq!(native.is_none(), nan_sensitive, "{elem} {op}");
                if let Some(native) = native {
                    assert_eq!(native, Native { elem, op });
                }
            }
        }
    }
}
