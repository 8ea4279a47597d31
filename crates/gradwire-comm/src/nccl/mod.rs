//! `NcclComm`: the [`Communicator`] over NVIDIA GPUs with NCCL (feature
//! `nccl`).
//!
//! One rank per GPU, in one process (threads, [`run`]) or many (a shared
//! file, [`NcclComm::from_file`], or MPI, `NcclComm::from_mpi` with the `mpi`
//! feature too). NCCL and the CUDA driver are loaded at run time, so this
//! builds on any machine; without them every constructor returns
//! [`CommError::NcclUnavailable`]. It keeps the promises of
//! [`LocalComm`](crate::LocalComm) and [`MpiComm`](crate::MpiComm):
//!
//! - **Checked calls.** Before each collective the ranks all-gather the same
//!   64-byte description of their call as MpiComm's (`header.rs`), so a
//!   mismatch is [`CommError::Mismatch`] on every rank before any data moves,
//!   never NCCL's undefined behaviour (a hang or a truncated buffer).
//! - **Deterministic reductions, bitwise equal to LocalComm.** NCCL only
//!   moves bytes: each rank receives its [`chunk_range`] of every rank's
//!   buffer (grouped `ncclSend`/`ncclRecv`), reduces the W chunks in rank
//!   order, and the reduced chunks are all-gathered. On host slices the
//!   reduction runs on the CPU with LocalComm's kernels (`rank_order.rs`);
//!   on CUDA tensors ([`Communicator::all_reduce_tensor`]) it runs on the
//!   GPU with `kernels/cuda/comm.cu`, which computes the same bits. NCCL's
//!   own `ncclAllReduce` promises neither (its order depends on the
//!   algorithm and topology, and it sums f16 in f16). The traffic is the
//!   same as a ring all-reduce's: 2 (W-1)/W of the buffer per rank.
//! - **An owner thread per rank.** The NCCL communicator is used from one
//!   thread only: every NCCL call of a rank is issued there, in order. The
//!   caller's thread copies host data to and from the device and waits for
//!   the queued work on a CUDA event.
//! - **A deadline instead of a hang.** A wait that passes
//!   [`NcclConfig::timeout`] aborts the communicator (`ncclCommAbort`, as
//!   PyTorch's NCCL watchdog does) and returns [`CommError::Timeout`]; errors
//!   NCCL reports asynchronously (`ncclCommGetAsyncError`: a peer's network
//!   failure, a remote abort) end the wait early as [`CommError::Nccl`]. An
//!   aborted communicator returns that error from every later call.
//! - **Point to point with checked lengths.** A send carries a 16-byte
//!   header (element type and length) before its payload, so `recv` checks
//!   both and returns `Mismatch` (the message consumed) as LocalComm does.
//!   Unlike MPI's and LocalComm's eager sends, an NCCL send completes when
//!   the peer receives: `send` queues it and returns, but a ring of large
//!   sends each waiting for a receive queued behind it on the peer's stream
//!   cannot progress. Use [`Communicator::sendrecv`] for exchanges (both
//!   directions in one NCCL group).
//! - **Device tensors stay on the device.** `all_reduce_tensor` and
//!   `broadcast_tensor` (and their asynchronous forms) on a CUDA tensor run
//!   entirely on its GPU, ordered after the work queued on the tensor's
//!   stream and before anything queued on it later. The other `_tensor`
//!   methods take host tensors (a CUDA tensor is `DeviceMismatch`); move
//!   with `Tensor::to_device`.
//! - **Asynchronous jobs on a second communicator.** Each NcclComm splits a
//!   duplicate of itself at construction (collective); `run_async` runs jobs
//!   in order on a thread that owns it (the worker every backend shares),
//!   concurrently with blocking calls. A job that panics loses the lane on
//!   every rank: its rank posts [`CommError::Fault`] `{ rank, code:
//!   LANE_LOST }` in place of its next collective on the duplicate, which
//!   ends the collective the peers wait in (or their next), and every rank
//!   that sees it poisons its duplicate; a peer waiting in `recv` for the
//!   lost rank waits for its deadline.
//!
//! Tested by the conformance suite on every GPU present (`cargo test -p
//! gradwire-tests --features nccl`, which prints `SKIP` lines on a machine
//! without GPUs unless `GRADWIRE_REQUIRE_GPU=1`).

mod sys;

use std::cell::{OnceCell, RefCell};
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gradwire_tensor::cuda_backend::collective::{self, ChunkOp};
use gradwire_tensor::cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
};
use gradwire_tensor::{CudaDevice, CudaStorage, Storage, Tensor};

use crate::communicator::{Communicator, Gathered, chunk_range};
use crate::element::{ElemType, Element};
use crate::error::{CommError, Result};
use crate::header::{self, Call, Kind, WORDS};
use crate::job_slot::{AsyncJob, JobSlot};
use crate::op::ReduceOp;
use crate::pending::Pending;
use crate::worker::{Interrupter, Lane, Worker};
use sys::{RawComm, Transfer};

pub use sys::UniqueId;

/// Settings of an [`NcclComm`].
#[derive(Debug, Clone, PartialEq)]
pub struct NcclConfig {
    /// How long one wait (a collective's queued work, a peer's message) may
    /// take before the communicator is aborted and the call returns
    /// [`CommError::Timeout`]. `None`: wait forever. Default 600 s, as
    /// LocalComm's and PyTorch's default.
    pub timeout: Option<Duration>,
}

impl Default for NcclConfig {
    fn default() -> Self {
        NcclConfig {
            timeout: Some(Duration::from_secs(600)),
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

/// One rank of an NCCL communicator, bound to one CUDA device. `Send` (the
/// NCCL handle itself stays on the owner thread) but not `Sync`: one rank's
/// calls happen in order, as the trait requires.
pub struct NcclComm {
    rank: usize,
    size: usize,
    config: NcclConfig,
    device: Arc<CudaDevice>,
    /// The stream NCCL's work and this communicator's copies run on.
    stream: Arc<CudaStream>,
    owner: Owner,
    /// The duplicate asynchronous jobs run on, until the worker takes it.
    shadow: RefCell<Option<Box<NcclComm>>>,
    worker: OnceCell<Worker<NcclComm>>,
    /// Sends in flight: their device buffers stay alive until their event
    /// fires.
    outbox: RefCell<Vec<(CudaEvent, Vec<CudaSlice<u8>>)>>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("world_size", &self.size)
            .field("device", &self.device.ordinal())
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
fn device(ordinal: usize) -> Result<Arc<CudaDevice>> {
    CudaDevice::get(ordinal).map_err(|e| match e {
        gradwire_tensor::Error::CudaUnavailable(why) => CommError::NcclUnavailable(why),
        other => CommError::Tensor(other),
    })
}

impl NcclComm {
    /// The rank's asynchronous lane, started on first use.
    fn lane_worker(&self) -> Result<&Worker<NcclComm>> {
        if let Some(worker) = self.worker.get() {
            return Ok(worker);
        }
        let shadow = self.shadow.borrow_mut().take().ok_or_else(|| {
            CommError::InvalidArgument(
                "asynchronous jobs cannot start further asynchronous jobs".into(),
            )
        })?;
        let worker = Worker::start(
            format!("gradwire-nccl-async-{}", self.rank),
            self.rank,
            *shadow,
        )?;
        Ok(self.worker.get_or_init(|| worker))
    }

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
        let device = device(ordinal)?;
        let owner = Owner::start(rank, Arc::clone(&device), config.timeout, {
            let id = *id;
            move || sys::init_rank(&id, world, rank)
        })?;
        let comm = NcclComm::adopt(owner, rank, world, device, config, true)?;
        Ok(comm)
    }

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

    /// Wraps a started owner; with `with_shadow`, splits the duplicate that
    /// asynchronous jobs will use (collective).
    fn adopt(
        owner: Owner,
        rank: usize,
        size: usize,
        device: Arc<CudaDevice>,
        config: NcclConfig,
        with_shadow: bool,
    ) -> Result<NcclComm> {
        let stream = device
            .stream()
            .context()
            .new_stream()
            .map_err(|e| driver("cuStreamCreate", e))?;
        let comm = NcclComm {
            rank,
            size,
            config,
            device,
            stream,
            owner,
            shadow: RefCell::new(None),
            worker: OnceCell::new(),
            outbox: RefCell::new(Vec::new()),
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
                Arc::clone(&comm.device),
                comm.config.clone(),
                false,
            )?;
            *comm.shadow.borrow_mut() = Some(Box::new(shadow));
        }
        Ok(comm)
    }

    /// The CUDA device ordinal of this rank.
    pub fn device_ordinal(&self) -> usize {
        self.device.ordinal()
    }

    /// The NCCL version loaded (e.g. 22203 for 2.22.3).
    pub fn nccl_version() -> Result<i32> {
        sys::load()
    }

    /// Runs `issue` on the owner thread (it queues NCCL work on this
    /// communicator's stream), then waits for that work with the deadline.
    fn issue<F>(&self, op: &'static str, issue: F) -> Result<()>
    where
        F: FnOnce(&RawComm, usize) -> Result<()> + Send + 'static,
    {
        let stream = self.stream.cu_stream() as usize;
        self.owner
            .call(op, self.config.timeout, move |comm| issue(comm, stream))?;
        self.wait(op)
    }

    /// Waits until everything queued on the stream so far is done, polling
    /// for NCCL's asynchronous errors; aborts the communicator at the
    /// deadline.
    fn wait(&self, op: &'static str) -> Result<()> {
        let event = self
            .stream
            .record_event(None)
            .map_err(|e| driver("cuEventRecord", e))?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            match event.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    self.owner.abort();
                    return Err(driver("cuEventQuery", e));
                }
            }
            if let Err(e) = self.owner.async_error() {
                self.owner.abort();
                return Err(e);
            }
            if self
                .config
                .timeout
                .is_some_and(|limit| start.elapsed() > limit)
            {
                self.owner.abort();
                return Err(CommError::Timeout {
                    op,
                    waited: start.elapsed(),
                    // NCCL does not say which peer is missing.
                    missing: Vec::new(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// A device buffer of `bytes` bytes (at least one: NCCL and the driver
    /// want a real address even for empty transfers).
    fn scratch(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        self.stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| driver("cuMemAlloc", e))
    }

    /// Copies host bytes to a new device buffer on this stream.
    fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>> {
        if bytes.is_empty() {
            return self.scratch(0);
        }
        self.stream
            .clone_htod(bytes)
            .map_err(|e| driver("cuMemcpyHtoD", e))
    }

    /// Copies the first `dst.len()` bytes of a device buffer to the host.
    /// Call after [`NcclComm::wait`]: the copy itself has no deadline.
    fn download(&self, src: &CudaSlice<u8>, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let view = src
            .try_slice(..dst.len())
            .ok_or_else(|| CommError::InvalidArgument("download beyond a device buffer".into()))?;
        self.stream
            .memcpy_dtoh(&view, dst)
            .map_err(|e| driver("cuMemcpyDtoH", e))
    }

    /// `ncclAllGather` of `bytes` bytes from every rank's `send` into
    /// `recv` (W blocks of `bytes`), waited for. The lengths are checked
    /// here, so the queued call stays inside both buffers, which the caller
    /// holds until this returns.
    fn all_gather_bytes<S, R>(
        &self,
        op: &'static str,
        send: &S,
        recv: &mut R,
        bytes: usize,
    ) -> Result<()>
    where
        S: DevicePtr<u8>,
        R: DevicePtrMut<u8>,
    {
        if send.len() < bytes || recv.len() < bytes.saturating_mul(self.size) {
            return Err(CommError::InvalidArgument(format!(
                "{op}: all-gather of {bytes} bytes from {} into {}",
                send.len(),
                recv.len()
            )));
        }
        let (s, _s) = send.device_ptr(&self.stream);
        let (r, _r) = recv.device_ptr_mut(&self.stream);
        self.issue(op, move |comm, stream| {
            #[allow(unsafe_code)]
            // SAFETY: both ranges were checked above against live buffers
            // that outlive the wait in `issue`.
            unsafe {
                sys::ops::all_gather(comm, s, r, bytes, stream as _)
            }
        })
    }

    /// `ncclBroadcast` of the first `bytes` bytes of `buf` in place from
    /// `root`, waited for (lengths checked as in `all_gather_bytes`).
    fn broadcast_bytes<B: DevicePtrMut<u8>>(
        &self,
        buf: &mut B,
        bytes: usize,
        root: usize,
    ) -> Result<()> {
        if buf.len() < bytes {
            return Err(CommError::InvalidArgument(format!(
                "broadcast of {bytes} bytes from a buffer of {}",
                buf.len()
            )));
        }
        let (p, _p) = buf.device_ptr_mut(&self.stream);
        self.issue("broadcast", move |comm, stream| {
            #[allow(unsafe_code)]
            // SAFETY: the range was checked above against a live buffer that
            // outlives the wait in `issue`.
            unsafe {
                sys::ops::broadcast(comm, p, bytes, root, stream as _)
            }
        })
    }

    /// The header exchange: all-gathers every rank's description of its
    /// call and validates them, identically on every rank.
    fn agree(&self, call: Call) -> Result<Vec<Call>> {
        if let Some(reason) = self.owner.aborted() {
            return Err(reason);
        }
        self.reap()?;
        let mine: Vec<u8> = call.encode().iter().flat_map(|w| w.to_le_bytes()).collect();
        let send = self.upload(&mine)?;
        let bytes = mine.len();
        let mut recv = self.scratch(bytes * self.size)?;
        self.all_gather_bytes("header exchange", &send, &mut recv, bytes)?;
        let mut all = vec![0u8; bytes * self.size];
        self.download(&recv, &mut all)?;
        let words: Vec<i64> = all
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        debug_assert_eq!(words.len(), WORDS * self.size);
        let calls = header::decode_all(&words)?;
        crate::call::validate(&calls).inspect_err(|err| {
            // A lost lane's fault ends the communicator, as on every backend.
            if err.is_lane_lost() {
                self.owner.poison(err.clone());
            }
        })?;
        Ok(calls)
    }

    /// Frees the device buffers of sends the peers have received.
    fn reap(&self) -> Result<()> {
        let mut outbox = self.outbox.borrow_mut();
        let mut kept = Vec::with_capacity(outbox.len());
        for (event, buffers) in outbox.drain(..) {
            match event.try_is_complete() {
                Ok(true) => drop(buffers),
                Ok(false) => kept.push((event, buffers)),
                Err(e) => return Err(driver("cuEventQuery", e)),
            }
        }
        *outbox = kept;
        Ok(())
    }

    /// The exchange both reductions are made of: this rank receives its
    /// chunk of every rank's `send` (device bytes of `len` elements of
    /// `elem_bytes` each) into `stage` (W chunks back to back). Its own
    /// chunk's slot is left to the caller: the host path reads it from the
    /// caller's slice, the device path copies it. Waits for the exchange.
    fn scatter_chunks(
        &self,
        send: &CudaView<'_, u8>,
        len: usize,
        elem_bytes: usize,
        stage: &mut CudaViewMut<'_, u8>,
    ) -> Result<()> {
        let (w, me) = (self.size, self.rank);
        let mine = chunk_range(len, w, me);
        let n = mine.len();
        {
            let (s, _s) = send.device_ptr(&self.stream);
            let (r, _r) = stage.device_ptr_mut(&self.stream);
            let mut sends = Vec::with_capacity(w);
            let mut recvs = Vec::with_capacity(w);
            for q in (0..w).filter(|&q| q != me) {
                let theirs = chunk_range(len, w, q);
                sends.push(Transfer {
                    peer: q,
                    ptr: s + (theirs.start * elem_bytes) as u64,
                    bytes: theirs.len() * elem_bytes,
                });
                recvs.push(Transfer {
                    peer: q,
                    ptr: r + (q * n * elem_bytes) as u64,
                    bytes: n * elem_bytes,
                });
            }
            // Every transfer lies inside `send` (a chunk_range of its
            // length) or `stage` (W * n elements), and both outlive the
            // wait in `issue`.
            self.issue("chunk exchange", move |comm, stream| {
                #[allow(unsafe_code)]
                // SAFETY: see above.
                unsafe {
                    sys::ops::exchange(comm, &sends, &recvs, stream as _)
                }
            })?;
        }
        Ok(())
    }

    /// All-gathers each rank's `chunk_range(len, W, rank)` of elements from
    /// `mine` (device bytes) into `out` (device bytes, `len` elements).
    /// Chunks differ by at most one element; NCCL's all-gather wants equal
    /// blocks, so every rank sends the largest chunk's size and the blocks
    /// are then copied into place.
    fn gather_chunks(
        &self,
        mine: &CudaView<'_, u8>,
        len: usize,
        elem_bytes: usize,
        out: &mut CudaViewMut<'_, u8>,
    ) -> Result<()> {
        let w = self.size;
        let block = chunk_range(len, w, 0).len() * elem_bytes;
        let mut blocks = self.scratch(block * w)?;
        self.all_gather_bytes("all-gather of chunks", mine, &mut blocks, block)?;
        for q in 0..w {
            let range = chunk_range(len, w, q);
            if range.is_empty() {
                continue;
            }
            let bytes = range.len() * elem_bytes;
            let src = blocks
                .try_slice(q * block..q * block + bytes)
                .ok_or_else(|| CommError::InvalidArgument("block beyond the gather".into()))?;
            let mut dst = out
                .try_slice_mut(range.start * elem_bytes..range.end * elem_bytes)
                .ok_or_else(|| CommError::InvalidArgument("chunk beyond the output".into()))?;
            self.stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(|e| driver("cuMemcpyDtoD", e))?;
        }
        self.wait("all-gather of chunks")
    }

    /// `reduce_scatter`'s and `all_reduce`'s host half: exchanges the
    /// chunks, reduces this rank's in rank order on the CPU into `out`.
    fn reduce_chunk_on_host<T: Element>(
        &self,
        send: &CudaSlice<u8>,
        own: &[T],
        len: usize,
        op: ReduceOp,
        out: &mut [T],
    ) -> Result<()> {
        let size = std::mem::size_of::<T>();
        let n = out.len();
        let mut stage = self.scratch(self.size * n * size)?;
        self.scatter_chunks(&send.as_view(), len, size, &mut stage.as_view_mut())?;
        let mut host = vec![T::zeroed(); self.size * n];
        self.download(&stage, bytemuck::cast_slice_mut(&mut host))?;
        let sources: Vec<&[T]> = (0..self.size)
            .map(|q| {
                if q == self.rank {
                    own
                } else {
                    host.get(q * n..(q + 1) * n).unwrap_or(&[])
                }
            })
            .collect();
        crate::rank_order::in_rank_order(&sources, op, self.size, out)
    }

    /// `ncclCommSplit` on the owner thread; the new communicator gets an
    /// owner thread of its own.
    fn split_raw(&self, color: Option<i32>, key: i32) -> Result<Option<Owner>> {
        let (tx, rx) = mpsc::channel();
        self.owner
            .call("ncclCommSplit", self.config.timeout, move |comm| {
                let new = sys::split(comm, color, key)?;
                // The raw handle moves to its own owner thread below.
                tx.send(new).map_err(|_| CommError::WorkerStopped)
            })?;
        let new = rx.recv().map_err(|_| CommError::WorkerStopped)?;
        match new {
            None => Ok(None),
            Some(raw) => {
                Owner::start(self.rank, Arc::clone(&self.device), None, move || Ok(raw)).map(Some)
            }
        }
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

    /// Queues one NCCL group on the owner thread: the first `bytes` of a
    /// buffer to rank `peer` (`send`), and/or `bytes` into a buffer from rank
    /// `peer` (`recv`). The ranges are checked against the buffers here; the
    /// caller keeps the buffers alive until the stream has passed the group
    /// (it waits, or parks them in the outbox).
    fn queue_p2p(
        &self,
        op: &'static str,
        send: Option<(usize, &CudaSlice<u8>, usize)>,
        recv: Option<(usize, &mut CudaSlice<u8>, usize)>,
    ) -> Result<()> {
        let short = |have: usize, want: usize| {
            CommError::InvalidArgument(format!("{op}: {want} bytes through a buffer of {have}"))
        };
        let mut sends = Vec::with_capacity(1);
        let mut recvs = Vec::with_capacity(1);
        let mut guards = Vec::with_capacity(2);
        if let Some((peer, buf, bytes)) = send {
            if buf.len() < bytes {
                return Err(short(buf.len(), bytes));
            }
            let (ptr, guard) = buf.device_ptr(&self.stream);
            guards.push(guard);
            sends.push(Transfer { peer, ptr, bytes });
        }
        if let Some((peer, buf, bytes)) = recv {
            if buf.len() < bytes {
                return Err(short(buf.len(), bytes));
            }
            let (ptr, guard) = buf.device_ptr_mut(&self.stream);
            guards.push(guard);
            recvs.push(Transfer { peer, ptr, bytes });
        }
        let stream = self.stream.cu_stream() as usize;
        let queued = self.owner.call(op, self.config.timeout, move |comm| {
            #[allow(unsafe_code)]
            // SAFETY: every transfer lies in a buffer checked above, which
            // the caller keeps until the stream has passed the group.
            unsafe {
                sys::ops::exchange(comm, &sends, &recvs, stream as _)
            }
        });
        // The guards record the buffers' use on the stream after the group.
        drop(guards);
        queued
    }

    /// The send half of `send`: header, then payload, queued (not waited
    /// for); the buffers stay in the outbox until the peer received them.
    fn queue_send<T: Element>(&self, buf: &[T], dest: usize) -> Result<()> {
        let header = self.upload(&encode_message_header(T::TYPE, buf.len()))?;
        let payload = self.upload(bytes_of(buf))?;
        self.queue_p2p("send", Some((dest, &header, 16)), None)?;
        let bytes = std::mem::size_of_val(buf);
        self.queue_p2p("send", Some((dest, &payload, bytes)), None)?;
        let event = self
            .stream
            .record_event(None)
            .map_err(|e| driver("cuEventRecord", e))?;
        self.outbox
            .borrow_mut()
            .push((event, vec![header, payload]));
        Ok(())
    }

    /// The receive half: the 16-byte header, checked, then the payload as
    /// long as the sender says (consumed even when it does not fit `buf`).
    fn receive<T: Element>(&self, buf: &mut [T], src: usize) -> Result<()> {
        let mut header = self.scratch(16)?;
        self.queue_p2p("recv", None, Some((src, &mut header, 16)))?;
        self.wait("recv")?;
        let mut head = [0u8; 16];
        self.download(&header, &mut head)?;
        let (elem, len) = decode_message_header(&head)?;
        let bytes = elem.map_or(0, |e| len.saturating_mul(e.size_in_bytes()));
        let mut payload = self.scratch(bytes)?;
        self.queue_p2p("recv", None, Some((src, &mut payload, bytes)))?;
        self.wait("recv")?;
        self.deliver(elem, len, &payload, buf, src)
    }
}

impl NcclComm {
    /// `sendrecv` in two NCCL groups, so that neither direction waits for
    /// the other: first both 16-byte headers, then both payloads (the
    /// incoming one as long as its header says, consumed even when it does
    /// not fit `recv`).
    fn exchange_with<T: Element>(
        &self,
        send: &[T],
        dest: usize,
        recv: &mut [T],
        src: usize,
    ) -> Result<()> {
        let out_header = self.upload(&encode_message_header(T::TYPE, send.len()))?;
        let mut in_header = self.scratch(16)?;
        self.queue_p2p(
            "sendrecv",
            Some((dest, &out_header, 16)),
            Some((src, &mut in_header, 16)),
        )?;
        self.wait("sendrecv")?;
        let mut head = [0u8; 16];
        self.download(&in_header, &mut head)?;
        let (elem, len) = decode_message_header(&head)?;
        let incoming = elem.map_or(0, |e| len.saturating_mul(e.size_in_bytes()));
        let out_payload = self.upload(bytes_of(send))?;
        let mut in_payload = self.scratch(incoming)?;
        self.queue_p2p(
            "sendrecv",
            Some((dest, &out_payload, std::mem::size_of_val(send))),
            Some((src, &mut in_payload, incoming)),
        )?;
        self.wait("sendrecv")?;
        self.deliver(elem, len, &in_payload, recv, src)
    }

    /// Copies a received payload into `buf` if its type and length are
    /// `buf`'s, else returns the `Mismatch` LocalComm returns.
    fn deliver<T: Element>(
        &self,
        elem: Option<ElemType>,
        len: usize,
        payload: &CudaSlice<u8>,
        buf: &mut [T],
        src: usize,
    ) -> Result<()> {
        match elem {
            Some(e) if e == T::TYPE && len == buf.len() => {
                self.download(payload, bytemuck::cast_slice_mut(buf))
            }
            other => Err(CommError::Mismatch {
                detail: format!(
                    "rank {src} sent {len} elements of {} to rank {}, which receives {} of {}",
                    other.map_or("unknown elements", |e| e.as_str()),
                    self.rank,
                    buf.len(),
                    T::TYPE
                ),
            }),
        }
    }
}

/// The 16-byte header a point-to-point message starts with: the element
/// type's index in [`ElemType::ALL`] and the length, little-endian.
fn encode_message_header(elem: ElemType, len: usize) -> [u8; 16] {
    let index = ElemType::ALL
        .iter()
        .position(|&e| e == elem)
        .unwrap_or(usize::MAX);
    let mut head = [0u8; 16];
    head[..8].copy_from_slice(&(index as u64).to_le_bytes());
    head[8..].copy_from_slice(&(len as u64).to_le_bytes());
    head
}

/// The element type and length a message header announces.
fn decode_message_header(head: &[u8; 16]) -> Result<(Option<ElemType>, usize)> {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&head[i..i + 8]);
        u64::from_le_bytes(w)
    };
    let elem = usize::try_from(word(0))
        .ok()
        .and_then(|i| ElemType::ALL.get(i).copied());
    let len = usize::try_from(word(8))
        .map_err(|_| CommError::InvalidArgument("a message longer than memory".into()))?;
    Ok((elem, len))
}

/// A lost lane is announced by a fault in place of this rank's next
/// collective on the lane: the peers' collective (the one they wait in, or
/// their next) ends with it on every rank, and each poisons its lane. NCCL
/// has no message a peer's `recv` could watch for: a peer waiting to
/// receive from the lost rank waits for its deadline.
impl Lane for NcclComm {
    fn poisoned(&self) -> Option<CommError> {
        self.owner.aborted()
    }

    fn announce_lost(&self, lost: &CommError) {
        let _ = self.post_fault(crate::LANE_LOST);
        self.owner.poison(lost.clone());
    }

    fn interrupter(&self) -> Interrupter {
        let state = Arc::clone(&self.owner.abort);
        Box::new(move |reason| state.poison(reason))
    }
}

impl Drop for NcclComm {
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
        // A send nobody received would keep its buffer in use forever:
        // abort rather than free memory NCCL may still read.
        let pending = self
            .outbox
            .borrow()
            .iter()
            .any(|(event, _)| !event.try_is_complete().unwrap_or(false));
        if pending {
            self.owner.abort();
        }
        self.outbox.borrow_mut().clear();
        // `owner` drops after this body: its thread destroys the
        // communicator (unless aborted).
    }
}

/// Bytes of a host slice.
fn bytes_of<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.agree(Call {
            elem: Some(T::TYPE),
            op: Some(op),
            len: buf.len(),
            ..Call::new(Kind::AllReduce)
        })?;
        let (w, len) = (self.size, buf.len());
        if w == 1 || len == 0 {
            return Ok(());
        }
        let size = std::mem::size_of::<T>();
        let send = self.upload(bytes_of(buf))?;
        let mine = chunk_range(len, w, self.rank);
        let mut out = vec![T::zeroed(); mine.len()];
        let own = buf.get(mine).unwrap_or(&[]);
        self.reduce_chunk_on_host(&send, own, len, op, &mut out)?;
        // The largest chunk's size goes into the all-gather.
        let mut padded = bytes_of(&out).to_vec();
        padded.resize(chunk_range(len, w, 0).len() * size, 0);
        let reduced = self.upload(&padded)?;
        let mut all = self.scratch(len * size)?;
        self.gather_chunks(&reduced.as_view(), len, size, &mut all.as_view_mut())?;
        self.download(&all, bytemuck::cast_slice_mut(buf))
    }

    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.agree(Call {
            elem: Some(T::TYPE),
            len: buf.len(),
            root,
            ..Call::new(Kind::Broadcast)
        })?;
        if buf.is_empty() {
            return Ok(());
        }
        let mut device = self.upload(bytes_of(buf))?;
        self.broadcast_bytes(&mut device, std::mem::size_of_val(buf), root)?;
        self.download(&device, bytemuck::cast_slice_mut(buf))
    }

    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.agree(Call {
            elem: Some(T::TYPE),
            len: send.len(),
            recv_len: recv.len(),
            ..Call::new(Kind::AllGather)
        })?;
        if recv.is_empty() {
            return Ok(());
        }
        let bytes = std::mem::size_of_val(send);
        let device = self.upload(bytes_of(send))?;
        let mut all = self.scratch(bytes * self.size)?;
        self.all_gather_bytes("all_gather", &device, &mut all, bytes)?;
        self.download(&all, bytemuck::cast_slice_mut(recv))
    }

    fn all_gather_varied<T: Element>(&self, send: &[T]) -> Result<Gathered<T>> {
        // The header exchange carries every rank's count.
        let calls = self.agree(Call {
            elem: Some(T::TYPE),
            len: send.len(),
            ..Call::new(Kind::AllGatherVaried)
        })?;
        let lens: Vec<usize> = calls.iter().map(|c| c.len).collect();
        let most = lens.iter().copied().max().unwrap_or(0);
        let size = std::mem::size_of::<T>();
        let block = most * size;
        let mut data = Vec::with_capacity(lens.iter().sum());
        if block > 0 {
            let mut padded = bytes_of(send).to_vec();
            padded.resize(block, 0);
            let device = self.upload(&padded)?;
            let mut all = self.scratch(block * self.size)?;
            self.all_gather_bytes("all_gather_varied", &device, &mut all, block)?;
            let mut host = vec![T::zeroed(); most * self.size];
            self.download(&all, bytemuck::cast_slice_mut(&mut host))?;
            for (q, &l) in lens.iter().enumerate() {
                data.extend_from_slice(host.get(q * most..q * most + l).unwrap_or(&[]));
            }
        }
        Gathered::new(data, &lens)
    }

    fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.agree(Call {
            elem: Some(T::TYPE),
            op: Some(op),
            len: send.len(),
            recv_len: recv.len(),
            ..Call::new(Kind::ReduceScatter)
        })?;
        let mine = chunk_range(send.len(), self.size, self.rank);
        let own = send.get(mine).unwrap_or(&[]);
        if self.size == 1 {
            recv.copy_from_slice(own);
            return Ok(());
        }
        let device = self.upload(bytes_of(send))?;
        self.reduce_chunk_on_host(&device, own, send.len(), op, recv)
    }

    fn send<T: Element>(&self, buf: &[T], dest: usize) -> Result<()> {
        self.check_rank(dest)?;
        self.reap()?;
        self.queue_send(buf, dest)
    }

    fn recv<T: Element>(&self, buf: &mut [T], src: usize) -> Result<()> {
        self.check_rank(src)?;
        self.reap()?;
        self.receive(buf, src)
    }

    fn sendrecv<T: Element>(
        &self,
        send: &[T],
        dest: usize,
        recv: &mut [T],
        src: usize,
    ) -> Result<()> {
        self.check_rank(dest)?;
        self.check_rank(src)?;
        self.reap()?;
        self.exchange_with(send, dest, recv, src)
    }

    fn barrier(&self) -> Result<()> {
        // The header all-gather is itself a barrier.
        self.agree(Call::new(Kind::Barrier)).map(|_| ())
    }

    fn post_fault(&self, code: u32) -> CommError {
        let call = Call {
            key: i64::from(code),
            ..Call::new(Kind::Fault)
        };
        match self.agree(call) {
            Err(err) => err,
            // Unreachable: validation fails every round with a fault in it.
            Ok(_) => CommError::Fault {
                rank: self.rank(),
                code,
            },
        }
    }

    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Self>> {
        let calls = self.agree(Call {
            color,
            key,
            ..Call::new(Kind::Split)
        })?;
        let plan = header::split_plan(&calls)?;
        let (nccl_color, nccl_key) = plan.get(self.rank).copied().unwrap_or((None, 0));
        let size = color.map_or(0, |_| {
            plan.iter()
                .filter(|(c, _)| c.is_some() && *c == nccl_color)
                .count()
        });
        match self.split_raw(nccl_color, nccl_key)? {
            None => Ok(None),
            Some(owner) => NcclComm::adopt(
                owner,
                usize::try_from(nccl_key).unwrap_or(0),
                size,
                Arc::clone(&self.device),
                self.config.clone(),
                true,
            )
            .map(Some),
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

    fn broadcast_tensor(&self, tensor: &mut Tensor, root: usize) -> Result<()> {
        match tensor.storage() {
            Storage::Cuda(_) => self.broadcast_device(tensor, root),
            Storage::Cpu(_) => crate::communicator::broadcast_host_tensor(self, tensor, root),
        }
    }

    fn all_reduce_tensor(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<()> {
        match tensor.storage() {
            Storage::Cuda(_) => self.all_reduce_device(tensor, op),
            Storage::Cpu(_) => crate::communicator::all_reduce_host_tensor(self, tensor, op),
        }
    }
}

impl NcclComm {
    /// A CUDA tensor's storage, prepared for a collective that writes it:
    /// checked to be on this rank's device, its zeroed flag materialised (a
    /// zeroed tensor takes part with zeros), copied if shared with a clone
    /// (copy on write, done now, before the streams are ordered), and
    /// NCCL's stream ordered after the work queued on the tensor's stream.
    /// Returns the storage and the tensor's stream, which the caller orders
    /// after NCCL's when done.
    fn device_storage<'t>(
        &self,
        tensor: &'t mut Tensor,
    ) -> Result<(&'t mut CudaStorage, Arc<CudaStream>)> {
        let ordinal = self.device.ordinal();
        let storage = tensor.cuda_storage_mut().map_err(cuda)?;
        if storage.ordinal() != ordinal {
            return Err(CommError::InvalidArgument(format!(
                "tensor on CUDA device {}, communicator on device {ordinal}",
                storage.ordinal()
            )));
        }
        storage.buffer_mut().map_err(cuda)?;
        let tensor_stream = Arc::clone(storage.device().stream());
        self.stream
            .join(&tensor_stream)
            .map_err(|e| driver("cuStreamWaitEvent", e))?;
        Ok((storage, tensor_stream))
    }

    /// `broadcast_tensor` on a CUDA tensor: `ncclBroadcast` in place.
    fn broadcast_device(&self, tensor: &mut Tensor, root: usize) -> Result<()> {
        let elem = ElemType::from(tensor.dtype());
        let len = tensor.len();
        self.agree(Call {
            elem: Some(elem),
            len,
            root,
            ..Call::new(Kind::Broadcast)
        })?;
        if len == 0 {
            return Ok(());
        }
        let (storage, tensor_stream) = self.device_storage(tensor)?;
        let mut view = storage.bytes_mut().map_err(cuda)?;
        self.broadcast_bytes(&mut view, len * elem.size_in_bytes(), root)?;
        tensor_stream
            .join(&self.stream)
            .map_err(|e| driver("cuStreamWaitEvent", e))
    }

    /// `all_reduce_tensor` on a CUDA tensor, all on the device: chunk
    /// exchange, the rank-ordered reduction kernel, all-gather of the
    /// reduced chunks back into the tensor.
    fn all_reduce_device(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<()> {
        let elem = ElemType::from(tensor.dtype());
        let len = tensor.len();
        self.agree(Call {
            elem: Some(elem),
            op: Some(op),
            len,
            ..Call::new(Kind::AllReduce)
        })?;
        let (w, me) = (self.size, self.rank);
        if w == 1 || len == 0 {
            return Ok(());
        }
        let chunk_op = match op {
            ReduceOp::Sum => ChunkOp::Sum,
            ReduceOp::Avg => ChunkOp::Avg,
            ReduceOp::Max => ChunkOp::Max,
            ReduceOp::Min => ChunkOp::Min,
        };
        let dtype = tensor.dtype();
        let size = elem.size_in_bytes();
        let n = chunk_range(len, w, me).len();
        let most = chunk_range(len, w, 0).len();
        let ordinal = self.device.ordinal();
        let (storage, tensor_stream) = self.device_storage(tensor)?;
        let mut stage = CudaStorage::alloc_zeros(w * n, dtype, ordinal).map_err(cuda)?;
        {
            let send = storage.bytes().map_err(cuda)?;
            let mut slots = stage.bytes_mut().map_err(cuda)?;
            self.scatter_chunks(&send, len, size, &mut slots)?;
            // The own chunk: a device-to-device copy, never sent to itself.
            if n > 0 {
                let mine = chunk_range(len, w, me);
                let src = send
                    .try_slice(mine.start * size..mine.end * size)
                    .ok_or_else(|| CommError::InvalidArgument("chunk beyond the buffer".into()))?;
                let mut dst = slots
                    .try_slice_mut(me * n * size..(me + 1) * n * size)
                    .ok_or_else(|| CommError::InvalidArgument("chunk beyond the stage".into()))?;
                self.stream
                    .memcpy_dtod(&src, &mut dst)
                    .map_err(|e| driver("cuMemcpyDtoD", e))?;
            }
        }
        // The reduced chunk, in a block as long as the largest chunk (the
        // all-gather's block size; the tail is never read back).
        let mut reduced = CudaStorage::alloc_zeros(n, dtype, ordinal).map_err(cuda)?;
        collective::reduce_chunks(&mut reduced, &stage, w, chunk_op, &self.stream).map_err(cuda)?;
        let mut block = self.scratch(most * size)?;
        if n > 0 {
            let src = reduced.bytes().map_err(cuda)?;
            let mut dst = block
                .try_slice_mut(..n * size)
                .ok_or_else(|| CommError::InvalidArgument("reduced block".into()))?;
            self.stream
                .memcpy_dtod(&src, &mut dst)
                .map_err(|e| driver("cuMemcpyDtoD", e))?;
        }
        self.gather_chunks(
            &block.as_view(),
            len,
            size,
            &mut storage.bytes_mut().map_err(cuda)?,
        )?;
        tensor_stream
            .join(&self.stream)
            .map_err(|e| driver("cuStreamWaitEvent", e))
    }
}

type OwnerJob = Box<dyn FnOnce(&RawComm) + Send>;

/// The thread that holds a rank's NCCL communicator and issues every NCCL
/// call on it, in order. Dropping it destroys the communicator there (or
/// leaves it, if it was aborted).
struct Owner {
    jobs: Option<mpsc::Sender<OwnerJob>>,
    thread: Option<JoinHandle<()>>,
    abort: Arc<AbortState>,
}

/// The watchdog's view of a communicator: its abort handle until aborted.
struct AbortState {
    handle: std::sync::Mutex<Option<sys::AbortHandle>>,
    /// Why it was aborted, returned by every later call.
    reason: std::sync::Mutex<Option<CommError>>,
}

impl Owner {
    /// Starts the owner thread; `make` creates the communicator there (a
    /// collective init, or a handle from a split) with the device current.
    ///
    /// An init waits for every rank; past `timeout` this returns
    /// `Timeout` (the blocked thread is left behind: NCCL cannot abort a
    /// communicator that does not exist yet).
    fn start<M>(
        rank: usize,
        device: Arc<CudaDevice>,
        timeout: Option<Duration>,
        make: M,
    ) -> Result<Owner>
    where
        M: FnOnce() -> Result<RawComm> + Send + 'static,
    {
        let abort = Arc::new(AbortState {
            handle: std::sync::Mutex::new(None),
            reason: std::sync::Mutex::new(None),
        });
        let (jobs, queue) = mpsc::channel::<OwnerJob>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let state = Arc::clone(&abort);
        let thread = std::thread::Builder::new()
            .name(format!("gradwire-nccl-{rank}"))
            .spawn(move || {
                // NCCL uses the thread's current CUDA context.
                if let Err(e) = device.stream().context().bind_to_thread() {
                    let _ = ready_tx.send(Err(driver("cuCtxSetCurrent", e)));
                    return;
                }
                let comm = match make() {
                    Ok(comm) => comm,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                *lock(&state.handle) = Some(comm.abort_handle());
                if ready_tx.send(Ok(())).is_err() {
                    let _ = sys::destroy(comm);
                    return;
                }
                for job in queue {
                    job(&comm);
                }
                // The NcclComm dropped. Destroy the communicator unless an
                // abort already freed it (the abort took the handle; a
                // RawComm has no Drop, so letting it go frees nothing).
                if lock(&state.handle).take().is_some() {
                    let _ = sys::destroy(comm);
                }
            })
            .map_err(|e| CommError::InvalidArgument(format!("cannot start a thread: {e}")))?;
        let start = Instant::now();
        let ready = match timeout {
            None => ready_rx
                .recv()
                .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            Some(limit) => ready_rx.recv_timeout(limit),
        };
        match ready {
            Ok(Ok(())) => Ok(Owner {
                jobs: Some(jobs),
                thread: Some(thread),
                abort,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(mpsc::RecvTimeoutError::Timeout) => Err(CommError::Timeout {
                op: "ncclCommInitRank",
                waited: start.elapsed(),
                missing: Vec::new(),
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
                Err(CommError::WorkerStopped)
            }
        }
    }

    /// Runs `job` on the owner thread and returns its result, waiting at
    /// most `timeout` (then aborting the communicator).
    fn call<F>(&self, op: &'static str, timeout: Option<Duration>, job: F) -> Result<()>
    where
        F: FnOnce(&RawComm) -> Result<()> + Send + 'static,
    {
        if let Some(reason) = self.aborted() {
            return Err(reason);
        }
        let (tx, rx) = mpsc::channel();
        let job: OwnerJob = Box::new(move |comm| {
            let _ = tx.send(job(comm));
        });
        self.jobs
            .as_ref()
            .ok_or(CommError::WorkerStopped)?
            .send(job)
            .map_err(|_| CommError::WorkerStopped)?;
        let start = Instant::now();
        let result = match timeout {
            None => rx.recv().map_err(|_| CommError::WorkerStopped)?,
            Some(limit) => match rx.recv_timeout(limit) {
                Ok(result) => result,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let timeout = CommError::Timeout {
                        op,
                        waited: start.elapsed(),
                        missing: Vec::new(),
                    };
                    self.abort_with(timeout.clone());
                    return Err(timeout);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(CommError::WorkerStopped),
            },
        };
        if let Err(e) = &result {
            // A failed NCCL call leaves the communicator in an unknown
            // state: abort it, so the peers' waits end too.
            self.abort_with(e.clone());
        }
        result
    }

    fn aborted(&self) -> Option<CommError> {
        lock(&self.abort.reason).clone()
    }

    /// The asynchronous error NCCL found, if any.
    fn async_error(&self) -> Result<()> {
        if let Some(reason) = self.aborted() {
            return Err(reason);
        }
        let handle = *lock(&self.abort.handle);
        match handle {
            Some(h) => h.async_error(),
            None => Err(CommError::WorkerStopped),
        }
    }

    fn abort(&self) {
        self.abort_with(CommError::Nccl {
            op: "ncclCommAbort",
            code: 0,
            message: "the communicator was aborted".into(),
        });
    }

    /// Aborts the communicator once (`ncclCommAbort`), remembering why.
    fn abort_with(&self, reason: CommError) {
        let handle = lock(&self.abort.handle).take();
        if let Some(handle) = handle {
            lock(&self.abort.reason).get_or_insert(reason);
            #[allow(unsafe_code)]
            // SAFETY: the handle was taken out of the state, so this is the
            // only abort; the communicator is live (destroy happens only
            // when the owner thread ends, after this Owner is dropped); no
            // job is queued after this one (every call checks `aborted`
            // first, and calls come from the one thread holding the Owner).
            let _ = unsafe { handle.abort() };
        }
    }

    /// Makes every later call return `reason`, without aborting (a lost
    /// asynchronous lane: no work is in flight).
    fn poison(&self, reason: CommError) {
        self.abort.poison(reason);
    }
}

impl AbortState {
    /// Sets the reason every later call returns, unless there is one. Any
    /// thread may call it: a wait of the thread using the communicator
    /// (`NcclComm::wait`, which polls `async_error`) then ends with it, and
    /// that thread aborts the communicator itself.
    fn poison(&self, reason: CommError) {
        lock(&self.reason).get_or_insert(reason);
    }
}

/// Locks a mutex, ignoring poisoning (the data are plain values).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
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
    let (body, config) = (&body, &config);
    std::thread::scope(|scope| {
        let threads = ordinals
            .iter()
            .enumerate()
            .map(|(rank, &ordinal)| {
                std::thread::Builder::new()
                    .name(format!("gradwire-nccl-rank-{rank}"))
                    .spawn_scoped(scope, move || {
                        let comm = NcclComm::from_id(&id, rank, world, ordinal, config.clone())?;
                        body(comm)
                    })
                    .map_err(|e| CommError::InvalidArgument(format!("cannot start a thread: {e}")))
            })
            .collect::<Vec<_>>();
        Ok(threads
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                t.and_then(|t| {
                    t.join().unwrap_or_else(|payload| {
                        Err(CommError::RankPanicked {
                            rank,
                            message: crate::pending::panic_message(payload.as_ref()),
                        })
                    })
                })
            })
            .collect())
    })
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
    fn message_headers_round_trip_and_reject_unknown_types() {
        for (i, &elem) in ElemType::ALL.iter().enumerate() {
            let head = encode_message_header(elem, 1000 + i);
            assert_eq!(
                decode_message_header(&head).expect("decodes"),
                (Some(elem), 1000 + i)
            );
        }
        let mut head = [0u8; 16];
        head[..8].copy_from_slice(&99u64.to_le_bytes());
        assert_eq!(decode_message_header(&head).expect("decodes").0, None);
    }
}
