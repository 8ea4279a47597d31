//! Ranks as scoped threads: the one harness of [`crate::local::run`] and
//! the NCCL `run`s (on devices and on the host transport).
//!
//! The harness is split in two. [`on_rank_threads`] is generic over the
//! caller's closure and result, and does only what needs their types: it
//! boxes each rank's work (its input, the closure, where its result goes)
//! as a `dyn FnOnce`. [`join_rank_threads`] spawns, joins and catches
//! panics over those boxes, so that work is compiled once in this crate,
//! not once per closure in every crate that calls `run`: test crates call
//! it with dozens of closures, and monomorphised the thread machinery was
//! a tenth of the LLVM IR of gradwire-optim's integration tests (`cargo
//! llvm-lines`: 85 copies of `spawn_unchecked`, `scope` and their
//! closures).

use crate::error::{CommError, Result};

/// One rank's work, its result written where the caller reads it.
type RankJob<'a> = Box<dyn FnOnce() + Send + 'a>;

/// Runs `rank_body(input)` for each of `inputs` (one per rank, in rank
/// order), each on a scoped thread named `name-rank`, and returns the
/// results in rank order: a thread that could not start is that rank's
/// `InvalidArgument` (its input dropped at once, so a communicator it held
/// is a peer lost to the others, not one they wait for), and one that
/// panicked its [`CommError::RankPanicked`] (the ranks that did start are
/// joined either way).
pub(crate) fn on_rank_threads<I, R, F>(inputs: Vec<I>, name: &str, rank_body: F) -> Vec<Result<R>>
where
    I: Send,
    R: Send,
    F: Fn(I) -> R + Sync,
{
    let rank_body = &rank_body;
    let mut results: Vec<Option<R>> = inputs.iter().map(|_| None).collect();
    let jobs: Vec<RankJob<'_>> = inputs
        .into_iter()
        .zip(results.iter_mut())
        .map(|(input, result)| -> RankJob<'_> {
            Box::new(move || *result = Some(rank_body(input)))
        })
        .collect();
    let ends = join_rank_threads(jobs, name);
    ends.into_iter()
        .zip(results)
        .enumerate()
        .map(|(rank, (end, result))| {
            end.and_then(|()| {
                result.ok_or_else(|| CommError::RankPanicked {
                    rank,
                    message: "its thread ended without a result".into(),
                })
            })
        })
        .collect()
}

/// The part of [`on_rank_threads`] that does not depend on the caller's
/// types: each rank's thread, its start and its end (`Ok` when its job
/// returned). A job whose thread fails to start is dropped unrun.
fn join_rank_threads(jobs: Vec<RankJob<'_>>, name: &str) -> Vec<Result<()>> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = jobs
            .into_iter()
            .enumerate()
            .map(|(rank, job)| {
                std::thread::Builder::new()
                    .name(format!("{name}-{rank}"))
                    .spawn_scoped(scope, job)
                    .map_err(|e| {
                        CommError::InvalidArgument(format!(
                            "cannot start rank {rank}'s thread: {e}"
                        ))
                    })
            })
            .collect();
        threads
            .into_iter()
            .enumerate()
            .map(|(rank, thread)| {
                thread.and_then(|thread| {
                    thread.join().map_err(|payload| CommError::RankPanicked {
                        rank,
                        message: crate::pending::panic_message(payload.as_ref()),
                    })
                })
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::on_rank_threads;
    use crate::error::CommError;

    #[test]
    fn every_rank_gets_its_input_and_returns_its_result_in_rank_order() {
        let results = on_rank_threads((0..5).collect(), "test-rank", |rank: usize| {
            let name = std::thread::current().name().map(str::to_owned);
            (rank * 10, name)
        });
        for (rank, result) in results.into_iter().enumerate() {
            let (value, name) = result.expect("the rank returned");
            assert_eq!(value, rank * 10);
            assert_eq!(name, Some(format!("test-rank-{rank}")));
        }
    }

    #[test]
    fn a_panicking_rank_is_rank_panicked_and_the_others_keep_their_results() {
        let results = on_rank_threads(vec![0, 1, 2], "test-rank", |rank: usize| {
            if rank == 1 {
                panic!("rank one fails");
            }
            vec![rank; rank + 1]
        });
        assert_eq!(results[0].as_ref().ok(), Some(&vec![0]));
        assert!(
            matches!(&results[1], Err(CommError::RankPanicked { rank: 1, message }) if message == "rank one fails"),
            "{:?}",
            results[1]
        );
        assert_eq!(results[2].as_ref().ok(), Some(&vec![2, 2, 2]));
    }

    #[test]
    fn no_ranks_is_no_results() {
        assert!(on_rank_threads(Vec::<usize>::new(), "test-rank", |rank| rank).is_empty());
    }
}
