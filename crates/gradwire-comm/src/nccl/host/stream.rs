//! The host transport's streams and memory, with CUDA's semantics: a
//! stream runs its operations in order, one at a time, whatever else the
//! caller does (a thread of its own runs what no waiting caller runs
//! first: [`Stream`]); a buffer's
//! memory is freed on its stream after the work queued before the free;
//! an upload returns once its source is consumed, a download once the copy
//! is done (CUDA's rules for pageable host memory); an event is a point on
//! the stream.
//!
//! Device addresses are the addresses of host allocations, exposed as
//! integers as CUDA's are; every access through them is one of the
//! stream operations below or the fabric's copies (`fabric.rs`).

use std::alloc::Layout;
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::super::watchdog::lock;
use crate::error::{CommError, Result};

/// A queued operation: runs on the stream's thread or on a caller waiting
/// for it ([`Stream::wait_for`]); dropped unrun once an earlier one failed.
pub(super) type Op = Box<dyn FnOnce() -> Result<()> + Send>;

/// One stream's queue and its progress.
///
/// Operations run one at a time, in order, on whichever thread gets to
/// them first: the stream's own thread, or a caller waiting for the
/// stream ([`Stream::wait_for`]), which runs the operations before its
/// mark itself instead of sleeping while the stream's thread wakes up to
/// run them (on CUDA the device runs them; which host thread does here is
/// not observable, and the hand-offs' context switches were about half of
/// the CPU time of NcclComm-host's fault matrix). The stream's thread is
/// what makes queued work
/// progress when nobody waits for it (a collective a peer waits for).
#[derive(Debug)]
pub struct Stream {
    state: Mutex<State>,
    /// Wakes the stream's thread: work was queued, or the stream closed.
    work: Condvar,
    /// Wakes the callers waiting for the stream: an operation ended.
    progress: Condvar,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Op>,
    /// Operations queued so far.
    queued: u64,
    /// Operations done (run or dropped) so far.
    done: u64,
    /// An operation is running (only one at a time, on any thread).
    running: bool,
    /// The stream's thread waits for work.
    idle: bool,
    /// Callers waiting for the stream.
    waiters: usize,
    /// The first failure: later operations are dropped unrun, and every
    /// wait reports it (CUDA's sticky errors).
    failed: Option<CommError>,
    /// The stream's owner is gone: the thread ends once the queue is empty.
    closed: bool,
    /// The thread has ended: a later operation (a buffer's free) runs at
    /// once on the caller's thread.
    ended: bool,
}

/// The stream of one rank's communicator; dropping it lets its thread end
/// once the queued work is done (never waiting for it here).
#[derive(Debug)]
pub struct HostStream {
    pub(super) inner: Arc<Stream>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("queued", &self.queued)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl HostStream {
    /// A stream with its thread.
    pub(super) fn start(name: String) -> Result<HostStream> {
        let inner = Arc::new(Stream {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            progress: Condvar::new(),
        });
        let theirs = Arc::clone(&inner);
        std::thread::Builder::new()
            .name(name)
            .spawn(move || theirs.serve())
            .map_err(|e| CommError::InvalidArgument(format!("cannot start a thread: {e}")))?;
        Ok(HostStream { inner })
    }
}

impl Drop for HostStream {
    fn drop(&mut self) {
        lock(&self.inner.state).closed = true;
        self.inner.work.notify_all();
    }
}

impl Stream {
    /// The stream's thread: runs what no waiting caller runs.
    fn serve(&self) {
        let mut state = lock(&self.state);
        loop {
            if !state.running
                && let Some(op) = state.queue.pop_front()
            {
                state = self.run(state, op);
                continue;
            }
            if state.closed && state.queue.is_empty() && !state.running {
                state.ended = true;
                return;
            }
            state.idle = true;
            state = self.work.wait(state).unwrap_or_else(|e| e.into_inner());
            state.idle = false;
        }
    }

    /// Runs `op`, the queue's next operation, taken under the lock, with
    /// the lock released; returns the lock.
    fn run<'a>(&'a self, mut state: MutexGuard<'a, State>, op: Op) -> MutexGuard<'a, State> {
        state.running = true;
        let skip = state.failed.is_some();
        drop(state);
        let result = if skip {
            drop(op);
            Ok(())
        } else {
            op()
        };
        let mut state = lock(&self.state);
        if let Err(e) = result {
            state.failed.get_or_insert(e);
        }
        state.done += 1;
        state.running = false;
        if state.waiters > 0 {
            self.progress.notify_all();
        }
        state
    }

    /// Queues `op`; returns its position (the event after it).
    pub(super) fn push(&self, op: Op) -> u64 {
        let mut state = lock(&self.state);
        if state.ended {
            drop(state);
            // Nothing holds the stream after its end (its owner dropped
            // it, and a free then runs at once): run a late operation
            // here rather than never.
            let _ = op();
            return u64::MAX;
        }
        self.enqueue(&mut state, op)
    }

    /// Appends `op` to the queue, waking the stream's thread if it waits;
    /// its position.
    fn enqueue(&self, state: &mut State, op: Op) -> u64 {
        state.queue.push_back(op);
        state.queued += 1;
        if state.idle {
            self.work.notify_one();
        }
        state.queued
    }

    /// Frees `memory` after the work queued so far: at once if none is
    /// left (the common case: a buffer dropped after a synchronisation,
    /// and every buffer once the stream ended), else as an operation of
    /// the stream, decided and queued under one lock.
    fn free(&self, memory: Memory) {
        let mut state = lock(&self.state);
        if state.queue.is_empty() && !state.running {
            drop(state);
            drop(memory);
            return;
        }
        self.enqueue(
            &mut state,
            Box::new(move || {
                drop(memory);
                Ok(())
            }),
        );
    }

    /// The position after everything queued so far.
    pub(super) fn mark(&self) -> u64 {
        lock(&self.state).queued
    }

    /// Whether the stream has passed `mark`.
    pub(super) fn passed(&self, mark: u64) -> bool {
        lock(&self.state).done >= mark
    }

    /// Waits until the stream has passed `mark`, running the operations
    /// before it on this thread when no other thread runs one; the
    /// stream's failure, if any.
    pub(super) fn wait_for(&self, mark: u64) -> Result<()> {
        let mut state = lock(&self.state);
        while state.done < mark {
            if !state.running
                && let Some(op) = state.queue.pop_front()
            {
                state = self.run(state, op);
                continue;
            }
            state.waiters += 1;
            state = self.progress.wait(state).unwrap_or_else(|e| e.into_inner());
            state.waiters -= 1;
        }
        // What is left is the stream's thread's to run.
        if !state.queue.is_empty() && state.idle {
            self.work.notify_one();
        }
        state.failed.clone().map_or(Ok(()), Err)
    }
}

/// A host allocation addressed by an integer, as device memory is.
///
/// Aligned to [`MEMORY_ALIGN`] by hand inside an allocation of the
/// allocator's own alignment: the system allocator zeroes such a block
/// with `calloc`, which takes fresh (already zero) pages for a large one,
/// where an over-aligned `alloc_zeroed` writes every byte. A communicator's
/// scratch is a 2 MiB granule of which a split's connection touches a few
/// bytes; the fault matrix makes hundreds of them, and clearing each whole
/// put 5 to 9 % of its samples in `memset`, more in page faults (perf);
/// without it the test takes 5 % less CPU.
pub(crate) struct Memory {
    /// The allocation, `padded(len)` bytes (dangling when `len` is 0).
    base: NonNull<u8>,
    /// The first aligned byte within it.
    ptr: NonNull<u8>,
    len: usize,
}

/// The alignment of every host buffer (cuMemAlloc's is 256 bytes too).
const MEMORY_ALIGN: usize = 256;

/// The layout of the allocation behind `len` usable bytes: room to align
/// them, at the allocator's natural alignment.
fn padded(len: usize) -> Result<Layout> {
    len.checked_add(MEMORY_ALIGN - 1)
        .and_then(|size| Layout::from_size_align(size, std::mem::align_of::<u128>()).ok())
        .ok_or_else(|| CommError::InvalidArgument(format!("{len} bytes of host memory overflow")))
}

#[allow(unsafe_code)]
// SAFETY: the allocation is plain bytes owned by this value; every access
// goes through raw addresses under the stream and fabric rules.
unsafe impl Send for Memory {}
#[allow(unsafe_code)]
// SAFETY: as for `Send`: no reference into the bytes is ever formed.
unsafe impl Sync for Memory {}

impl Memory {
    fn zeroed(len: usize) -> Result<Memory> {
        if len == 0 {
            return Ok(Memory {
                base: NonNull::dangling(),
                ptr: NonNull::dangling(),
                len,
            });
        }
        let layout = padded(len)?;
        #[allow(unsafe_code)]
        // SAFETY: a layout of non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        let base = NonNull::new(base).ok_or_else(|| {
            CommError::InvalidArgument(format!("cannot allocate {len} bytes of host memory"))
        })?;
        let offset = base.align_offset(MEMORY_ALIGN);
        #[allow(unsafe_code)]
        // SAFETY: `offset < MEMORY_ALIGN`, and the allocation holds
        // `len + MEMORY_ALIGN - 1` bytes: `offset + len` stays inside it.
        let ptr = unsafe { base.add(offset) };
        Ok(Memory { base, ptr, len })
    }

    fn address(&self) -> u64 {
        self.ptr.as_ptr().expose_provenance() as u64
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if self.len > 0
            && let Ok(layout) = padded(self.len)
        {
            #[allow(unsafe_code)]
            // SAFETY: allocated in `zeroed` with this layout, freed once.
            unsafe {
                std::alloc::dealloc(self.base.as_ptr(), layout)
            };
        }
    }
}

/// A device buffer of the host transport: freed on its stream, after the
/// work queued before the free (as cudarc frees a `CudaSlice`).
pub struct HostBuffer {
    /// `None` only once given to the stream to free.
    memory: Option<Memory>,
    stream: Arc<Stream>,
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl HostBuffer {
    pub(super) fn alloc_zeros(stream: &HostStream, len: usize) -> Result<HostBuffer> {
        Ok(HostBuffer {
            memory: Some(Memory::zeroed(len)?),
            stream: Arc::clone(&stream.inner),
        })
    }

    pub(super) fn len(&self) -> usize {
        self.memory.as_ref().map_or(0, |m| m.len)
    }

    pub(super) fn address(&self) -> u64 {
        self.memory.as_ref().map_or(0, |m| m.address())
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Some(memory) = self.memory.take() {
            // Freed when the stream reaches this point (or drops the
            // operation unrun after a failure: the same).
            self.stream.free(memory);
        }
    }
}

/// A point on a stream.
#[derive(Debug)]
pub struct HostEvent {
    stream: Arc<Stream>,
    mark: u64,
}

impl HostEvent {
    pub(super) fn record(stream: &HostStream) -> HostEvent {
        HostEvent {
            stream: Arc::clone(&stream.inner),
            mark: stream.inner.mark(),
        }
    }

    pub(super) fn done(&self) -> bool {
        self.stream.passed(self.mark)
    }
}

/// Copies `len` bytes between raw addresses.
///
/// # Safety
///
/// Both ranges are live allocations of at least `len` bytes that no one
/// else writes during the copy, and they do not overlap.
#[allow(unsafe_code)]
pub(super) unsafe fn copy(from: u64, to: u64, len: usize) {
    if len == 0 {
        return;
    }
    let from = std::ptr::with_exposed_provenance::<u8>(from as usize);
    let to = std::ptr::with_exposed_provenance_mut::<u8>(to as usize);
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(from, to, len) };
}

/// Uploads `src` into `dst` at `at`: staged now, copied on the stream.
pub(super) fn upload(stream: &HostStream, src: &[u8], dst: &HostBuffer, at: usize) -> Result<()> {
    check_range("upload", at, src.len(), dst.len())?;
    let staged = src.to_vec();
    let to = dst.address() + at as u64;
    stream.inner.push(Box::new(move || {
        #[allow(unsafe_code)]
        // SAFETY: the range lies in `dst` (checked above), whose free is
        // queued behind this operation; `staged` is owned here.
        unsafe {
            copy(staged.as_ptr().expose_provenance() as u64, to, staged.len())
        };
        Ok(())
    }));
    Ok(())
}

/// Downloads `dst.len()` bytes of `src` from `at`: returns once copied (or
/// once the stream failed, `dst` untouched).
pub(super) fn download(
    stream: &HostStream,
    src: &HostBuffer,
    at: usize,
    dst: &mut [u8],
) -> Result<()> {
    check_range("download", at, dst.len(), src.len())?;
    let from = src.address() + at as u64;
    let (to, len) = (dst.as_mut_ptr().expose_provenance() as u64, dst.len());
    let mark = stream.inner.push(Box::new(move || {
        #[allow(unsafe_code)]
        // SAFETY: the range lies in `src` (checked above), whose free is
        // queued behind this operation; `dst` is borrowed by the caller,
        // which waits below until this operation has run or was dropped.
        unsafe {
            copy(from, to, len)
        };
        Ok(())
    }));
    stream.inner.wait_for(mark)
}

fn check_range(op: &str, at: usize, bytes: usize, len: usize) -> Result<()> {
    match at.checked_add(bytes) {
        Some(end) if end <= len => Ok(()),
        _ => Err(super::super::stream::beyond(op, at, bytes, len)),
    }
}

#[cfg(test)]
mod tests {
    //! A stream's operations run one at a time, in order, whether the
    //! stream's thread or a waiting caller runs them; queued work
    //! progresses with nobody waiting; a failure is sticky.

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// Far beyond what a trivial operation takes on a loaded machine: only
    /// a stream that never runs it misses it.
    const NEVER: Duration = Duration::from_secs(60);

    #[test]
    fn operations_run_one_at_a_time_in_order_whoever_runs_them() {
        let stream = HostStream::start("test-stream".into()).expect("a thread");
        let running = Arc::new(AtomicBool::new(false));
        // Set, not asserted, in the operation: a panic there would end the
        // thread that runs it and leave the wait below hanging.
        let overlapped = Arc::new(AtomicBool::new(false));
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut marks = Vec::new();
        for i in 0..200usize {
            let (busy, ran) = (Arc::clone(&running), Arc::clone(&order));
            let both = Arc::clone(&overlapped);
            marks.push(stream.inner.push(Box::new(move || {
                if busy.swap(true, Ordering::SeqCst) {
                    both.store(true, Ordering::SeqCst);
                }
                // Long enough for the other thread to try to take the next.
                std::thread::yield_now();
                lock(&ran).push(i);
                busy.store(false, Ordering::SeqCst);
                Ok(())
            })));
            // Now and then a caller waits for what it queued so far.
            if i % 7 == 3 {
                stream.inner.wait_for(marks[i]).expect("no failure");
                assert!(lock(&order).len() > i, "the wait returned early");
            }
        }
        stream
            .inner
            .wait_for(stream.inner.mark())
            .expect("no failure");
        assert!(!overlapped.load(Ordering::SeqCst), "two ran at once");
        assert_eq!(*lock(&order), (0..200).collect::<Vec<_>>());
        assert!(stream.inner.passed(*marks.last().expect("marks")));
    }

    #[test]
    fn queued_work_progresses_with_nobody_waiting() {
        let stream = HostStream::start("test-stream".into()).expect("a thread");
        let (tx, rx) = mpsc::channel();
        let mark = stream.inner.push(Box::new(move || {
            let _ = tx.send(());
            Ok(())
        }));
        assert!(rx.recv_timeout(NEVER).is_ok(), "the stream's thread ran it");
        stream.inner.wait_for(mark).expect("no failure");
    }

    #[test]
    fn a_failure_drops_later_operations_and_fails_every_later_wait() {
        let stream = HostStream::start("test-stream".into()).expect("a thread");
        let ran = Arc::new(AtomicBool::new(false));
        stream.inner.push(Box::new(|| {
            Err(CommError::InvalidArgument("the first failure".into()))
        }));
        let theirs = Arc::clone(&ran);
        let mark = stream.inner.push(Box::new(move || {
            theirs.store(true, Ordering::SeqCst);
            Ok(())
        }));
        for _ in 0..2 {
            let waited = stream.inner.wait_for(mark);
            assert!(
                matches!(&waited, Err(CommError::InvalidArgument(m)) if m == "the first failure"),
                "{waited:?}"
            );
        }
        assert!(!ran.load(Ordering::SeqCst), "dropped unrun");
    }

    #[test]
    fn a_buffer_freed_on_a_busy_stream_outlives_the_work_queued_before() {
        let stream = HostStream::start("test-stream".into()).expect("a thread");
        let buffer = HostBuffer::alloc_zeros(&stream, 64).expect("memory");
        let (gate, opened) = mpsc::channel::<()>();
        // Blocks the stream, then writes the buffer through its address.
        let at = buffer.address();
        stream.inner.push(Box::new(move || {
            let _ = opened.recv();
            #[allow(unsafe_code)]
            // SAFETY: the buffer's free is queued behind this operation.
            unsafe {
                copy([7u8; 64].as_ptr().expose_provenance() as u64, at, 64)
            };
            Ok(())
        }));
        let before = stream.inner.mark();
        drop(buffer);
        assert_eq!(
            stream.inner.mark(),
            before + 1,
            "the free waits in the queue"
        );
        let _ = gate.send(());
        stream
            .inner
            .wait_for(stream.inner.mark())
            .expect("no failure");
        // On an idle stream a buffer is freed at once, queuing nothing.
        let idle = HostBuffer::alloc_zeros(&stream, 64).expect("memory");
        let before = stream.inner.mark();
        drop(idle);
        assert_eq!(stream.inner.mark(), before);
    }

    #[test]
    fn memory_is_aligned_and_zero_at_every_length() {
        for len in [0usize, 1, 2, 3, 255, 256, 257, 4099, (2 << 20) + 3] {
            let memory = Memory::zeroed(len).expect("memory");
            assert_eq!(memory.len, len);
            if len == 0 {
                continue;
            }
            assert_eq!(memory.address() % MEMORY_ALIGN as u64, 0, "{len} bytes");
            #[allow(unsafe_code)]
            // SAFETY: `len` bytes from the aligned start, inside the
            // allocation and owned by `memory`, alive for the read.
            let bytes = unsafe { std::slice::from_raw_parts(memory.ptr.as_ptr(), len) };
            assert!(bytes.iter().all(|&b| b == 0), "{len} bytes not zero");
        }
    }

    #[test]
    fn memory_too_large_to_lay_out_is_an_invalid_argument() {
        assert!(matches!(
            Memory::zeroed(usize::MAX),
            Err(CommError::InvalidArgument(_))
        ));
    }
}
