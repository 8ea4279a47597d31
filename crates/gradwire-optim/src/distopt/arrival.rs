//! Who arrived last at a step's exchange ([`StepStats::straggler`]): the
//! step's first vote (the per-step vote, or the first bucket's) carries,
//! after the written-anywhere flags, [`ARRIVAL_BYTES`] per rank, rank `r`'s
//! slot holding 1 + the microseconds from the end of its previous step to
//! its arrival at this one's exchange (its `finish`, or its first bucket's
//! launch during backward) and every other slot zeros, so that the vote's
//! maximum hands every rank every rank's time. The ranks left the previous step's last collective
//! together, so the rank that took longest arrived last, and the first
//! arrival waited for it the longest time minus the shortest: the same on
//! every rank, no clock shared, no collective added. Time the caller spends
//! between steps (collectives of its own, an evaluation) counts as the
//! rank's.
//!
//! [`StepStats::straggler`]: super::StepStats::straggler

use super::StepStraggler;
pub(super) use gradwire_algos::cost::ARRIVAL_BYTES;
use std::time::Duration;

/// Appends this rank's arrival (`busy`: from the end of its previous step
/// to its arrival at this one's exchange) and the other ranks' empty slots
/// to `votes`.
pub(super) fn append(votes: &mut Vec<u8>, rank: usize, world: usize, busy: Duration) {
    let start = votes.len();
    votes.resize(start + ARRIVAL_BYTES * world, 0);
    let busy = u64::try_from(busy.as_micros()).unwrap_or(u64::MAX - 1) + 1;
    let slot = start + ARRIVAL_BYTES * rank;
    if let Some(mine) = votes.get_mut(slot..slot + ARRIVAL_BYTES) {
        mine.copy_from_slice(&busy.to_le_bytes());
    }
}

/// The straggler the reduced slots (`tail`, of `world` ranks) name: `None`
/// for one rank, a slot left empty, or ranks that all took the same time.
/// A tie for last goes to the lower rank.
pub(super) fn read(tail: &[u8], world: usize) -> Option<StepStraggler> {
    if world < 2 || tail.len() != ARRIVAL_BYTES * world {
        return None;
    }
    let times = tail
        .chunks_exact(ARRIVAL_BYTES)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; ARRIVAL_BYTES])));
    let (mut last, mut longest, mut shortest) = (0, 0u64, u64::MAX);
    for (rank, t) in times.enumerate() {
        if t == 0 {
            return None;
        }
        if t > longest {
            (last, longest) = (rank, t);
        }
        shortest = shortest.min(t);
    }
    (longest > shortest).then(|| StepStraggler {
        rank: last,
        late: Duration::from_micros(longest - shortest),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three ranks' votes as the maximum reduces them.
    fn reduced(busy_us: [u64; 3]) -> Vec<u8> {
        let mut out = vec![1u8, 0];
        out.resize(2 + ARRIVAL_BYTES * 3, 0);
        for (rank, t) in busy_us.iter().enumerate() {
            let slot = 2 + ARRIVAL_BYTES * rank;
            out[slot..slot + ARRIVAL_BYTES].copy_from_slice(&t.to_le_bytes());
        }
        out
    }

    #[test]
    fn the_rank_that_took_longest_is_last_by_the_spread() {
        let votes = reduced([1_001, 4_001, 2_501]);
        assert_eq!(
            read(&votes[2..], 3),
            Some(StepStraggler {
                rank: 1,
                late: Duration::from_micros(3_000)
            })
        );
        // Equal times name nobody, nor does an empty slot or one rank.
        assert_eq!(read(&reduced([7, 7, 7])[2..], 3), None);
        assert_eq!(read(&reduced([7, 0, 9])[2..], 3), None);
        assert_eq!(read(&reduced([7, 8, 9])[2..2 + ARRIVAL_BYTES], 1), None);
    }

    #[test]
    fn a_rank_writes_only_its_own_slot() {
        let mut votes = vec![1u8, 1];
        append(&mut votes, 2, 3, Duration::from_micros(5));
        assert_eq!(votes.len(), 2 + 3 * ARRIVAL_BYTES);
        assert!(votes[2..2 + 2 * ARRIVAL_BYTES].iter().all(|&b| b == 0));
        let own = u64::from_le_bytes(votes[2 + 2 * ARRIVAL_BYTES..].try_into().unwrap());
        assert_eq!(own, 6);
    }
}
