//! The calibration of a shaped network, before `gradwire compare
//! --network` trains: all-reduces timed at a latency size and at rate
//! sizes, gradwire's and the library's, to which the cost model fits its
//! links (`gradwire_algos::cost::fit_all_reduce`, each size's mean;
//! `spread_of_all_reduce`, the links of single repetitions).
//!
//! Why these sizes: a token-bucket shaper lets a burst (tbf's bucket, at
//! least 96 KiB here) leave at the wire's speed, so a chunk smaller than it
//! travels faster than the rate and fits no line with the large ones (a 64
//! KiB all-reduce took 8 ms at 100 Mbit/s where the rate says 11). The
//! latency size's chunks are tiny: its time is the latency. The rate
//! sizes' chunks (256 KiB and more on 4 ranks) are past the burst at 100
//! Mbit/s and 1 Gbit/s; at 10 Gbit/s the cores, not the shaper, set the
//! rate. The latency size is timed often (its timings are short and
//! noisy); each rate size eight times, since its mean is kept and a shaped
//! link's timings come in two modes (`gradwire_algos::cost`'s fit).
//!
//! The burst itself is timed apart ([`BurstTimings`]): one all-reduce in
//! which every rank sends two buckets, back to back (the bucket drained)
//! and after a pause that refills it, as a training step's compute does.
//! The difference of the means is what a refilled bucket saves a step
//! (`crate::project::ProfileBurst`, `gradwire_algos::cost::Burst`); where the cores and not the shaper set
//! the rate, it is about nothing.

use crate::engine::Backend;
use crate::error::{ExperimentError, Result};
use gradwire_algos::cost::mean;
use gradwire_comm::ReduceOp;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// The all-reduce timed for the latency, in bytes of f32 (64 entries:
/// eight per rank at eight ranks).
pub const LATENCY_BYTES: usize = 256;

/// The all-reduces timed for the rate, in bytes of f32.
pub const RATE_BYTES: [usize; 3] = [1 << 20, 4 << 20, 16 << 20];

/// Timed repetitions of the latency size (after one untimed).
const LATENCY_REPETITIONS: usize = 15;

/// Timed repetitions of each rate size (after one untimed).
const RATE_REPETITIONS: usize = 8;

/// Buffers rotated through per size, so that no timing reuses the
/// previous one's cache-warm buffer.
const ROTATION: usize = 3;

/// Timed repetitions of the burst's all-reduce, each way (after one
/// untimed).
const BURST_REPETITIONS: usize = 8;

/// A shaper's token bucket, for [`calibrate`] to time what it saves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShaperBucket {
    /// Bytes the bucket holds.
    pub bytes: usize,
    /// Seconds of idle link that refill it (its bytes at the shaper's
    /// rate).
    pub refill_s: f64,
}

impl ShaperBucket {
    /// Checks that the bucket holds at most 1 GiB and refills in 0 to
    /// 3600 s (a finite time); [`ExperimentError::Usage`] says which.
    pub fn validate(&self) -> Result<()> {
        if self.bytes > 1 << 30 || !(0.0..=3600.0).contains(&self.refill_s) {
            return Err(ExperimentError::Usage(format!(
                "a shaper's bucket of {} bytes refilled in {} s: give at most 1 GiB and 0 to 3600 s",
                self.bytes, self.refill_s
            )));
        }
        Ok(())
    }
}

/// The burst's timings: gradwire's all-reduce of `bytes`, in which each
/// rank sends twice the bucket, back to back and after a pause of twice
/// the refill time (and a millisecond).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BurstTimings {
    /// The shaper's bucket, bytes.
    pub bucket_bytes: usize,
    /// Seconds of idle link that refill it.
    pub refill_s: f64,
    /// The all-reduce timed, bytes of f32.
    pub bytes: usize,
    /// The slowest rank's seconds, each repetition back to back.
    pub back_to_back: Vec<f64>,
    /// The same after each pause.
    pub after_pause: Vec<f64>,
}

/// What the all-reduces of a calibration took on this network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Ranks.
    pub world: usize,
    /// `(bytes, seconds)` of gradwire's all-reduce, every timed repetition
    /// (the slowest rank's time), size after size. (A `compare.json`
    /// written before this calibration holds one median per size of 64 KiB
    /// to 16 MiB: it still loads and fits.)
    pub gradwire: Vec<(usize, f64)>,
    /// The same for the library's own all-reduce (MPI_Allreduce), then
    /// its timings at the baselines' sizes.
    pub library: Vec<(usize, f64)>,
    /// Seconds of gradwire's all-reduce at [`LATENCY_BYTES`], timed again
    /// after the runs ([`recheck_latency`]); empty before, and in a
    /// `compare.json` written before this field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency_after: Vec<f64>,
    /// The shaper's burst, where [`calibrate`] was given a bucket and more
    /// than one rank (`None` in a `compare.json` written before this
    /// field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<BurstTimings>,
}

impl Calibration {
    /// Gradwire's timings the link is fitted to: the calibration's, and
    /// the latency size's again after the runs, so that the latency is the
    /// mean over the whole comparison. (On 4 ranks of a 2-core machine the
    /// 256 B all-reduce took 356 to 1167 us, and moved by -31 to +86 %
    /// between the two timings of one comparison: the machine's passing
    /// state, which the runs in between share.)
    pub fn gradwire_timings(&self) -> Vec<(usize, f64)> {
        let after = self.latency_after.iter().map(|&t| (LATENCY_BYTES, t));
        self.gradwire.iter().copied().chain(after).collect()
    }

    /// The mean seconds of gradwire's all-reduce at [`LATENCY_BYTES`]
    /// before the runs and after them, once timed after.
    pub fn latency_before_after(&self) -> Option<(f64, f64)> {
        let before = mean(
            self.gradwire
                .iter()
                .filter(|t| t.0 == LATENCY_BYTES)
                .map(|t| t.1),
        )?;
        Some((before, mean(self.latency_after.iter().copied())?))
    }

    /// The mean of the library's timings at exactly `bytes`, if the
    /// calibration timed that size (the mean, as the fit's: a run pays the
    /// slow mode of a shaped link as often as it comes).
    pub fn library_at(&self, bytes: usize) -> Option<f64> {
        mean(self.library.iter().filter(|t| t.0 == bytes).map(|t| t.1))
    }
}

/// Times both all-reduces at [`LATENCY_BYTES`] and [`RATE_BYTES`], and
/// the library's also at `baselines` (the bytes of the baseline runs'
/// fused all-reduces, eight times each: `MPI_Allreduce` picks its
/// algorithm by size, so its cost at the size a baseline sends is timed,
/// not read off a line), and, given the shaper's `bucket` on more than
/// one rank, the burst ([`BurstTimings`]). A `bucket` that does not
/// validate ([`ShaperBucket::validate`]) is refused before anything is
/// timed. Collective: every rank calls it, with the same `baselines` and
/// `bucket`.
pub fn calibrate<C: Backend>(
    comm: &C,
    baselines: &[usize],
    bucket: Option<ShaperBucket>,
) -> Result<Calibration> {
    if let Some(bucket) = &bucket {
        bucket.validate()?;
    }
    let mut gradwire = Vec::new();
    let mut library = Vec::new();
    let sizes = std::iter::once((LATENCY_BYTES, LATENCY_REPETITIONS, true))
        .chain(RATE_BYTES.iter().map(|&b| (b, RATE_REPETITIONS, true)))
        .chain(
            baselines
                .iter()
                .filter(|b| **b >= 4 && !RATE_BYTES.contains(b))
                .map(|&b| (b, RATE_REPETITIONS, false)),
        );
    for (bytes, repetitions, both) in sizes {
        for library_call in [false, true] {
            if !library_call && !both {
                continue;
            }
            let timings = time_all_reduce(comm, bytes, repetitions, library_call, Duration::ZERO)?;
            let into = if library_call {
                &mut library
            } else {
                &mut gradwire
            };
            into.extend(timings.into_iter().map(|t| (bytes, t)));
        }
    }
    let world = comm.world_size();
    let burst = match bucket {
        Some(bucket) if world > 1 => Some(time_burst(comm, bucket)?),
        _ => None,
    };
    Ok(Calibration {
        world,
        gradwire,
        library,
        latency_after: Vec::new(),
        burst,
    })
}

/// [`BurstTimings`] of `bucket` on more than one rank: a ring all-reduce
/// of `S` bytes sends `2 (W - 1) / W S` a rank, so `S = W / (W - 1)`
/// buckets (rounded up to whole f32) send two.
fn time_burst<C: Backend>(comm: &C, bucket: ShaperBucket) -> Result<BurstTimings> {
    let world = comm.world_size();
    let bytes = (bucket.bytes * world).div_ceil(world - 1).div_ceil(4) * 4;
    let pause = Duration::from_secs_f64(2.0 * bucket.refill_s + 1e-3);
    Ok(BurstTimings {
        bucket_bytes: bucket.bytes,
        refill_s: bucket.refill_s,
        bytes,
        back_to_back: time_all_reduce(comm, bytes, BURST_REPETITIONS, false, Duration::ZERO)?,
        after_pause: time_all_reduce(comm, bytes, BURST_REPETITIONS, false, pause)?,
    })
}

/// Times gradwire's all-reduce at [`LATENCY_BYTES`] again, as the
/// calibration did, into `calibration.latency_after`: after the runs, so
/// that the link the model fits spans them
/// ([`Calibration::gradwire_timings`]). Collective.
pub fn recheck_latency<C: Backend>(comm: &C, calibration: &mut Calibration) -> Result<()> {
    calibration.latency_after = time_all_reduce(
        comm,
        LATENCY_BYTES,
        LATENCY_REPETITIONS,
        false,
        Duration::ZERO,
    )?;
    Ok(())
}

/// The slowest rank's seconds of `repetitions` all-reduces of `bytes` of
/// f32 (after one untimed), gradwire's or the library's, each after a
/// `pause` without traffic and a barrier, over [`ROTATION`] buffers.
/// Collective.
fn time_all_reduce<C: Backend>(
    comm: &C,
    bytes: usize,
    repetitions: usize,
    library_call: bool,
    pause: Duration,
) -> Result<Vec<f64>> {
    let len = bytes / 4;
    let mut buffers: Vec<Vec<f32>> = (0..ROTATION)
        .map(|k| (0..len).map(|i| ((i + k) % 97) as f32 * 1e-3).collect())
        .collect();
    let mut timings = Vec::with_capacity(repetitions);
    for rep in 0..=repetitions {
        let buf = &mut buffers[rep % ROTATION];
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        comm.barrier()?;
        let started = Instant::now();
        if library_call {
            comm.library_sum(buf)?;
        } else {
            comm.all_reduce(buf, ReduceOp::Sum)?;
        }
        let mut took = [started.elapsed().as_secs_f64()];
        // The collective ends for everyone when the slowest rank is done.
        comm.all_reduce(&mut took, ReduceOp::Max)?;
        if rep > 0 {
            timings.push(took[0]);
        }
    }
    Ok(timings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradwire_algos::cost::{fit_all_reduce, spread_of_all_reduce};
    use gradwire_comm::LocalComm;

    /// A small bucket that refills fast: the burst's code runs, its time
    /// is not asked (in-process, no shaper).
    const TEST_BUCKET: ShaperBucket = ShaperBucket {
        bytes: 1001,
        refill_s: 1e-4,
    };

    /// Every size, every repetition, in order, for both all-reduces; the
    /// timings grow with the size (in-process, by memory bandwidth alone:
    /// a fit is possible, what it says of a network is not asked here).
    #[test]
    fn a_calibration_times_every_size_and_repetition() {
        // A baseline of 6 000 bytes: the library's timed there too, and a
        // shaper's bucket, whose burst is timed last.
        let bucket = TEST_BUCKET;
        let calibrations =
            gradwire_comm::local::run(2, |comm: LocalComm| calibrate(&comm, &[6000], Some(bucket)))
                .unwrap()
                .into_iter()
                .collect::<Result<Vec<_>>>()
                .unwrap();
        let mut wanted = vec![LATENCY_BYTES; LATENCY_REPETITIONS];
        for b in RATE_BYTES {
            wanted.extend([b; RATE_REPETITIONS]);
        }
        let mut with_baseline = wanted.clone();
        with_baseline.extend([6000; RATE_REPETITIONS]);
        for c in &calibrations {
            assert_eq!(c.world, 2);
            for (timings, wanted) in [(&c.gradwire, &wanted), (&c.library, &with_baseline)] {
                let sizes: Vec<usize> = timings.iter().map(|t| t.0).collect();
                assert_eq!(&sizes, wanted);
                assert!(timings.iter().all(|t| t.1 > 0.0 && t.1.is_finite()));
            }
        }
        // Rank 0's record is every rank's (the slowest rank's times).
        assert_eq!(calibrations[0], calibrations[1]);
        let c = &calibrations[0];
        assert_eq!(c.latency_before_after(), None);
        let burst = c.burst.as_ref().expect("a bucket on 2 ranks is timed");
        assert_eq!((burst.bucket_bytes, burst.refill_s), (1001, 1e-4));
        assert_eq!(c.gradwire_timings(), c.gradwire);
        fit_all_reduce(2, &c.gradwire).unwrap();
        let spread = spread_of_all_reduce(2, &c.gradwire).unwrap().unwrap();
        assert_eq!(spread.repetitions, RATE_REPETITIONS);
        let at_6000: Vec<f64> = c
            .library
            .iter()
            .filter(|t| t.0 == 6000)
            .map(|t| t.1)
            .collect();
        let mean = at_6000.iter().sum::<f64>() / at_6000.len() as f64;
        assert!((c.library_at(6000).unwrap() / mean - 1.0).abs() < 1e-12);
        assert_eq!(c.library_at(6001), None);
    }

    /// The latency size timed again joins gradwire's timings, after the
    /// calibration's, and gives the mean before and after.
    #[test]
    fn a_recheck_times_the_latency_size_again() {
        let rechecked = gradwire_comm::local::run(3, |comm: LocalComm| {
            let mut calibration = calibrate(&comm, &[], None)?;
            recheck_latency(&comm, &mut calibration)?;
            Ok::<_, crate::error::ExperimentError>(calibration)
        })
        .unwrap()
        .into_iter()
        .collect::<Result<Vec<_>>>()
        .unwrap();
        let c = &rechecked[0];
        // No bucket given: no burst timed.
        assert_eq!(c.burst, None);
        assert_eq!(c.latency_after.len(), LATENCY_REPETITIONS);
        assert!(c.latency_after.iter().all(|t| *t > 0.0 && t.is_finite()));
        let timings = c.gradwire_timings();
        assert_eq!(&timings[..c.gradwire.len()], &c.gradwire[..]);
        let after: Vec<(usize, f64)> = c
            .latency_after
            .iter()
            .map(|&t| (LATENCY_BYTES, t))
            .collect();
        assert_eq!(&timings[c.gradwire.len()..], &after[..]);
        let (before, after) = c.latency_before_after().unwrap();
        let mean_after = c.latency_after.iter().sum::<f64>() / LATENCY_REPETITIONS as f64;
        assert!((after / mean_after - 1.0).abs() < 1e-12);
        assert!(before > 0.0);
    }

    /// On every world of more than one rank the burst is an all-reduce in
    /// which each rank sends at least two buckets (a ring's `2 (W - 1) /
    /// W` of it), timed both ways; one rank has no link to time.
    #[test]
    fn a_bucket_is_timed_back_to_back_and_after_a_pause() {
        let bucket = TEST_BUCKET;
        let alone =
            gradwire_comm::local::run(1, |comm: LocalComm| calibrate(&comm, &[], Some(bucket)))
                .unwrap();
        assert_eq!(alone[0].as_ref().unwrap().burst, None);
        for world in 2..=4 {
            let calibrations =
                gradwire_comm::local::run(world, |comm: LocalComm| time_burst(&comm, bucket))
                    .unwrap()
                    .into_iter()
                    .collect::<Result<Vec<_>>>()
                    .unwrap();
            let timings = &calibrations[0];
            assert_eq!((timings.bucket_bytes, timings.refill_s), (1001, 1e-4));
            assert_eq!(timings.bytes % 4, 0);
            let sent = gradwire_algos::Traffic::all_reduce(timings.bytes, world).sent;
            assert!(sent >= 2 * 1001, "{world} ranks send {sent} bytes");
            // Not a whole f32 more than needed.
            let less = gradwire_algos::Traffic::all_reduce(timings.bytes - 4, world).sent;
            assert!(
                less < 2 * 1001,
                "{world} ranks: {} bytes is not the least",
                timings.bytes
            );
            for t in [&timings.back_to_back, &timings.after_pause] {
                assert_eq!(t.len(), BURST_REPETITIONS);
                assert!(t.iter().all(|t| *t > 0.0 && t.is_finite()));
            }
            let burst = crate::project::ProfileBurst::of(timings).unwrap();
            assert_eq!(burst.all_reduce_bytes, timings.bytes);
            assert!(burst.saved_s() >= 0.0 && burst.saved_s().is_finite());
            // Every rank records the slowest rank's times.
            assert_eq!(&calibrations[1], timings);
        }
    }

    /// A bucket past 1 GiB or refilled in a time that is not a finite
    /// number of seconds up to an hour is a usage error on every rank,
    /// before anything is timed.
    #[test]
    fn a_bad_bucket_is_a_usage_error() {
        for (bytes, refill_s) in [
            ((1 << 30) + 1, 0.01),
            (1000, f64::NAN),
            (1000, -1.0),
            (1000, f64::INFINITY),
        ] {
            let bad = ShaperBucket { bytes, refill_s };
            for result in
                gradwire_comm::local::run(2, |comm: LocalComm| calibrate(&comm, &[], Some(bad)))
                    .unwrap()
            {
                crate::error::assert_usage(result, "a shaper's bucket of");
            }
        }
    }
}
