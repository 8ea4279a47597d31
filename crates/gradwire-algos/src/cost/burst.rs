//! A token-bucket shaper's burst: what a link that has idled gives back to
//! the next step's first bytes.
//!
//! Why: a shaped link (tc's `tbf`, as `gradwire compare --network` builds
//! it, or a cloud instance's burst allowance) fills a bucket while it is
//! idle, and the first bytes sent after the idle time leave at the wire's
//! speed, not the rate. Timed on 4 ranks at 100 Mbit/s (tbf's bucket of
//! 96 KiB, 2026-11-28): an all-reduce in which each rank sends 192 KiB took
//! 16.1 ms back to back and 9.0 ms after a pause; one in which each rank
//! sends 96 KiB, 8.1 ms and 0.8 ms. A collective timed back to back (the
//! calibration's rate sizes, [`collective_secs`](super::collective_secs))
//! finds the bucket empty; a training step finds it full, refilled during
//! its compute. For a step that sends a few hundred KB (1-bit's two
//! phases) that is a tenth of the step; for one that sends megabytes it is
//! lost in the rate. Where the cores, not the shaper, set the rate (4 ranks
//! on 2 cores at 10 Gbit/s), the bucket never runs dry and a pause saves
//! nothing: the saving is measured, not derived from the bucket's size.
//!
//! The model: an exchange that sends `s` bytes a rank after `idle` seconds
//! without traffic saves `saved_s * min(1, s / bytes) * min(1, idle /
//! refill_s)`, at most one bucket a step ([`credit_secs`]).

use super::collectives::CollectiveCall;
use crate::error::Result;

/// A link's token bucket, as a calibration measured it
/// ([`Link::with_burst`](super::Link::with_burst)); the default is none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Burst {
    /// Bytes a rank can send at once after the bucket has refilled (the
    /// shaper's bucket; 0: no bucket).
    pub bytes: f64,
    /// Seconds a full bucket saves a step that sends at least `bytes` a
    /// rank (measured: a collective timed back to back less the same after
    /// a pause that refills the bucket; 0 where the shaper does not bind).
    pub saved_s: f64,
    /// Seconds of idle link that refill the bucket from empty (its bytes
    /// at the shaper's rate; 0: at once).
    pub refill_s: f64,
}

impl Burst {
    /// Checks that every field is finite and non-negative;
    /// [`AlgoError::InvalidArgument`](crate::AlgoError::InvalidArgument)
    /// names the field that is not.
    pub fn validate(&self) -> Result<()> {
        super::at_least_zero("a burst's bytes", "", self.bytes)?;
        super::at_least_zero("a burst's saved time", " s", self.saved_s)?;
        super::at_least_zero("a burst's refill time", " s", self.refill_s)
    }
}

/// Seconds per step that `burst` takes off the `calls` waited for in
/// their step, when a step spends `busy_s` seconds away from the link
/// (compute, codec, other): each exchange (the calls of one `(period,
/// exchange)`, [`CollectiveCall::exchange`]) finds the bucket refilled by
/// the `period` steps since its last turn, and saves its share of the
/// bucket once every `period` steps; the sum is at most one bucket a step.
/// `burst` is the link's, which [`predict_step_secs`](super::predict_step_secs)
/// has validated with each call's time.
pub(super) fn credit_secs(burst: &Burst, calls: &[CollectiveCall], busy_s: f64) -> Result<f64> {
    if burst.bytes <= 0.0 || burst.saved_s <= 0.0 {
        return Ok(0.0);
    }
    let mut credit = 0.0;
    for (first, sent) in super::per_exchange(calls, |c| Ok(c.sent))? {
        let period = first.period.max(1) as f64;
        let idle = busy_s * period;
        let refilled = if burst.refill_s > 0.0 {
            (idle / burst.refill_s).min(1.0)
        } else {
            1.0
        };
        let used = (sent as f64 / burst.bytes).min(1.0);
        credit += burst.saved_s * used * refilled / period;
    }
    Ok(credit.min(burst.saved_s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::tests::refused;
    use crate::cost::{Algorithm, Collective, Link, StepModel, predict_step_secs};

    const BURST: Burst = Burst {
        bytes: 100_000.0,
        saved_s: 0.008,
        refill_s: 0.01,
    };

    fn step(busy: f64) -> StepModel {
        StepModel {
            compute_s: busy,
            ..StepModel::default()
        }
    }

    /// Predicted seconds of `calls` on a 10 MB/s link, with and without
    /// `burst`.
    fn with_and_without(burst: Burst, busy: f64, calls: &[CollectiveCall]) -> (f64, f64) {
        let plain = Link::new(0.0, 1e7).unwrap();
        let shaped = plain.with_burst(burst).unwrap();
        let predict =
            |link: &Link| predict_step_secs(&step(busy), calls, 4, link, &Algorithm::Ring);
        (predict(&shaped).unwrap(), predict(&plain).unwrap())
    }

    #[test]
    fn a_step_past_the_bucket_saves_the_measured_time_once() {
        // 4 MB all-reduced on 4 ranks: 6 MB sent a rank, far past the
        // bucket, after 50 ms of compute (the bucket refills in 10).
        let calls = vec![
            CollectiveCall::all_reduce(4_000_000, 4),
            CollectiveCall::all_reduce(4_000_000, 4),
        ];
        let (shaped, plain) = with_and_without(BURST, 0.05, &calls);
        assert!((plain - shaped - 0.008).abs() < 1e-12, "{plain} {shaped}");
    }

    #[test]
    fn a_step_inside_the_bucket_saves_its_share() {
        // 40 000 bytes all-reduced on 4 ranks: 60 000 sent a rank, 0.6 of
        // the bucket.
        let calls = vec![CollectiveCall::all_reduce(40_000, 4)];
        assert_eq!(calls[0].sent, 60_000);
        let (shaped, plain) = with_and_without(BURST, 0.05, &calls);
        assert!((plain - shaped - 0.6 * 0.008).abs() < 1e-12);
        // A barrier sends nothing and saves nothing.
        let barrier = vec![CollectiveCall::new(Collective::Barrier, 4, 0)];
        let (shaped, plain) = with_and_without(BURST, 0.05, &barrier);
        assert_eq!(shaped, plain);
    }

    #[test]
    fn a_short_idle_time_refills_part_of_the_bucket() {
        let calls = vec![CollectiveCall::all_reduce(4_000_000, 4)];
        // 4 ms away from the link refill 0.4 of it.
        let (shaped, plain) = with_and_without(BURST, 0.004, &calls);
        assert!((plain - shaped - 0.4 * 0.008).abs() < 1e-12);
        // A refill time of 0: a full bucket whatever the idle time.
        let instant = Burst {
            refill_s: 0.0,
            ..BURST
        };
        let (shaped, plain) = with_and_without(instant, 0.0, &calls);
        assert!((plain - shaped - 0.008).abs() < 1e-12);
    }

    #[test]
    fn an_exchange_every_h_steps_saves_once_a_round() {
        // DiLoCo's round of 8 steps: its bucket refills over all 8.
        let calls = vec![CollectiveCall::all_reduce(4_000_000, 4).once_every(8)];
        let (shaped, plain) = with_and_without(BURST, 0.002, &calls);
        assert!((plain - shaped - 0.008 / 8.0).abs() < 1e-12);
        // Two exchanges in turn, one a step: one bucket a step at most.
        let turns = vec![
            CollectiveCall::all_reduce(4_000_000, 4)
                .once_every(2)
                .in_exchange(0, 0),
            CollectiveCall::all_reduce(4_000_000, 4)
                .once_every(2)
                .in_exchange(1, 0)
                .first_counted_at(1),
        ];
        let (shaped, plain) = with_and_without(BURST, 0.05, &turns);
        assert!((plain - shaped - 0.008).abs() < 1e-12);
    }

    #[test]
    fn an_exchange_hidden_under_inner_steps_saves_nothing_more() {
        // Streaming DiLoCo's overlapped fragment: its time hides under the
        // next steps' compute, the bucket is not counted on top.
        let calls = vec![
            CollectiveCall::all_reduce(40_000, 4)
                .once_every(4)
                .in_exchange(0, 1),
        ];
        let (shaped, plain) = with_and_without(BURST, 0.05, &calls);
        assert_eq!(shaped, plain);
    }

    #[test]
    fn the_saving_never_makes_communication_negative() {
        // A step of 12 ms on the link, a bucket said to save 20.
        let big = Burst {
            saved_s: 0.02,
            ..BURST
        };
        let calls = vec![CollectiveCall::all_reduce(80_000, 4)];
        let (shaped, _) = with_and_without(big, 0.05, &calls);
        assert!((shaped - 0.05).abs() < 1e-12, "{shaped}");
    }

    #[test]
    fn bad_bursts_are_invalid_arguments() {
        let link = Link::new(0.0, 1e7).unwrap();
        for (burst, what) in [
            (
                Burst {
                    bytes: -1.0,
                    ..BURST
                },
                "a burst's bytes must be finite and at least 0, got -1",
            ),
            (
                Burst {
                    saved_s: f64::NAN,
                    ..BURST
                },
                "a burst's saved time must be finite",
            ),
            (
                Burst {
                    refill_s: f64::INFINITY,
                    ..BURST
                },
                "a burst's refill time must be finite",
            ),
        ] {
            refused(link.with_burst(burst), what);
            let set = Link { burst, ..link };
            refused(set.validate(), what);
            // A link set field by field is refused by the prediction too.
            let calls = [CollectiveCall::all_reduce(40_000, 4)];
            refused(
                predict_step_secs(&step(0.05), &calls, 4, &set, &Algorithm::Ring),
                what,
            );
        }
    }
}
