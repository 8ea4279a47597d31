//! The only code that calls NCCL: thin, checked wrappers over cudarc's raw
//! bindings (`cudarc::nccl::sys`, loaded at run time).
//!
//! cudarc's own safe `Comm` panics in places (its `Drop` expects
//! `ncclCommAbort` to succeed, `from_rank` expects the world size to fit an
//! int) and a missing library or symbol panics inside its loader. So gradwire
//! checks that the library is present and recent enough ([`load`]) before
//! any other call, and wraps the raw functions itself, turning every
//! `ncclResult_t` into [`CommError::Nccl`] with NCCL's own message.
//!
//! Communicators are non-blocking (`ncclCommInitRankConfig` with `blocking
//! = 0`, inherited by splits): a call may return `ncclInProgress`, which
//! means issued ([`check_issued`]), and the owner thread polls
//! `ncclCommGetAsyncError` until the communicator is ready.
//!
//! Transfers that only move data (all-gather, broadcast, send and receive)
//! move bytes (`ncclUint8`). Reductions name NCCL's datatype and operator
//! ([`datatype`], [`red_op`]): NCCL's own `ncclAllReduce` and
//! `ncclReduceScatter` (`NcclReduction::Native`); the rank-ordered setting
//! moves bytes and does the arithmetic itself.

use std::ffi::{CStr, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

use gradwire_tensor::cudarc::driver::sys::CUstream;
use gradwire_tensor::cudarc::nccl::sys;

use crate::element::ElemType;
use crate::error::{CommError, Result};
use crate::op::ReduceOp;

/// The oldest NCCL this backend accepts: 2.18 introduced `ncclCommSplit`.
pub(super) const MIN_VERSION: i32 = 21800;

/// Checks once per process that the NCCL library can be loaded and is at
/// least [`MIN_VERSION`]; every entry point calls this first, so no cudarc
/// loader panic (missing library or symbol) is reachable.
pub(super) fn load() -> Result<i32> {
    static LOADED: OnceLock<std::result::Result<i32, String>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        #[allow(unsafe_code)]
        // SAFETY: `is_culib_present` only tries to dlopen the library under
        // its usual names and reports whether one opened; no NCCL function
        // is called.
        let present = unsafe { sys::is_culib_present() };
        if !present {
            return Err("the NCCL library (libnccl.so.2) is not installed".into());
        }
        let mut version = 0i32;
        #[allow(unsafe_code)]
        // SAFETY: ncclGetVersion writes one int through a valid pointer; it
        // exists in every NCCL 2 release, so the loader finds the symbol.
        let status = unsafe { sys::ncclGetVersion(&mut version) };
        if status != sys::ncclResult_t::ncclSuccess {
            return Err(format!("ncclGetVersion failed: {}", describe(status)));
        }
        if version < MIN_VERSION {
            return Err(format!(
                "NCCL {version} is too old: gradwire needs 2.18 (code {MIN_VERSION}) or later"
            ));
        }
        Ok(version)
    });
    loaded.clone().map_err(CommError::NcclUnavailable)
}

/// NCCL's description of a result code.
fn describe(status: sys::ncclResult_t) -> String {
    #[allow(unsafe_code)]
    // SAFETY: ncclGetErrorString returns a pointer to a static string (or
    // null for an unknown code), never freed.
    let text = unsafe { sys::ncclGetErrorString(status) };
    if text.is_null() {
        return format!("{status:?}");
    }
    #[allow(unsafe_code)]
    // SAFETY: non-null, and NCCL's strings are NUL-terminated and static.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_string_lossy().into_owned()
}

/// `Ok` for success, else [`CommError::Nccl`] naming `op`, the code, NCCL's
/// description and, with a communicator, its last error message.
/// [`check`] of a call on a non-blocking communicator: `ncclInProgress`
/// means issued, not failed; the owner thread then polls the communicator
/// ([`AbortHandle::progress`]) until it is ready.
fn check_issued(op: &'static str, status: sys::ncclResult_t, comm: Option<&RawComm>) -> Result<()> {
    match status {
        sys::ncclResult_t::ncclInProgress => Ok(()),
        status => check(op, status, comm),
    }
}

fn check(op: &'static str, status: sys::ncclResult_t, comm: Option<&RawComm>) -> Result<()> {
    match status {
        sys::ncclResult_t::ncclSuccess => Ok(()),
        status => {
            let mut message = describe(status);
            if let Some(comm) = comm {
                #[allow(unsafe_code)]
                // SAFETY: the communicator is live (RawComm is only built
                // from a successful init or split, and freed by consuming
                // it); ncclGetLastError returns a NUL-terminated string
                // owned by NCCL, valid until the next call on this thread.
                let last = unsafe { sys::ncclGetLastError(comm.0) };
                if !last.is_null() {
                    #[allow(unsafe_code)]
                    // SAFETY: non-null and NUL-terminated (see above).
                    let last = unsafe { CStr::from_ptr(last) }.to_string_lossy();
                    if !last.is_empty() {
                        message = format!("{message}: {last}");
                    }
                }
            }
            Err(CommError::Nccl {
                op,
                code: status as i32,
                message,
            })
        }
    }
}

fn int(what: &str, value: usize) -> Result<i32> {
    i32::try_from(value)
        .map_err(|_| CommError::InvalidArgument(format!("{what} {value} exceeds NCCL's int")))
}

/// The 128 bytes that let W processes find each other.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub(super) [u8; 128]);

impl UniqueId {
    /// A fresh id (`ncclGetUniqueId`), made by one rank and shared with the
    /// others.
    pub(super) fn new() -> Result<UniqueId> {
        load()?;
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        #[allow(unsafe_code)]
        // SAFETY: writes one ncclUniqueId through a valid pointer.
        let status = unsafe { sys::ncclGetUniqueId(&mut id) };
        check("ncclGetUniqueId", status, None)?;
        Ok(UniqueId(id.internal.map(|c| c as u8)))
    }

    fn raw(&self) -> sys::ncclUniqueId {
        sys::ncclUniqueId {
            internal: self.0.map(|b| b as std::ffi::c_char),
        }
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The id is a rendezvous address: print only that it exists.
        f.write_str("UniqueId(..)")
    }
}

/// A live NCCL communicator handle, non-blocking (every call returns at
/// once; [`AbortHandle::progress`] says when its host side is done). Not
/// `Sync`: one thread (a rank's owner thread) issues its operations, the
/// abort included; only `ncclCommGetAsyncError` comes from another (the
/// watchdog's), which NCCL allows.
#[derive(Debug)]
pub struct RawComm(sys::ncclComm_t);

#[allow(unsafe_code)]
// SAFETY: an ncclComm_t is a pointer NCCL lets any thread use, as long as
// operations on one communicator are not issued concurrently; gradwire
// issues them from the owner thread only (the handle moves there once).
unsafe impl Send for RawComm {}

/// NCCL's configuration of a non-blocking communicator: `NCCL_CONFIG_INITIALIZER`
/// (every field undefined but the header) with `blocking = 0`. The header
/// names the bindings' NCCL (2.24), which a later library reads as such.
fn non_blocking_config() -> sys::ncclConfig_t {
    // NCCL_CONFIG_UNDEF_INT and NCCL_CONFIG_UNDEF_PTR.
    const UNDEF: i32 = i32::MIN;
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        // NCCL_VERSION(2, 24, 3).
        version: 2 * 10_000 + 24 * 100 + 3,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
    }
}

/// `ncclCommInitRankConfig` with a non-blocking configuration: joins the
/// communicator of `world` ranks identified by `id` as `rank`, on the CUDA
/// device current on this thread. Returns at once, the communicator still
/// initialising: poll [`AbortHandle::progress`] until it is ready (or abort
/// it, which is allowed while it initialises).
///
/// Non-blocking, so that no NCCL call ever blocks the owner thread: an
/// abort is then issued by that same thread between polls, never while
/// another call on the communicator is running (NCCL allows one thread at
/// a time on a communicator).
pub(super) fn init_rank(id: &UniqueId, world: usize, rank: usize) -> Result<RawComm> {
    load()?;
    let mut comm: sys::ncclComm_t = std::ptr::null_mut();
    let mut config = non_blocking_config();
    #[allow(unsafe_code)]
    // SAFETY: `comm` and `config` are valid pointers; the id is passed by
    // value; NCCL copies the configuration.
    let status = unsafe {
        sys::ncclCommInitRankConfig(
            &mut comm,
            int("world size", world)?,
            id.raw(),
            int("rank", rank)?,
            &mut config,
        )
    };
    check_issued("ncclCommInitRankConfig", status, None)?;
    if comm.is_null() {
        return Err(CommError::Nccl {
            op: "ncclCommInitRankConfig",
            code: 0,
            message: "returned no communicator".into(),
        });
    }
    Ok(RawComm(comm))
}

/// A split in flight: NCCL writes the new communicator's handle into
/// `slot`, from its own thread, when the split completes, so the slot lives
/// on the heap until then. Dropped before [`PendingSplit::result`] (the
/// split failed or timed out, and NCCL may still write), the slot is leaked
/// rather than freed under that write.
#[derive(Debug)]
pub struct PendingSplit {
    slot: Option<Box<AtomicPtr<sys::ncclComm>>>,
}

impl PendingSplit {
    /// The new communicator, once the parent's progress said the split is
    /// done (`None` for no color, or if NCCL made none).
    pub(super) fn result(mut self) -> Option<RawComm> {
        let slot = self.slot.take()?;
        // NCCL stores it with release ordering before it clears the
        // parent's ncclInProgress.
        let comm = slot.load(Ordering::Acquire);
        (!comm.is_null()).then_some(RawComm(comm))
    }
}

impl Drop for PendingSplit {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            Box::leak(slot);
        }
    }
}

/// `ncclCommSplit`: the sub-communicator of the ranks with the same `color`
/// (`None`: this rank joins none), ordered by `key`. Collective over
/// `comm`, non-blocking: `comm` is in progress until every rank split, and
/// the new handle is written then ([`PendingSplit::result`]).
pub(super) fn split(comm: &RawComm, color: Option<i32>, key: i32) -> Result<PendingSplit> {
    // NCCL_SPLIT_NOCOLOR.
    const NO_COLOR: i32 = -1;
    let slot = Box::new(AtomicPtr::new(std::ptr::null_mut()));
    #[allow(unsafe_code)]
    // SAFETY: `comm` is live; the slot is a valid out-pointer that stays
    // allocated until NCCL has written it (`PendingSplit` frees it only
    // after the split completed, and leaks it otherwise); a null config
    // asks for the parent's configuration (non-blocking).
    let status = unsafe {
        sys::ncclCommSplit(
            comm.0,
            color.unwrap_or(NO_COLOR),
            key,
            slot.as_ptr(),
            std::ptr::null_mut(),
        )
    };
    let pending = PendingSplit { slot: Some(slot) };
    check_issued("ncclCommSplit", status, Some(comm))?;
    Ok(pending)
}

/// Releases a communicator whose operations are complete
/// (`ncclCommDestroy`). Errors are returned for the caller to report.
pub(super) fn destroy(comm: RawComm) -> Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: `comm` is live and consumed: it is never used again.
    let status = unsafe { sys::ncclCommDestroy(comm.0) };
    check_issued("ncclCommDestroy", status, None)
}

/// A handle that reads a communicator's asynchronous error from any thread
/// (the watchdog's) and aborts it (the owner thread, between its calls).
#[derive(Clone, Copy, Debug)]
pub struct AbortHandle(sys::ncclComm_t);

#[allow(unsafe_code)]
// SAFETY: ncclCommGetAsyncError may be called from any thread while
// another thread issues the communicator's operations; that is what it is
// for. The abort is issued by the owner thread (`nccl::Owner`), between its
// calls, at most once, and never after the communicator was destroyed.
unsafe impl Send for AbortHandle {}
#[allow(unsafe_code)]
// SAFETY: see `Send`; the handle is a plain pointer value.
unsafe impl Sync for AbortHandle {}

impl RawComm {
    /// The handle the watchdog uses.
    pub(super) fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.0)
    }
}

impl AbortHandle {
    /// `ncclCommAbort`: ends every pending operation of the communicator and
    /// frees it.
    ///
    /// # Safety
    ///
    /// The communicator must be live, no other call on it may run beside
    /// this one, and nothing may use it afterwards (a CUDA wait on its
    /// stream is released by the abort): the caller forgets the
    /// [`RawComm`].
    #[allow(unsafe_code)]
    pub(super) unsafe fn abort(self) -> Result<()> {
        // SAFETY: the communicator is live (the caller's contract).
        let status = unsafe { sys::ncclCommAbort(self.0) };
        check_issued("ncclCommAbort", status, None)
    }

    /// Whether the communicator has finished its last operation's host
    /// side (`ncclCommGetAsyncError` is not `ncclInProgress`: the init, a
    /// split, a group's connections), or the error it ended with.
    pub(super) fn progress(&self) -> Result<bool> {
        let mut status = sys::ncclResult_t::ncclSuccess;
        #[allow(unsafe_code)]
        // SAFETY: called while the communicator is live (the owner thread
        // holds it); `status` is a valid out-pointer.
        let call = unsafe { sys::ncclCommGetAsyncError(self.0, &mut status) };
        check("ncclCommGetAsyncError", call, None)?;
        match status {
            sys::ncclResult_t::ncclSuccess => Ok(true),
            sys::ncclResult_t::ncclInProgress => Ok(false),
            status => check("asynchronous NCCL error", status, None).map(|()| true),
        }
    }

    /// `ncclCommGetAsyncError`: an error NCCL found in the background (a
    /// peer's network failure, a remote abort).
    pub(super) fn async_error(&self) -> Result<()> {
        let mut status = sys::ncclResult_t::ncclSuccess;
        #[allow(unsafe_code)]
        // SAFETY: the owner only lets the watchdog query while the
        // communicator is live; `status` is a valid out-pointer.
        let call = unsafe { sys::ncclCommGetAsyncError(self.0, &mut status) };
        check("ncclCommGetAsyncError", call, None)?;
        match status {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => Ok(()),
            status => check("asynchronous NCCL error", status, None),
        }
    }
}

/// NCCL's datatype of `elem`. Every gradwire element type has one: bf16 is
/// `ncclBfloat16` (9), which every NCCL release gradwire accepts defines
/// when built with CUDA 11 or later, as NVIDIA's builds are (cudarc's
/// bindings follow NCCL 2.24's header, which names it; the values of the
/// other types are the same in every NCCL 2).
pub(super) fn datatype(elem: ElemType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as D;
    match elem {
        ElemType::F16 => D::ncclFloat16,
        ElemType::BF16 => D::ncclBfloat16,
        ElemType::F32 => D::ncclFloat32,
        ElemType::F64 => D::ncclFloat64,
        ElemType::U8 => D::ncclUint8,
        ElemType::U32 => D::ncclUint32,
        ElemType::U64 => D::ncclUint64,
        ElemType::I32 => D::ncclInt32,
        ElemType::I64 => D::ncclInt64,
    }
}

/// The bytes of one element of NCCL's `dtype`.
#[cfg(test)]
fn datatype_size(dtype: sys::ncclDataType_t) -> usize {
    use sys::ncclDataType_t as D;
    match dtype {
        D::ncclInt8 | D::ncclUint8 => 1,
        D::ncclFloat16 | D::ncclBfloat16 => 2,
        D::ncclInt32 | D::ncclUint32 | D::ncclFloat32 => 4,
        D::ncclInt64 | D::ncclUint64 | D::ncclFloat64 => 8,
        // The FP8 types of newer NCCLs (gradwire maps no element to them).
        _ => 1,
    }
}

/// NCCL's operator for `op`. Which reductions NCCL computes at all is
/// decided once, in `super::native_reduction`:
///
/// - `Sum` is `ncclSum` (integers wrap, as gradwire's do);
/// - `Avg` is `ncclAvg` (NCCL 2.10 and later; gradwire needs 2.18): each
///   input is multiplied by 1/W in the element type, then summed (floats
///   only, which the header exchange has checked);
/// - `Max` and `Min` are `ncclMax` / `ncclMin` (taken on integers only:
///   NCCL's `fmaxf` / `__hmax` drop a NaN that gradwire's propagate).
pub(super) fn red_op(op: ReduceOp) -> sys::ncclRedOp_t {
    use sys::ncclRedOp_t as O;
    match op {
        ReduceOp::Sum => O::ncclSum,
        ReduceOp::Avg => O::ncclAvg,
        ReduceOp::Max => O::ncclMax,
        ReduceOp::Min => O::ncclMin,
    }
}

/// The operations the owner thread issues, all on bytes, all queued on
/// `stream` (they return once queued, not once done).
///
/// # Safety (for every function below)
///
/// Device addresses are live allocations of at least the given byte counts
/// on the communicator's device, and stay allocated until the queued work is
/// complete (the callers keep their buffers until the stream's event fires
/// or the communicator is aborted).
pub(super) mod ops {
    use super::*;
    use crate::nccl::transport::Transfer;

    /// `ncclAllGather` of `bytes` bytes from every rank into `recv`
    /// (`world * bytes`); `send == recv + rank * bytes` is NCCL's in-place
    /// form.
    #[allow(unsafe_code)]
    pub unsafe fn all_gather(
        comm: &RawComm,
        send: u64,
        recv: u64,
        bytes: usize,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the module contract; the byte type has size 1.
        let status = unsafe {
            sys::ncclAllGather(
                send as *const c_void,
                recv as *mut c_void,
                bytes,
                sys::ncclDataType_t::ncclUint8,
                comm.0,
                stream as sys::cudaStream_t,
            )
        };
        check_issued("ncclAllGather", status, Some(comm))
    }

    /// `ncclAllReduce` of `count` elements of `dtype` from `send` into
    /// `recv` (the same address: in place).
    #[allow(unsafe_code)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        comm: &RawComm,
        send: u64,
        recv: u64,
        count: usize,
        dtype: sys::ncclDataType_t,
        op: sys::ncclRedOp_t,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the module contract (`count` elements of `dtype` at both
        // addresses); NCCL documents send == recv as the in-place form.
        let status = unsafe {
            sys::ncclAllReduce(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dtype,
                op,
                comm.0,
                stream as sys::cudaStream_t,
            )
        };
        check_issued("ncclAllReduce", status, Some(comm))
    }

    /// `ncclReduceScatter`: `send` holds W blocks of `recv_count` elements
    /// of `dtype`; rank r receives the reduction of every rank's block r
    /// in `recv` (`recv_count` elements: NCCL's count is per rank).
    #[allow(unsafe_code)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter(
        comm: &RawComm,
        send: u64,
        recv: u64,
        recv_count: usize,
        dtype: sys::ncclDataType_t,
        op: sys::ncclRedOp_t,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the module contract (W * recv_count elements at `send`,
        // recv_count at `recv`).
        let status = unsafe {
            sys::ncclReduceScatter(
                send as *const c_void,
                recv as *mut c_void,
                recv_count,
                dtype,
                op,
                comm.0,
                stream as sys::cudaStream_t,
            )
        };
        check_issued("ncclReduceScatter", status, Some(comm))
    }

    /// `ncclBroadcast` of `bytes` bytes in place from `root`.
    #[allow(unsafe_code)]
    pub unsafe fn broadcast(
        comm: &RawComm,
        buf: u64,
        bytes: usize,
        root: usize,
        stream: CUstream,
    ) -> Result<()> {
        let root = int("root", root)?;
        // SAFETY: the module contract; send and receive buffers coincide,
        // which NCCL documents as the in-place broadcast.
        let status = unsafe {
            sys::ncclBroadcast(
                buf as *const c_void,
                buf as *mut c_void,
                bytes,
                sys::ncclDataType_t::ncclUint8,
                root,
                comm.0,
                stream as sys::cudaStream_t,
            )
        };
        check_issued("ncclBroadcast", status, Some(comm))
    }

    /// Every send and receive in one NCCL group (`ncclGroupStart` ..
    /// `ncclGroupEnd`), so a rank can send to and receive from many peers
    /// at once without ordering deadlocks. Empty transfers are skipped.
    #[allow(unsafe_code)]
    pub unsafe fn exchange(
        comm: &RawComm,
        sends: &[Transfer],
        recvs: &[Transfer],
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: group calls take no arguments.
        check("ncclGroupStart", unsafe { sys::ncclGroupStart() }, None)?;
        let mut first_error = Ok(());
        let all = sends
            .iter()
            .map(|t| (true, t))
            .chain(recvs.iter().map(|t| (false, t)));
        for (is_send, t) in all.filter(|(_, t)| t.bytes > 0) {
            let peer = match int("peer", t.peer) {
                Ok(peer) => peer,
                Err(e) => {
                    first_error = first_error.and(Err(e));
                    continue;
                }
            };
            let (op, status) = if is_send {
                // SAFETY: the module contract.
                let status = unsafe {
                    sys::ncclSend(
                        t.ptr as *const c_void,
                        t.bytes,
                        sys::ncclDataType_t::ncclUint8,
                        peer,
                        comm.0,
                        stream as sys::cudaStream_t,
                    )
                };
                ("ncclSend", status)
            } else {
                // SAFETY: the module contract.
                let status = unsafe {
                    sys::ncclRecv(
                        t.ptr as *mut c_void,
                        t.bytes,
                        sys::ncclDataType_t::ncclUint8,
                        peer,
                        comm.0,
                        stream as sys::cudaStream_t,
                    )
                };
                ("ncclRecv", status)
            };
            first_error = first_error.and(check_issued(op, status, Some(comm)));
        }
        // The group is always closed, even after a failed call in it.
        // SAFETY: group calls take no arguments.
        let end = check_issued("ncclGroupEnd", unsafe { sys::ncclGroupEnd() }, Some(comm));
        first_error.and(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_element_type_has_an_nccl_datatype_of_its_size() {
        use sys::ncclDataType_t as D;
        for elem in ElemType::ALL {
            let dtype = datatype(elem);
            assert!(
                !matches!(dtype, D::ncclInt8),
                "{elem}: no gradwire element is an i8"
            );
            assert_eq!(datatype_size(dtype), elem.size_in_bytes(), "{elem}");
        }
        // NCCL's numbering (nccl.h), which the library checks.
        assert_eq!(datatype(ElemType::BF16) as u32, 9);
        assert_eq!(datatype(ElemType::F16) as u32, 6);
        assert_eq!(datatype(ElemType::F32) as u32, 7);
        assert_eq!(datatype(ElemType::I64) as u32, 4);
    }

    #[test]
    fn reduction_operators_are_nccls() {
        use sys::ncclRedOp_t as O;
        assert_eq!(red_op(ReduceOp::Sum), O::ncclSum);
        assert_eq!(red_op(ReduceOp::Avg), O::ncclAvg);
        assert_eq!(red_op(ReduceOp::Max), O::ncclMax);
        assert_eq!(red_op(ReduceOp::Min), O::ncclMin);
        assert_eq!(O::ncclAvg as u32, 4);
    }
}
