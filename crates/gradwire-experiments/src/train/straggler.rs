//! Which rank the others waited for. In a step's exchange the rank that
//! arrives last waits least, so from every rank's wait in every step
//! (`StepStats::wait`, gathered at the epoch's end) the step's straggler
//! is the rank that waited least, late by the longest wait minus its own.
//! The epoch's straggler is the rank that was last most often: how often,
//! and by how much on average over those steps (Horovod's stall inspector
//! and PyTorch's straggler logs answer the same question).

use serde::{Deserialize, Serialize};

/// The rank the others waited for most often in an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    /// The rank.
    pub rank: usize,
    /// The fraction of the epoch's exchanging steps in which it was last.
    pub share: f64,
    /// Seconds the others waited for it, on average over those steps (the
    /// longest wait minus its own).
    pub late_secs: f64,
}

/// The straggler of `waits` (`waits[r][s]`: rank `r`'s seconds waiting in
/// step `s`; every rank the same steps). Steps in which every rank waited
/// the same (none exchanged: DiLoCo's inner steps) say nothing and are left
/// out; a tie for last goes to the lower rank, and so does a tie for most
/// often. `None` with fewer than two ranks, ranks of different step counts,
/// or no step that exchanged.
pub fn straggler(waits: &[Vec<f64>]) -> Option<Straggler> {
    let steps = waits.first()?.len();
    if waits.len() < 2 || waits.iter().any(|w| w.len() != steps) {
        return None;
    }
    let mut last_count = vec![0usize; waits.len()];
    let mut late_sum = vec![0f64; waits.len()];
    let mut exchanging = 0usize;
    for s in 0..steps {
        let column = waits.iter().map(|w| w[s]);
        let longest = column.clone().fold(f64::NEG_INFINITY, f64::max);
        let (last, shortest) =
            column.enumerate().fold(
                (0, f64::INFINITY),
                |(r0, w0), (r, w)| if w < w0 { (r, w) } else { (r0, w0) },
            );
        if longest.partial_cmp(&shortest) != Some(std::cmp::Ordering::Greater) {
            continue; // nobody waited for anybody (or a NaN)
        }
        exchanging += 1;
        last_count[last] += 1;
        late_sum[last] += longest - shortest;
    }
    let (rank, &count) = last_count.iter().enumerate().fold(
        None,
        |best: Option<(usize, &usize)>, (r, c)| match best {
            Some((_, bc)) if bc >= c => best,
            _ => Some((r, c)),
        },
    )?;
    (count > 0).then(|| Straggler {
        rank,
        share: count as f64 / exchanging as f64,
        late_secs: late_sum[rank] / count as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rank_that_waits_least_is_the_one_waited_for() {
        // Rank 2 arrives last in three of four steps, rank 0 in one.
        let waits = vec![
            vec![0.030, 0.020, 0.000, 0.025],
            vec![0.031, 0.022, 0.004, 0.026],
            vec![0.001, 0.002, 0.005, 0.001],
        ];
        let s = straggler(&waits).unwrap();
        assert_eq!(s.rank, 2);
        assert_eq!(s.share, 0.75);
        // Late by 30, 20 and 25 ms: 25 ms on average.
        assert!((s.late_secs - 0.025).abs() < 1e-12, "{s:?}");
    }

    #[test]
    fn steps_without_an_exchange_and_ties_say_nothing_or_go_low() {
        // DiLoCo's inner steps: nobody waited.
        let idle = vec![vec![0.0; 5], vec![0.0; 5]];
        assert_eq!(straggler(&idle), None);
        // One exchanging step among idle ones: its straggler, share 1.
        let one = vec![vec![0.0, 0.010, 0.0], vec![0.0, 0.002, 0.0]];
        let s = straggler(&one).unwrap();
        assert_eq!((s.rank, s.share), (1, 1.0));
        assert!((s.late_secs - 0.008).abs() < 1e-12);
        // Two ranks last equally often: the lower one.
        let tie = vec![vec![0.0, 0.01], vec![0.01, 0.0]];
        assert_eq!(straggler(&tie).unwrap().rank, 0);
    }

    #[test]
    fn what_cannot_be_attributed_is_none() {
        assert_eq!(straggler(&[]), None);
        assert_eq!(straggler(&[vec![0.1, 0.2]]), None, "one rank");
        assert_eq!(straggler(&[vec![0.1], vec![0.2, 0.3]]), None, "uneven");
        assert_eq!(straggler(&[vec![], vec![]]), None, "no step");
        assert_eq!(straggler(&[vec![f64::NAN], vec![0.1]]), None, "NaN");
    }
}
