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

pub(super) use crate::call::{Call, Kind};
use crate::element::ElemType;
use crate::error::{CommError, Result};
use crate::op::ReduceOp;

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

/// Integers per encoded call.
pub(super) const WORDS: usize = 8;

impl Call {
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
}
