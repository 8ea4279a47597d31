//! One step every rank takes alike (writing its checkpoint, resuming from
//! it, writing the timeline, rank 0's evaluation) ends in an agreement on
//! its outcome: no rank goes on alone, and a failure seen on one rank
//! reaches every rank through that collective, not by an early return.

use crate::error::{ExperimentError, Result};
use gradwire_comm::{Communicator, ReduceOp};

/// `local`, this rank's outcome of a step every rank takes alike, once
/// every rank knows every rank's: the value if all succeeded; this rank's
/// own error if it failed; otherwise an [`ExperimentError::Peer`] naming
/// the lowest rank that failed to `what`.
pub(super) fn agree<T, C: Communicator>(comm: &C, local: Result<T>, what: &str) -> Result<T> {
    let mut failed = [if local.is_err() {
        comm.rank() as u64
    } else {
        u64::MAX
    }];
    comm.all_reduce(&mut failed, ReduceOp::Min)?;
    match (local, failed[0]) {
        (Ok(value), u64::MAX) => Ok(value),
        (Err(e), _) => Err(e),
        (Ok(_), rank) => Err(ExperimentError::Peer {
            rank: rank as usize,
            what: what.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradwire_comm::local;

    /// Worlds of 1 to 4 ranks, each with every set of failing ranks: a
    /// failing rank keeps its own error, every other rank gets `Peer`
    /// naming the lowest failing rank, and with none failing every rank
    /// its own value.
    #[test]
    fn every_rank_learns_the_lowest_rank_that_failed() {
        for world in 1..=4usize {
            for failing in 0u32..(1 << world) {
                let fails = |r: usize| failing & (1 << r) != 0;
                let outcomes = local::run(world, |comm| {
                    let rank = comm.rank();
                    let mine = if fails(rank) {
                        Err(ExperimentError::Usage(format!("rank {rank}'s own")))
                    } else {
                        Ok(rank * 10)
                    };
                    Ok::<_, gradwire_comm::CommError>(format!(
                        "{:?}",
                        agree(&comm, mine, "evaluate the model")
                    ))
                })
                .unwrap();
                let lowest = (0..world).find(|&r| fails(r));
                for (rank, outcome) in outcomes.into_iter().enumerate() {
                    let expected = match lowest {
                        None => format!("Ok({})", rank * 10),
                        Some(_) if fails(rank) => format!("Err(Usage(\"rank {rank}'s own\"))"),
                        Some(low) => {
                            format!("Err(Peer {{ rank: {low}, what: \"evaluate the model\" }})")
                        }
                    };
                    assert_eq!(
                        outcome.unwrap(),
                        expected,
                        "W = {world}, failing {failing:b}"
                    );
                }
            }
        }
    }
}
