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
//! variable-length all-gather, and the colors and keys of a split, and one
//! word more than the call: how long the rank was away from the
//! communicator before it (since its previous call ended), from which every
//! rank reads how long it waits for the last one to arrive
//! ([`wait_for_last`]).

pub(crate) use crate::call::{Call, Kind};
use crate::element::ElemType;
use crate::error::{CommError, Result};
use crate::op::ReduceOp;
use std::time::Duration;

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

/// Integers of an encoded call.
pub(crate) const CALL_WORDS: usize = 8;

/// Integers per rank in the header exchange: its call, then its time
/// away from the communicator before it ([`encode`]).
pub(crate) const WORDS: usize = CALL_WORDS + 1;

/// A rank's header: `call`, then `away`, the nanoseconds since the rank's
/// previous call on the communicator ended (-1 where it does not keep
/// count, or before its first call).
pub(crate) fn encode(call: &Call, away: Option<Duration>) -> [i64; WORDS] {
    let mut words = [0; WORDS];
    words[..CALL_WORDS].copy_from_slice(&call.encode());
    words[CALL_WORDS] = away.map_or(-1, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    words
}

/// How long a rank that was away `own` before this call waits in it for
/// the last rank to arrive, read off every rank's headers (`words`): the
/// longest time away minus its own. The ranks left their previous call on
/// this communicator together (it ended for all of them when the last
/// rank's data or header arrived), so the rank away longest arrives last.
/// Ranks that keep no count are left out.
pub(crate) fn wait_for_last(words: &[i64], own: Duration) -> Duration {
    let longest = words
        .chunks(WORDS)
        .filter_map(|w| u64::try_from(*w.get(CALL_WORDS)?).ok())
        .max()
        .unwrap_or(0);
    Duration::from_nanos(longest).saturating_sub(own)
}

impl Call {
    /// The call as integers: enums as 1 + their index (0 = none).
    pub(crate) fn encode(&self) -> [i64; CALL_WORDS] {
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
            Call::decode(&w[..CALL_WORDS.min(w.len())]).ok_or_else(|| CommError::Mismatch {
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

    /// A header is the call and the time away; every rank reads its wait
    /// for the last arrival off the gathered headers, leaving out a rank
    /// that keeps no count.
    #[test]
    fn headers_carry_the_time_away_and_give_the_wait_for_the_last_rank() {
        let call = Call::new(Kind::Barrier);
        let ms = Duration::from_millis;
        let mut words = Vec::new();
        for away in [Some(ms(3)), None, Some(ms(10)), Some(ms(4))] {
            let header = encode(&call, away);
            assert_eq!(header[..CALL_WORDS], call.encode());
            words.extend(header);
        }
        assert_eq!(decode_all(&words).unwrap(), vec![call; 4]);
        assert_eq!(wait_for_last(&words, ms(3)), ms(7));
        assert_eq!(wait_for_last(&words, ms(10)), Duration::ZERO);
        // Longer away than every rank that counts (a clock read late).
        assert_eq!(wait_for_last(&words, ms(12)), Duration::ZERO);
        assert_eq!(wait_for_last(&encode(&call, None), ms(1)), Duration::ZERO);
    }
}
