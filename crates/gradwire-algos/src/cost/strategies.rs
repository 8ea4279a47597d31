//! Every gradwire strategy's collectives in one training step, as an
//! analytic function of the parameter shapes, the world size, the
//! strategy's settings and DistOpt's buckets: the number of calls and
//! their sizes, which is what the alpha-beta model times, and the bytes
//! rank 0 sends, equal to what DistOpt reports (`StepStats::traffic.sent`,
//! the ring model of [`crate::Traffic`]).
//!
//! The model follows the code, not the papers: DistOpt's bucket plan
//! (SINGA's grouping, [`plan_buckets`]), its written-anywhere vote per
//! bucket (one `u8` per parameter), and each strategy's own calls
//! (`dense.rs`, `half.rs`, `sparse.rs`, `powersgd.rs`, `quantized.rs`,
//! `adasum.rs`, `dimreduce/`), using the same helpers for sizes (the sparse wire
//! format's [`wire::encoded_len`], the quantizers'
//! [`Quantizer::encoded_len`], PowerSGD's [`lowrank::matrix_shape`],
//! [`chunk_range`], [`sparse_costs_more`]), so a change there changes the
//! model too. It describes a step in which every parameter's gradient was
//! written (the usual case) and in which compression is on (after
//! PowerSGD's `start_step`, after 1-bit Adam's freeze when asked).

use super::collectives::{Collective, CollectiveCall};
use super::loops;
use crate::error::{AlgoError, Result};
use crate::handle::Traffic;
use crate::{DEFAULT_FUSION_CAPACITY, sparse_costs_more};
use gradwire_comm::chunk_range;
use gradwire_compress::select::{SAMPLED_TOP_K_SLACK, count_for_ratio};
use gradwire_compress::{Quantizer, lowrank, wire};
use gradwire_tensor::DType;
use std::ops::Range;

/// DistOpt's default fusion threshold in elements (SINGA's), the same
/// value as `gradwire_optim::DEFAULT_FUSION_THRESHOLD` (gradwire-optim
/// depends on this crate, not the other way; a test in gradwire-experiments
/// checks that the two agree).
pub const DEFAULT_FUSION_THRESHOLD: usize = 2_097_152;

/// Bytes per rank that a gradient step's first vote carries after its
/// written-anywhere flags: each rank's arrival, from which every rank names
/// the step's straggler (gradwire-optim's `distopt/arrival.rs`).
pub const ARRIVAL_BYTES: usize = 8;

/// How DistOpt groups parameters into buckets, and how it votes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucketing {
    /// Elements above which a bucket is closed (DistOptConfig's
    /// `fusion_threshold`; the CLI's `--fusion-threshold`).
    pub fusion_threshold: usize,
    /// The most elements a bucket may hold (DistOptConfig's `capacity`).
    pub capacity: usize,
    /// One written-anywhere vote per bucket (DistOpt's default,
    /// `SkipVote::PerBucket`); `false`: one vote for all parameters per
    /// step (`SkipVote::PerStep`).
    pub vote_per_bucket: bool,
}

impl Default for Bucketing {
    /// DistOpt's defaults: 2 Mi-element threshold, 4 Mi capacity, a vote
    /// per bucket.
    fn default() -> Self {
        Bucketing {
            fusion_threshold: DEFAULT_FUSION_THRESHOLD,
            capacity: DEFAULT_FUSION_CAPACITY,
            vote_per_bucket: true,
        }
    }
}

/// A strategy and the settings that decide what it sends.
#[derive(Debug, Clone, PartialEq)]
pub enum StrategySpec {
    /// f32 sum (fused all-reduce per bucket).
    Dense,
    /// f16 or bf16 on the wire (both 2 bytes an entry).
    Half,
    /// Exact top-k of each bucket, `k = ceil(ratio n)`, with or without
    /// error feedback (the same bytes): an all-gather of (index, value)
    /// payloads, or a dense all-reduce when that is cheaper at this world
    /// size ([`sparse_costs_more`]).
    TopK {
        /// Fraction kept, in (0, 1].
        ratio: f64,
    },
    /// Sampled top-k (DGC): between `k` and `ceil(1.3 k)` entries,
    /// depending on the data; modelled as `ceil(overshoot k)` (buckets of
    /// at least 4096 entries; smaller ones take the exact top k).
    SampledTopK {
        /// Fraction targeted, in (0, 1].
        ratio: f64,
        /// Kept entries over `k`, in `[1, 1.3]` (1.0: the lower bound).
        overshoot: f64,
    },
    /// Random-k from a shared seed: every rank keeps the same indices, so
    /// only the `k` values are all-reduced.
    RandomK {
        /// Fraction kept, in (0, 1].
        ratio: f64,
    },
    /// PowerSGD at `rank` (after its start step): per bucket one
    /// all-reduce of the uncompressed tensors and the `P` factors, one of
    /// the `Q` factors.
    PowerSgd {
        /// The rank of the factors.
        rank: usize,
        /// A matrix is compressed only if its factors are at least this
        /// many times smaller (DDP's default 2).
        min_compression_rate: f64,
    },
    /// The quantized all-reduce (onebit, QSGD, uint8): per bucket a
    /// barrier, `W - 1` paired exchanges of quantized chunks and an
    /// all-gather of the re-quantized averages.
    Quantized {
        /// How entries are quantized.
        quantizer: Quantizer,
    },
    /// 1-bit Adam: dense before `freeze_step` (`compressed: false`), the
    /// 1-bit quantized all-reduce of the moment after it.
    OneBitAdam {
        /// Whether the step is past the freeze.
        compressed: bool,
    },
    /// AdaSum by gradient (flat, `AdaSum::new`): per bucket a length
    /// agreement, recursive vector halving with a small f64 all-reduce per
    /// level, the gathering in reverse.
    AdaSum,
    /// DimReduce's step (no buckets, no votes): a reduce-scatter of the
    /// gradient, an all-reduce of `components + 2` f64, two all-gathers of
    /// f32 slices, and one 8-byte all-reduce per line-search trial.
    DimReduce {
        /// Principal components kept.
        components: usize,
        /// Trial points the line search evaluates this step (1 when the
        /// first step size is accepted).
        trials: usize,
    },
    /// DiLoCo's loop (`gradwire_optim`'s `distopt/outer.rs`): the inner
    /// steps make no collective (their faults ride the round's first
    /// combination); the round's last step combines the pseudo-gradients
    /// bucket by bucket with `codec`'s calls (no vote), once every
    /// `sync_every` steps. Streaming DiLoCo (`fragments` > 1): the
    /// parameters in [`fragment_ranges`](super::fragment_ranges), the buckets planned inside each,
    /// fragment `k`'s calls one exchange of their own every `sync_every`
    /// steps, which the next `delay` inner steps may hide
    /// ([`CollectiveCall::hidden_steps`]).
    Outer {
        /// Inner steps per round (`H`, at least 1).
        sync_every: u32,
        /// Fragments exchanged in turn (`F`, 1 for DiLoCo; it divides `H`).
        fragments: u32,
        /// Inner steps between a fragment's exchange leaving and its
        /// merge (`τ`, under `H / F`; 0 for DiLoCo).
        delay: u32,
        /// The strategy that carries the pseudo-gradient: a per-bucket one
        /// (dense, half, top-k, random-k, PowerSGD, quantized).
        codec: Box<StrategySpec>,
    },
    /// Partial averaging (SINGA's `backward_and_partial_update`): a local
    /// step and the agreement that opens it (a barrier), then bucket
    /// `counter mod K`'s parameters averaged (one all-reduce), and with
    /// `state_buffers` > 0 their optimizer buffers too (one more): each
    /// bucket's calls once every `K` steps, bucket `b`'s at steps `b, b +
    /// K, ..`.
    Partial {
        /// Optimizer buffers per parameter averaged with it (0: the
        /// parameters alone, SINGA's; the optimizer's count with
        /// `partial:state`).
        state_buffers: usize,
    },
    /// Delta weight (`adasum-delta`): a local step and the agreement that
    /// opens it, then the weight changes combined bucket by bucket with
    /// `codec`'s calls (no vote).
    DeltaWeight {
        /// The strategy that combines the weight changes (AdaSum).
        codec: Box<StrategySpec>,
    },
    /// A selection whose size depends on the data (the threshold codec):
    /// the sparse exchange of top-k with `density` of each bucket's
    /// entries kept, the density measured on a run (the mean over its
    /// steps of what the codec kept).
    Selected {
        /// Fraction of each bucket's entries kept, in (0, 1].
        density: f64,
    },
}

/// SINGA's grouping (DistOpt's, which calls this): a tensor above the
/// threshold alone; smaller ones together until the group's count exceeds
/// the threshold. The buckets' ranges of `lens`, with no capacity check
/// ([`plan_buckets`] and DistOpt check it).
pub fn group_buckets(lens: &[usize], threshold: usize) -> Vec<Range<usize>> {
    let mut buckets = Vec::new();
    let (mut start, mut count) = (0, 0usize);
    for (i, &n) in lens.iter().enumerate() {
        if n > threshold {
            if start < i {
                buckets.push(start..i);
            }
            buckets.push(i..i + 1);
            start = i + 1;
            count = 0;
            continue;
        }
        // Both are at most the threshold here, so the sum cannot overflow
        // unless the threshold is near usize::MAX: saturated anyway.
        count = count.saturating_add(n);
        if count > threshold {
            buckets.push(start..i + 1);
            start = i + 1;
            count = 0;
        }
    }
    if start < lens.len() {
        buckets.push(start..lens.len());
    }
    buckets
}

/// [`group_buckets`], each bucket checked against `capacity`: one beyond
/// it is [`AlgoError::Capacity`] (DistOpt refuses such a model).
pub fn plan_buckets(
    lens: &[usize],
    threshold: usize,
    capacity: usize,
) -> Result<Vec<Range<usize>>> {
    let buckets = group_buckets(lens, threshold);
    for b in &buckets {
        let needed = lens[b.clone()]
            .iter()
            .try_fold(0usize, |sum, &n| sum.checked_add(n))
            .unwrap_or(usize::MAX);
        if needed > capacity {
            return Err(AlgoError::Capacity { needed, capacity });
        }
    }
    Ok(buckets)
}

/// Bytes rank 0 sends per step in `calls`: with [`step_collectives`]'
/// calls, what DistOpt reports for the step (for a strategy with calls of a
/// longer period, the mean over its round: [`CollectiveCall::period`]).
pub fn bytes_sent(calls: &[CollectiveCall]) -> f64 {
    calls
        .iter()
        .map(|c| c.sent as f64 / c.period.max(1) as f64)
        .sum()
}

/// Bytes rank 0 sends at step `step` (counting from 0) in `calls`: what
/// DistOpt's `StepStats::traffic.sent` reports for that step, the calls
/// of a longer period counted where [`CollectiveCall::counted_at`] says.
pub fn sent_at_step(calls: &[CollectiveCall], step: u64) -> u64 {
    calls
        .iter()
        .filter(|c| c.counted_at(step))
        .map(|c| c.sent)
        .sum()
}

/// Bytes rank 0 sends in the first `steps` steps (counting from 0) in
/// `calls`: [`sent_at_step`] summed over them, in closed form.
pub fn sent_over_steps(calls: &[CollectiveCall], steps: u64) -> u64 {
    calls
        .iter()
        .map(|c| {
            let times = if steps > c.first_step {
                (steps - 1 - c.first_step) / c.period.max(1) + 1
            } else {
                0
            };
            c.sent.saturating_mul(times)
        })
        .fold(0u64, u64::saturating_add)
}

/// The most bytes rank 0 sends in one exchange of `calls`: a step's for
/// strategies that exchange every step, the round's for DiLoCo, the
/// largest fragment's for Streaming DiLoCo (its peak of bandwidth, where
/// [`bytes_sent`] is the mean).
pub fn peak_bytes(calls: &[CollectiveCall]) -> u64 {
    super::per_exchange(calls, |c| Ok(c.sent))
        .unwrap_or_default()
        .into_iter()
        .map(|(_, sent)| sent)
        .max()
        .unwrap_or(0)
}

fn check_ratio(ratio: f64) -> Result<()> {
    if ratio > 0.0 && ratio <= 1.0 {
        Ok(())
    } else {
        Err(AlgoError::InvalidArgument(format!(
            "a sparse ratio must be in (0, 1], got {ratio}"
        )))
    }
}

pub(super) fn check_spec(spec: &StrategySpec) -> Result<()> {
    match *spec {
        StrategySpec::TopK { ratio }
        | StrategySpec::RandomK { ratio }
        | StrategySpec::Selected { density: ratio } => check_ratio(ratio),
        StrategySpec::SampledTopK { ratio, overshoot } => {
            check_ratio(ratio)?;
            if (1.0..=SAMPLED_TOP_K_SLACK).contains(&overshoot) {
                Ok(())
            } else {
                Err(AlgoError::InvalidArgument(format!(
                    "sampled top-k keeps 1 to {SAMPLED_TOP_K_SLACK} times k, got {overshoot}"
                )))
            }
        }
        StrategySpec::PowerSgd {
            rank,
            min_compression_rate,
        } => crate::PowerSgdConfig {
            rank,
            min_compression_rate,
            ..crate::PowerSgdConfig::default()
        }
        .validate(),
        StrategySpec::Quantized { quantizer } => Ok(quantizer.validate()?),
        StrategySpec::Outer {
            sync_every,
            fragments,
            delay,
            ref codec,
        } => {
            if sync_every == 0 {
                return Err(AlgoError::InvalidArgument(
                    "a round takes at least one inner step".into(),
                ));
            }
            if fragments == 0 || !sync_every.is_multiple_of(fragments) {
                return Err(AlgoError::InvalidArgument(format!(
                    "{fragments} fragments must divide a round of {sync_every} steps"
                )));
            }
            if delay >= sync_every / fragments {
                return Err(AlgoError::InvalidArgument(format!(
                    "a merge {delay} steps late must come before the next fragment \
                     leaves, {} steps later",
                    sync_every / fragments
                )));
            }
            match **codec {
                StrategySpec::AdaSum | StrategySpec::OneBitAdam { .. } => Err(
                    AlgoError::InvalidArgument(format!("{codec:?} cannot carry a pseudo-gradient")),
                ),
                _ => check_bucket_codec(codec),
            }
        }
        StrategySpec::DeltaWeight { ref codec } => check_bucket_codec(codec),
        _ => Ok(()),
    }
}

/// `codec` checked as a bucket's codec inside another loop: one that is a
/// loop of its own cannot be.
fn check_bucket_codec(codec: &StrategySpec) -> Result<()> {
    match codec {
        StrategySpec::Outer { .. }
        | StrategySpec::DimReduce { .. }
        | StrategySpec::Partial { .. }
        | StrategySpec::DeltaWeight { .. } => Err(AlgoError::InvalidArgument(format!(
            "{codec:?} is a training loop, not a bucket's codec"
        ))),
        _ => check_spec(codec),
    }
}

/// The collectives of one step of `strategy` on `world` ranks for
/// parameters of `shapes` (declaration order, as given to DistOpt), with
/// `bucketing`, in the order they run. Rank 0's view: where ranks' chunks
/// differ by one element (the quantized chunks, DimReduce's slices),
/// rank 0 holds the larger one.
pub fn step_collectives(
    strategy: &StrategySpec,
    shapes: &[Vec<usize>],
    world: usize,
    bucketing: &Bucketing,
) -> Result<Vec<CollectiveCall>> {
    if world == 0 {
        return Err(AlgoError::InvalidArgument("a world of 0 ranks".into()));
    }
    check_spec(strategy)?;
    let lens = shapes
        .iter()
        .map(|s| {
            s.iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .ok_or_else(|| AlgoError::InvalidArgument(format!("shape {s:?} overflows")))
        })
        .collect::<Result<Vec<usize>>>()?;
    if let Some(calls) = loops::loop_collectives(strategy, &lens, shapes, world, bucketing)? {
        return Ok(calls);
    }
    let mut calls = Vec::new();
    let buckets = plan_buckets(&lens, bucketing.fusion_threshold, bucketing.capacity)?;
    // The step's first vote also carries every rank's arrival.
    let arrivals = ARRIVAL_BYTES * world;
    if !bucketing.vote_per_bucket {
        calls.push(CollectiveCall::all_reduce(lens.len() + arrivals, world));
    }
    for (b, range) in buckets.into_iter().enumerate() {
        if bucketing.vote_per_bucket {
            let first = if b == 0 { arrivals } else { 0 };
            calls.push(CollectiveCall::all_reduce(range.len() + first, world));
        }
        Bucket::of(range, &lens, shapes, world).calls(strategy, &mut calls)?;
    }
    // The agreement on the updates' outcome, a collective of its own
    // (DistOpt's `agree_after`): a header exchange without data.
    calls.push(CollectiveCall::new(Collective::Barrier, world, 0));
    Ok(calls)
}

/// One bucket: its element count, its tensors' shapes, the world.
pub(super) struct Bucket<'a> {
    n: usize,
    tensors: usize,
    shapes: &'a [Vec<usize>],
    world: usize,
}

impl<'a> Bucket<'a> {
    /// The bucket of the parameters in `range` (of counts `lens` and
    /// shapes `shapes`) on `world` ranks.
    pub(super) fn of(
        range: Range<usize>,
        lens: &[usize],
        shapes: &'a [Vec<usize>],
        world: usize,
    ) -> Self {
        Bucket {
            n: lens[range.clone()].iter().sum(),
            tensors: range.len(),
            shapes: &shapes[range],
            world,
        }
    }

    /// The bucket's strategy's calls (after its vote), appended to `out`.
    pub(super) fn calls(
        &self,
        strategy: &StrategySpec,
        out: &mut Vec<CollectiveCall>,
    ) -> Result<()> {
        let (n, world) = (self.n, self.world);
        match *strategy {
            StrategySpec::Dense | StrategySpec::OneBitAdam { compressed: false } => {
                out.push(CollectiveCall::all_reduce(4 * n, world));
            }
            StrategySpec::Half => out.push(CollectiveCall::all_reduce(2 * n, world)),
            StrategySpec::TopK { ratio } => {
                let k = count_for_ratio(ratio, n)?;
                self.sparse(k, false, out);
            }
            StrategySpec::SampledTopK { ratio, overshoot } => {
                let k = count_for_ratio(ratio, n)?;
                // sampled_top_k_into: small inputs take the exact top k.
                let kept = if n < 4096 || k == 0 {
                    k
                } else {
                    let cap = ((k as f64 * SAMPLED_TOP_K_SLACK).ceil() as usize).max(k);
                    ((k as f64 * overshoot).ceil() as usize)
                        .clamp(k, cap)
                        .min(n)
                };
                self.sparse(kept, false, out);
            }
            StrategySpec::RandomK { ratio } => {
                let k = count_for_ratio(ratio, n)?;
                self.sparse(k, true, out);
            }
            StrategySpec::Selected { density } => {
                let kept = ((density * n as f64).round() as usize).min(n);
                self.sparse(kept, false, out);
            }
            StrategySpec::PowerSgd {
                rank,
                min_compression_rate,
            } => self.powersgd(rank, min_compression_rate, out),
            StrategySpec::Quantized { quantizer } => self.quantized(quantizer, out),
            StrategySpec::OneBitAdam { compressed: true } => self.quantized(Quantizer::Sign, out),
            StrategySpec::AdaSum => self.adasum(out),
            // Loops of their own (`loops.rs`), never a bucket's codec.
            StrategySpec::DimReduce { .. }
            | StrategySpec::Outer { .. }
            | StrategySpec::Partial { .. }
            | StrategySpec::DeltaWeight { .. } => {}
        }
        Ok(())
    }

    /// `sparse_exchange_with`: the vote (largest selection, and random-k's
    /// shared-index fingerprint), then the values alone (shared indices),
    /// a dense all-reduce (when sparse costs more), or the all-gather of
    /// every rank's payload. Every rank keeps `kept` entries.
    fn sparse(&self, kept: usize, shared_indices: bool, out: &mut Vec<CollectiveCall>) {
        let (n, world) = (self.n, self.world);
        out.push(CollectiveCall::all_reduce(24, world));
        if shared_indices && world > 1 {
            out.push(CollectiveCall::all_reduce(4 * kept, world));
        } else if sparse_costs_more(kept, n, world) {
            out.push(CollectiveCall::all_reduce(4 * n, world));
        } else {
            let payload = wire::encoded_len(kept, DType::F32);
            let total = payload * world;
            out.push(CollectiveCall::new(
                Collective::AllGatherVaried {
                    largest: payload,
                    total,
                },
                world,
                Traffic::all_gather(payload, total, world).sent,
            ));
        }
    }

    /// `PowerSgd::all_reduce`: the uncompressed tensors and every matrix's
    /// `P` (rows x rank) in one all-reduce, then every `Q` (cols x rank)
    /// in another if there is a matrix.
    fn powersgd(&self, rank: usize, min_rate: f64, out: &mut Vec<CollectiveCall>) {
        let (mut first, mut second) = (0usize, 0usize);
        for dims in self.shapes {
            match lowrank::matrix_shape(dims, rank, min_rate) {
                Some((rows, cols)) => {
                    first += rows * rank;
                    second += cols * rank;
                }
                None => first += dims.iter().product::<usize>(),
            }
        }
        out.push(CollectiveCall::all_reduce(4 * first, self.world));
        if second > 0 {
            out.push(CollectiveCall::all_reduce(4 * second, self.world));
        }
    }

    /// `QuantizedAllReduce::all_reduce_in` from rank 0: a barrier; in
    /// round `s`, chunk `s` (quantized) to rank `s` while rank `W - s`'s
    /// copy of chunk 0 arrives; the all-gather of the averaged chunks,
    /// quantized again.
    fn quantized(&self, q: Quantizer, out: &mut Vec<CollectiveCall>) {
        let (n, world) = (self.n, self.world);
        out.push(CollectiveCall::new(Collective::Barrier, world, 0));
        let enc = |c: usize| q.encoded_len(chunk_range(n, world, c).len());
        // Chunk 0 is the largest: what rank 0 receives in every round, and
        // what bounds each round's time.
        let own = enc(0);
        for s in 1..world {
            out.push(CollectiveCall::new(
                Collective::SendRecv { bytes: own },
                world,
                enc(s) as u64,
            ));
        }
        let total: usize = (0..world).map(enc).sum();
        out.push(CollectiveCall::new(
            Collective::AllGatherVaried {
                largest: own,
                total,
            },
            world,
            (own * (world - 1)) as u64,
        ));
    }

    /// `AdaSum::combine` (flat) from rank 0: the length agreement; the
    /// fold of ranks beyond the largest power of two `P`; at each level `d`
    /// = 1, 2, .. P/2 half of the current piece to rank `d` and the
    /// partials' all-reduce (three f64 per tensor) in the group of `2 d`;
    /// the gathering in reverse; the unfold.
    fn adasum(&self, out: &mut Vec<CollectiveCall>) {
        let (n, world) = (self.n, self.world);
        out.push(CollectiveCall::all_reduce(16, world));
        if world <= 1 {
            return;
        }
        let pow2 = 1usize << (usize::BITS - 1 - world.leading_zeros());
        let folded = world > pow2;
        if folded {
            // Rank P's vector arrives; rank 0 sends nothing yet.
            out.push(CollectiveCall::new(
                Collective::SendRecv { bytes: 4 * n },
                world,
                0,
            ));
        }
        // Rank 0 is the lower rank at every level: it keeps the first half.
        let mut pieces = Vec::new();
        let (mut piece, mut d) = (n, 1usize);
        while d < pow2 {
            let keep = piece / 2;
            let give = piece - keep;
            out.push(CollectiveCall::new(
                Collective::SendRecv { bytes: 4 * give },
                2 * d,
                (4 * give) as u64,
            ));
            out.push(CollectiveCall::all_reduce(24 * self.tensors, 2 * d));
            pieces.push((keep, give, 2 * d));
            piece = keep;
            d *= 2;
        }
        for &(keep, give, ranks) in pieces.iter().rev() {
            // Sends its kept piece, receives the partner's (the larger).
            out.push(CollectiveCall::new(
                Collective::SendRecv { bytes: 4 * give },
                ranks,
                (4 * keep) as u64,
            ));
        }
        if folded {
            out.push(CollectiveCall::new(
                Collective::SendRecv { bytes: 4 * n },
                world,
                (4 * n) as u64,
            ));
        }
    }
}

#[cfg(test)]
mod tests;
