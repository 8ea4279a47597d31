//! NCCL's rules on the CPU: the transport that lets CI run every line of
//! [`NcclComm`]'s own protocol without a GPU. The ranks are threads of one
//! process ([`run`]), device memory is host memory, and the transport
//! enforces what NCCL documents (and what a first run on GPUs would have
//! met), so that a protocol that would hang or fail on NCCL hangs (until
//! the communicator's deadline) or fails here too:
//!
//! 1. **Joining** (`ncclCommInitRank`) blocks until every rank of the world
//!    joined the id; splits (`ncclCommSplit`) block until every rank split.
//! 2. **One stream per communicator**: its operations run in the order
//!    queued, on a thread of their own; a synchronisation waits for all of
//!    them, and a failed operation fails every later wait (CUDA's sticky
//!    errors). Buffers are freed on their stream after the work queued
//!    before the free; an upload returns once its source is consumed, a
//!    download once copied (pageable memory).
//! 3. **Collectives meet in order**: every rank's k-th collective on a
//!    communicator must be the same call (operation, count, type,
//!    operator, root). A difference, undefined on NCCL (a hang or
//!    garbage), breaks the communicator: every rank's call fails and its
//!    asynchronous error says what differed.
//! 4. **Point to point meets in order**: the k-th send from r to q matches
//!    the k-th receive at q from r, of the same byte count (else the
//!    communicator breaks). **A send completes only once its receive has
//!    taken the data** (NCCL: "blocking for the GPU"): nothing is buffered,
//!    so a send queued ahead of its peer's receive holds its stream.
//! 5. **A group's transfers progress together**; the group completes once
//!    all of them have.
//! 6. **A send to self needs its receive in the same group**; without it,
//!    `ncclGroupEnd` fails with `ncclInvalidUsage` ("Trying to send to self
//!    without a matching recv").
//! 7. **The first transfer between two ranks connects them**: the group
//!    that has it blocks in `ncclGroupEnd` (on the host, the owner thread)
//!    until the peer issues a group with a transfer to this rank.
//! 8. **An abort ends the rank's blocked calls and stream operations** with
//!    an error; the peers are not told (no network fails here), so they
//!    wait, as on NCCL, for their own deadline or a notice from gradwire.
//!
//! What it does not model: NCCL's algorithms and precision (reductions are
//! gradwire's rank-ordered kernels, within the bound the conformance suite
//! allows NCCL), kernels running concurrently on one device, and timing.
//! CUDA tensors are refused (`DeviceMismatch`): host tensors take the host
//! path, as they do on NCCL.

mod fabric;
mod stream;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use gradwire_tensor::Tensor;

use self::fabric::{Collective, Fabric};
use self::stream::{HostBuffer, HostEvent, HostStream, Stream};
use super::transport::{Imp, Native, NcclTransport, Transfer};
use super::{NcclComm, NcclConfig};
use crate::error::{CommError, Result};
use crate::op::ReduceOp;

/// NCCL's rules on the CPU (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct HostTransport;

/// What the host transport's ranks join with: a fresh number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostId(u64);

impl HostId {
    /// A fresh id.
    pub fn generate() -> HostId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        HostId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// One rank's handle of a host communicator.
#[derive(Debug)]
pub struct HostComm {
    fabric: Arc<Fabric>,
    rank: usize,
}

/// The host transport's abort handle.
#[derive(Debug, Clone)]
pub struct HostAbort {
    fabric: Arc<Fabric>,
    rank: usize,
}

/// A rank's "device": the host, numbered by rank.
#[derive(Debug, Clone, Copy)]
pub struct HostDevice(usize);

impl NcclTransport for HostTransport {}

impl HostComm {
    fn enqueue(&self, queue: &Arc<Stream>, call: Collective, send: u64, recv: u64) -> Result<()> {
        let (fabric, rank) = (Arc::clone(&self.fabric), self.rank);
        queue.push(Box::new(move || {
            #[allow(unsafe_code)]
            // SAFETY: the addresses are the caller's (the trait's
            // contract: live until the stream has passed this operation).
            unsafe {
                fabric.collective(rank, call, send, recv)
            }
        }));
        Ok(())
    }
}

impl Imp for HostTransport {
    type Device = HostDevice;
    type Comm = HostComm;
    type Abort = HostAbort;
    type Stream = HostStream;
    type Queue = Arc<Stream>;
    type Buffer = HostBuffer;
    type Event = HostEvent;
    type Id = HostId;

    fn load() -> Result<i32> {
        Ok(0)
    }

    fn ordinal(device: &HostDevice) -> usize {
        device.0
    }

    fn bind(_: &HostDevice) -> Result<()> {
        Ok(())
    }

    fn new_stream(device: &HostDevice) -> Result<HostStream> {
        HostStream::start(format!("gradwire-host-stream-{}", device.0))
    }

    fn queue_of(stream: &HostStream) -> Arc<Stream> {
        Arc::clone(&stream.inner)
    }

    fn init_rank(id: &HostId, world: usize, rank: usize) -> Result<HostComm> {
        let fabric = Fabric::join(id.0, world, rank)?;
        Ok(HostComm { fabric, rank })
    }

    fn split(comm: &HostComm, color: Option<i32>, key: i32) -> Result<Option<HostComm>> {
        Ok(comm
            .fabric
            .split(comm.rank, color, key)?
            .map(|(fabric, rank)| HostComm { fabric, rank }))
    }

    fn destroy(_: HostComm) -> Result<()> {
        Ok(())
    }

    fn abort_handle(comm: &HostComm) -> HostAbort {
        HostAbort {
            fabric: Arc::clone(&comm.fabric),
            rank: comm.rank,
        }
    }

    #[allow(unsafe_code)]
    unsafe fn abort(handle: HostAbort) -> Result<()> {
        handle.fabric.abort(handle.rank);
        Ok(())
    }

    fn async_error(handle: &HostAbort) -> Result<()> {
        handle.fabric.async_error()
    }

    #[allow(unsafe_code)]
    unsafe fn all_gather(
        comm: &HostComm,
        send: u64,
        recv: u64,
        bytes: usize,
        queue: &Arc<Stream>,
    ) -> Result<()> {
        comm.enqueue(queue, Collective::AllGather { bytes }, send, recv)
    }

    #[allow(unsafe_code)]
    unsafe fn all_reduce(
        comm: &HostComm,
        send: u64,
        recv: u64,
        count: usize,
        native: Native,
        queue: &Arc<Stream>,
    ) -> Result<()> {
        comm.enqueue(queue, Collective::AllReduce { count, native }, send, recv)
    }

    #[allow(unsafe_code)]
    unsafe fn reduce_scatter(
        comm: &HostComm,
        send: u64,
        recv: u64,
        recv_count: usize,
        native: Native,
        queue: &Arc<Stream>,
    ) -> Result<()> {
        let call = Collective::ReduceScatter { recv_count, native };
        comm.enqueue(queue, call, send, recv)
    }

    #[allow(unsafe_code)]
    unsafe fn broadcast(
        comm: &HostComm,
        buf: u64,
        bytes: usize,
        root: usize,
        queue: &Arc<Stream>,
    ) -> Result<()> {
        if root >= comm.fabric.world() {
            return Err(fabric::nccl_error(
                "ncclBroadcast",
                fabric::INVALID_USAGE,
                format!("root {root} of a world of {}", comm.fabric.world()),
            ));
        }
        comm.enqueue(queue, Collective::Broadcast { bytes, root }, buf, buf)
    }

    #[allow(unsafe_code)]
    unsafe fn exchange(
        comm: &HostComm,
        sends: &[Transfer],
        recvs: &[Transfer],
        queue: &Arc<Stream>,
    ) -> Result<()> {
        comm.fabric.issue_group(comm.rank, sends, recvs)?;
        let (fabric, rank) = (Arc::clone(&comm.fabric), comm.rank);
        let (sends, recvs) = (sends.to_vec(), recvs.to_vec());
        queue.push(Box::new(move || {
            #[allow(unsafe_code)]
            // SAFETY: the addresses are the caller's (the trait's
            // contract: live until the stream has passed this operation).
            unsafe {
                fabric.group(rank, &sends, &recvs)
            }
        }));
        Ok(())
    }

    fn alloc_zeros(stream: &HostStream, bytes: usize) -> Result<HostBuffer> {
        HostBuffer::alloc_zeros(stream, bytes)
    }

    fn len(buffer: &HostBuffer) -> usize {
        buffer.len()
    }

    fn with_address<R>(
        buffer: &mut HostBuffer,
        _: &HostStream,
        use_at: impl FnOnce(u64) -> R,
    ) -> R {
        use_at(buffer.address())
    }

    fn upload(stream: &HostStream, src: &[u8], dst: &mut HostBuffer, at: usize) -> Result<()> {
        stream::upload(stream, src, dst, at)
    }

    fn download(stream: &HostStream, src: &HostBuffer, at: usize, dst: &mut [u8]) -> Result<()> {
        stream::download(stream, src, at, dst)
    }

    fn sync(stream: &HostStream) -> Result<()> {
        stream.inner.wait_for(stream.inner.mark())
    }

    fn record_event(stream: &HostStream) -> Result<HostEvent> {
        Ok(HostEvent::record(stream))
    }

    fn event_done(event: &HostEvent) -> Result<bool> {
        Ok(event.done())
    }

    fn broadcast_device(_: &NcclComm<Self>, tensor: &mut Tensor, _: usize) -> Result<()> {
        Err(no_devices(tensor))
    }

    fn all_reduce_device(_: &NcclComm<Self>, tensor: &mut Tensor, _: ReduceOp) -> Result<()> {
        Err(no_devices(tensor))
    }
}

fn no_devices(tensor: &Tensor) -> CommError {
    CommError::Tensor(gradwire_tensor::Error::DeviceMismatch {
        op: "NcclComm<HostTransport>",
        expected: gradwire_tensor::Device::Cpu,
        got: tensor.device(),
    })
}

impl NcclComm<HostTransport> {
    /// Joins the host communicator of `world` ranks identified by `id` as
    /// `rank` (collective, like [`NcclComm::from_id`]).
    pub fn from_host_id(
        id: HostId,
        rank: usize,
        world: usize,
        config: NcclConfig,
    ) -> Result<NcclComm<HostTransport>> {
        NcclComm::join(id, rank, world, HostDevice(rank), config)
    }
}

/// Runs `body` on `world` threads, each with its rank of one
/// `NcclComm<HostTransport>`, and returns the results in rank order (the
/// host transport's [`super::run`]).
pub fn run<R, F>(world: usize, config: NcclConfig, body: F) -> Result<Vec<Result<R>>>
where
    R: Send,
    F: Fn(NcclComm<HostTransport>) -> Result<R> + Sync,
{
    if world == 0 {
        return Err(CommError::InvalidArgument("no ranks".into()));
    }
    let id = HostId::generate();
    Ok(super::join::on_rank_threads(
        world,
        "gradwire-host-nccl-rank",
        |rank| body(NcclComm::from_host_id(id, rank, world, config.clone())?),
    ))
}
