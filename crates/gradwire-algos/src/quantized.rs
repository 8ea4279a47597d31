//! Quantized all-reduce: every entry crosses the wire in 1 or 8 bits, both
//! ways, with the scalable pattern of DeepSpeed's compressed all-reduce
//! (1-bit Adam) and Bagua's ByteGrad (a reduce-scatter and an all-gather,
//! each of compressed chunks):
//!
//! 1. each rank packs its tensors, optionally folds them into a local
//!    momentum (`m = mu m + g`, sent instead of `g`: dist-EF-SGDM, Zheng et
//!    al., NeurIPS 2019, as 1-bit Adam compresses Adam's momentum), adds its
//!    worker residual (error feedback), splits the vector into W chunks and
//!    quantizes each (the worker residual keeps what quantization lost);
//! 2. chunk `c` of every rank goes to rank `c` (W - 1 paired exchanges);
//! 3. rank `c` decodes the W copies of its chunk, sums them in rank order,
//!    averages, adds its server residual, and quantizes the average again
//!    (the server residual keeps that loss);
//! 4. an all-gather of the quantized averages; every rank decodes them all.
//!
//! Each rank sends and receives about `2 (W - 1) / W` payloads, as a ring
//! all-reduce does with f32: 32 times fewer bytes at 1 bit, about 4 times
//! fewer at 8 bits, at any world size (an all-gather of every rank's payload
//! would grow with W). Every rank holds the same bits at the end: each chunk
//! is averaged by one rank only.
//!
//! State is kept per entry of a *full* layout ([`QuantizedAllReduce::all_reduce_in`]:
//! each tensor's range in it), so that when only some of a bucket's tensors
//! take part in a step, each keeps its own residual and momentum. The
//! server residual follows the chunks of what was sent; when the set of
//! tensors changes, rank `c` folds its server residual (times W) into its
//! worker residual at the entries it belonged to, so no mass is lost.
//!
//! Failure model ([`crate::fault`]): this rank's checks and quantization
//! (NaN, settings, tensor kinds) come before a barrier that carries a local
//! failure to every rank; the exchanges of step 2 cannot fail locally, and
//! a failure of step 3 (a corrupt payload) is posted in place of the
//! all-gather. On an error the residuals may have changed: callers that must
//! undo a failed step keep a copy ([`QuantizedState`]).

use crate::error::{AlgoError, Result};
use crate::fault::prepare;
use crate::handle::Traffic;
use gradwire_comm::CommError;
use gradwire_comm::{Communicator, Gathered, chunk_range};
use gradwire_compress::Quantizer;
use gradwire_tensor::{Tensor, flat};
use std::ops::Range;

mod strategy;

/// The error-feedback residuals (and momentum) of a quantized all-reduce.
#[derive(Debug, Default, PartialEq)]
pub struct QuantizedState {
    /// This rank's momentum (the full layout's length), empty without
    /// momentum or before the first step.
    pub momentum: Vec<f32>,
    /// This rank's worker residual (the full layout's length), empty
    /// before the first step.
    pub worker: Vec<f32>,
    /// This rank's server residual (the length of the chunk it averages),
    /// empty before the first step.
    pub server: Vec<f32>,
    /// The ranges of the full layout that were sent at the last step, in
    /// order (what the server residual's chunk refers to).
    pub layout: Vec<Range<usize>>,
}

impl Clone for QuantizedState {
    fn clone(&self) -> Self {
        QuantizedState {
            momentum: self.momentum.clone(),
            worker: self.worker.clone(),
            server: self.server.clone(),
            layout: self.layout.clone(),
        }
    }

    // Reuses the vectors' memory: a copy kept every step allocates nothing.
    fn clone_from(&mut self, source: &Self) {
        self.momentum.clone_from(&source.momentum);
        self.worker.clone_from(&source.worker);
        self.server.clone_from(&source.server);
        self.layout.clone_from(&source.layout);
    }
}

/// A quantized all-reduce with its residuals and buffers (reused from call
/// to call: no allocation once warm).
#[derive(Debug)]
pub struct QuantizedAllReduce {
    quantizer: Quantizer,
    error_feedback: bool,
    /// The momentum sent instead of the tensors, if any.
    momentum: Option<Momentum>,
    pub(crate) state: QuantizedState,
    /// The packed tensors (then the averaged result).
    flat: Vec<f32>,
    /// The decoded chunks of this rank (what the workers' residuals lose).
    decoded: Vec<f32>,
    /// The tensors' ranges of a call without a layout of its own.
    ranges: Vec<Range<usize>>,
    /// This rank's quantized chunks, back to back: chunk c at
    /// `offsets[c]..offsets[c + 1]`.
    sent: Vec<u8>,
    offsets: Vec<usize>,
    /// Every rank's quantized copy of this rank's chunk.
    received: Vec<u8>,
    /// The average of this rank's chunk.
    average: Vec<f32>,
    /// Its quantized form.
    reduced: Vec<u8>,
    /// Every rank's quantized average.
    gathered: Gathered<u8>,
    /// Every rank's length, agreed before the exchanges.
    lens: Vec<u64>,
    /// As a [`crate::Strategy`]: the state before this step's combination.
    pub(crate) before: crate::strategy::BeforeStep<QuantizedState>,
    /// As a [`crate::Strategy`]: the written parameters' ranges of the
    /// bucket.
    pub(crate) written: Vec<Range<usize>>,
}

impl QuantizedAllReduce {
    /// An all-reduce through `quantizer` (checked), with error feedback on
    /// both sides when `error_feedback` (needed by the biased 1-bit sign).
    pub fn new(quantizer: Quantizer, error_feedback: bool) -> Result<Self> {
        quantizer.validate()?;
        Ok(QuantizedAllReduce {
            quantizer,
            error_feedback,
            momentum: None,
            state: QuantizedState::default(),
            flat: Vec::new(),
            decoded: Vec::new(),
            ranges: Vec::new(),
            sent: Vec::new(),
            offsets: Vec::new(),
            received: Vec::new(),
            average: Vec::new(),
            reduced: Vec::new(),
            gathered: Gathered::default(),
            lens: Vec::new(),
            before: Default::default(),
            written: Vec::new(),
        })
    }

    /// The same, sending a local momentum `m = mu m + g` instead of the
    /// tensors (`mu` in `[0, 1)`): the result is then the average momentum,
    /// to be applied by an optimizer without momentum of its own. With a
    /// biased quantizer (the 1-bit sign) this is what keeps momentum SGD
    /// accurate (dist-EF-SGDM); momentum applied after the exchange
    /// amplifies the error feedback's delayed entries instead.
    pub fn with_momentum(mut self, mu: f32) -> Result<Self> {
        if !(0.0..1.0).contains(&mu) {
            return Err(AlgoError::InvalidArgument(format!(
                "the local momentum must be in [0, 1), got {mu}"
            )));
        }
        self.momentum = Some(Momentum::Local(mu));
        Ok(self)
    }

    /// The same, sending Adam's first moment `m = beta1 m + (1 - beta1) g`,
    /// which every rank then replaces by the exchanged average (1-bit
    /// Adam's compression stage: the result is the average momentum, and
    /// every rank's `m` is that average).
    pub fn with_adam_momentum(mut self, beta1: f32) -> Result<Self> {
        if !(0.0..1.0).contains(&beta1) {
            return Err(AlgoError::InvalidArgument(format!(
                "beta1 must be in [0, 1), got {beta1}"
            )));
        }
        self.momentum = Some(Momentum::Adam(beta1));
        Ok(self)
    }

    /// The quantizer.
    pub fn quantizer(&self) -> Quantizer {
        self.quantizer
    }

    /// The residuals kept between calls.
    pub fn state(&self) -> &QuantizedState {
        &self.state
    }

    /// The residuals, to restore (a checkpoint, or a copy taken before a
    /// step that failed).
    pub fn state_mut(&mut self) -> &mut QuantizedState {
        &mut self.state
    }

    /// Averages `tensors` (f32, in host memory) across the ranks of `comm`
    /// in place (see the module docs), their state laid out back to back.
    /// `step` (the same on every rank) picks QSGD's random streams. Returns
    /// the bytes moved.
    pub fn all_reduce<C: Communicator>(
        &mut self,
        comm: &C,
        tensors: &mut [Tensor],
        step: u64,
    ) -> Result<Traffic> {
        let mut ranges = std::mem::take(&mut self.ranges);
        ranges.clear();
        let mut at = 0;
        for t in tensors.iter() {
            ranges.push(at..at + t.len());
            at += t.len();
        }
        let result = self.all_reduce_in(comm, tensors, &ranges, at, step);
        self.ranges = ranges;
        result
    }

    /// [`QuantizedAllReduce::all_reduce`] of some of the tensors of a full
    /// layout of `full_len` entries: tensor `i` is `ranges[i]` of it
    /// (increasing, disjoint), which is where its residual and momentum
    /// are kept.
    pub fn all_reduce_in<C: Communicator>(
        &mut self,
        comm: &C,
        tensors: &mut [Tensor],
        ranges: &[Range<usize>],
        full_len: usize,
        step: u64,
    ) -> Result<Traffic> {
        let (world, rank) = (comm.world_size(), comm.rank());
        let n = prepare(comm, || {
            self.check_layout(tensors, ranges, full_len)?;
            self.fold_server_residual(ranges, world, rank);
            self.quantize_chunks(tensors, ranges, world, rank, step)
        })?;
        // Carries a failure of this rank's preparation to every rank (the
        // paired exchanges cannot), and agrees on the length: chunks of
        // other sizes would pair sends and receives that never match.
        self.lens.clear();
        self.lens.resize(world, 0);
        comm.all_gather(&[n as u64], &mut self.lens)?;
        if self.lens.iter().any(|&len| len != self.lens[0]) {
            // The same lengths on every rank: the same error everywhere.
            return Err(AlgoError::Comm(CommError::Mismatch {
                detail: format!("a quantized all-reduce of {:?} entries by rank", self.lens),
            }));
        }
        let q = self.quantizer;
        let own = chunk_range(n, world, rank);
        let own_len = q.encoded_len(own.len());
        // Step 2: chunk c to rank c; rank c - s's copy of ours, from it.
        self.received.clear();
        self.received.resize(world * own_len, 0);
        let mut traffic = Traffic::default();
        for s in 0..world {
            let (dest, src) = ((rank + s) % world, (rank + world - s) % world);
            let send = &self.sent[self.offsets[dest]..self.offsets[dest + 1]];
            let send_len = send.len();
            let recv = &mut self.received[src * own_len..(src + 1) * own_len];
            if s == 0 {
                recv.copy_from_slice(send);
            } else {
                comm.sendrecv(send, dest, recv, src)?;
                traffic.sent += send_len as u64;
                traffic.received += own_len as u64;
            }
        }
        // Step 3: this rank's chunk averaged and quantized again.
        prepare(comm, || self.reduce_own_chunk(world, rank, own.len(), step))?;
        // Step 4.
        comm.all_gather_varied_into(&self.reduced, &mut self.gathered)?;
        traffic.sent += (self.reduced.len() * (world - 1)) as u64;
        traffic.received += (self.gathered.data().len() - self.reduced.len()) as u64;
        for c in 0..world {
            let range = chunk_range(n, world, c);
            // Every rank decodes the same bytes: the same result, or the
            // same error, everywhere.
            q.decode(self.gathered.part(c), &mut self.flat[range])?;
        }
        flat::unpack_from(&self.flat[..n], tensors)?;
        if let Some(Momentum::Adam(_)) = self.momentum {
            // Every rank's first moment becomes the exchanged average.
            scatter(&self.flat[..n], ranges, &mut self.state.momentum);
        }
        self.state.layout.clear();
        self.state.layout.extend_from_slice(ranges);
        Ok(traffic)
    }

    /// The checks of a layout: one increasing, disjoint range per tensor,
    /// of its length, within `full_len`; f32 tensors in host memory.
    fn check_layout(
        &self,
        tensors: &[Tensor],
        ranges: &[Range<usize>],
        full_len: usize,
    ) -> Result<()> {
        for t in tensors {
            crate::error::require_f32_on_host("quantized all-reduce", t)?;
        }
        let mut end = 0;
        let fits = ranges.len() == tensors.len()
            && ranges.iter().zip(tensors).all(|(r, t)| {
                // `start <= end` first: a reversed range is refused, not
                // subtracted.
                let ok = r.start >= end
                    && r.start <= r.end
                    && r.end - r.start == t.len()
                    && r.end <= full_len;
                end = r.end;
                ok
            });
        if !fits {
            return Err(AlgoError::InvalidArgument(format!(
                "a layout of {} ranges in {full_len} entries does not fit {} tensors",
                ranges.len(),
                tensors.len()
            )));
        }
        Ok(())
    }

    /// When the tensors sent differ from the last step's, this rank's
    /// server residual (its chunk of what was sent then) goes into its
    /// worker residual at the entries it belonged to, times W (the worker
    /// residuals count for 1/W each in the average): nothing is lost.
    fn fold_server_residual(&mut self, ranges: &[Range<usize>], world: usize, rank: usize) {
        let state = &mut self.state;
        if state.server.is_empty() || state.layout.as_slice() == ranges {
            return;
        }
        let n_prev: usize = state.layout.iter().map(|r| r.len()).sum();
        let own = chunk_range(n_prev, world, rank);
        if state.worker.len() >= state.layout.last().map_or(0, |r| r.end)
            && own.len() == state.server.len()
        {
            let (mut packed, scale) = (0usize, world as f32);
            for r in &state.layout {
                for full in r.clone() {
                    if own.contains(&packed) {
                        state.worker[full] += scale * state.server[packed - own.start];
                    }
                    packed += 1;
                }
            }
        }
        state.server.clear();
    }

    /// Step 1: packs, folds into the momentum, adds the worker residual,
    /// quantizes every chunk into `sent`, keeps the loss (all state in the
    /// full layout). Returns the packed length.
    fn quantize_chunks(
        &mut self,
        tensors: &[Tensor],
        ranges: &[Range<usize>],
        world: usize,
        rank: usize,
        step: u64,
    ) -> Result<usize> {
        let full_len = ranges
            .last()
            .map_or(0, |r| r.end)
            .max(self.state.worker.len());
        let n = flat::pack_into(tensors, &mut self.flat)?;
        let x = &mut self.flat[..n];
        if let Some((index, &value)) = x.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(gradwire_compress::CompressError::NonFinite { index, value }.into());
        }
        let q = self.quantizer;
        if let Some(momentum) = self.momentum {
            let m = &mut self.state.momentum;
            if m.len() < full_len {
                m.resize(full_len, 0.0);
            }
            let (decay, gain) = match momentum {
                Momentum::Local(mu) => (mu, 1.0),
                Momentum::Adam(beta1) => (beta1, 1.0 - beta1),
            };
            let mut at = 0;
            for r in ranges {
                for (x, m) in x[at..at + r.len()].iter_mut().zip(&mut m[r.clone()]) {
                    *m = decay * *m + gain * *x;
                    *x = *m;
                }
                at += r.len();
            }
        }
        if self.error_feedback {
            let w = &mut self.state.worker;
            if w.len() < full_len {
                w.resize(full_len, 0.0);
            }
            let mut at = 0;
            for r in ranges {
                for (x, e) in x[at..at + r.len()].iter_mut().zip(&w[r.clone()]) {
                    *x += e;
                }
                at += r.len();
            }
        }
        // Where each chunk's payload starts in `sent` (and, last, its end).
        self.offsets.clear();
        self.offsets.push(0);
        for c in 0..world {
            let end = self.offsets[c] + q.encoded_len(chunk_range(n, world, c).len());
            self.offsets.push(end);
        }
        self.sent.clear();
        self.sent.resize(self.offsets[world], 0);
        if self.error_feedback {
            self.decoded.clear();
            self.decoded.resize(n, 0.0);
        }
        for c in 0..world {
            let range = chunk_range(n, world, c);
            let payload = &mut self.sent[self.offsets[c]..self.offsets[c + 1]];
            q.encode(&x[range.clone()], stream(step, rank, c), payload)?;
            if self.error_feedback {
                // What this chunk lost: the residual becomes x - decoded.
                let lost = &mut self.decoded[range.clone()];
                q.decode(payload, lost)?;
                for (l, v) in lost.iter_mut().zip(&x[range]) {
                    *l = v - *l;
                }
            }
        }
        if self.error_feedback {
            scatter(&self.decoded, ranges, &mut self.state.worker);
        }
        Ok(n)
    }

    /// Step 3: the average of this rank's chunk over the received copies (in
    /// rank order), the server residual added, quantized into `reduced`.
    fn reduce_own_chunk(&mut self, world: usize, rank: usize, len: usize, step: u64) -> Result<()> {
        let q = self.quantizer;
        let encoded = q.encoded_len(len);
        self.average.clear();
        self.average.resize(len, 0.0);
        for src in 0..world {
            q.decode_add(
                &self.received[src * encoded..(src + 1) * encoded],
                &mut self.average,
            )?;
        }
        let inverse = 1.0 / world as f32;
        for v in &mut self.average {
            *v *= inverse;
        }
        if self.error_feedback {
            if self.state.server.len() == len {
                for (v, r) in self.average.iter_mut().zip(&self.state.server) {
                    *v += r;
                }
            } else {
                self.state.server.clear();
                self.state.server.resize(len, 0.0);
            }
        }
        self.reduced.clear();
        self.reduced.resize(encoded, 0);
        // The server's streams follow the workers' (world of them).
        q.encode(
            &self.average,
            stream(step, world + rank, 0),
            &mut self.reduced,
        )?;
        if self.error_feedback {
            q.decode(&self.reduced, &mut self.state.server)?;
            for (r, v) in self.state.server.iter_mut().zip(&self.average) {
                *r = v - *r;
            }
        }
        Ok(())
    }
}

/// What is sent instead of the tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Momentum {
    /// `m = mu m + g`, kept by each rank (dist-EF-SGDM).
    Local(f32),
    /// `m = beta1 m + (1 - beta1) g`, replaced by the average (1-bit Adam).
    Adam(f32),
}

/// Writes `packed` (the tensors back to back) into `full` at `ranges`.
fn scatter(packed: &[f32], ranges: &[Range<usize>], full: &mut [f32]) {
    let mut at = 0;
    for r in ranges {
        if let (Some(dst), Some(src)) = (full.get_mut(r.clone()), packed.get(at..at + r.len())) {
            dst.copy_from_slice(src);
        }
        at += r.len();
    }
}

/// QSGD's random stream of `(step, who, chunk)`: distinct for every
/// encoding of a run.
fn stream(step: u64, who: usize, chunk: usize) -> u64 {
    step.wrapping_mul(0xD1B5_4A32_D192_ED03)
        ^ (who as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (chunk as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
}
