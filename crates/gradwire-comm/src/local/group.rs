//! The shared state of one group of in-process ranks, and its rendezvous.
//!
//! Every collective is a *round*. Each rank posts a description of its call
//! (kind, element type, length, op, root, and pointers to its buffers); the
//! last rank to arrive validates all W posts and *resolves* the round: either
//! every rank goes on to the data phase, or every rank gets the same error.
//! Because the resolution is decided once, under one lock, no two ranks can
//! disagree on the outcome of a collective.
//!
//! A round that moves data ends with a completion barrier: a rank returns
//! (and its buffer borrow ends) only once every rank has finished reading and
//! writing the shared buffers. That barrier has no deadline on purpose: the
//! data phase runs only this crate's code over buffers that are all present,
//! so it is bounded, and returning early would free memory a peer may still
//! be writing into.
//!
//! Waiting spins briefly when there are at most as many ranks as cores (the
//! common case on a GPU node: a wake-up through the kernel costs more than the
//! whole of a small all-reduce), yields, then sleeps on a condition variable
//! until the round resolves, a peer leaves, or the deadline passes.

use super::mailbox::Mailboxes;
use crate::call::Call;
pub(crate) use crate::call::Kind;
use crate::element::ElemType;
use crate::error::{CommError, Result};
use crate::op::ReduceOp;
use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A buffer address shared with the other ranks of a round.
///
/// It is only dereferenced during the data phase of a resolved round, while
/// the owning rank is blocked inside the same collective (it cannot return
/// before the completion barrier), and only with the element type and length
/// that the round validated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBuf(pub(crate) *mut u8);

// SAFETY: a RawBuf is an address, not access; see the type's documentation for
// when it is dereferenced.
unsafe impl Send for RawBuf {}
// SAFETY: as above.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    pub(crate) const NULL: RawBuf = RawBuf(std::ptr::null_mut());
}

/// For each rank of a split group, its new group and rank in it (`None`
/// for a rank that passed no color).
pub(crate) type SplitGroups = Arc<[Option<(Arc<Group>, usize)>]>;

/// One rank's description of its call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Post {
    pub(crate) kind: Kind,
    pub(crate) elem: Option<ElemType>,
    pub(crate) op: Option<ReduceOp>,
    pub(crate) len: usize,
    pub(crate) recv_len: usize,
    pub(crate) root: usize,
    pub(crate) color: Option<u32>,
    pub(crate) key: i64,
    pub(crate) send: RawBuf,
    pub(crate) recv: RawBuf,
}

impl Post {
    /// What is checked against the other ranks' calls.
    pub(crate) fn call(&self) -> Call {
        Call {
            kind: self.kind,
            elem: self.elem,
            op: self.op,
            len: self.len,
            recv_len: self.recv_len,
            root: self.root,
            color: self.color,
            key: self.key,
        }
    }

    pub(crate) fn new(kind: Kind) -> Post {
        Post {
            kind,
            elem: None,
            op: None,
            len: 0,
            recv_len: 0,
            root: 0,
            color: None,
            key: 0,
            send: RawBuf::NULL,
            recv: RawBuf::NULL,
        }
    }
}

/// What a resolved round means for the ranks that took part.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// Not resolved (only ever seen in an unused slot).
    Open,
    /// Go on; the posts of every rank, in rank order.
    Go(Arc<[Post]>),
    /// The split is done: for each old rank, its new group and rank.
    Split(SplitGroups),
    /// Every rank returns this error.
    Failed(CommError),
}

struct State {
    /// The open round (every earlier round is resolved).
    round: u64,
    arrived: usize,
    posts: Vec<Option<Post>>,
    /// The outcome of round r is kept at `r % 2`: round r + 2 cannot resolve
    /// before every rank has arrived at it, and so has read round r's.
    outcomes: [Outcome; 2],
    /// Set by a timeout, a lost peer or a lost asynchronous lane: every
    /// later call fails with it.
    poison: Option<CommError>,
    sleepers: usize,
    /// The resolving rank's lists, kept between rounds so that resolving a
    /// round allocates nothing.
    scratch_posts: Vec<Post>,
    scratch_calls: Vec<Call>,
}

/// One group of ranks: the world, a sub-group from `split`, or the duplicate
/// that runs a group's asynchronous jobs.
pub(crate) struct Group {
    pub(crate) size: usize,
    pub(crate) timeout: Option<Duration>,
    /// Where its members write their flight records.
    pub(crate) flight_dir: Option<PathBuf>,
    /// Spin before sleeping (there are at least as many cores as ranks).
    spin: bool,
    state: Mutex<State>,
    cv: Condvar,
    /// Mirrors `state.round` for lock-free spinning.
    resolved: CachePadded<AtomicU64>,
    /// Units of work (pieces, or ranks' own copies) claimed in the data
    /// phase of the round of that parity.
    claimed: [CachePadded<AtomicUsize>; 2],
    /// Units of work finished in the data phase of the round of that parity.
    finished: [CachePadded<AtomicUsize>; 2],
    /// 1 + the rank that failed (panicked) in the data phase of the round of
    /// that parity; 0 if none did.
    data_failed: [AtomicUsize; 2],
    /// Ranks whose communicator was dropped.
    gone: Box<[AtomicBool]>,
    poisoned: AtomicBool,
    pub(crate) mail: Mailboxes,
    /// The duplicate group on which asynchronous jobs run (none for a duplicate).
    pub(crate) shadow: Option<Arc<Group>>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("size", &self.size)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// How long a waiter spins before yielding, when spinning is worth it.
const SPIN_FOR: Duration = Duration::from_micros(50);
/// How many times a waiter yields before it sleeps.
const YIELDS: usize = 16;

impl Group {
    /// A group of `size` ranks with its duplicate for asynchronous jobs.
    pub(crate) fn new(
        size: usize,
        timeout: Option<Duration>,
        flight_dir: Option<PathBuf>,
    ) -> Arc<Group> {
        let shadow = Group::single(size, timeout, flight_dir.clone(), None);
        Group::single(size, timeout, flight_dir, Some(shadow))
    }

    fn single(
        size: usize,
        timeout: Option<Duration>,
        flight_dir: Option<PathBuf>,
        shadow: Option<Arc<Group>>,
    ) -> Arc<Group> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Arc::new(Group {
            size,
            timeout,
            flight_dir,
            spin: size <= cores,
            state: Mutex::new(State {
                round: 0,
                arrived: 0,
                posts: vec![None; size],
                scratch_posts: Vec::with_capacity(size),
                scratch_calls: Vec::with_capacity(size),
                outcomes: [Outcome::Open, Outcome::Open],
                poison: None,
                sleepers: 0,
            }),
            cv: Condvar::new(),
            resolved: CachePadded::new(AtomicU64::new(0)),
            claimed: [
                CachePadded::new(AtomicUsize::new(0)),
                CachePadded::new(AtomicUsize::new(0)),
            ],
            finished: [
                CachePadded::new(AtomicUsize::new(0)),
                CachePadded::new(AtomicUsize::new(0)),
            ],
            data_failed: [AtomicUsize::new(0), AtomicUsize::new(0)],
            gone: (0..size).map(|_| AtomicBool::new(false)).collect(),
            poisoned: AtomicBool::new(false),
            mail: Mailboxes::new(size),
            shadow,
        })
    }

    fn deadline(&self) -> Option<Instant> {
        self.timeout.and_then(|t| Instant::now().checked_add(t))
    }

    /// Spins (when worth it), then yields, until `cond` holds; false if it
    /// still does not.
    pub(crate) fn spin_until(&self, cond: impl Fn() -> bool) -> bool {
        if cond() {
            return true;
        }
        if self.spin {
            let start = Instant::now();
            loop {
                for _ in 0..64 {
                    if cond() {
                        return true;
                    }
                    std::hint::spin_loop();
                }
                if start.elapsed() > SPIN_FOR {
                    break;
                }
            }
        }
        for _ in 0..YIELDS {
            std::thread::yield_now();
            if cond() {
                return true;
            }
        }
        false
    }

    /// Whether rank `r` has left the group.
    pub(crate) fn is_gone(&self, r: usize) -> bool {
        self.gone.get(r).is_some_and(|g| g.load(Ordering::Acquire))
    }

    /// The error every call returns once the group is poisoned.
    pub(crate) fn poison_error(&self) -> Option<CommError> {
        if !self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        self.state.lock().poison.clone()
    }

    /// Poisons the group (a timeout, a lost peer): the open round, if any
    /// rank waits in it, fails with `err`, and so does every later call.
    pub(crate) fn poison(&self, err: CommError) {
        let mut st = self.state.lock();
        if st.poison.is_some() {
            return;
        }
        if st.arrived > 0 {
            self.fail_round(&mut st, err);
        } else {
            st.poison = Some(err);
            self.poisoned.store(true, Ordering::Release);
            self.cv.notify_all();
        }
        drop(st);
        self.mail.wake_all();
    }

    /// Marks `rank` as gone (its communicator was dropped) and wakes every
    /// waiter so that it can tell.
    pub(crate) fn depart(&self, rank: usize) {
        if let Some(g) = self.gone.get(rank) {
            g.store(true, Ordering::Release);
        }
        let st = self.state.lock();
        self.cv.notify_all();
        drop(st);
        self.mail.wake_all();
    }

    /// Posts rank `rank`'s call for its round `seq` and waits until the round
    /// is resolved. Returns the outcome, or the round's error.
    pub(crate) fn rendezvous(&self, rank: usize, seq: u64, post: Post) -> Result<Outcome> {
        let deadline = self.deadline();
        let mut st = self.state.lock();
        if let Some(err) = &st.poison {
            return Err(err.clone());
        }
        if st.round != seq || st.posts[rank].is_some() {
            // Unreachable while each rank's sequence numbers are its own and the
            // group is not poisoned; reported rather than trusted.
            return Err(CommError::Mismatch {
                detail: format!(
                    "rank {rank} is at collective #{seq} but the group is at #{}",
                    st.round
                ),
            });
        }
        st.posts[rank] = Some(post);
        st.arrived += 1;
        if st.arrived == self.size {
            self.resolve(&mut st);
            return outcome_of(&st, seq);
        }
        drop(st);

        self.spin_until(|| self.resolved.load(Ordering::Acquire) > seq);
        let mut st = self.state.lock();
        loop {
            if st.round > seq {
                return outcome_of(&st, seq);
            }
            let lost: Vec<usize> = (0..self.size)
                .filter(|&r| st.posts[r].is_none() && self.is_gone(r))
                .collect();
            if !lost.is_empty() {
                self.fail_round(
                    &mut st,
                    CommError::PeerLost {
                        op: post.kind.name(),
                        ranks: lost,
                    },
                );
                continue;
            }
            if let (Some(deadline), Some(timeout)) = (deadline, self.timeout)
                && Instant::now() >= deadline
            {
                let missing = (0..self.size).filter(|&r| st.posts[r].is_none()).collect();
                let err = CommError::Timeout {
                    op: post.kind.name(),
                    waited: timeout,
                    missing,
                };
                self.fail_round(&mut st, err);
                continue;
            }
            st.sleepers += 1;
            match deadline {
                Some(d) => {
                    self.cv.wait_until(&mut st, d);
                }
                None => self.cv.wait(&mut st),
            }
            st.sleepers -= 1;
        }
    }

    /// Ends the open round with `err` for every rank and poisons the group.
    fn fail_round(&self, st: &mut MutexGuard<'_, State>, err: CommError) {
        let slot = (st.round % 2) as usize;
        st.outcomes[slot] = Outcome::Failed(err.clone());
        st.poison = Some(err);
        self.poisoned.store(true, Ordering::Release);
        self.advance(st);
    }

    /// Closes the open round (its outcome already stored) and wakes everyone.
    fn advance(&self, st: &mut MutexGuard<'_, State>) {
        st.round += 1;
        st.arrived = 0;
        st.posts.iter_mut().for_each(|p| *p = None);
        self.resolved.store(st.round, Ordering::Release);
        if st.sleepers > 0 {
            self.cv.notify_all();
        }
    }

    /// Validates the posts of a full round and stores its outcome.
    fn resolve(&self, st: &mut MutexGuard<'_, State>) {
        let slot = (st.round % 2) as usize;
        // The posts of round r - 2, whose outcome this slot held: every rank
        // has finished that round (all arrived at this one), so its list is
        // reused when no rank still holds it.
        let previous = std::mem::replace(&mut st.outcomes[slot], Outcome::Open);
        let mut posts = std::mem::take(&mut st.scratch_posts);
        posts.clear();
        posts.extend(st.posts.iter().flatten().copied());
        let mut calls = std::mem::take(&mut st.scratch_calls);
        calls.clear();
        calls.extend(posts.iter().map(Post::call));
        let outcome = match crate::call::validate(&calls) {
            Err(err) => {
                // A lost lane's fault ends the group, as on every backend.
                if err.is_lane_lost() {
                    st.poison = Some(err.clone());
                    self.poisoned.store(true, Ordering::Release);
                }
                Outcome::Failed(err)
            }
            Ok(()) => match posts[0].kind {
                Kind::Split => Outcome::Split(self.split_groups(&posts)),
                kind => {
                    if kind.moves_data() {
                        self.claimed[slot].store(0, Ordering::Relaxed);
                        self.finished[slot].store(0, Ordering::Relaxed);
                        self.data_failed[slot].store(0, Ordering::Relaxed);
                    }
                    let reused = match previous {
                        Outcome::Go(mut shared) => match Arc::get_mut(&mut shared) {
                            Some(list) if list.len() == posts.len() => {
                                list.copy_from_slice(&posts);
                                Some(shared)
                            }
                            _ => None,
                        },
                        _ => None,
                    };
                    Outcome::Go(reused.unwrap_or_else(|| Arc::from(posts.as_slice())))
                }
            },
        };
        st.scratch_posts = posts;
        st.scratch_calls = calls;
        st.outcomes[slot] = outcome;
        self.advance(st);
    }

    /// Forms the sub-groups of a split: one per color, ranks ordered by
    /// (key, old rank), each with this group's deadline.
    fn split_groups(&self, posts: &[Post]) -> SplitGroups {
        let mut by_color: BTreeMap<u32, Vec<(i64, usize)>> = BTreeMap::new();
        for (rank, p) in posts.iter().enumerate() {
            if let Some(color) = p.color {
                by_color.entry(color).or_default().push((p.key, rank));
            }
        }
        let mut result = vec![None; posts.len()];
        for (_, mut members) in by_color {
            members.sort_unstable();
            let group = Group::new(members.len(), self.timeout, self.flight_dir.clone());
            for (new_rank, &(_, old_rank)) in members.iter().enumerate() {
                result[old_rank] = Some((Arc::clone(&group), new_rank));
            }
        }
        result.into()
    }

    /// The data phase of round `seq`, whose work is `target` units.
    pub(crate) fn progress(
        &self,
        rank: usize,
        seq: u64,
        target: usize,
        op: &'static str,
    ) -> Progress<'_> {
        let slot = (seq % 2) as usize;
        Progress {
            group: self,
            slot,
            target,
            op,
            rank,
            held: Cell::new(0),
            completed: false,
        }
    }
}

/// One rank's part in the data phase of a round.
///
/// The work is cut into `target` units. For a reduction the units are pieces
/// of the buffer that any rank may claim, so the ranks that are running do
/// all of it while descheduled ones sleep (W ranks on fewer cores would
/// otherwise wait on the scheduler to rotate them); for the copies each rank
/// finishes one unit, its own. Every rank then waits until all units are
/// finished: only then may it return and let its buffers go.
pub(crate) struct Progress<'a> {
    group: &'a Group,
    slot: usize,
    target: usize,
    op: &'static str,
    rank: usize,
    /// Units this rank claimed and has not finished.
    held: Cell<usize>,
    completed: bool,
}

impl Progress<'_> {
    /// Claims the next unclaimed piece, if any.
    pub(crate) fn claim(&self) -> Option<usize> {
        let id = self.group.claimed[self.slot].fetch_add(1, Ordering::Relaxed);
        (id < self.target).then(|| {
            self.held.set(self.held.get() + 1);
            id
        })
    }

    /// Takes on one unit of work without claiming (a rank's own copy).
    pub(crate) fn hold(&self) {
        self.held.set(self.held.get() + 1);
    }

    /// Marks one held unit finished; its writes are visible to whoever sees
    /// the count.
    pub(crate) fn finish(&self) {
        self.held.set(self.held.get().saturating_sub(1));
        let finished = self.group.finished[self.slot].fetch_add(1, Ordering::Release) + 1;
        if finished == self.target {
            let st = self.group.state.lock();
            if st.sleepers > 0 {
                self.group.cv.notify_all();
            }
        }
    }

    /// Waits until every unit of the round is finished; fails if a rank
    /// unwound out of the data phase (the buffers may be partly reduced).
    pub(crate) fn complete(mut self) -> Result<()> {
        self.wait_all();
        self.completed = true;
        match self.group.data_failed[self.slot].load(Ordering::Acquire) {
            0 => Ok(()),
            failed => Err(CommError::PeerLost {
                op: self.op,
                ranks: vec![failed - 1],
            }),
        }
    }

    fn wait_all(&self) {
        let group = self.group;
        let finished = &group.finished[self.slot];
        let all = || finished.load(Ordering::Acquire) >= self.target;
        if !group.spin_until(all) {
            let mut st = group.state.lock();
            while !all() {
                st.sleepers += 1;
                group.cv.wait(&mut st);
                st.sleepers -= 1;
            }
        }
    }
}

impl Drop for Progress<'_> {
    /// A rank unwinding out of its data phase (only a bug in this crate can
    /// make it): the round fails for everyone, the units it held count as
    /// finished so nobody waits for them, and it still waits for the others
    /// to stop touching its buffers before it lets them go.
    fn drop(&mut self) {
        if self.completed {
            return;
        }
        self.group.data_failed[self.slot].store(self.rank + 1, Ordering::Release);
        for _ in 0..self.held.get() {
            self.finish();
        }
        self.wait_all();
    }
}

fn outcome_of(st: &State, seq: u64) -> Result<Outcome> {
    match &st.outcomes[(seq % 2) as usize] {
        Outcome::Failed(err) => Err(err.clone()),
        other => Ok(other.clone()),
    }
}
