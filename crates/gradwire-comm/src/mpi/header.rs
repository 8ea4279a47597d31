//! The header exchange that precedes every MPI collective.
//!
//! MPI does not check that ranks agree: an all-reduce called with different
//! lengths on two ranks is undefined behaviour (a hang, a truncation, or
//! memory corruption). So before any data moves, every rank describes its
//! call in eight integers and the descriptions are all-gathered (one tiny
//! `MPI_Allgather`). Every rank then runs the same validation over the same
//! W descriptions and so reaches the same verdict: go on, or return the same
//! error, [`CommError::Mismatch`] or [`CommError::InvalidArgument`], on every
//! rank, with the communicator still usable. The gathered descriptions also
//! carry what some collectives need anyway: the counts of the
//! variable-length all-gather, and the colors and keys of a split.

use crate::communicator::chunk_range;
use crate::element::ElemType;
use crate::error::{CommError, Result};
use crate::op::ReduceOp;

/// Which collective a rank called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    AllReduce,
    Broadcast,
    AllGather,
    AllGatherVaried,
    ReduceScatter,
    Barrier,
    Split,
    SplitShared,
}

const KINDS: [Kind; 8] = [
    Kind::AllReduce,
    Kind::Broadcast,
    Kind::AllGather,
    Kind::AllGatherVaried,
    Kind::ReduceScatter,
    Kind::Barrier,
    Kind::Split,
    Kind::SplitShared,
];

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::Broadcast => "broadcast",
            Kind::AllGather => "all_gather",
            Kind::AllGatherVaried => "all_gather_varied",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Barrier => "barrier",
            Kind::Split => "split",
            Kind::SplitShared => "split_shared",
        }
    }

    /// Whether every rank must pass the same length.
    fn same_len(self) -> bool {
        matches!(
            self,
            Kind::AllReduce | Kind::Broadcast | Kind::AllGather | Kind::ReduceScatter
        )
    }
}

/// One rank's description of its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Call {
    pub(super) kind: Kind,
    pub(super) elem: Option<ElemType>,
    pub(super) op: Option<ReduceOp>,
    pub(super) len: usize,
    pub(super) recv_len: usize,
    pub(super) root: usize,
    pub(super) color: Option<u32>,
    pub(super) key: i64,
}

/// Integers per encoded call.
pub(super) const WORDS: usize = 8;

impl Call {
    pub(super) fn new(kind: Kind) -> Call {
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

    /// The call as integers: enums as 1 + their index (0 = none).
    pub(super) fn encode(&self) -> [i64; WORDS] {
        let index = |i: Option<usize>| i.map_or(0, |i| i as i64 + 1);
        [
            index(KINDS.iter().position(|&k| k == self.kind)),
            index(
                self.elem
                    .and_then(|e| ElemType::ALL.iter().position(|&x| x == e)),
            ),
            index(
                self.op
                    .and_then(|o| ReduceOp::ALL.iter().position(|&x| x == o)),
            ),
            // Lengths beyond i64 cannot exist in memory; saturate anyway.
            i64::try_from(self.len).unwrap_or(i64::MAX),
            i64::try_from(self.recv_len).unwrap_or(i64::MAX),
            i64::try_from(self.root).unwrap_or(i64::MAX),
            self.color.map_or(-1, i64::from),
            self.key,
        ]
    }

    /// Decodes what [`Call::encode`] wrote; `None` for words no rank of this
    /// crate writes (a peer that is not running gradwire's protocol).
    pub(super) fn decode(words: &[i64]) -> Option<Call> {
        let pick = |w: i64, n: usize| -> Option<Option<usize>> {
            match w {
                0 => Some(None),
                w => usize::try_from(w - 1).ok().filter(|&i| i < n).map(Some),
            }
        };
        let [kind, elem, op, len, recv_len, root, color, key] = *words else {
            return None;
        };
        Some(Call {
            kind: KINDS[pick(kind, KINDS.len())??],
            elem: pick(elem, ElemType::ALL.len())?.map(|i| ElemType::ALL[i]),
            op: pick(op, ReduceOp::ALL.len())?.map(|i| ReduceOp::ALL[i]),
            len: usize::try_from(len).ok()?,
            recv_len: usize::try_from(recv_len).ok()?,
            root: usize::try_from(root).ok()?,
            color: match color {
                -1 => None,
                c => Some(u32::try_from(c).ok()?),
            },
            key,
        })
    }
}

/// Decodes the all-gathered words of every rank.
pub(super) fn decode_all(words: &[i64]) -> Result<Vec<Call>> {
    words
        .chunks(WORDS)
        .enumerate()
        .map(|(r, w)| {
            Call::decode(w).ok_or_else(|| CommError::Mismatch {
                detail: format!("rank {r} sent a call description this version cannot read"),
            })
        })
        .collect()
}

/// Checks that every rank called the same collective with compatible
/// arguments; the first difference found is reported, naming the ranks.
/// The same rules and messages as the in-process backend's rendezvous.
pub(super) fn validate(calls: &[Call]) -> Result<()> {
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
    fn calls_round_trip_through_their_encoding() {
        for kind in KINDS {
            for elem in [None, Some(ElemType::BF16), Some(ElemType::I64)] {
                for op in [None, Some(ReduceOp::Avg), Some(ReduceOp::Min)] {
                    let call = Call {
                        kind,
                        elem,
                        op,
                        len: 1031,
                        recv_len: 7,
                        root: 3,
                        color: Some(u32::MAX),
                        key: i64::MIN,
                    };
                    assert_eq!(Call::decode(&call.encode()), Some(call));
                }
            }
        }
        assert_eq!(Call::decode(&[99, 0, 0, 0, 0, 0, -1, 0]), None);
        assert_eq!(Call::decode(&[1, 0, 0, -5, 0, 0, -1, 0]), None);
    }

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
}
