//! An alpha-beta cost model of gradwire's communication: what a training
//! step's collectives cost on a network, so that a strategy measured on a
//! small shaped network can be projected to another link and to 8..1024
//! workers.
//!
//! Why a model: the bytes a strategy sends are exact and machine
//! independent ([`Traffic`](crate::Traffic)), but what matters is seconds
//! per step, which depend on the link's latency (alpha, seconds per
//! message) and bandwidth (beta, seconds per byte) and on how many messages
//! each collective needs. The model has three parts:
//!
//! - [`Link`]: alpha and 1/beta, given or fitted from timings
//!   ([`fit_link`], [`fit_all_reduce`]), and a shaper's [`Burst`] where
//!   a calibration measured one;
//! - [`collectives`]: the time of each collective under a
//!   [`Algorithm`] (ring, tree, two-level hierarchical), from the textbook
//!   formulas (Thakur, Rabenseifner & Gropp 2005; Sanders, Speck & Träff
//!   2009), cited where each is written;
//! - [`strategies`]: every gradwire strategy's collectives in one step,
//!   an analytic function of the parameter shapes, the world size, the
//!   strategy's settings and DistOpt's buckets ([`step_collectives`]),
//!   matching what the implementations send, byte for byte
//!   ([`bytes_sent`] equals DistOpt's `StepStats::traffic.sent` of rank 0).
//!
//! [`predict_step_secs`] adds compute, codec and other time to the
//! collectives' time. gradwire's CLI computes every gradient before the
//! step's first collective (candle's backward), so nothing overlaps by
//! default ([`StepModel::overlap`] is 0); a framework whose buckets travel
//! during backward sets a fraction.
//!
//! ```
//! use gradwire_algos::cost::{
//!     Algorithm, Bucketing, Link, StepModel, StrategySpec, predict_step_secs, step_collectives,
//! };
//!
//! let shapes = vec![vec![1024, 1024], vec![1024]];
//! let calls = step_collectives(&StrategySpec::Dense, &shapes, 8, &Bucketing::default())?;
//! let link = Link::from_bit_rate(10e9, 5e-6)?;
//! let step = StepModel { compute_s: 0.05, ..StepModel::default() };
//! let secs = predict_step_secs(&step, &calls, 8, &link, &Algorithm::Ring)?;
//! assert!(secs > 0.05);
//! # Ok::<(), gradwire_algos::AlgoError>(())
//! ```

mod burst;
pub mod collectives;
mod fit;
mod fragments;
mod loops;
pub mod strategies;

pub use burst::Burst;
pub use collectives::{Algorithm, Collective, CollectiveCall, collective_secs};
pub use fit::{LinkSpread, fit_all_reduce, fit_link, mean, median, spread_of_all_reduce};
pub use fragments::fragment_ranges;
pub use strategies::{
    ARRIVAL_BYTES, Bucketing, DEFAULT_FUSION_THRESHOLD, StrategySpec, bytes_sent, group_buckets,
    peak_bytes, plan_buckets, sent_at_step, sent_over_steps, step_collectives,
};

use crate::error::{AlgoError, Result};

/// A point-to-point link in the alpha-beta (Hockney) model: a message of
/// `n` bytes takes `latency_s + n / bytes_per_s` seconds; a shaped link's
/// [`Burst`] takes some of that off a step's first bytes
/// ([`predict_step_secs`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Alpha: seconds per message, whatever its size (NIC, switch and
    /// software stack).
    pub latency_s: f64,
    /// 1 / beta: bytes per second once a message streams.
    pub bytes_per_s: f64,
    /// The token bucket of a shaper in front of the link; none
    /// (`Burst::default()`) for a plain NIC and in every constructor.
    pub burst: Burst,
}

impl Link {
    /// A link of `latency_s` seconds and `bytes_per_s` bytes per second;
    /// a non-finite value, a rate of zero or less or a negative latency is
    /// [`AlgoError::InvalidArgument`].
    pub fn new(latency_s: f64, bytes_per_s: f64) -> Result<Link> {
        at_least_zero("a link's latency", " s", latency_s)?;
        if !(bytes_per_s.is_finite() && bytes_per_s > 0.0) {
            return Err(AlgoError::InvalidArgument(format!(
                "a link's rate must be finite and positive, got {bytes_per_s} bytes/s"
            )));
        }
        Ok(Link {
            latency_s,
            bytes_per_s,
            burst: Burst::default(),
        })
    }

    /// The same link behind a shaper's token bucket; a field that is not
    /// finite and non-negative is [`AlgoError::InvalidArgument`].
    pub fn with_burst(self, burst: Burst) -> Result<Link> {
        burst.validate()?;
        Ok(Link { burst, ..self })
    }

    /// A link of `bits_per_s` (as tc and NIC data sheets give rates: 10e9
    /// for 10 Gbit/s) and `latency_s`.
    pub fn from_bit_rate(bits_per_s: f64, latency_s: f64) -> Result<Link> {
        Link::new(latency_s, bits_per_s / 8.0)
    }

    /// Checks a `Link` built field by field (the fields are public).
    pub fn validate(&self) -> Result<()> {
        Link::new(self.latency_s, self.bytes_per_s)?;
        self.burst.validate()
    }

    /// Seconds for one message of `bytes`: alpha + bytes beta.
    pub fn message_secs(&self, bytes: f64) -> f64 {
        self.latency_s + bytes / self.bytes_per_s
    }
}

/// What a step costs besides its collectives, in seconds per step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepModel {
    /// Forward and backward (and the optimizer's update).
    pub compute_s: f64,
    /// The strategy's encoding and decoding (casts, selections,
    /// quantization, PowerSGD's products).
    pub codec_s: f64,
    /// Anything else measured per step (data loading, bookkeeping).
    pub other_s: f64,
    /// The fraction of `compute_s`, in `[0, 1]`, under which communication
    /// can hide (buckets sent during backward). 0 in gradwire's CLI, whose
    /// candle backward produces every gradient before the first bucket
    /// leaves.
    pub overlap: f64,
}

impl StepModel {
    /// Checks that every time is finite and non-negative and `overlap` is
    /// in `[0, 1]`.
    pub fn validate(&self) -> Result<()> {
        at_least_zero("the compute time", " s", self.compute_s)?;
        at_least_zero("the codec time", " s", self.codec_s)?;
        at_least_zero("the other time", " s", self.other_s)?;
        if !(0.0..=1.0).contains(&self.overlap) {
            return Err(AlgoError::InvalidArgument(format!(
                "the overlap must be in [0, 1], got {}",
                self.overlap
            )));
        }
        Ok(())
    }
}

/// Seconds per step of all `calls` one after the other (gradwire runs a
/// step's buckets in order on one communication thread, so they never run
/// concurrently), on `world` ranks: a call that runs once every `period`
/// steps counts `1 / period` of its time (the mean over a round).
pub fn communication_secs(
    calls: &[CollectiveCall],
    world: usize,
    link: &Link,
    algorithm: &Algorithm,
) -> Result<f64> {
    calls.iter().try_fold(0.0, |sum, call| {
        let secs = collective_secs(call, world, link, algorithm)?;
        Ok(sum + secs / call.period.max(1) as f64)
    })
}

/// `value` summed over each exchange of `calls` (the calls of one
/// `(period, exchange)`, [`CollectiveCall::exchange`]), with the
/// exchange's first call, in the order the exchanges first appear.
pub(crate) fn per_exchange<T: Copy + Default + std::ops::AddAssign>(
    calls: &[CollectiveCall],
    value: impl Fn(&CollectiveCall) -> Result<T>,
) -> Result<Vec<(CollectiveCall, T)>> {
    let mut sums: Vec<(CollectiveCall, T)> = Vec::new();
    for c in calls {
        let v = value(c)?;
        match sums
            .iter_mut()
            .find(|(first, _)| (first.period, first.exchange) == (c.period, c.exchange))
        {
            Some((_, sum)) => *sum += v,
            None => sums.push((*c, v)),
        }
    }
    Ok(sums)
}

/// Predicted seconds per step: compute + codec + other + the collectives'
/// time, less what hides under compute:
/// `compute + codec + other + max(0, comm - overlap * compute)`, where
/// `comm` is the collectives' time less what the link's [`Burst`] saves
/// when the step's bytes find its bucket refilled (at most one bucket a
/// step; [`Burst`]'s module says why).
/// The codec is never hidden (it runs on the same cores, before its
/// bucket's collective). An exchange that runs under the next `τ` inner
/// steps ([`CollectiveCall::hidden_steps`], Streaming DiLoCo's) is waited
/// for only for what outlasts them: `max(0, its time - τ * (compute +
/// codec + other))`, once per its period.
pub fn predict_step_secs(
    step: &StepModel,
    calls: &[CollectiveCall],
    world: usize,
    link: &Link,
    algorithm: &Algorithm,
) -> Result<f64> {
    step.validate()?;
    let waited: Vec<CollectiveCall> = calls
        .iter()
        .copied()
        .filter(|c| c.hidden_steps == 0)
        .collect();
    let busy = step.compute_s + step.codec_s + step.other_s;
    let comm = communication_secs(&waited, world, link, algorithm)?;
    let comm = (comm - burst::credit_secs(&link.burst, &waited, busy)?).max(0.0);
    let mut exposed = (comm - step.overlap * step.compute_s).max(0.0);
    let hidden: Vec<CollectiveCall> = calls
        .iter()
        .copied()
        .filter(|c| c.hidden_steps > 0)
        .collect();
    for (first, secs) in per_exchange(&hidden, |c| collective_secs(c, world, link, algorithm))? {
        let under = f64::from(first.hidden_steps) * busy;
        exposed += (secs - under).max(0.0) / first.period.max(1) as f64;
    }
    Ok(step.compute_s + step.codec_s + step.other_s + exposed)
}

/// `Ok` for a finite `v` of at least 0, else [`AlgoError::InvalidArgument`]
/// saying that `what` must be one (in `unit`).
pub(crate) fn at_least_zero(what: &str, unit: &str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        return Ok(());
    }
    Err(AlgoError::InvalidArgument(format!(
        "{what} must be finite and at least 0{unit}, got {v}"
    )))
}

/// A codec time measured on `measured_params` parameters, scaled to
/// `target_params`: every codec gradwire has is linear in the number of
/// entries (a cast, a selection by radix passes, a quantization; PowerSGD's
/// products are linear in `rows x cols` at a fixed rank), so the time per
/// entry carries over, on the same hardware and as long as neither size is
/// so small that fixed costs dominate.
pub fn scale_codec_secs(
    measured_s: f64,
    measured_params: usize,
    target_params: usize,
) -> Result<f64> {
    at_least_zero("a codec time", " s", measured_s)?;
    if measured_params == 0 {
        return Err(AlgoError::InvalidArgument(
            "a codec time measured on 0 parameters cannot be scaled".into(),
        ));
    }
    Ok(measured_s * target_params as f64 / measured_params as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `result` is an [`AlgoError::InvalidArgument`] whose message says
    /// `what`.
    #[track_caller]
    pub(super) fn refused<T: std::fmt::Debug>(result: Result<T>, what: &str) {
        assert!(
            matches!(&result, Err(AlgoError::InvalidArgument(m)) if m.contains(what)),
            "expected InvalidArgument saying {what:?}, got {result:?}"
        );
    }

    #[test]
    fn links_refuse_bad_values() {
        refused(
            Link::new(-1e-6, 1e9),
            "latency must be finite and at least 0",
        );
        refused(
            Link::new(f64::NAN, 1e9),
            "latency must be finite and at least 0",
        );
        refused(Link::new(1e-6, 0.0), "rate must be finite and positive");
        refused(
            Link::new(1e-6, f64::INFINITY),
            "rate must be finite and positive",
        );
        refused(
            Link::from_bit_rate(-8.0, 0.0),
            "rate must be finite and positive",
        );
        let l = Link::from_bit_rate(8e9, 2e-6).unwrap();
        assert_eq!(l.bytes_per_s, 1e9);
        assert!((l.message_secs(1e9) - 1.000002).abs() < 1e-12);
    }

    #[test]
    fn prediction_adds_up_and_overlap_hides_communication() {
        let link = Link::new(0.0, 1e9).unwrap();
        let calls = vec![CollectiveCall::all_reduce(1_000_000, 2)];
        // Ring on 2 ranks: 2 (W-1)/W n beta = 1e6 / 1e9 = 1 ms.
        let step = StepModel {
            compute_s: 0.01,
            codec_s: 0.002,
            other_s: 0.003,
            overlap: 0.0,
        };
        let t = predict_step_secs(&step, &calls, 2, &link, &Algorithm::Ring).unwrap();
        assert!((t - 0.016).abs() < 1e-12, "{t}");
        let hidden = StepModel {
            overlap: 1.0,
            ..step
        };
        let t = predict_step_secs(&hidden, &calls, 2, &link, &Algorithm::Ring).unwrap();
        assert!((t - 0.015).abs() < 1e-12, "{t}");
        let bad = StepModel {
            overlap: 1.5,
            ..step
        };
        refused(
            predict_step_secs(&bad, &calls, 2, &link, &Algorithm::Ring),
            "the overlap must be in [0, 1], got 1.5",
        );
        assert_eq!(scale_codec_secs(0.01, 1000, 3000).unwrap(), 0.03);
        refused(scale_codec_secs(0.01, 0, 3000), "measured on 0 parameters");
    }
}
