//! The only code that calls MPI: thin, checked wrappers over rsmpi's raw
//! bindings (`mpi::ffi`).
//!
//! rsmpi's safe layer ignores MPI's return codes (it relies on the default
//! `MPI_ERRORS_ARE_FATAL` handler), and gradwire needs every failure as a
//! [`CommError`], so the backend goes through the bindings directly. Each
//! wrapper takes Rust slices, checks that every count fits MPI's `int`, and
//! turns a non-success return into [`CommError::Mpi`] with MPI's own message.
//! Every `unsafe` block in the MPI backend is in this file.

use crate::error::{CommError, Result};
use ::mpi::ffi;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, Weak};
use std::thread::ThreadId;

pub(super) use ffi::{MPI_Comm, MPI_Datatype, MPI_Request};

/// The thread support level MPI granted (`MPI_Init_thread`'s `provided`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ThreadLevel {
    /// `MPI_THREAD_SINGLE`: one thread in the process.
    Single,
    /// `MPI_THREAD_FUNNELED`: only the initializing thread calls MPI.
    Funneled,
    /// `MPI_THREAD_SERIALIZED`: any thread, never two at once.
    Serialized,
    /// `MPI_THREAD_MULTIPLE`: any thread, concurrently.
    Multiple,
}

impl ThreadLevel {
    fn from_raw(level: c_int) -> ThreadLevel {
        // SAFETY: the RSMPI_THREAD_* statics are constants initialised by
        // rsmpi's C shim before main; reading them has no side effect.
        let (serialized, multiple, funneled) = unsafe {
            (
                ffi::RSMPI_THREAD_SERIALIZED,
                ffi::RSMPI_THREAD_MULTIPLE,
                ffi::RSMPI_THREAD_FUNNELED,
            )
        };
        if level >= multiple {
            ThreadLevel::Multiple
        } else if level >= serialized {
            ThreadLevel::Serialized
        } else if level >= funneled {
            ThreadLevel::Funneled
        } else {
            ThreadLevel::Single
        }
    }
}

/// The MPI library's state as this process uses it: initialized once,
/// finalized when the last holder goes (if this crate initialized it).
#[derive(Debug)]
pub(super) struct Env {
    pub(super) level: ThreadLevel,
    pub(super) init_thread: ThreadId,
    /// Whether this crate called `MPI_Init_thread` (and so must finalize).
    owned: bool,
}

/// The live environment, shared by every communicator of this crate.
static ENV: Mutex<Weak<Env>> = Mutex::new(Weak::new());

impl Env {
    /// The environment, initializing MPI with `MPI_THREAD_MULTIPLE` on first
    /// use. MPI may be initialized only once per process, so once the last
    /// handle has gone (and MPI was finalized) this is an error.
    pub(super) fn get() -> Result<Arc<Env>> {
        let mut slot = ENV.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(env) = slot.upgrade() {
            return Ok(env);
        }
        let mut finalized: c_int = 0;
        // SAFETY: MPI_Finalized may be called at any time, from any thread.
        check("MPI_Finalized", unsafe {
            ffi::MPI_Finalized(&mut finalized)
        })?;
        if finalized != 0 {
            return Err(CommError::Unsupported(
                "MPI was already finalized in this process and cannot be initialized again".into(),
            ));
        }
        let mut initialized: c_int = 0;
        // SAFETY: MPI_Initialized may be called at any time, from any thread.
        check("MPI_Initialized", unsafe {
            ffi::MPI_Initialized(&mut initialized)
        })?;
        let mut provided: c_int = 0;
        let owned = initialized == 0;
        if owned {
            // SAFETY: MPI is neither initialized nor finalized (checked above,
            // under the ENV lock, so no other caller of this crate races);
            // MPI-2 allows null argc/argv.
            check("MPI_Init_thread", unsafe {
                ffi::MPI_Init_thread(
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    ffi::RSMPI_THREAD_MULTIPLE,
                    &mut provided,
                )
            })?;
        } else {
            // Someone else (rsmpi's Universe, a C library) initialized MPI:
            // use it as it is, and leave finalizing to them.
            // SAFETY: MPI is initialized; MPI_Query_thread only reads state.
            check("MPI_Query_thread", unsafe {
                ffi::MPI_Query_thread(&mut provided)
            })?;
        }
        let env = Arc::new(Env {
            level: ThreadLevel::from_raw(provided),
            init_thread: std::thread::current().id(),
            owned,
        });
        *slot = Arc::downgrade(&env);
        Ok(env)
    }

    /// Fails unless the calling thread may call MPI at the granted level.
    pub(super) fn check_thread(&self, op: &'static str) -> Result<()> {
        if self.level >= ThreadLevel::Serialized || std::thread::current().id() == self.init_thread
        {
            Ok(())
        } else {
            Err(CommError::Unsupported(format!(
                "{op}: MPI granted {:?} threading, so only the thread that initialized MPI may call it",
                self.level
            )))
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if self.owned {
            // Every communicator holds this Env and frees its MPI handles
            // before releasing it, so nothing of ours is live any more. A
            // failure here has no one left to report to.
            // SAFETY: MPI was initialized by `Env::get` and not finalized.
            let _ = unsafe { ffi::MPI_Finalize() };
        }
    }
}

/// Turns an MPI return code into a `Result`, with MPI's message for it.
pub(super) fn check(op: &'static str, code: c_int) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    let mut text = [0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize];
    let mut len: c_int = 0;
    // SAFETY: `text` holds MPI_MAX_ERROR_STRING characters, as the call
    // requires; MPI_Error_string may be called at any time.
    let ok = unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr(), &mut len) };
    let message = if ok == ffi::MPI_SUCCESS as c_int {
        let len = usize::try_from(len).unwrap_or(0).min(text.len());
        let bytes: Vec<u8> = text[..len].iter().map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    } else {
        "(no description)".to_string()
    };
    Err(CommError::Mpi { op, code, message })
}

/// A count or displacement as MPI's `int`.
pub(super) fn int(what: &str, n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| {
        CommError::InvalidArgument(format!(
            "{what} of {n} exceeds what one MPI call can address (2^31 - 1)"
        ))
    })
}

/// The address MPI gets for a send buffer. An empty slice's address is
/// dangling, and for bytes it is 0x1, which Open MPI reads as
/// `MPI_IN_PLACE`: empty buffers are passed as a real (unused) word instead.
fn send_ptr<T>(buf: &[T], spare: &u64) -> *const c_void {
    if buf.is_empty() {
        std::ptr::from_ref(spare).cast()
    } else {
        buf.as_ptr().cast()
    }
}

/// [`send_ptr`] for a receive buffer.
fn recv_ptr<T>(buf: &mut [T], spare: &mut u64) -> *mut c_void {
    if buf.is_empty() {
        std::ptr::from_mut(spare).cast()
    } else {
        buf.as_mut_ptr().cast()
    }
}

/// The MPI datatypes the backend moves elements as.
#[derive(Debug, Clone, Copy)]
pub(super) enum Wire {
    U8,
    U16,
    U32,
    U64,
    I32,
    I64,
    F32,
    F64,
}

impl Wire {
    pub(super) fn raw(self) -> MPI_Datatype {
        // SAFETY: the RSMPI_* datatype statics are predefined handles set by
        // rsmpi's C shim; reading them has no side effect.
        unsafe {
            match self {
                Wire::U8 => ffi::RSMPI_UINT8_T,
                Wire::U16 => ffi::RSMPI_UINT16_T,
                Wire::U32 => ffi::RSMPI_UINT32_T,
                Wire::U64 => ffi::RSMPI_UINT64_T,
                Wire::I32 => ffi::RSMPI_INT32_T,
                Wire::I64 => ffi::RSMPI_INT64_T,
                Wire::F32 => ffi::RSMPI_FLOAT,
                Wire::F64 => ffi::RSMPI_DOUBLE,
            }
        }
    }
}

/// An owned communicator handle. Plain data: freeing it is explicit
/// ([`comm_free`]), because it must happen before the environment goes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Comm(pub(super) MPI_Comm);

// SAFETY: an MPI communicator handle is an identifier that MPI lets any
// thread use, subject to the thread level: the backend requests
// MPI_THREAD_MULTIPLE and checks the granted level before each call
// (`Env::check_thread`), and a `Comm` is used by one `MpiComm`, which is
// not `Sync`, so calls on one handle never overlap.
unsafe impl Send for Comm {}

/// `MPI_COMM_WORLD` duplicated, so that this crate's traffic never mixes with
/// the application's own use of the world communicator.
pub(super) fn dup_world() -> Result<Comm> {
    // SAFETY: reading a predefined handle set by rsmpi's C shim.
    let world = unsafe { ffi::RSMPI_COMM_WORLD };
    comm_dup(Comm(world))
}

/// `MPI_Comm_dup` (collective), with errors returned rather than fatal.
pub(super) fn comm_dup(comm: Comm) -> Result<Comm> {
    // SAFETY: reading a predefined handle.
    let mut out = Comm(unsafe { ffi::RSMPI_COMM_NULL });
    // SAFETY: `comm` is a live communicator; `out.0` is written by MPI.
    check("MPI_Comm_dup", unsafe {
        ffi::MPI_Comm_dup(comm.0, &mut out.0)
    })?;
    if let Err(e) = set_errors_return(out) {
        comm_free(out);
        return Err(e);
    }
    Ok(out)
}

/// Makes MPI return error codes on `comm` instead of aborting the job.
fn set_errors_return(comm: Comm) -> Result<()> {
    // SAFETY: `comm` is live; MPI_ERRORS_RETURN is a predefined handler.
    check("MPI_Comm_set_errhandler", unsafe {
        ffi::MPI_Comm_set_errhandler(comm.0, ffi::RSMPI_ERRORS_RETURN)
    })
}

/// Frees a communicator this crate created. Errors are dropped: this runs in
/// destructors, where there is no one to report them to.
pub(super) fn comm_free(mut comm: Comm) {
    // SAFETY: `comm` was created by this crate (dup or split), is not null,
    // and is not used afterwards (every owner frees it exactly once).
    let _ = unsafe { ffi::MPI_Comm_free(&mut comm.0) };
}

/// This process's rank and the size of `comm`.
pub(super) fn rank_and_size(comm: Comm) -> Result<(usize, usize)> {
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: `comm` is live; both outputs are plain ints.
    check("MPI_Comm_rank", unsafe {
        ffi::MPI_Comm_rank(comm.0, &mut rank)
    })?;
    // SAFETY: as above.
    check("MPI_Comm_size", unsafe {
        ffi::MPI_Comm_size(comm.0, &mut size)
    })?;
    let rank = usize::try_from(rank).map_err(|_| mpi_bug("negative rank"))?;
    let size = usize::try_from(size).map_err(|_| mpi_bug("negative size"))?;
    Ok((rank, size))
}

fn mpi_bug(what: &str) -> CommError {
    CommError::Mpi {
        op: "MPI_Comm_rank",
        code: -1,
        message: what.into(),
    }
}

/// `MPI_Comm_split` with `color` (`None` = `MPI_UNDEFINED`); `None` back for
/// a process that takes no part.
pub(super) fn comm_split(comm: Comm, color: Option<c_int>, key: c_int) -> Result<Option<Comm>> {
    // SAFETY: reading predefined constants.
    let (undefined, null) = unsafe { (ffi::RSMPI_UNDEFINED, ffi::RSMPI_COMM_NULL) };
    let mut out = Comm(null);
    // SAFETY: `comm` is live; `out.0` is written by MPI.
    check("MPI_Comm_split", unsafe {
        ffi::MPI_Comm_split(comm.0, color.unwrap_or(undefined), key, &mut out.0)
    })?;
    if out.0 == null {
        return Ok(None);
    }
    if let Err(e) = set_errors_return(out) {
        comm_free(out);
        return Err(e);
    }
    Ok(Some(out))
}

/// `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`: the processes that can share
/// memory with this one (its host), ordered by their rank in `comm`.
pub(super) fn comm_split_shared(comm: Comm, key: c_int) -> Result<Comm> {
    // SAFETY: reading predefined constants.
    let (shared, null, info) = unsafe {
        (
            ffi::RSMPI_COMM_TYPE_SHARED,
            ffi::RSMPI_COMM_NULL,
            ffi::RSMPI_INFO_NULL,
        )
    };
    let mut out = Comm(null);
    // SAFETY: `comm` is live; `out.0` is written by MPI.
    check("MPI_Comm_split_type", unsafe {
        ffi::MPI_Comm_split_type(comm.0, shared, key, info, &mut out.0)
    })?;
    if out.0 == null {
        return Err(mpi_bug("shared-memory split gave no communicator"));
    }
    if let Err(e) = set_errors_return(out) {
        comm_free(out);
        return Err(e);
    }
    Ok(out)
}

/// Aborts every process of the job (used when a rank unwinds while it holds
/// a communicator: its peers would otherwise wait for it forever).
pub(super) fn abort(comm: Comm, code: c_int) {
    // SAFETY: `comm` is live; MPI_Abort does not return on success.
    let _ = unsafe { ffi::MPI_Abort(comm.0, code) };
}

/// `MPI_Allgather` of `send` (equal counts) into `recv`.
pub(super) fn all_gather<T: bytemuck::Pod>(
    comm: Comm,
    wire: Wire,
    send: &[T],
    recv: &mut [T],
) -> Result<()> {
    let count = int("all_gather length", send.len())?;
    let (_, size) = rank_and_size(comm)?;
    if Some(recv.len()) != send.len().checked_mul(size) {
        return Err(CommError::InvalidArgument(format!(
            "all_gather: receive buffer of {} for {} x {size}",
            recv.len(),
            send.len()
        )));
    }
    // SAFETY: `send` holds `count` elements of the wire type's size and
    // `recv` holds `size * count` (checked above); both live for the call.
    check("MPI_Allgather", unsafe {
        ffi::MPI_Allgather(
            send_ptr(send, &0),
            count,
            wire.raw(),
            recv_ptr(recv, &mut 0),
            count,
            wire.raw(),
            comm.0,
        )
    })
}

/// The MPI reduction of a [`crate::ReduceOp`] (`Avg` has none: MPI sums,
/// the caller divides).
#[derive(Debug, Clone, Copy)]
pub(super) enum NativeOp {
    Sum,
    Max,
    Min,
    /// The sum of 16-bit floats on the u16 wire, which MPI cannot add: a
    /// user-defined operation ([`half_sum_op`]).
    HalfSum(HalfKind),
}

/// Which 16-bit float a [`NativeOp::HalfSum`] adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HalfKind {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
}

/// An MPI operation handle made once per process.
struct OpHandle(ffi::MPI_Op);

// SAFETY: an MPI_Op is a handle MPI owns; it is only passed back to MPI,
// from whichever thread calls it (MPI's thread rules govern the calls, not
// the handle).
unsafe impl Send for OpHandle {}
// SAFETY: as above; the handle is never written after it is made.
unsafe impl Sync for OpHandle {}

/// A 16-bit float MPI cannot add, as its bits.
trait HalfBits: Copy {
    fn widen(bits: u16) -> f32;
    fn narrow(value: f32) -> u16;
}

impl HalfBits for half::f16 {
    fn widen(bits: u16) -> f32 {
        half::f16::from_bits(bits).to_f32()
    }
    fn narrow(value: f32) -> u16 {
        half::f16::from_f32(value).to_bits()
    }
}

impl HalfBits for half::bf16 {
    fn widen(bits: u16) -> f32 {
        half::bf16::from_bits(bits).to_f32()
    }
    fn narrow(value: f32) -> u16 {
        half::bf16::from_f32(value).to_bits()
    }
}

/// The user function of [`half_sum_op`]: adds `*len` 16-bit floats `H`
/// of `invec` into `inoutvec`, each pair in f32 and rounded once to `H`
/// (Horovod's float16 sum).
///
/// # Safety
/// MPI's contract for a user function: both vectors hold `*len` elements of
/// the u16 wire type and do not overlap.
unsafe extern "C" fn half_sum<H: HalfBits>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _: *mut MPI_Datatype,
) {
    // SAFETY: the caller's contract (MPI's): `len` points at the count and
    // the vectors hold that many u16 each.
    let n = usize::try_from(unsafe { *len }).unwrap_or(0);
    if n == 0 || invec.is_null() || inoutvec.is_null() {
        return;
    }
    // SAFETY: as above; `invec` is only read, `inoutvec` only written here.
    let (from, into) = unsafe {
        (
            std::slice::from_raw_parts(invec.cast::<u16>(), n),
            std::slice::from_raw_parts_mut(inoutvec.cast::<u16>(), n),
        )
    };
    for (into, &from) in into.iter_mut().zip(from) {
        *into = H::narrow(H::widen(from) + H::widen(*into));
    }
}

/// The commutative user-defined operation that sums `kind` on the u16
/// wire, made on first use (`MPI_Op_create` is local: no rank waits for
/// another) and kept for the process.
fn half_sum_op(kind: HalfKind) -> Result<ffi::MPI_Op> {
    static F16: std::sync::OnceLock<OpHandle> = std::sync::OnceLock::new();
    static BF16: std::sync::OnceLock<OpHandle> = std::sync::OnceLock::new();
    let (cell, function): (_, ffi::MPI_User_function) = match kind {
        HalfKind::F16 => (&F16, Some(half_sum::<half::f16>)),
        HalfKind::BF16 => (&BF16, Some(half_sum::<half::bf16>)),
    };
    if let Some(op) = cell.get() {
        return Ok(op.0);
    }
    let mut op = std::mem::MaybeUninit::<ffi::MPI_Op>::uninit();
    // SAFETY: `function` has MPI_User_function's signature and lives for
    // the process; `op` is a valid place for the new handle.
    check("MPI_Op_create", unsafe {
        ffi::MPI_Op_create(function, 1, op.as_mut_ptr())
    })?;
    // SAFETY: MPI_Op_create succeeded, so it wrote the handle.
    let op = unsafe { op.assume_init() };
    // A second thread's handle, if it raced this one, is kept instead
    // (both are valid; this one stays with MPI until it finalizes).
    Ok(cell.get_or_init(|| OpHandle(op)).0)
}

/// `MPI_Allreduce` of `send` into `recv` (equal lengths), with MPI's own
/// algorithm and reduction order.
pub(super) fn all_reduce<T: bytemuck::Pod>(
    comm: Comm,
    wire: Wire,
    send: &[T],
    recv: &mut [T],
    op: NativeOp,
) -> Result<()> {
    let count = int("all_reduce length", send.len())?;
    if recv.len() != send.len() {
        return Err(CommError::InvalidArgument(format!(
            "all_reduce: receive buffer of {} for {}",
            recv.len(),
            send.len()
        )));
    }
    let half = match op {
        NativeOp::HalfSum(kind) => Some(half_sum_op(kind)?),
        _ => None,
    };
    // SAFETY: reading predefined operation handles set by rsmpi's C shim
    // (or using the one half_sum_op made); both buffers hold `count`
    // elements of the wire type's size and live for the call.
    check("MPI_Allreduce", unsafe {
        let op = match (op, half) {
            (_, Some(half)) => half,
            (NativeOp::Sum | NativeOp::HalfSum(_), None) => ffi::RSMPI_SUM,
            (NativeOp::Max, None) => ffi::RSMPI_MAX,
            (NativeOp::Min, None) => ffi::RSMPI_MIN,
        };
        ffi::MPI_Allreduce(
            send_ptr(send, &0),
            recv_ptr(recv, &mut 0),
            count,
            wire.raw(),
            op,
            comm.0,
        )
    })
}

/// Checks that `counts` and `displs` describe ranges inside a buffer of `len`.
fn check_layout(what: &str, counts: &[c_int], displs: &[c_int], len: usize) -> Result<()> {
    for (&c, &d) in counts.iter().zip(displs) {
        let end = usize::try_from(c)
            .ok()
            .zip(usize::try_from(d).ok())
            .and_then(|(c, d)| c.checked_add(d));
        if end.is_none_or(|end| end > len) {
            return Err(CommError::InvalidArgument(format!(
                "{what}: range {d}+{c} outside a buffer of {len}"
            )));
        }
    }
    if counts.len() != displs.len() {
        return Err(CommError::InvalidArgument(format!(
            "{what}: {} counts for {} displacements",
            counts.len(),
            displs.len()
        )));
    }
    Ok(())
}

/// `MPI_Allgatherv`: `send` from every rank into `recv` at `displs[r]`.
pub(super) fn all_gather_varied<T: bytemuck::Pod>(
    comm: Comm,
    wire: Wire,
    send: &[T],
    recv: &mut [T],
    counts: &[c_int],
    displs: &[c_int],
) -> Result<()> {
    let (rank, size) = rank_and_size(comm)?;
    if counts.len() != size || counts.get(rank).copied() != Some(int("count", send.len())?) {
        return Err(CommError::InvalidArgument(
            "all_gather_varied: counts do not describe this world".into(),
        ));
    }
    check_layout("all_gather_varied", counts, displs, recv.len())?;
    // SAFETY: `send` holds counts[rank] elements, every (count, displ) pair
    // lies inside `recv` (checked), and both buffers live for the call.
    check("MPI_Allgatherv", unsafe {
        ffi::MPI_Allgatherv(
            send_ptr(send, &0),
            int("count", send.len())?,
            wire.raw(),
            recv_ptr(recv, &mut 0),
            counts.as_ptr(),
            displs.as_ptr(),
            wire.raw(),
            comm.0,
        )
    })
}

/// One side of an `MPI_Alltoallv`: counts and displacements per rank.
pub(super) struct Layout<'a> {
    pub(super) counts: &'a [c_int],
    pub(super) displs: &'a [c_int],
}

/// `MPI_Alltoallv` from `send` to `recv`.
pub(super) fn all_to_all_varied<T: bytemuck::Pod>(
    comm: Comm,
    wire: Wire,
    send: &[T],
    sends: Layout<'_>,
    recv: &mut [T],
    recvs: Layout<'_>,
) -> Result<()> {
    let (_, size) = rank_and_size(comm)?;
    if sends.counts.len() != size || recvs.counts.len() != size {
        return Err(CommError::InvalidArgument(
            "all_to_all: layouts do not describe this world".into(),
        ));
    }
    check_layout("all_to_all send", sends.counts, sends.displs, send.len())?;
    check_layout("all_to_all recv", recvs.counts, recvs.displs, recv.len())?;
    // SAFETY: every (count, displ) lies inside its buffer (checked), the
    // buffers do not overlap (one shared, one exclusive borrow), and both
    // live for the call.
    check("MPI_Alltoallv", unsafe {
        ffi::MPI_Alltoallv(
            send_ptr(send, &0),
            sends.counts.as_ptr(),
            sends.displs.as_ptr(),
            wire.raw(),
            recv_ptr(recv, &mut 0),
            recvs.counts.as_ptr(),
            recvs.displs.as_ptr(),
            wire.raw(),
            comm.0,
        )
    })
}

/// `MPI_Bcast` of `buf` from `root`.
pub(super) fn broadcast<T: bytemuck::Pod>(
    comm: Comm,
    wire: Wire,
    buf: &mut [T],
    root: usize,
) -> Result<()> {
    let count = int("broadcast length", buf.len())?;
    let root = int("root", root)?;
    // SAFETY: `buf` holds `count` elements and lives for the call; every
    // rank passed the same count and root (validated by the header exchange).
    check("MPI_Bcast", unsafe {
        ffi::MPI_Bcast(recv_ptr(buf, &mut 0), count, wire.raw(), root, comm.0)
    })
}

/// An `MPI_Isend` in flight with the bytes it sends (owned, so the caller's
/// buffer is free at once: sends are eager, as the trait promises).
pub(super) struct Outgoing {
    request: MPI_Request,
    _bytes: Vec<u8>,
}

// SAFETY: a request handle is an identifier; it is only tested or freed by
// the `MpiComm` that owns it (not `Sync`), at the granted thread level.
unsafe impl Send for Outgoing {}

/// Starts sending `bytes` to `dest` with `tag`.
pub(super) fn isend(comm: Comm, bytes: Vec<u8>, dest: usize, tag: c_int) -> Result<Outgoing> {
    let count = int("message size in bytes", bytes.len())?;
    let dest = int("rank", dest)?;
    // SAFETY: reading a predefined handle.
    let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
    // SAFETY: `bytes` holds `count` bytes; its heap block does not move when
    // the Vec moves into the returned `Outgoing`, which keeps it alive until
    // the request completes (`test`) or is freed with the buffer leaked.
    check("MPI_Isend", unsafe {
        ffi::MPI_Isend(
            send_ptr(&bytes, &0),
            count,
            Wire::U8.raw(),
            dest,
            tag,
            comm.0,
            &mut request,
        )
    })?;
    Ok(Outgoing {
        request,
        _bytes: bytes,
    })
}

impl Outgoing {
    /// Whether the send has completed (its buffer may then be dropped).
    pub(super) fn test(&mut self) -> Result<bool> {
        let mut flag: c_int = 0;
        // SAFETY: `request` came from MPI_Isend and is tested by its owner
        // only; MPI_STATUS_IGNORE is allowed.
        check("MPI_Test", unsafe {
            ffi::MPI_Test(&mut self.request, &mut flag, ffi::RSMPI_STATUS_IGNORE)
        })?;
        Ok(flag != 0)
    }

    /// Gives up on a send nobody received: MPI completes it in the
    /// background, so the buffer must outlive us (leaked on purpose; only a
    /// program that sends without a matching receive gets here).
    pub(super) fn abandon(mut self) {
        // SAFETY: the request is active and owned here; freeing an active
        // send request is allowed, the send still completes.
        let _ = unsafe { ffi::MPI_Request_free(&mut self.request) };
        std::mem::forget(self._bytes);
    }
}

/// A message announced by `MPI_Improbe`: its source, tag and size, and the
/// handle that receives exactly it.
pub(super) struct Probed {
    message: ffi::MPI_Message,
    pub(super) source: usize,
    pub(super) tag: c_int,
    pub(super) bytes: usize,
}

/// Looks (without waiting) for the next message from `src` (`None`: any
/// source) with `tag` (`None`: any tag), and reserves it if there is one:
/// no other probe or receive can take it, and [`Probed::receive`] gets
/// exactly it. The caller polls this with its own deadline, where
/// `MPI_Mprobe` would wait forever.
pub(super) fn improbe(
    comm: Comm,
    src: Option<usize>,
    tag: Option<c_int>,
) -> Result<Option<Probed>> {
    // SAFETY: reading predefined constants.
    let (any_source, any_tag, null) = unsafe {
        (
            ffi::RSMPI_ANY_SOURCE,
            ffi::RSMPI_ANY_TAG,
            ffi::RSMPI_MESSAGE_NULL,
        )
    };
    let src = match src {
        Some(src) => int("rank", src)?,
        None => any_source,
    };
    let mut found: c_int = 0;
    let mut message = null;
    // SAFETY: MPI_Status is a plain C struct of integers: all-zero is valid.
    let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
    // SAFETY: `comm` is live; `found`, `message` and `status` are written by
    // MPI (`message` and `status` only when a message was found).
    check("MPI_Improbe", unsafe {
        ffi::MPI_Improbe(
            src,
            tag.unwrap_or(any_tag),
            comm.0,
            &mut found,
            &mut message,
            &mut status,
        )
    })?;
    if found == 0 {
        return Ok(None);
    }
    let mut count: c_int = 0;
    // SAFETY: `status` was filled by MPI_Improbe, which found a message.
    check("MPI_Get_count", unsafe {
        ffi::MPI_Get_count(&status, Wire::U8.raw(), &mut count)
    })?;
    Ok(Some(Probed {
        message,
        source: usize::try_from(status.MPI_SOURCE).unwrap_or(usize::MAX),
        tag: status.MPI_TAG,
        bytes: usize::try_from(count).unwrap_or(0),
    }))
}

impl Probed {
    /// Receives the message into `buf`, which must hold exactly its bytes.
    pub(super) fn receive(mut self, buf: &mut [u8]) -> Result<()> {
        if buf.len() != self.bytes {
            return Err(CommError::InvalidArgument(format!(
                "receive buffer of {} bytes for a message of {}",
                buf.len(),
                self.bytes
            )));
        }
        let count = int("message size in bytes", buf.len())?;
        // SAFETY: `buf` holds exactly the message's bytes (checked) and lives
        // for the call; the message handle came from MPI_Improbe and is
        // received once (this consumes it).
        check("MPI_Mrecv", unsafe {
            ffi::MPI_Mrecv(
                recv_ptr(buf, &mut 0),
                count,
                Wire::U8.raw(),
                &mut self.message,
                ffi::RSMPI_STATUS_IGNORE,
            )
        })
    }
}

/// An `MPI_Iallgather` of `i64` words in flight (the header exchange): it
/// owns both buffers, which MPI may read and write until the request
/// completes.
///
/// A request that never completes (a peer never arrived) cannot be
/// cancelled or freed (MPI forbids both for a collective request), so
/// dropping an incomplete `Gathering` leaks its buffers on purpose: MPI may
/// still write into them if the missing rank posts its part later. Only a
/// communicator that timed out (and is poisoned) leaves one behind.
pub(super) struct Gathering {
    request: MPI_Request,
    send: Vec<i64>,
    recv: Vec<i64>,
    done: bool,
}

/// Starts an `MPI_Iallgather` of `send` from every rank of `comm` (of
/// `size` ranks); poll it with [`Gathering::test`].
pub(super) fn iallgather(comm: Comm, send: Vec<i64>, size: usize) -> Result<Gathering> {
    let count = int("all_gather length", send.len())?;
    let total = send
        .len()
        .checked_mul(size)
        .ok_or_else(|| CommError::InvalidArgument("all_gather size overflows".into()))?;
    let mut gathering = Gathering {
        // SAFETY: reading a predefined handle.
        request: unsafe { ffi::RSMPI_REQUEST_NULL },
        send,
        recv: vec![0; total],
        // Nothing is in flight until MPI_Iallgather succeeds.
        done: true,
    };
    let Gathering {
        request,
        send,
        recv,
        ..
    } = &mut gathering;
    // SAFETY: `send` holds `count` words and `recv` `size * count`; both are
    // heap blocks owned by the returned `Gathering`, which does not free them
    // before the request completes (its drop leaks them otherwise), and the
    // blocks do not move when the struct does. `request` is written by MPI.
    check("MPI_Iallgather", unsafe {
        ffi::MPI_Iallgather(
            send_ptr(send.as_slice(), &0),
            count,
            Wire::I64.raw(),
            recv_ptr(recv.as_mut_slice(), &mut 0),
            count,
            Wire::I64.raw(),
            comm.0,
            request,
        )
    })?;
    gathering.done = false;
    Ok(gathering)
}

impl Gathering {
    /// Whether the all-gather has completed (`MPI_Test`; it also drives
    /// MPI's progress). Once it has, the received words are final.
    pub(super) fn test(&mut self) -> Result<bool> {
        if self.done {
            return Ok(true);
        }
        let mut flag: c_int = 0;
        // SAFETY: `request` came from MPI_Iallgather and has not completed
        // (MPI_Test sets it to MPI_REQUEST_NULL when it does, and `done`
        // records that); MPI_STATUS_IGNORE is allowed.
        check("MPI_Test", unsafe {
            ffi::MPI_Test(&mut self.request, &mut flag, ffi::RSMPI_STATUS_IGNORE)
        })?;
        self.done = flag != 0;
        Ok(self.done)
    }

    /// The gathered words, once [`Gathering::test`] said it completed.
    pub(super) fn received(&self) -> Option<&[i64]> {
        self.done.then_some(&self.recv[..])
    }
}

impl Drop for Gathering {
    fn drop(&mut self) {
        if !self.done {
            // MPI may still use both buffers: leak them (see the type).
            std::mem::forget(std::mem::take(&mut self.send));
            std::mem::forget(std::mem::take(&mut self.recv));
        }
    }
}
