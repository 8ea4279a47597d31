//! What NcclComm needs from below: NCCL's calls, one stream per
//! communicator, device memory and events. [`NcclTransport`] names the two
//! implementations, so that every line of NcclComm's own protocol (the
//! header exchange, the collectives' layouts and calls, point to point and
//! its loopback, the rank-ordered reduction, the owner thread, the
//! watchdog, the scratch, the outbox, the departure notice) runs on both:
//!
//! - [`CudaTransport`](super::CudaTransport) (`cuda.rs` over `sys.rs`):
//!   NCCL and CUDA, loaded at run time;
//! - [`HostTransport`](super::HostTransport) (`host/`): the ranks as
//!   threads of one process and host memory as device memory, with NCCL's
//!   rules enforced ([`super::host`] lists them), so that CI runs NcclComm's
//!   protocol without a GPU.
//!
//! The machinery is the private supertrait [`Imp`]: users name a transport
//! as a type parameter only.

use crate::element::ElemType;
use crate::error::Result;
use crate::op::ReduceOp;

/// The transport NcclComm runs on: [`CudaTransport`](super::CudaTransport)
/// (the default, real NCCL on GPUs) or
/// [`HostTransport`](super::HostTransport) (NCCL's rules on the CPU, for
/// tests). Sealed: implemented in this crate only.
pub trait NcclTransport: sealed::Imp {}

/// A reduction NCCL computes itself (`NcclReduction::Native`): the element
/// type and the operator, which the transport maps to its own datatype and
/// operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Native {
    /// The element type of the buffer.
    pub elem: ElemType,
    /// The operator.
    pub op: ReduceOp,
}

/// One point-to-point transfer of a group: `bytes` bytes at device address
/// `ptr` to or from `peer`.
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    /// The peer's rank in the communicator.
    pub peer: usize,
    /// The device address.
    pub ptr: u64,
    /// How many bytes.
    pub bytes: usize,
}

pub(super) use sealed::Imp;

mod sealed {
    use super::*;
    use gradwire_tensor::Tensor;

    /// The transport's machinery (see the module docs). Every operation
    /// below is what NcclComm's protocol issues; the CUDA transport's are
    /// NCCL's and CUDA's own calls, the host transport's their emulation.
    ///
    /// # Safety of the `unsafe` operations
    ///
    /// Device addresses are live allocations of at least the given byte
    /// counts on the communicator's device, and stay allocated until the
    /// queued work is complete (the callers keep their buffers until the
    /// stream has passed the work, or the communicator is aborted).
    pub trait Imp: Sized + Send + Sync + 'static {
        /// A device (one rank's GPU, or the host).
        type Device: Clone + Send + Sync + 'static;
        /// A live communicator handle, held by the owner thread.
        type Comm: Send + 'static;
        /// A handle that reads the communicator's asynchronous error from
        /// any thread (the watchdog's) and aborts it (the owner thread,
        /// between its calls).
        type Abort: Clone + Send + Sync + 'static;
        /// A split issued and not yet complete: it names the new
        /// communicator once the parent's [`Imp::progress`] says done.
        type Split: Send + 'static;
        /// The communicator's stream, on which its work runs in order.
        type Stream: Send + Sync + 'static;
        /// What crosses to the owner thread to name the stream.
        type Queue: Send + 'static;
        /// A device byte buffer.
        type Buffer: Send + 'static;
        /// A point on a stream, passed once the work queued before it is
        /// done.
        type Event: Send + 'static;
        /// What ranks find each other with (NCCL's unique id).
        type Id: Copy + Send + Sync + 'static;

        /// Checks that the library is present and usable; its version.
        fn load() -> Result<i32>;
        /// The device's ordinal.
        fn ordinal(device: &Self::Device) -> usize;
        /// Makes the device current on this thread (NCCL uses the
        /// thread's current CUDA context).
        fn bind(device: &Self::Device) -> Result<()>;
        /// A new stream on the device.
        fn new_stream(device: &Self::Device) -> Result<Self::Stream>;
        /// The stream's name for the owner thread.
        fn queue_of(stream: &Self::Stream) -> Self::Queue;

        /// `ncclCommInitRankConfig`, non-blocking: returns at once with the
        /// communicator initialising; [`Imp::progress`] says when every
        /// rank has joined.
        fn init_rank(id: &Self::Id, world: usize, rank: usize) -> Result<Self::Comm>;
        /// `ncclCommSplit`: collective over `comm`, non-blocking as the
        /// init: `comm` is in progress until every rank split (poll it with
        /// [`Imp::progress`]), then [`Imp::split_result`] hands out the new
        /// communicator.
        fn split(comm: &Self::Comm, color: Option<i32>, key: i32) -> Result<Self::Split>;
        /// The new communicator of a split whose parent's progress said
        /// done (`None` for a rank that asked for no color). NCCL writes it
        /// only when the split completes: read earlier, it is missing.
        fn split_result(split: Self::Split) -> Result<Option<Self::Comm>>;
        /// `ncclCommDestroy` of a communicator whose work is complete.
        fn destroy(comm: Self::Comm) -> Result<()>;
        /// The watchdog's handle of `comm`.
        fn abort_handle(comm: &Self::Comm) -> Self::Abort;
        /// `ncclCommAbort`: ends every pending operation and frees the
        /// communicator.
        ///
        /// # Safety
        ///
        /// The communicator is live, no other call on it runs beside this
        /// one, and nothing uses it afterwards.
        unsafe fn abort(handle: Self::Abort) -> Result<()>;
        /// `ncclCommGetAsyncError`.
        fn async_error(handle: &Self::Abort) -> Result<()>;
        /// Whether the communicator finished the host side of its last
        /// operation (`ncclCommGetAsyncError` no longer `ncclInProgress`:
        /// its init, a split, a group's connections), or why it failed.
        /// Every call of a non-blocking communicator returns at once; the
        /// owner thread polls this before it issues the next.
        fn progress(handle: &Self::Abort) -> Result<bool>;

        /// `ncclAllGather` of `bytes` bytes per rank (in place when `send
        /// == recv + rank * bytes`).
        ///
        /// # Safety
        ///
        /// See the trait.
        unsafe fn all_gather(
            comm: &Self::Comm,
            send: u64,
            recv: u64,
            bytes: usize,
            queue: &Self::Queue,
        ) -> Result<()>;
        /// `ncclAllReduce` of `count` elements (in place when `send ==
        /// recv`).
        ///
        /// # Safety
        ///
        /// See the trait.
        unsafe fn all_reduce(
            comm: &Self::Comm,
            send: u64,
            recv: u64,
            count: usize,
            native: Native,
            queue: &Self::Queue,
        ) -> Result<()>;
        /// `ncclReduceScatter`: W blocks of `recv_count` elements at
        /// `send`, this rank's reduced block at `recv`.
        ///
        /// # Safety
        ///
        /// See the trait.
        unsafe fn reduce_scatter(
            comm: &Self::Comm,
            send: u64,
            recv: u64,
            recv_count: usize,
            native: Native,
            queue: &Self::Queue,
        ) -> Result<()>;
        /// `ncclBroadcast` of `bytes` bytes in place from `root`.
        ///
        /// # Safety
        ///
        /// See the trait.
        unsafe fn broadcast(
            comm: &Self::Comm,
            buf: u64,
            bytes: usize,
            root: usize,
            queue: &Self::Queue,
        ) -> Result<()>;
        /// Every send and receive in one group (`ncclGroupStart` ..
        /// `ncclGroupEnd`); empty transfers are skipped.
        ///
        /// # Safety
        ///
        /// See the trait.
        unsafe fn exchange(
            comm: &Self::Comm,
            sends: &[Transfer],
            recvs: &[Transfer],
            queue: &Self::Queue,
        ) -> Result<()>;

        /// A zeroed buffer of `bytes` bytes, allocated on the stream.
        fn alloc_zeros(stream: &Self::Stream, bytes: usize) -> Result<Self::Buffer>;
        /// The buffer's length in bytes.
        fn len(buffer: &Self::Buffer) -> usize;
        /// Runs `use_at` with the buffer's device address, recording the
        /// buffer's use on the stream after it (cudarc's stream tracking).
        fn with_address<R>(
            buffer: &mut Self::Buffer,
            stream: &Self::Stream,
            use_at: impl FnOnce(u64) -> R,
        ) -> R;
        /// Copies host bytes into `dst` at byte offset `at`, on the stream;
        /// returns once `src` is consumed.
        fn upload(
            stream: &Self::Stream,
            src: &[u8],
            dst: &mut Self::Buffer,
            at: usize,
        ) -> Result<()>;
        /// Copies `dst.len()` bytes of `src` from offset `at` to the host,
        /// on the stream: `dst` holds them once the stream is synchronised.
        fn download(
            stream: &Self::Stream,
            src: &Self::Buffer,
            at: usize,
            dst: &mut [u8],
        ) -> Result<()>;
        /// Waits until everything queued on the stream is done.
        fn sync(stream: &Self::Stream) -> Result<()>;
        /// An event after everything queued on the stream so far.
        fn record_event(stream: &Self::Stream) -> Result<Self::Event>;
        /// Whether the stream has passed the event.
        fn event_done(event: &Self::Event) -> Result<bool>;

        /// `broadcast_tensor` on a tensor of this transport's devices (the
        /// host transport has none: host tensors take the host path).
        fn broadcast_device(
            comm: &super::super::NcclComm<Self>,
            tensor: &mut Tensor,
            root: usize,
        ) -> Result<()>
        where
            Self: super::NcclTransport;
        /// `all_reduce_tensor` on a tensor of this transport's devices.
        fn all_reduce_device(
            comm: &super::super::NcclComm<Self>,
            tensor: &mut Tensor,
            op: ReduceOp,
        ) -> Result<()>
        where
            Self: super::NcclTransport;
    }
}
