//! The `Communicator` trait: the one interface every backend implements.
//!
//! The required methods work on plain slices of any [`Element`]; the `_tensor`
//! methods are provided on top and dispatch on the tensor's dtype, so a backend
//! implements each collective once. Every call is collective unless it says
//! otherwise: all ranks of the communicator must make the same calls in the
//! same order, as with MPI and NCCL. What a rank gets back when they do not is
//! an error on every rank ([`CommError::Mismatch`]), never a hang. The other
//! failures are errors on every rank too: a rank that fails before a
//! collective ([`Communicator::post_fault`]), a lost peer or a deadline
//! ([`CommError::PeerLost`], [`CommError::Timeout`]), and a panicking
//! asynchronous job ([`Communicator::run_async`]).

use crate::element::Element;
use crate::error::{CommError, Result};
use crate::job_slot::{AsyncJob, JobSlot};
use crate::op::ReduceOp;
use crate::pending::Pending;
use gradwire_tensor::{DType, Tensor};
use std::ops::Range;

/// Data gathered from every rank when ranks contribute different lengths.
///
/// A `Gathered` can be refilled in place ([`Communicator::all_gather_varied_into`],
/// [`Gathered::clear`] and [`Gathered::push_part`] for backends): its two
/// buffers keep their capacity, so a caller that gathers every step
/// allocates nothing once they have grown.
#[derive(Debug, Clone, PartialEq)]
pub struct Gathered<T> {
    data: Vec<T>,
    offsets: Vec<usize>,
}

impl<T> Default for Gathered<T> {
    /// Nothing gathered from no rank: a buffer to refill (allocates
    /// nothing until then).
    fn default() -> Self {
        Gathered {
            data: Vec::new(),
            offsets: Vec::new(),
        }
    }
}

impl<T> Gathered<T> {
    /// Builds a gathered set from the concatenated data and the per-rank
    /// counts (for backends). Errors if the counts do not add up.
    pub fn new(data: Vec<T>, counts: &[usize]) -> Result<Self> {
        let mut offsets = Vec::with_capacity(counts.len() + 1);
        let mut total = 0usize;
        offsets.push(0);
        for &c in counts {
            total = total
                .checked_add(c)
                .ok_or_else(|| CommError::InvalidArgument("gathered counts overflow".into()))?;
            offsets.push(total);
        }
        if total != data.len() {
            return Err(CommError::InvalidArgument(format!(
                "gathered counts add up to {total}, data holds {}",
                data.len()
            )));
        }
        Ok(Gathered { data, offsets })
    }

    /// Empties it (no rank's part left), keeping the buffers' capacity.
    pub fn clear(&mut self) {
        self.data.clear();
        self.offsets.clear();
        self.offsets.push(0);
    }

    /// Appends the next rank's part (for backends filling a reused
    /// `Gathered` in rank order after [`Gathered::clear`]).
    pub fn push_part(&mut self, part: &[T])
    where
        T: Copy,
    {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.data.extend_from_slice(part);
        self.offsets.push(self.data.len());
    }

    /// Number of ranks that contributed.
    pub fn world_size(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// What `rank` contributed (empty for a rank out of range).
    pub fn part(&self, rank: usize) -> &[T] {
        match self.range(rank) {
            Some(r) => &self.data[r],
            None => &[],
        }
    }

    /// Where `rank`'s contribution lies in [`Gathered::data`].
    pub fn range(&self, rank: usize) -> Option<Range<usize>> {
        Some(*self.offsets.get(rank)?..*self.offsets.get(rank + 1)?)
    }

    /// How many elements each rank contributed.
    pub fn counts(&self) -> Vec<usize> {
        self.offsets.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// All contributions, concatenated in rank order.
    pub fn data(&self) -> &[T] {
        &self.data
    }

    /// The concatenated data.
    pub fn into_data(self) -> Vec<T> {
        self.data
    }
}

/// The range of elements that part `index` of `parts` covers when `len`
/// elements are split as evenly as possible (the first `len % parts` parts
/// get one more). This is how [`Communicator::reduce_scatter`] assigns chunks.
/// An `index` out of range (or `parts == 0`) gives an empty range.
pub fn chunk_range(len: usize, parts: usize, index: usize) -> Range<usize> {
    if parts == 0 || index >= parts {
        return len..len;
    }
    let base = len / parts;
    let extra = len % parts;
    let start = index * base + index.min(extra);
    let size = base + usize::from(index < extra);
    start..start + size
}

/// A group of ranks that exchange data: the trait every backend implements.
pub trait Communicator: Send + Sized {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world_size(&self) -> usize;

    /// The flight recorder's memory of this communicator's last
    /// collectives, oldest first ([`crate::FlightRecord`]: sequence number,
    /// kind, length, how far each got, when), which it also writes to the
    /// directory its configuration names when a deadline expires or a peer
    /// is lost. Empty for a communicator that keeps none (the default).
    fn flight_records(&self) -> Vec<crate::FlightRecord> {
        Vec::new()
    }

    /// This communicator's track on its rank's timeline, when the timeline
    /// is on (its configuration's `timeline`): the layers above record
    /// their spans there ([`crate::timeline::span`]), and
    /// [`crate::timeline::gather_trace`] merges every rank's. `None` (the
    /// default) records nothing.
    fn timeline(&self) -> Option<&crate::timeline::TimelineTrack> {
        None
    }

    /// Reduces `buf` across all ranks in place; every rank receives the result.
    fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()>;

    /// Copies `root`'s `buf` into every other rank's `buf`.
    fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()>;

    /// Gathers equal-length contributions: `recv` (of `world_size() *
    /// send.len()` elements) receives rank r's `send` at `r * send.len()`.
    fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()>;

    /// Gathers contributions of different lengths (sparse payloads).
    fn all_gather_varied<T: Element>(&self, send: &[T]) -> Result<Gathered<T>>;

    /// [`Communicator::all_gather_varied`] into `out`, whose buffers are
    /// reused: a backend that overrides it (LocalComm) allocates nothing
    /// once they have grown. On an error `out`'s contents are unspecified.
    fn all_gather_varied_into<T: Element>(&self, send: &[T], out: &mut Gathered<T>) -> Result<()> {
        *out = self.all_gather_varied(send)?;
        Ok(())
    }

    /// Reduces `send` across ranks and leaves this rank's chunk of the result
    /// in `recv`: chunk `r` is [`chunk_range`]`(send.len(), world_size(), r)`.
    fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()>;

    /// Sends `buf` to rank `dest` (point to point). Messages between two
    /// ranks arrive in order.
    ///
    /// What a send may assume depends on the backend
    /// ([`Communicator::eager_messages`]): LocalComm and MpiComm buffer the
    /// message and return, so every rank may send before it receives.
    /// NcclComm returns once the transfer is queued, but the transfer
    /// completes only when `dest` receives, and until then it holds the
    /// rank's stream (every later call of this rank waits behind it): a
    /// portable program posts each receive before the receiver's own
    /// blocking sends and collectives (pairwise: one side sends first, the
    /// other receives first), or uses [`Communicator::sendrecv`], which
    /// exchanges both directions at once on every backend.
    fn send<T: Element>(&self, buf: &[T], dest: usize) -> Result<()>;

    /// Receives the next message from rank `src` into `buf`, whose element
    /// type and length must match the message's.
    fn recv<T: Element>(&self, buf: &mut [T], src: usize) -> Result<()>;

    /// Sends `send` to `dest` and receives from `src` into `recv` without
    /// deadlocking when every rank does the same (a ring shift, a pairwise
    /// exchange).
    fn sendrecv<T: Element>(
        &self,
        send: &[T],
        dest: usize,
        recv: &mut [T],
        src: usize,
    ) -> Result<()>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;

    /// Takes part in this rank's next collective as a rank that has failed,
    /// so that a fault found on one rank ends the collective on *every*
    /// rank instead of leaving the others waiting (or pairing their call
    /// with this rank's next one). Whatever collective the other ranks
    /// called, each of them, and this rank, returns the same
    /// [`CommError::Fault`] naming the lowest rank that posted a fault and
    /// its `kind` (only the kind's code crosses the wire); no data moves
    /// and the communicator stays usable. If the round fails for another
    /// reason (a lost peer, a timeout) that error is returned.
    ///
    /// This is how a multi-collective operation keeps its invariant: a rank
    /// that fails between two collectives posts a fault in place of the
    /// next one, then returns its own error; every other rank returns the
    /// `Fault` from that same collective, so all stand at the same point.
    ///
    /// [`FaultKind::LaneLost`](crate::FaultKind::LaneLost) is what the
    /// asynchronous lane of a rank whose job panicked posts (see
    /// [`Communicator::run_async`]); a round that ends with it poisons the
    /// communicator on every rank, whoever posted it. A caller's own codes
    /// ([`FaultKind::Code`](crate::FaultKind::Code)) stay below
    /// [`FIRST_RESERVED_CODE`](crate::FIRST_RESERVED_CODE).
    fn post_fault(&self, kind: crate::FaultKind) -> CommError;

    /// Splits into sub-groups (MPI_Comm_split): ranks with the same `color`
    /// form a new communicator, ordered by `(key, old rank)`; `None` takes no
    /// part and receives `None`. Sub-groups are isolated from each other and
    /// from the parent.
    fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Self>>;

    /// Runs `job` on this rank's communication thread, against a duplicate of
    /// this communicator (the rank's *asynchronous lane*), and returns a
    /// handle to its result. Jobs run one at a time in the order they were
    /// submitted, so ranks must submit asynchronous collectives in the same
    /// order, as with any collective. The asynchronous forms below are built
    /// on this. A job cannot start further jobs (`InvalidArgument`), and
    /// dropping the communicator lets the queued jobs finish.
    ///
    /// # Failures (every backend alike)
    ///
    /// A job that panics does not take the thread down: its own handle
    /// returns [`CommError::RankPanicked`]. The peers may be waiting for it
    /// in a collective it never reaches, so the lane is *lost*, on every
    /// rank, at once (not at the deadline):
    ///
    /// - a peer's job that waits in a call of the lane, or reaches one
    ///   later, fails with [`CommError::Fault`] of kind
    ///   [`FaultKind::LaneLost`](crate::FaultKind::LaneLost) naming the
    ///   panicking rank ([`CommError::lane_lost`]); a
    ///   peer's job whose collectives all completed before the panic
    ///   succeeds, and its next job fails;
    /// - from then on `run_async` fails at once, on every rank, with that
    ///   same error, and jobs already queued fail without running;
    /// - the blocking calls of the communicator are untouched.
    ///
    /// How the loss reaches the peers: LocalComm poisons the duplicate group
    /// (the round a peer waits in fails, and its receives); MpiComm sends
    /// each peer a notice that every wait of the lane (collectives and
    /// `recv`) watches for; NcclComm posts the fault in place of its next
    /// collective on the lane (there, a peer blocked in `recv` from the lost
    /// rank waits for its deadline). A lane that times out or loses a peer
    /// is lost the same way: every later job fails at once with that error.
    fn run_async<R, F>(&self, job: F) -> Result<Pending<R>>
    where
        R: Send + 'static,
        F: FnOnce(&Self) -> Result<R> + Send + 'static;

    /// [`Communicator::run_async`] of a job type `J`, through `slot`, which
    /// the caller keeps and passes again with its next job: once the slot
    /// exists and each handle is waited for before the next submission,
    /// submitting, running and waiting allocate nothing (a job submitted
    /// every training step). The failure model is `run_async`'s. The
    /// default, for communicators outside this crate, boxes the job as
    /// `run_async` does.
    fn run_job<J: AsyncJob<Self>>(
        &self,
        slot: &mut JobSlot<J, J::Output>,
        job: J,
    ) -> Result<Pending<J::Output>>
    where
        Self: Sized,
    {
        let _ = slot;
        self.run_async(move |comm| job.run(comm))
    }

    /// [`Communicator::all_reduce`] on the communication thread.
    fn all_reduce_async<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
    ) -> Result<Pending<Vec<T>>> {
        self.run_async(move |comm| comm.all_reduce(&mut buf, op).map(|()| buf))
    }

    /// [`Communicator::all_gather`] on the communication thread; the result
    /// holds every rank's `send` in rank order.
    fn all_gather_async<T: Element>(&self, send: Vec<T>) -> Result<Pending<Vec<T>>> {
        self.run_async(move |comm| {
            let mut recv = vec![T::zeroed(); send.len() * comm.world_size()];
            comm.all_gather(&send, &mut recv).map(|()| recv)
        })
    }

    /// [`Communicator::all_gather_varied`] on the communication thread.
    fn all_gather_varied_async<T: Element>(&self, send: Vec<T>) -> Result<Pending<Gathered<T>>> {
        self.run_async(move |comm| comm.all_gather_varied(&send))
    }

    /// Whether a message can reach its receiver before the receiver asks
    /// for it (`true`, the default: LocalComm and MpiComm). Then a
    /// [`Communicator::send`] completes without its receive, and a rank
    /// blocked in [`Communicator::recv`] hears at once that its sender is
    /// gone (a lost asynchronous lane, a departure). `false` for NcclComm,
    /// whose transfers need both sides: a send completes only once its
    /// receive is posted (see [`Communicator::send`]), and a receive from a
    /// rank that will never send ends only at the deadline.
    fn eager_messages(&self) -> bool {
        true
    }

    /// Whether [`Communicator::all_reduce_tensor`] and
    /// [`Communicator::broadcast_tensor`] take CUDA tensors and work on them
    /// in device memory (NcclComm); `false` (the default) when they take
    /// host tensors only, so that callers holding device tensors move them
    /// through host memory themselves.
    fn takes_device_tensors(&self) -> bool {
        false
    }

    /// [`Communicator::all_reduce`] of a tensor.
    fn all_reduce_tensor(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<()> {
        all_reduce_host_tensor(self, tensor, op)
    }

    /// [`Communicator::all_reduce`] of a tensor on the communication thread.
    fn all_reduce_tensor_async(&self, mut tensor: Tensor, op: ReduceOp) -> Result<Pending<Tensor>> {
        self.run_async(move |comm| comm.all_reduce_tensor(&mut tensor, op).map(|()| tensor))
    }

    /// [`Communicator::broadcast`] of a tensor.
    fn broadcast_tensor(&self, tensor: &mut Tensor, root: usize) -> Result<()> {
        broadcast_host_tensor(self, tensor, root)
    }

    /// [`Communicator::all_gather`] of tensors: `recv` must have the same
    /// dtype as `send` and `world_size()` times its elements.
    fn all_gather_tensor(&self, send: &Tensor, recv: &mut Tensor) -> Result<()> {
        check_same_dtype("all_gather_tensor", send, recv)?;
        match send.dtype() {
            DType::F32 => self.all_gather(send.as_slice::<f32>()?, recv.as_mut_slice::<f32>()?),
            DType::F16 => self.all_gather(send.as_slice::<half::f16>()?, recv.as_mut_slice()?),
            DType::BF16 => self.all_gather(send.as_slice::<half::bf16>()?, recv.as_mut_slice()?),
        }
    }

    /// [`Communicator::reduce_scatter`] of tensors.
    fn reduce_scatter_tensor(&self, send: &Tensor, recv: &mut Tensor, op: ReduceOp) -> Result<()> {
        check_same_dtype("reduce_scatter_tensor", send, recv)?;
        match send.dtype() {
            DType::F32 => {
                self.reduce_scatter(send.as_slice::<f32>()?, recv.as_mut_slice::<f32>()?, op)
            }
            DType::F16 => {
                self.reduce_scatter(send.as_slice::<half::f16>()?, recv.as_mut_slice()?, op)
            }
            DType::BF16 => {
                self.reduce_scatter(send.as_slice::<half::bf16>()?, recv.as_mut_slice()?, op)
            }
        }
    }

    /// [`Communicator::send`] of a tensor's elements.
    fn send_tensor(&self, tensor: &Tensor, dest: usize) -> Result<()> {
        match tensor.dtype() {
            DType::F32 => self.send(tensor.as_slice::<f32>()?, dest),
            DType::F16 => self.send(tensor.as_slice::<half::f16>()?, dest),
            DType::BF16 => self.send(tensor.as_slice::<half::bf16>()?, dest),
        }
    }

    /// [`Communicator::recv`] into a tensor.
    fn recv_tensor(&self, tensor: &mut Tensor, src: usize) -> Result<()> {
        match tensor.dtype() {
            DType::F32 => self.recv(tensor.as_mut_slice::<f32>()?, src),
            DType::F16 => self.recv(tensor.as_mut_slice::<half::f16>()?, src),
            DType::BF16 => self.recv(tensor.as_mut_slice::<half::bf16>()?, src),
        }
    }
}

fn check_same_dtype(op: &'static str, send: &Tensor, recv: &Tensor) -> Result<()> {
    if send.dtype() == recv.dtype() {
        Ok(())
    } else {
        Err(CommError::InvalidArgument(format!(
            "{op}: send is {} but recv is {}",
            send.dtype(),
            recv.dtype()
        )))
    }
}

/// [`Communicator::all_reduce_tensor`] through the slice method: the default,
/// and what a backend with a device path of its own runs for host tensors.
pub(crate) fn all_reduce_host_tensor<C: Communicator>(
    comm: &C,
    tensor: &mut Tensor,
    op: ReduceOp,
) -> Result<()> {
    match tensor.dtype() {
        DType::F32 => comm.all_reduce(tensor.as_mut_slice::<f32>()?, op),
        DType::F16 => comm.all_reduce(tensor.as_mut_slice::<half::f16>()?, op),
        DType::BF16 => comm.all_reduce(tensor.as_mut_slice::<half::bf16>()?, op),
    }
}

/// [`Communicator::broadcast_tensor`] through the slice method (see
/// [`all_reduce_host_tensor`]).
pub(crate) fn broadcast_host_tensor<C: Communicator>(
    comm: &C,
    tensor: &mut Tensor,
    root: usize,
) -> Result<()> {
    match tensor.dtype() {
        DType::F32 => comm.broadcast(tensor.as_mut_slice::<f32>()?, root),
        DType::F16 => comm.broadcast(tensor.as_mut_slice::<half::f16>()?, root),
        DType::BF16 => comm.broadcast(tensor.as_mut_slice::<half::bf16>()?, root),
    }
}
