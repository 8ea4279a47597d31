//! The header exchange that precedes every MPI and NCCL collective.
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

pub(crate) use crate::call::{Call, Kind};
use crate::element::ElemType;
use crate::error::{CommError, Result};
use crate::op::ReduceOp;

const KINDS: [Kind; 11] = [
    Kind::AllReduce,
    Kind::Broadcast,
    Kind::AllGather,
    Kind::AllGatherVaried,
    Kind::ReduceScatter,
    Kind::Barrier,
    Kind::Split,
    Kind::SplitShared,
    Kind::Fault,
    Kind::LibraryAllReduce,
    Kind::Departed,
];

/// Integers per encoded call.
pub(crate) const WORDS: usize = 8;

impl Call {
    /// The call as integers: enums as 1 + their index (0 = none).
    pub(crate) fn encode(&self) -> [i64; WORDS] {
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
    pub(crate) fn decode(words: &[i64]) -> Option<Call> {
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
pub(crate) fn decode_all(words: &[i64]) -> Result<Vec<Call>> {
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

/// The color and key of each rank of a split, as MPI and NCCL take them:
/// colors numbered densely in increasing order (their colors are
/// non-negative ints, gradwire's any u32), and each member's key its
/// position by (key, old rank) in its group (their keys are ints, gradwire's
/// i64). `None`: the rank is in no group.
pub(crate) fn split_plan(calls: &[Call]) -> Result<Vec<(Option<i32>, i32)>> {
    let int = |what: &str, v: usize| {
        i32::try_from(v)
            .map_err(|_| CommError::InvalidArgument(format!("split {what} {v} exceeds i32")))
    };
    let mut groups: std::collections::BTreeMap<u32, Vec<(i64, usize)>> = Default::default();
    for (rank, c) in calls.iter().enumerate() {
        if let Some(color) = c.color {
            groups.entry(color).or_default().push((c.key, rank));
        }
    }
    let mut plan = vec![(None, 0); calls.len()];
    for (dense, (_, mut members)) in groups.into_iter().enumerate() {
        members.sort_unstable();
        for (position, &(_, rank)) in members.iter().enumerate() {
            if let Some(slot) = plan.get_mut(rank) {
                *slot = (Some(int("color", dense)?), int("key", position)?);
            }
        }
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    #[test]
    fn split_plans_order_by_key_then_rank_with_dense_colors() {
        let call = |color, key| Call {
            color,
            key,
            ..Call::new(Kind::Split)
        };
        let plan = split_plan(&[
            call(Some(u32::MAX), 5),
            call(None, 0),
            call(Some(7), i64::MAX),
            call(Some(u32::MAX), i64::MIN),
            call(Some(7), i64::MAX),
        ])
        .unwrap();
        assert_eq!(
            plan,
            vec![
                (Some(1), 1),
                (None, 0),
                (Some(0), 0),
                (Some(1), 0),
                (Some(0), 1)
            ]
        );
    }

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
}
