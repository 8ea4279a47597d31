//! One communicator of the host transport, shared by its ranks: how they
//! join, and how their streams' collectives and transfers meet, under
//! NCCL's rules (listed in `host/mod.rs`).
//!
//! Everything is under one lock per communicator, every copy out of or
//! into another rank's memory included, so an abort never races one: an
//! aborted rank's posts are withdrawn before its stream moves on (and
//! frees what they point at). Only a rank's copy of a collective's result
//! into its own memory runs outside the lock, on its own stream.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use super::stream::copy;
use crate::element::ElemType;
use crate::error::{CommError, Result};
use crate::nccl::transport::{Native, Transfer};
use crate::nccl::watchdog::lock;
use crate::op::ReduceOp;

/// NCCL's `ncclInvalidUsage`.
pub(super) const INVALID_USAGE: i32 = 5;

/// An NCCL error as NCCL reports it.
pub(super) fn nccl_error(op: &'static str, code: i32, message: String) -> CommError {
    CommError::Nccl { op, code, message }
}

/// What a rank contributes to a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Collective {
    AllGather { bytes: usize },
    AllReduce { count: usize, native: Native },
    ReduceScatter { recv_count: usize, native: Native },
    Broadcast { bytes: usize, root: usize },
}

impl Collective {
    /// NCCL's name of the call.
    pub(super) fn name(self) -> &'static str {
        match self {
            Collective::AllGather { .. } => "ncclAllGather",
            Collective::AllReduce { .. } => "ncclAllReduce",
            Collective::ReduceScatter { .. } => "ncclReduceScatter",
            Collective::Broadcast { .. } => "ncclBroadcast",
        }
    }

    /// Bytes this rank's input holds, at its send address.
    fn input_bytes(self, world: usize) -> usize {
        match self {
            Collective::AllGather { bytes } | Collective::Broadcast { bytes, .. } => bytes,
            Collective::AllReduce { count, native } => count * native.elem.size_in_bytes(),
            Collective::ReduceScatter { recv_count, native } => {
                world * recv_count * native.elem.size_in_bytes()
            }
        }
    }
}

/// One collective, as the ranks reach it on their streams.
#[derive(Default)]
struct Slot {
    /// Each rank's call and send address, until every rank has arrived.
    calls: BTreeMap<usize, (Collective, u64)>,
    /// The collective's result, computed once from the inputs when the
    /// last rank arrived: each rank copies its part.
    result: Option<Arc<Vec<u8>>>,
    /// Ranks that have written their output.
    finished: usize,
}

/// A posted transfer.
struct Post {
    id: u64,
    ptr: u64,
    bytes: usize,
}

/// One split, as the ranks reach it.
#[derive(Default)]
struct SplitSlot {
    entries: BTreeMap<usize, (Option<i32>, i32)>,
    made: HashMap<i32, Arc<Fabric>>,
    taken: usize,
}

#[derive(Default)]
struct State {
    /// The ranks that have joined.
    joined: HashSet<usize>,
    aborted: HashSet<usize>,
    /// A break of NCCL's rules seen by the transport (NCCL's behaviour is
    /// undefined: a hang or garbage); every rank's asynchronous error.
    broken: Option<String>,
    /// Each rank's next collective, by the order its stream reaches them.
    next_collective: HashMap<usize, u64>,
    collectives: BTreeMap<u64, Slot>,
    /// Posted sends and receives per (sender, receiver), oldest first.
    sends: HashMap<(usize, usize), VecDeque<Post>>,
    recvs: HashMap<(usize, usize), VecDeque<Post>>,
    completed: HashSet<u64>,
    /// Connections asked for (from, to) and made (lower, higher).
    asked: HashSet<(usize, usize)>,
    connected: HashSet<(usize, usize)>,
    next_split: HashMap<usize, u64>,
    splits: BTreeMap<u64, SplitSlot>,
}

/// One communicator of the host transport.
pub(crate) struct Fabric {
    world: usize,
    state: Mutex<State>,
    /// One per rank: wakes that rank's blocked stream operation (its
    /// collective's result is made, one of its transfers completed, the
    /// communicator aborted or broke). Waking only the ranks concerned
    /// keeps the others asleep.
    wake: Vec<Condvar>,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("world", &self.world)
            .finish_non_exhaustive()
    }
}

static NEXT_POST: AtomicU64 = AtomicU64::new(1);

/// Communicators being joined, by id.
fn joining() -> &'static Mutex<HashMap<u64, Arc<Fabric>>> {
    static JOINING: OnceLock<Mutex<HashMap<u64, Arc<Fabric>>>> = OnceLock::new();
    JOINING.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Fabric {
    fn new(world: usize) -> Arc<Fabric> {
        Arc::new(Fabric {
            world,
            state: Mutex::new(State::default()),
            wake: (0..world).map(|_| Condvar::new()).collect(),
        })
    }

    pub(super) fn world(&self) -> usize {
        self.world
    }

    /// Blocks `rank`'s stream operation until [`Fabric::wake`] or
    /// [`Fabric::wake_all`].
    fn wait<'a>(&self, state: MutexGuard<'a, State>, rank: usize) -> MutexGuard<'a, State> {
        match self.wake.get(rank) {
            Some(wake) => wake.wait(state).unwrap_or_else(|e| e.into_inner()),
            None => state,
        }
    }

    /// Wakes `rank`'s blocked stream operation.
    fn wake(&self, rank: usize) {
        if let Some(wake) = self.wake.get(rank) {
            wake.notify_all();
        }
    }

    /// Wakes every rank's blocked stream operation.
    fn wake_all(&self) {
        self.wake.iter().for_each(Condvar::notify_all);
    }

    /// `ncclCommInitRank`, non-blocking: registers `rank` in the world of
    /// `world` ranks joining `id` and returns at once; the communicator is
    /// in progress ([`Fabric::progress`]) until every rank joined.
    pub(super) fn join(id: u64, world: usize, rank: usize) -> Result<Arc<Fabric>> {
        let fabric = {
            let mut joining = lock(joining());
            let fabric = Arc::clone(joining.entry(id).or_insert_with(|| Fabric::new(world)));
            if fabric.world != world {
                return Err(nccl_error(
                    "ncclCommInitRank",
                    INVALID_USAGE,
                    format!(
                        "rank {rank} joins a world of {world}, others of {}",
                        fabric.world
                    ),
                ));
            }
            let mut state = lock(&fabric.state);
            if rank >= world || !state.joined.insert(rank) {
                return Err(nccl_error(
                    "ncclCommInitRank",
                    INVALID_USAGE,
                    format!("rank {rank} joins a world of {world} twice or outside it"),
                ));
            }
            if state.joined.len() == world {
                joining.remove(&id);
            }
            drop(state);
            fabric
        };
        Ok(fabric)
    }

    /// `ncclCommGetAsyncError` for `rank`: `Ok(true)` once the host side
    /// of its last operation is done (every rank joined, its splits
    /// complete, the peers of its groups connected), `Ok(false)` while in
    /// progress, the error of an abort or a broken rule.
    pub(super) fn progress(&self, rank: usize) -> Result<bool> {
        let state = lock(&self.state);
        Fabric::check(&state, rank, "ncclCommGetAsyncError")?;
        if state.joined.len() < self.world {
            return Ok(false);
        }
        let splitting = state
            .splits
            .values()
            .any(|slot| slot.entries.contains_key(&rank) && slot.entries.len() < self.world);
        let connecting = state.asked.iter().any(|&(from, to)| {
            from == rank
                && !state.connected.contains(&(from.min(to), from.max(to)))
                && !state.asked.contains(&(to, from))
        });
        Ok(!splitting && !connecting)
    }

    /// Whether `rank` aborted: its blocked calls end with this error.
    fn check(state: &State, rank: usize, op: &'static str) -> Result<()> {
        if state.aborted.contains(&rank) {
            return Err(nccl_error(
                op,
                INVALID_USAGE,
                "the communicator was aborted".into(),
            ));
        }
        if let Some(broken) = &state.broken {
            return Err(nccl_error(op, INVALID_USAGE, broken.clone()));
        }
        Ok(())
    }

    fn break_rules(&self, state: &mut State, what: String) -> CommError {
        state.broken.get_or_insert(what.clone());
        self.wake_all();
        nccl_error("NCCL's rules", INVALID_USAGE, what)
    }

    /// `ncclCommAbort` of `rank`: its posts are withdrawn (nobody copies
    /// out of or into its memory any more), its blocked calls end. The
    /// peers are not told: they wait, as on NCCL, for their deadline.
    pub(super) fn abort(&self, rank: usize) {
        let mut state = lock(&self.state);
        state.aborted.insert(rank);
        for slot in state.collectives.values_mut() {
            if slot.result.is_none() {
                slot.calls.remove(&rank);
            }
        }
        let state = &mut *state;
        for ((from, to), posts) in state.sends.iter_mut().chain(state.recvs.iter_mut()) {
            if *from == rank || *to == rank {
                posts.clear();
            }
        }
        self.wake_all();
    }

    /// `ncclCommGetAsyncError`: a break of NCCL's rules by any rank.
    pub(super) fn async_error(&self) -> Result<()> {
        let state = lock(&self.state);
        match &state.broken {
            None => Ok(()),
            Some(what) => Err(nccl_error(
                "asynchronous NCCL error",
                INVALID_USAGE,
                what.clone(),
            )),
        }
    }

    /// A collective on `rank`'s stream: waits for every rank's, checks
    /// they are the same call, and writes this rank's output at `recv`.
    ///
    /// # Safety
    ///
    /// `send` and `recv` address live memory of the call's sizes, kept
    /// until this returns.
    #[allow(unsafe_code)]
    pub(super) unsafe fn collective(
        &self,
        rank: usize,
        call: Collective,
        send: u64,
        recv: u64,
    ) -> Result<()> {
        let world = self.world;
        let mut state = lock(&self.state);
        Fabric::check(&state, rank, "collective")?;
        let seq = take_next(&mut state.next_collective, rank);
        let slot = state.collectives.entry(seq).or_default();
        slot.calls.insert(rank, (call, send));
        if slot.calls.len() == world {
            let first = slot.calls.values().next().map(|c| c.0);
            if let Some((r, (other, _))) = slot.calls.iter().find(|(_, c)| Some(c.0) != first) {
                let what = format!(
                    "collective #{seq}: rank {} calls {first:?}, rank {r} calls {other:?}",
                    slot.calls.keys().next().copied().unwrap_or(0)
                );
                return Err(self.break_rules(&mut state, what));
            }
            // Only the root's input matters to a broadcast.
            let needed =
                |r: usize| !matches!(call, Collective::Broadcast { root, .. } if r != root);
            let inputs: Vec<Vec<u8>> = slot
                .calls
                .iter()
                .map(|(&r, &(c, at))| {
                    let len = if needed(r) { c.input_bytes(world) } else { 0 };
                    let mut bytes = vec![0u8; len];
                    // SAFETY: every rank's send address holds its input
                    // (its caller's contract), and every rank is blocked
                    // in this call, under the lock, until the result is
                    // made.
                    unsafe { copy(at, bytes.as_mut_ptr().expose_provenance() as u64, len) };
                    bytes
                })
                .collect();
            match result_of(call, inputs, world) {
                Ok(result) => slot.result = Some(Arc::new(result)),
                Err(e) => return Err(self.break_rules(&mut state, e.to_string())),
            }
            // Every rank's call is in the slot.
            self.wake_all();
        }
        let result = loop {
            Fabric::check(&state, rank, "collective")?;
            if let Some(result) = state.collectives.get(&seq).and_then(|s| s.result.clone()) {
                break result;
            }
            state = self.wait(state, rank);
        };
        if let Some(slot) = state.collectives.get_mut(&seq) {
            slot.finished += 1;
            if slot.finished == world {
                state.collectives.remove(&seq);
            }
        }
        drop(state);
        let part = match call {
            Collective::ReduceScatter { recv_count, native } => {
                let block = recv_count * native.elem.size_in_bytes();
                result.get(rank * block..(rank + 1) * block).unwrap_or(&[])
            }
            _ => &result[..],
        };
        // SAFETY: `recv` holds this rank's part (the caller's contract),
        // and only this rank's stream writes it.
        unsafe { copy(part.as_ptr().expose_provenance() as u64, recv, part.len()) };
        Ok(())
    }

    /// The host side of a group (`ncclGroupEnd`): a send to itself needs
    /// its receive in the group, and the first transfer with a peer asks to
    /// connect the pair, which is in progress ([`Fabric::progress`]) until
    /// the peer asks too.
    pub(super) fn issue_group(
        &self,
        rank: usize,
        sends: &[Transfer],
        recvs: &[Transfer],
    ) -> Result<()> {
        let to_self: Vec<usize> = sends
            .iter()
            .filter(|t| t.peer == rank && t.bytes > 0)
            .map(|t| t.bytes)
            .collect();
        let from_self: Vec<usize> = recvs
            .iter()
            .filter(|t| t.peer == rank && t.bytes > 0)
            .map(|t| t.bytes)
            .collect();
        if to_self != from_self {
            return Err(nccl_error(
                "ncclGroupEnd",
                INVALID_USAGE,
                "Trying to send to self without a matching recv".into(),
            ));
        }
        let peers: HashSet<usize> = sends
            .iter()
            .chain(recvs)
            .filter(|t| t.bytes > 0 && t.peer != rank)
            .map(|t| t.peer)
            .collect();
        if let Some(&bad) = peers.iter().find(|&&p| p >= self.world) {
            return Err(nccl_error(
                "ncclSend",
                INVALID_USAGE,
                format!("peer {bad} of a world of {}", self.world),
            ));
        }
        let mut state = lock(&self.state);
        Fabric::check(&state, rank, "ncclGroupEnd")?;
        for &peer in &peers {
            state.asked.insert((rank, peer));
            if state.asked.contains(&(peer, rank)) {
                state.connected.insert((rank.min(peer), rank.max(peer)));
            }
        }
        Ok(())
    }

    /// A group on `rank`'s stream: posts its transfers, copies every one
    /// whose other side is posted, and returns once all of its own are
    /// done. A send is done only once its receive has taken it.
    ///
    /// # Safety
    ///
    /// Every transfer's address holds its bytes, kept until this returns.
    #[allow(unsafe_code)]
    pub(super) unsafe fn group(
        &self,
        rank: usize,
        sends: &[Transfer],
        recvs: &[Transfer],
    ) -> Result<()> {
        let mut state = lock(&self.state);
        Fabric::check(&state, rank, "ncclGroupEnd")?;
        let mut mine = Vec::new();
        let mut pairs = HashSet::new();
        for (is_send, t) in sends
            .iter()
            .map(|t| (true, t))
            .chain(recvs.iter().map(|t| (false, t)))
        {
            if t.bytes == 0 {
                continue;
            }
            let id = NEXT_POST.fetch_add(1, Ordering::Relaxed);
            let post = Post {
                id,
                ptr: t.ptr,
                bytes: t.bytes,
            };
            let pair = if is_send {
                (rank, t.peer)
            } else {
                (t.peer, rank)
            };
            let queue = if is_send {
                &mut state.sends
            } else {
                &mut state.recvs
            };
            queue.entry(pair).or_default().push_back(post);
            mine.push(id);
            pairs.insert(pair);
        }
        for pair in pairs {
            // SAFETY: the posts' addresses hold their bytes while their
            // ranks are blocked in this function, under the lock; an
            // aborted rank's posts are withdrawn first.
            if unsafe { self.match_pair(&mut state, pair)? } {
                self.wake(pair.0);
                self.wake(pair.1);
            }
        }
        loop {
            Fabric::check(&state, rank, "ncclGroupEnd")?;
            if mine.iter().all(|id| state.completed.contains(id)) {
                for id in &mine {
                    state.completed.remove(id);
                }
                return Ok(());
            }
            state = self.wait(state, rank);
        }
    }

    /// Copies every matched send of `pair` into its receive, oldest first;
    /// whether it copied any.
    ///
    /// # Safety
    ///
    /// Every posted address holds its bytes (see [`Fabric::group`]).
    #[allow(unsafe_code)]
    unsafe fn match_pair(&self, state: &mut State, pair: (usize, usize)) -> Result<bool> {
        let mut matched = false;
        loop {
            let ready = state.sends.get(&pair).is_some_and(|q| !q.is_empty())
                && state.recvs.get(&pair).is_some_and(|q| !q.is_empty());
            if !ready {
                return Ok(matched);
            }
            let send = state.sends.get_mut(&pair).and_then(VecDeque::pop_front);
            let recv = state.recvs.get_mut(&pair).and_then(VecDeque::pop_front);
            let (Some(send), Some(recv)) = (send, recv) else {
                return Ok(matched);
            };
            if send.bytes != recv.bytes {
                let what = format!(
                    "rank {} sends {} bytes to rank {}, which receives {}",
                    pair.0, send.bytes, pair.1, recv.bytes
                );
                return Err(self.break_rules(state, what));
            }
            // SAFETY: the caller's contract; sender and receiver are
            // distinct posts (a self-transfer copies between two regions
            // NcclComm lays out apart).
            unsafe { copy(send.ptr, recv.ptr, send.bytes) };
            state.completed.insert(send.id);
            state.completed.insert(recv.id);
            matched = true;
        }
    }

    /// `ncclCommSplit` by `rank`, non-blocking: registers its color and
    /// key and returns the split's number, at once; the new communicators
    /// exist once every rank split ([`Fabric::split_result`]), and until
    /// then this one is in progress for `rank`. A rank of no color takes
    /// no part in the result.
    pub(super) fn split(&self, rank: usize, color: Option<i32>, key: i32) -> Result<u64> {
        let world = self.world;
        let mut state = lock(&self.state);
        Fabric::check(&state, rank, "ncclCommSplit")?;
        let seq = take_next(&mut state.next_split, rank);
        let slot = state.splits.entry(seq).or_default();
        slot.entries.insert(rank, (color, key));
        if color.is_none() {
            slot.taken += 1;
        }
        if slot.entries.len() == world {
            let mut sizes: HashMap<i32, usize> = HashMap::new();
            for (c, _) in slot.entries.values() {
                if let Some(c) = c {
                    *sizes.entry(*c).or_default() += 1;
                }
            }
            slot.made = sizes
                .into_iter()
                .map(|(c, n)| {
                    let made = Fabric::new(n);
                    lock(&made.state).joined = (0..n).collect();
                    (c, made)
                })
                .collect();
            if slot.taken == world {
                state.splits.remove(&seq);
            }
        }
        Ok(seq)
    }

    /// The new communicator of `rank`'s color from split `seq` and its rank
    /// there (ranks ordered by key, then rank), once every rank split.
    pub(super) fn split_result(&self, seq: u64, rank: usize) -> Option<(Arc<Fabric>, usize)> {
        let world = self.world;
        let mut state = lock(&self.state);
        let slot = state.splits.get_mut(&seq)?;
        if slot.entries.len() < world {
            return None;
        }
        let (Some(color), _) = *slot.entries.get(&rank)? else {
            return None;
        };
        let fabric = slot.made.get(&color).cloned()?;
        let mut members: Vec<(i32, usize)> = slot
            .entries
            .iter()
            .filter(|(_, (c, _))| *c == Some(color))
            .map(|(&r, &(_, k))| (k, r))
            .collect();
        members.sort_unstable();
        let new_rank = members.iter().position(|&(_, r)| r == rank)?;
        slot.taken += 1;
        if slot.taken == world {
            state.splits.remove(&seq);
        }
        Some((fabric, new_rank))
    }
}

/// `rank`'s next number in `counters` (0 first), counted.
fn take_next(counters: &mut HashMap<usize, u64>, rank: usize) -> u64 {
    let next = counters.entry(rank).or_insert(0);
    *next += 1;
    *next - 1
}

/// The result of `call` from every rank's input (in rank order): the
/// whole of what the ranks receive (a reduce-scatter's every block).
fn result_of(call: Collective, inputs: Vec<Vec<u8>>, world: usize) -> Result<Vec<u8>> {
    match call {
        Collective::AllGather { .. } => Ok(inputs.concat()),
        Collective::Broadcast { root, .. } => Ok(inputs.into_iter().nth(root).unwrap_or_default()),
        Collective::AllReduce { count, native } => reduce(native, &inputs, 0..count, world),
        Collective::ReduceScatter { recv_count, native } => {
            reduce(native, &inputs, 0..world * recv_count, world)
        }
    }
}

/// Every rank's elements `range` reduced by `native`, in rank order,
/// with gradwire's own kernels (NCCL's order and half-precision rounding
/// differ within the bound the conformance suite allows for NCCL).
fn reduce(
    native: Native,
    inputs: &[Vec<u8>],
    range: std::ops::Range<usize>,
    world: usize,
) -> Result<Vec<u8>> {
    fn typed<E: crate::Element>(
        inputs: &[Vec<u8>],
        range: std::ops::Range<usize>,
        op: ReduceOp,
        world: usize,
    ) -> Result<Vec<u8>> {
        let size = std::mem::size_of::<E>();
        let parts: Vec<Vec<E>> = inputs
            .iter()
            .map(|bytes| {
                let mut part = vec![E::zeroed(); range.len()];
                if let Some(bytes) = bytes.get(range.start * size..range.end * size) {
                    bytemuck::cast_slice_mut(&mut part).copy_from_slice(bytes);
                }
                part
            })
            .collect();
        let sources: Vec<&[E]> = parts.iter().map(Vec::as_slice).collect();
        let mut out = vec![E::zeroed(); range.len()];
        crate::rank_order::in_rank_order(&sources, op, world, &mut out)?;
        Ok(bytemuck::cast_slice(&out).to_vec())
    }
    let op = native.op;
    match native.elem {
        ElemType::F16 => typed::<half::f16>(inputs, range, op, world),
        ElemType::BF16 => typed::<half::bf16>(inputs, range, op, world),
        ElemType::F32 => typed::<f32>(inputs, range, op, world),
        ElemType::F64 => typed::<f64>(inputs, range, op, world),
        ElemType::U8 => typed::<u8>(inputs, range, op, world),
        ElemType::U32 => typed::<u32>(inputs, range, op, world),
        ElemType::U64 => typed::<u64>(inputs, range, op, world),
        ElemType::I32 => typed::<i32>(inputs, range, op, world),
        ElemType::I64 => typed::<i64>(inputs, range, op, world),
    }
}

#[cfg(test)]
mod tests;
