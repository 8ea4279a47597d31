//! What a rank passes to a collective, and the rules that decide whether
//! every rank's call agrees. Both backends use them: LocalComm's rendezvous
//! validates the posted calls, MpiComm the all-gathered call headers, so the
//! same disagreement is the same `Mismatch` (or `InvalidArgument`), with the
//! same message, whichever backend runs it.

use crate::communicator::chunk_range;
use crate::element::ElemType;
use crate::error::{CommError, Result};
use crate::op::ReduceOp;

/// Which collective a rank called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
    Broadcast,
    AllGather,
    AllGatherVaried,
    ReduceScatter,
    Barrier,
    Split,
    /// MpiComm's node split (MPI_Comm_split_type); LocalComm has none.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    SplitShared,
    /// [`crate::Communicator::post_fault`]: the rank failed before this
    /// collective; its call's `key` is the caller's fault code.
    Fault,
    /// MpiComm's `library_all_reduce` (MPI's own algorithm) and NcclComm's
    /// `time_library_all_reduce` (NCCL's, unchecked after the agreement): a
    /// kind of its own, so that it never pairs with gradwire's all-reduce.
    #[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
    LibraryAllReduce,
    /// NcclComm's departure notice: the rank drops its communicator in
    /// place of its next collective, so the peers' collective fails with
    /// `PeerLost` at once instead of waiting out its deadline (MpiComm
    /// sends its notices as messages, LocalComm marks its group).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    Departed,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::Broadcast => "broadcast",
            Kind::AllGather => "all_gather",
            Kind::AllGatherVaried => "all_gather_varied",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Barrier => "barrier",
            Kind::Split => "split",
            Kind::SplitShared => "split_shared",
            Kind::Fault => "fault",
            Kind::LibraryAllReduce => "library_all_reduce",
            Kind::Departed => "departure",
        }
    }

    /// Whether every rank must pass the same length.
    pub(crate) fn same_len(self) -> bool {
        matches!(
            self,
            Kind::AllReduce
                | Kind::Broadcast
                | Kind::AllGather
                | Kind::ReduceScatter
                | Kind::LibraryAllReduce
        )
    }

    /// Whether the round has a data phase (and so a completion barrier).
    pub(crate) fn moves_data(self) -> bool {
        !matches!(
            self,
            Kind::Barrier | Kind::Split | Kind::SplitShared | Kind::Fault | Kind::Departed
        )
    }
}

/// One rank's description of its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) kind: Kind,
    pub(crate) elem: Option<ElemType>,
    pub(crate) op: Option<ReduceOp>,
    pub(crate) len: usize,
    pub(crate) recv_len: usize,
    pub(crate) root: usize,
    pub(crate) color: Option<u32>,
    pub(crate) key: i64,
}

impl Call {
    /// A call of `kind` with every other field empty (MpiComm builds its
    /// calls from it; LocalComm from its posts).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn new(kind: Kind) -> Call {
        Call {
            kind,
            elem: None,
            op: None,
            len: 0,
            recv_len: 0,
            root: 0,
            color: None,
            key: 0,
        }
    }
}

/// Checks that every rank called the same collective with compatible
/// arguments; the first difference found is reported, naming the ranks.
/// The same rules and messages as the in-process backend's rendezvous.
///
/// A rank that departed ([`Kind::Departed`]) decides the round first:
/// every rank gets [`CommError::PeerLost`] naming every departed rank.
/// Then a rank that posted a fault ([`Kind::Fault`]), whatever the others
/// called: every rank gets [`CommError::Fault`] naming the lowest such rank
/// and its kind, and no data moves.
pub(crate) fn validate(calls: &[Call]) -> Result<()> {
    let departed: Vec<usize> = (0..calls.len())
        .filter(|&r| calls[r].kind == Kind::Departed)
        .collect();
    if !departed.is_empty() {
        let op = calls
            .iter()
            .map(|c| c.kind)
            .find(|&k| k != Kind::Departed)
            .unwrap_or(Kind::Departed)
            .name();
        return Err(CommError::PeerLost {
            op,
            ranks: departed,
        });
    }
    if let Some((rank, call)) = calls
        .iter()
        .enumerate()
        .find(|(_, c)| c.kind == Kind::Fault)
    {
        let code = u32::try_from(call.key).unwrap_or(u32::MAX);
        return Err(CommError::Fault(crate::Fault::posted(
            rank,
            crate::FaultKind::from_code(code),
        )));
    }
    let world = calls.len();
    let Some(first) = calls.first() else {
        return Ok(());
    };
    let name = first.kind.name();
    for (r, c) in calls.iter().enumerate().skip(1) {
        let differs = |what: &str, a: String, b: String| CommError::Mismatch {
            detail: format!("rank 0 {what} {a}, rank {r} {what} {b}"),
        };
        if c.kind != first.kind {
            return Err(differs("called", name.into(), c.kind.name().into()));
        }
        if c.elem != first.elem {
            return Err(differs(
                &format!("passed to {name}"),
                fmt_opt(first.elem),
                fmt_opt(c.elem),
            ));
        }
        if c.op != first.op {
            return Err(differs(
                &format!("reduced {name} with"),
                fmt_opt(first.op),
                fmt_opt(c.op),
            ));
        }
        if first.kind.same_len() && c.len != first.len {
            return Err(differs(
                &format!("passed {name} a length of"),
                first.len.to_string(),
                c.len.to_string(),
            ));
        }
        if first.kind == Kind::Broadcast && c.root != first.root {
            return Err(differs(
                "broadcast from root",
                first.root.to_string(),
                c.root.to_string(),
            ));
        }
    }
    if let (Some(op), Some(elem)) = (first.op, first.elem)
        && !op.supports(elem)
    {
        return Err(CommError::InvalidArgument(format!(
            "{name}: {op} is not defined for {elem}"
        )));
    }
    match first.kind {
        Kind::Broadcast if first.root >= world => Err(CommError::InvalidArgument(format!(
            "broadcast root {} is out of range for a world of {world}",
            first.root
        ))),
        Kind::AllGather => check_recv_lens(calls, name, |c, _| c.len.checked_mul(world)),
        Kind::ReduceScatter => {
            check_recv_lens(calls, name, |c, r| Some(chunk_range(c.len, world, r).len()))
        }
        _ => Ok(()),
    }
}

fn check_recv_lens(
    calls: &[Call],
    name: &str,
    expected: impl Fn(&Call, usize) -> Option<usize>,
) -> Result<()> {
    for (r, c) in calls.iter().enumerate() {
        if expected(c, r) != Some(c.recv_len) {
            return Err(CommError::InvalidArgument(format!(
                "{name}: rank {r} passed a receive buffer of {} elements for {} sent by each of {} ranks",
                c.recv_len,
                c.len,
                calls.len()
            )));
        }
    }
    Ok(())
}

fn fmt_opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "nothing".into(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_rank_that_differs() {
        let call = |len| Call {
            elem: Some(ElemType::F32),
            op: Some(ReduceOp::Sum),
            len,
            ..Call::new(Kind::AllReduce)
        };
        assert_eq!(validate(&[call(4), call(4), call(4)]), Ok(()));
        match validate(&[call(4), call(4), call(5)]) {
            Err(CommError::Mismatch { detail }) => {
                assert!(
                    detail.contains("rank 2") && detail.contains('5'),
                    "{detail}"
                )
            }
            other => panic!("{other:?}"),
        }
        let avg_int = Call {
            elem: Some(ElemType::U32),
            op: Some(ReduceOp::Avg),
            ..call(1)
        };
        assert!(matches!(
            validate(&[avg_int, avg_int]),
            Err(CommError::InvalidArgument(_))
        ));
    }

    #[test]
    fn a_posted_fault_decides_the_round_whatever_the_others_called() {
        let fault = |code| Call {
            key: code,
            ..Call::new(Kind::Fault)
        };
        let reduce = Call {
            elem: Some(ElemType::F32),
            op: Some(ReduceOp::Sum),
            len: 4,
            ..Call::new(Kind::AllReduce)
        };
        assert_eq!(
            validate(&[reduce, fault(7), Call::new(Kind::Barrier), fault(3)]),
            Err(CommError::Fault(crate::Fault::posted(
                1,
                crate::FaultKind::Code(7)
            )))
        );
        assert_eq!(
            validate(&[fault(9)]),
            Err(CommError::Fault(crate::Fault::posted(
                0,
                crate::FaultKind::Code(9)
            )))
        );
    }
}
