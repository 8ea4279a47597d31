//! NCCL's rules on the CPU: the transport that lets CI run every line of
//! [`NcclComm`]'s own protocol without a GPU. The ranks are threads of one
//! process ([`run`]), device memory is host memory, and the transport
//! enforces what NCCL documents (and what a first run on GPUs would have
//! met), so that a protocol that would hang or fail on NCCL hangs (until
//! the communicator's deadline) or fails here too:
//!
//! 1. **Communicators are non-blocking**: joining (`ncclCommInitRank`)
//!    returns at once and the communicator is in progress
//!    (`ncclInProgress`) until every rank of the world joined the id; a
//!    split (`ncclCommSplit`) returns at once with the parent in progress
//!    until every rank split, and only then hands out the new
//!    communicator (NCCL writes the caller's handle when the split
//!    completes: read earlier, it is NULL). Using a communicator in
//!    progress is `ncclInvalidUsage`.
//! 2. **One stream per communicator**: its operations run one at a time
//!    in the order queued, on a thread of their own or on the thread that
//!    waits for them; a synchronisation waits for all of them, and a
//!    failed operation fails every later wait (CUDA's sticky errors).
//!    Buffers are freed on their stream after the work queued before the
//!    free; an upload returns once its source is consumed, a download once
//!    copied (pageable memory).
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
//! 7. **The first transfer between two ranks connects them**: after the
//!    group that has it, the communicator is in progress until the peer
//!    issues a group with a transfer to this rank.
//! 8. **An abort ends the rank's stream operations** with an error, and is
//!    allowed while the communicator is in progress; the peers are not told
//!    (no network fails here), so they wait, as on NCCL, for their own
//!    deadline or a notice from gradwire.
//! 9. **One thread at a time on a communicator**: a call (the abort
//!    included) that starts while another call on the same communicator
//!    runs fails with `ncclInvalidUsage`; only `ncclCommGetAsyncError` may
//!    come from another thread.
//!
//! What it does not model: NCCL's algorithms and precision (reductions are
//! gradwire's rank-ordered kernels, within the bound the conformance suite
//! allows NCCL), kernels running concurrently on one device, and timing.
//! CUDA tensors are refused (`DeviceMismatch`): host tensors take the host
//! path, as they do on NCCL.

mod fabric;
mod stream;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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
    binding: Arc<Binding>,
}

/// A split the host transport issued: its new communicator exists once
/// every rank split.
#[derive(Debug)]
pub struct HostSplit {
    parent: Arc<Fabric>,
    seq: u64,
    rank: usize,
    colored: bool,
}

/// The host transport's abort handle.
#[derive(Debug, Clone)]
pub struct HostAbort {
    binding: Arc<Binding>,
}

/// The communicator a handle is the rank of, and that rank.
#[derive(Debug)]
struct Binding {
    fabric: Arc<Fabric>,
    rank: usize,
    /// Aborted: every later call and poll fails.
    aborted: AtomicBool,
    /// A call on the communicator is running (rule 9).
    in_call: AtomicBool,
}

/// A call on a communicator, for as long as it runs (rule 9).
struct InCall<'a>(&'a AtomicBool);

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Binding {
    fn of(fabric: Arc<Fabric>, rank: usize) -> Arc<Binding> {
        Arc::new(Binding {
            fabric,
            rank,
            aborted: AtomicBool::new(false),
            in_call: AtomicBool::new(false),
        })
    }

    /// Starts call `op` on the communicator: `ncclInvalidUsage` if another
    /// call on it is running.
    fn enter(&self, op: &'static str) -> Result<InCall<'_>> {
        if self.in_call.swap(true, Ordering::SeqCst) {
            return Err(fabric::nccl_error(
                op,
                fabric::INVALID_USAGE,
                "called while another thread's call on the communicator runs".into(),
            ));
        }
        Ok(InCall(&self.in_call))
    }

    /// The communicator, or `ncclInvalidUsage` while it is in progress.
    fn ready(&self, op: &'static str) -> Result<(Arc<Fabric>, usize)> {
        if self.fabric.progress(self.rank)? {
            Ok((Arc::clone(&self.fabric), self.rank))
        } else {
            Err(in_progress(op))
        }
    }
}

/// The error of a call on a communicator still in progress.
fn in_progress(op: &'static str) -> CommError {
    fabric::nccl_error(
        op,
        fabric::INVALID_USAGE,
        "the communicator is still in progress (ncclInProgress)".into(),
    )
}

/// A rank's "device": the host, numbered by rank.
#[derive(Debug, Clone, Copy)]
pub struct HostDevice(usize);

impl NcclTransport for HostTransport {}

impl HostComm {
    fn enqueue(&self, queue: &Arc<Stream>, call: Collective, send: u64, recv: u64) -> Result<()> {
        let _call = self.binding.enter(call.name())?;
        let (fabric, rank) = self.binding.ready(call.name())?;
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
    type Split = HostSplit;
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
        Ok(HostComm {
            binding: Binding::of(fabric, rank),
        })
    }

    fn split(comm: &HostComm, color: Option<i32>, key: i32) -> Result<HostSplit> {
        let _call = comm.binding.enter("ncclCommSplit")?;
        let (parent, rank) = comm.binding.ready("ncclCommSplit")?;
        let seq = parent.split(rank, color, key)?;
        Ok(HostSplit {
            parent,
            seq,
            rank,
            colored: color.is_some(),
        })
    }

    fn split_result(split: HostSplit) -> Result<Option<HostComm>> {
        if !split.colored {
            return Ok(None);
        }
        // NCCL writes the new handle only once the split completed; read
        // earlier, it is still NULL.
        let (fabric, rank) = split
            .parent
            .split_result(split.seq, split.rank)
            .ok_or_else(|| {
                fabric::nccl_error(
                    "ncclCommSplit",
                    fabric::INVALID_USAGE,
                    "the new communicator was read before the split completed (NCCL leaves it NULL until then)".into(),
                )
            })?;
        Ok(Some(HostComm {
            binding: Binding::of(fabric, rank),
        }))
    }

    fn destroy(comm: HostComm) -> Result<()> {
        comm.binding.enter("ncclCommDestroy").map(drop)
    }

    fn abort_handle(comm: &HostComm) -> HostAbort {
        HostAbort {
            binding: Arc::clone(&comm.binding),
        }
    }

    #[allow(unsafe_code)]
    unsafe fn abort(handle: HostAbort) -> Result<()> {
        let _call = handle.binding.enter("ncclCommAbort")?;
        handle.binding.aborted.store(true, Ordering::SeqCst);
        handle.binding.fabric.abort(handle.binding.rank);
        Ok(())
    }

    fn async_error(handle: &HostAbort) -> Result<()> {
        handle.binding.fabric.async_error()
    }

    fn progress(handle: &HostAbort) -> Result<bool> {
        if handle.binding.aborted.load(Ordering::SeqCst) {
            return Err(fabric::nccl_error(
                "ncclCommGetAsyncError",
                fabric::INVALID_USAGE,
                "the communicator was aborted".into(),
            ));
        }
        handle.binding.fabric.progress(handle.binding.rank)
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
        let world = comm.binding.ready("ncclBroadcast")?.0.world();
        if root >= world {
            return Err(fabric::nccl_error(
                "ncclBroadcast",
                fabric::INVALID_USAGE,
                format!("root {root} of a world of {world}"),
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
        let _call = comm.binding.enter("ncclGroupEnd")?;
        let (fabric, rank) = comm.binding.ready("ncclGroupEnd")?;
        fabric.issue_group(rank, sends, recvs)?;
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
    let ranks = crate::rank_threads::on_rank_threads(
        (0..world).collect(),
        "gradwire-host-nccl-rank",
        |rank| body(NcclComm::from_host_id(id, rank, world, config.clone())?),
    );
    Ok(ranks.into_iter().map(|rank| rank.and_then(|r| r)).collect())
}

#[cfg(test)]
mod tests {
    //! The owner thread over the non-blocking host transport: an init or a
    //! split that a peer never joins ends at its deadline, aborted by the
    //! owner thread itself (rule 9 would refuse an abort beside a running
    //! call, and the handle would not report it).

    use std::time::Duration;

    use super::*;
    use crate::nccl::owner::Owner;

    const DEADLINE: Option<Duration> = Some(Duration::from_millis(300));

    fn timed_out(result: &Result<()>, op: &str) -> bool {
        matches!(result, Err(CommError::Timeout { op: o, .. }) if *o == op)
    }

    fn aborted(handle: &HostAbort) -> bool {
        matches!(HostTransport::progress(handle), Err(CommError::Nccl { code: fabric::INVALID_USAGE, message, .. }) if message.contains("aborted"))
    }

    #[test]
    fn an_init_a_peer_never_joins_ends_at_its_deadline() {
        let id = HostId::generate();
        let lone = Owner::<HostTransport>::start(0, HostDevice(0), DEADLINE, move || {
            HostTransport::init_rank(&id, 2, 0)
        })
        .map(drop);
        assert!(timed_out(&lone, "ncclCommInitRank"), "{lone:?}");
    }

    #[test]
    fn a_split_hands_out_its_communicator_only_once_every_rank_split() {
        let id = HostId::generate();
        let first = HostTransport::init_rank(&id, 2, 0).expect("rank 0 joins");
        let second = HostTransport::init_rank(&id, 2, 1).expect("rank 1 joins");
        let early = HostTransport::split(&first, Some(3), 0).expect("issued");
        assert_eq!(
            HostTransport::progress(&HostTransport::abort_handle(&first)).ok(),
            Some(false),
            "the parent is in progress until every rank split"
        );
        let read_early = HostTransport::split_result(early).map(|c| c.is_some());
        assert!(
            matches!(
                &read_early,
                Err(CommError::Nccl {
                    op: "ncclCommSplit",
                    code: fabric::INVALID_USAGE,
                    ..
                })
            ),
            "{read_early:?}"
        );
        // A second split, this time read once both ranks made it: the
        // first one's slot is taken by rank 1's first split.
        let late = HostTransport::split(&second, Some(3), 0).expect("issued");
        assert!(HostTransport::progress(&HostTransport::abort_handle(&second)).expect("no error"));
        let made = HostTransport::split_result(late).expect("complete");
        assert!(made.is_some(), "rank 1 has a color: it gets a communicator");
        let none = HostTransport::split(&first, None, 0).expect("issued");
        let _ = HostTransport::split(&second, None, 0).expect("issued");
        assert!(matches!(HostTransport::split_result(none), Ok(None)));
    }

    #[test]
    fn a_split_a_peer_never_makes_ends_at_its_deadline_aborted_by_the_owner() {
        let id = HostId::generate();
        let start = |rank: usize| {
            Owner::<HostTransport>::start(rank, HostDevice(rank), DEADLINE, move || {
                HostTransport::init_rank(&id, 2, rank)
            })
        };
        let (first, second) = std::thread::scope(|scope| {
            let other = scope.spawn(|| start(1));
            (start(0), other.join().expect("rank 1's thread"))
        });
        let (first, _second) = (first.expect("rank 0 joins"), second.expect("rank 1 joins"));
        let (tx, rx) = std::sync::mpsc::channel();
        let split = first.call("ncclCommSplit", DEADLINE, move |comm| {
            let _ = tx.send(HostTransport::abort_handle(comm));
            HostTransport::split(comm, Some(0), 0).map(drop)
        });
        assert!(timed_out(&split, "ncclCommSplit"), "{split:?}");
        let handle = rx.recv().expect("the job ran");
        let after = first.call("ncclAllReduce", DEADLINE, |_| Ok(()));
        assert!(timed_out(&after, "ncclCommSplit"), "{after:?}");
        // The owner thread aborts right after the job; joining it (the
        // drop) orders this after the abort.
        drop(first);
        assert!(
            aborted(&handle),
            "the owner thread aborted the communicator"
        );
    }
}
