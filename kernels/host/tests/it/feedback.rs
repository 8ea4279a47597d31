//! `kernels/cuda/feedback.cu` on the CPU against gradwire-compress's error
//! feedback (`ErrorFeedback`) and scatter-add (`SparseVec::scatter_add`,
//! `wire::scatter_add`).
//!
//! Each kernel runs on the grid its launcher in
//! `gradwire-compress/src/cuda/kernels/feedback.rs` computes (all are
//! grid-stride launches, `Blocks::Over`), in both thread orders, and the
//! steps of `CudaErrorFeedback` (`gradwire-compress/src/cuda/cuda.rs`) run as it
//! sequences them: the gradient's refusal (`first_non_finite_f32`),
//! `ef_accumulate_f32` or `ef_accumulate_momentum_f32` with the reset on
//! overflow, the selection (threshold, top-k, sampled top-k: the select.cu
//! pipelines of `cuda/kernels/select.rs`) and `ef_zero_selected`; or the accumulation and
//! `ef_cast_f32_<f16|bf16>`. After every step the sent entries, the cast
//! payload, the residual, the velocity and the error (index and value) must
//! equal the CPU's bitwise, on `LENGTHS`, with subnormals, ±0, overflow to
//! infinity and non-finite gradients. The cast runs with the residual and
//! the payload at aligned addresses and one element past them (the
//! kernel's four-at-a-time and one-at-a-time paths). Scatter-add is bitwise
//! the CPU's for f32, f16 and bf16 values (the half values are the wire
//! payload's bytes), subnormal sums included; a NaN result is compared as a
//! NaN, not by its payload, which the GPU's `add.f32` does not keep.

use gradwire_compress::cast::CastOptions;
use gradwire_compress::wire::{self, CodecId};
use gradwire_compress::{CompressError, ErrorFeedback, ErrorFeedbackState, SparseCodec, SparseVec};
use gradwire_kernels::{Blocks, Kernel, feedback as k};
use gradwire_kernels_host::{Arg, Element};
use gradwire_tensor::DType;
use half::{bf16, f16};

use crate::common::{LENGTHS, floats};
use crate::select::{
    Codec, NO_INDEX, Selected, assert_bits, assert_selected, bits_of, both, cpu_result, f32s,
    f32s_mut, first_non_finite, select_finite,
};

/// An error-feedback step's refusal: the index and the value's bits.
type Refused = (usize, u32);

/// `CudaErrorFeedback`'s memory on the device (floats as bits), its buffers
/// staged `offset` elements past an aligned address.
#[derive(Debug, Clone)]
struct Memory {
    residual: Vec<u32>,
    momentum: Option<(f32, Vec<u32>)>,
    steps: u64,
    offset: usize,
}

impl Memory {
    fn from_state(state: &ErrorFeedbackState, offset: usize) -> Memory {
        Memory {
            residual: bits_of(&state.residual),
            momentum: state
                .momentum
                .as_ref()
                .map(|(mu, velocity)| (*mu, bits_of(velocity))),
            steps: state.steps,
            offset,
        }
    }

    /// `CudaErrorFeedback::reset` (zero-fills).
    fn reset(&mut self) {
        self.residual.iter_mut().for_each(|r| *r = 0);
        if let Some((_, velocity)) = &mut self.momentum {
            velocity.iter_mut().for_each(|u| *u = 0);
        }
    }

    /// `CudaErrorFeedback::accumulate`: the refusal, then
    /// `feedback::accumulate` and the reset on overflow.
    fn accumulate(&mut self, case: &str, grad: &[u32]) -> Result<(), Refused> {
        if let Some(index) = first_non_finite(case, grad, 0) {
            return Err((index, grad[index]));
        }
        let n = self.residual.len();
        if n == 0 {
            return Ok(());
        }
        let offset = self.offset;
        let first = match &mut self.momentum {
            None => {
                let (residual, _, first) = both(
                    case,
                    &k::EF_ACCUMULATE_F32,
                    Blocks::Over(n),
                    (
                        std::mem::take(&mut self.residual),
                        grad.to_vec(),
                        vec![NO_INDEX],
                    ),
                    |(residual, grad, first)| {
                        vec![
                            Arg::write_at(f32s_mut(residual), offset),
                            Arg::read(f32s(grad)),
                            Arg::len(n),
                            Arg::write(first),
                        ]
                    },
                );
                self.residual = residual;
                first[0]
            }
            Some((mu, velocity)) => {
                let mu = *mu;
                let (residual, v, _, first) = both(
                    case,
                    &k::EF_ACCUMULATE_MOMENTUM_F32,
                    Blocks::Over(n),
                    (
                        std::mem::take(&mut self.residual),
                        std::mem::take(velocity),
                        grad.to_vec(),
                        vec![NO_INDEX],
                    ),
                    |(residual, velocity, grad, first)| {
                        vec![
                            Arg::write_at(f32s_mut(residual), offset),
                            Arg::write_at(f32s_mut(velocity), offset),
                            Arg::read(f32s(grad)),
                            Arg::len(n),
                            Arg::value(mu),
                            Arg::write(first),
                        ]
                    },
                );
                self.residual = residual;
                *velocity = v;
                first[0]
            }
        };
        if first != NO_INDEX {
            let index = usize::try_from(first).expect("an index");
            let value = self.residual[index];
            self.reset();
            return Err((index, value));
        }
        Ok(())
    }

    /// `feedback::zero_selected`.
    fn zero_selected(&mut self, case: &str, indices: &[u32]) {
        let (n, count) = (self.residual.len(), indices.len());
        if count == 0 {
            return;
        }
        let offset = self.offset;
        let velocity = self.momentum.as_mut().map(|(_, v)| std::mem::take(v));
        let (residual, velocity, _) = both(
            case,
            &k::EF_ZERO_SELECTED,
            Blocks::Over(count),
            (
                std::mem::take(&mut self.residual),
                velocity,
                indices.to_vec(),
            ),
            |(residual, velocity, indices)| {
                vec![
                    Arg::write_at(f32s_mut(residual), offset),
                    match velocity {
                        Some(v) => Arg::write_at(f32s_mut(v), offset),
                        None => Arg::Null,
                    },
                    Arg::len(n),
                    Arg::read(indices.as_slice()),
                    Arg::len(count),
                ]
            },
        );
        self.residual = residual;
        if let (Some((_, v)), Some(velocity)) = (&mut self.momentum, velocity) {
            *v = velocity;
        }
    }

    /// `CudaErrorFeedback::compress`.
    fn compress(&mut self, case: &str, grad: &[u32], codec: Codec) -> Result<Selected, Refused> {
        self.accumulate(case, grad)?;
        let sent = select_finite(case, &self.residual, self.offset, codec);
        self.zero_selected(case, &sent.indices);
        self.steps += 1;
        Ok(sent)
    }

    /// `CudaErrorFeedback::compress_cast` into f16 or bf16 (`kernel`), the
    /// payload `dst` staged `dst_offset` elements past an aligned address.
    fn compress_cast<H: Element>(
        &mut self,
        case: &str,
        grad: &[u32],
        kernel: &Kernel,
        dst: &mut Vec<u16>,
        dst_offset: usize,
        opts: &CastOptions,
    ) -> Result<(), Refused> {
        self.accumulate(case, grad)?;
        let n = self.residual.len();
        if n > 0 {
            let (has_clip, clip) = (i32::from(opts.clip.is_some()), opts.clip.unwrap_or(0.0));
            let (scale, inverse) = (opts.scale, 1.0f32 / opts.scale);
            let offset = self.offset;
            let (residual, sent) = both(
                case,
                kernel,
                Blocks::Over(n),
                (std::mem::take(&mut self.residual), std::mem::take(dst)),
                |(residual, dst)| {
                    vec![
                        Arg::write_at(f32s_mut(residual), offset),
                        Arg::write_at(bytemuck::cast_slice_mut::<u16, H>(dst), dst_offset),
                        Arg::len(n),
                        Arg::value(has_clip),
                        Arg::value(clip),
                        Arg::value(scale),
                        Arg::value(inverse),
                    ]
                },
            );
            self.residual = residual;
            *dst = sent;
        }
        self.steps += 1;
        Ok(())
    }
}

/// The CPU's refusal as (index, value bits).
fn refused(case: &str, error: CompressError) -> Refused {
    match error {
        CompressError::NonFinite { index, value } => (index, value.to_bits()),
        e => panic!("{case}: the CPU fails: {e}"),
    }
}

/// Asserts the device memory is the CPU's, bitwise.
fn assert_memory(case: &str, device: &Memory, cpu: &ErrorFeedback) {
    let state = cpu.state();
    assert_bits(
        case,
        "residual",
        &device.residual,
        &bits_of(&state.residual),
    );
    match (&device.momentum, &state.momentum) {
        (None, None) => {}
        (Some((_, v)), Some((_, u))) => assert_bits(case, "velocity", v, &bits_of(u)),
        _ => panic!("{case}: a momentum on one side only"),
    }
    assert_eq!(device.steps, state.steps, "{case}: steps");
}

/// A memory to start from: finite residual (and velocity) of every class.
fn start(n: usize, mu: Option<f32>, seed: u64) -> ErrorFeedbackState {
    ErrorFeedbackState {
        residual: floats(n, seed, false),
        momentum: mu.map(|mu| (mu, floats(n, seed + 1, false))),
        steps: 3,
    }
}

/// The gradients of a sequence of steps: finite, one holding infinities or
/// NaNs (refused, nothing changes), finite again, and -0 (the accumulator
/// unchanged, -0 entries included).
fn gradients(n: usize, seed: u64) -> Vec<(&'static str, Vec<f32>)> {
    let mut special = floats(n, seed + 2, true);
    if let Some(last) = special.last_mut() {
        *last = f32::NAN;
    }
    vec![
        ("finite", floats(n, seed, false)),
        ("non-finite", special),
        ("finite", floats(n, seed + 3, false)),
        ("-0", vec![-0.0; n]),
    ]
}

/// A memory that overflows: ±f32::MAX in the residual where the gradient
/// adds the same, at two places (the first is reported), then a finite
/// step from the reset memory.
fn overflow(n: usize, mu: Option<f32>, seed: u64) -> (ErrorFeedbackState, Vec<Vec<f32>>) {
    let mut state = start(n, mu, seed);
    let mut grad = floats(n, seed + 4, false);
    for (j, sign) in [(n / 2, -1.0f32), (n - 1, 1.0)] {
        state.residual[j] = sign * f32::MAX;
        grad[j] = sign * f32::MAX;
        if let Some((_, velocity)) = &mut state.momentum {
            velocity[j] = 0.0;
        }
    }
    (state, vec![grad, floats(n, seed + 5, false)])
}

#[test]
fn sparse_steps_match_the_cpus_error_feedback() {
    for &n in LENGTHS {
        let mut codecs = vec![SparseCodec::Threshold(0.75), SparseCodec::TopK(0.1)];
        if n >= 4096 {
            codecs.push(SparseCodec::SampledTopK(0.05));
        }
        for codec in codecs {
            let device_codec = match codec {
                SparseCodec::Threshold(t) => Codec::Threshold(t),
                SparseCodec::TopK(ratio) => Codec::TopK(
                    gradwire_compress::select::count_for_ratio(ratio, n).expect("a ratio"),
                ),
                SparseCodec::SampledTopK(ratio) => Codec::SampledTopK(ratio),
                SparseCodec::RandomK { .. } => unreachable!("no device form"),
            };
            for mu in [None, Some(0.9f32)] {
                let seed = 0xfeed + n as u64;
                let mut runs = vec![("from a memory", start(n, mu, seed), gradients(n, seed + 10))];
                if n >= 2 {
                    let (state, grads) = overflow(n, mu, seed + 20);
                    let names = ["overflowing", "finite, after the reset"];
                    let grads = names.into_iter().zip(grads).collect();
                    runs.push(("overflowing", state, grads));
                }
                for (run, state, grads) in runs {
                    let mut cpu = ErrorFeedback::from_state(state.clone()).expect("a valid state");
                    let mut device = Memory::from_state(&state, 0);
                    for (step, (input, grad)) in grads.iter().enumerate() {
                        let case = format!(
                            "error feedback {codec:?}, momentum {mu:?}, n={n}, f32, {run}, \
                             step {step} ({input} gradient)"
                        );
                        let want = cpu
                            .compress(grad, &codec)
                            .map_err(|e| refused(&case, e))
                            .map(|sent| cpu_result(Ok(sent), n, &case).expect("selected"));
                        if n > 0 && matches!(*input, "non-finite" | "overflowing") {
                            assert!(want.is_err(), "{case}: the CPU refuses the step");
                        }
                        let got = device.compress(&case, &bits_of(grad), device_codec);
                        match (&got, &want) {
                            (Ok(got), Ok(want)) => assert_selected(&case, got, want),
                            (got, want) => assert_eq!(got, want, "{case}: the step's result"),
                        }
                        assert_memory(&case, &device, &cpu);
                    }
                }
            }
        }
    }
}

#[test]
fn cast_steps_match_the_cpus_error_feedback() {
    let options = [
        CastOptions::default(),
        CastOptions {
            clip: Some(1.0),
            scale: 1.0,
        },
        CastOptions {
            clip: Some(0.0),
            scale: 2.0,
        },
        CastOptions {
            clip: None,
            scale: 1.0 / 1024.0,
        },
        // f16 overflows: the residual becomes infinite, and the next step
        // overflows and resets.
        CastOptions {
            clip: None,
            scale: 65536.0,
        },
        CastOptions {
            clip: Some(3.0e38),
            scale: 0.3,
        },
    ];
    // (residual, payload) offsets: aligned, then each or both one past.
    let offsets = [(0, 0), (1, 1), (0, 1), (1, 0)];
    for &n in LENGTHS {
        for (dtype, kernel) in [("f16", &k::EF_CAST_F32_F16), ("bf16", &k::EF_CAST_F32_BF16)] {
            for (o, opts) in options.iter().enumerate() {
                for (residual_offset, dst_offset) in offsets {
                    let seed = 0xca57 + n as u64 + 7 * o as u64;
                    let state = start(n, None, seed);
                    let mut cpu = ErrorFeedback::from_state(state.clone()).expect("a valid state");
                    let mut device = Memory::from_state(&state, residual_offset);
                    let mut cpu_dst = vec![0x7e5a_u16; n];
                    let mut device_dst = cpu_dst.clone();
                    for (step, (input, grad)) in gradients(n, seed + 1).iter().enumerate() {
                        let before = device.residual.clone();
                        let case = format!(
                            "{}, {opts:?}, n={n}, {dtype}, offsets (residual {residual_offset}, \
                             payload {dst_offset}), step {step} ({input} gradient)",
                            kernel.name()
                        );
                        let want = match dtype {
                            "f16" => cpu.compress_cast(
                                grad,
                                bytemuck::cast_slice_mut::<u16, f16>(&mut cpu_dst),
                                opts,
                            ),
                            _ => cpu.compress_cast(
                                grad,
                                bytemuck::cast_slice_mut::<u16, bf16>(&mut cpu_dst),
                                opts,
                            ),
                        }
                        .map_err(|e| refused(&case, e));
                        let bits = bits_of(grad);
                        let got = match dtype {
                            "f16" => device.compress_cast::<f16>(
                                &case,
                                &bits,
                                kernel,
                                &mut device_dst,
                                dst_offset,
                                opts,
                            ),
                            _ => device.compress_cast::<bf16>(
                                &case,
                                &bits,
                                kernel,
                                &mut device_dst,
                                dst_offset,
                                opts,
                            ),
                        };
                        assert_eq!(got, want, "{case}: the step's result");
                        if let Some(j) = (0..n).find(|&j| device_dst[j] != cpu_dst[j]) {
                            panic!(
                                "{case}: payload[{j}]: device {:#06x}, CPU {:#06x} (residual \
                                 before the step {:#010x}, gradient {:#010x})",
                                device_dst[j],
                                cpu_dst[j],
                                before[j],
                                grad[j].to_bits()
                            );
                        }
                        assert_memory(&case, &device, &cpu);
                    }
                }
            }
        }
    }
}

#[test]
fn zero_selected_ignores_indices_past_the_end() {
    // The launcher's indices are a DeviceSparse's, below n; the kernel
    // still ignores one at or past n (its documented contract), as the
    // CPU's `get_mut` does.
    for &n in LENGTHS {
        let indices: Vec<u32> = (0..n as u32)
            .step_by(3)
            .chain([n as u32, u32::MAX])
            .collect();
        for with_velocity in [false, true] {
            let case = format!("ef_zero_selected, n={n}, f32, velocity {with_velocity}");
            let residual = floats(n, 0x2e + n as u64, false);
            let velocity = floats(n, 0x2f + n as u64, false);
            let mut want_r = residual.clone();
            let mut want_v = velocity.clone();
            for &i in &indices {
                if let Some(r) = want_r.get_mut(i as usize) {
                    *r = 0.0;
                }
                if let Some(u) = want_v.get_mut(i as usize) {
                    *u = 0.0;
                }
            }
            let mut device = Memory {
                residual: bits_of(&residual),
                momentum: with_velocity.then(|| (0.5, bits_of(&velocity))),
                steps: 0,
                offset: 0,
            };
            device.zero_selected(&case, &indices);
            assert_bits(&case, "residual", &device.residual, &bits_of(&want_r));
            if let Some((_, v)) = &device.momentum {
                assert_bits(&case, "velocity", v, &bits_of(&want_v));
            }
        }
    }
}

/// Scatter-add's values in the dtype the kernel reads.
#[derive(Debug, Clone, PartialEq)]
enum Values {
    F32(Vec<u32>),
    F16(Vec<u16>),
    Bf16(Vec<u16>),
}

/// `feedback::scatter_add_values`: `dense[index[j]] += widen(value[j])`.
fn device_scatter_add(case: &str, dense: &[u32], indices: &[u32], values: Values) -> Vec<u32> {
    let (n, count) = (dense.len(), indices.len());
    if count == 0 {
        return dense.to_vec();
    }
    let kernel = match values {
        Values::F32(_) => &k::SCATTER_ADD_F32,
        Values::F16(_) => &k::SCATTER_ADD_F16,
        Values::Bf16(_) => &k::SCATTER_ADD_BF16,
    };
    let (dense, ..) = both(
        case,
        kernel,
        Blocks::Over(count),
        (dense.to_vec(), indices.to_vec(), values),
        |(dense, indices, values)| {
            vec![
                Arg::write(f32s_mut(dense)),
                Arg::len(n),
                Arg::read(indices.as_slice()),
                match values {
                    Values::F32(v) => Arg::read(f32s(v)),
                    Values::F16(v) => Arg::read(bytemuck::cast_slice::<u16, f16>(v)),
                    Values::Bf16(v) => Arg::read(bytemuck::cast_slice::<u16, bf16>(v)),
                },
                Arg::len(count),
            ]
        },
    );
    dense
}

#[test]
fn scatter_add_matches_the_cpu_bitwise() {
    use rand::{Rng, SeedableRng};
    for &n in LENGTHS {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5ca7 + n as u64);
        let all: Vec<u32> = (0..n as u32).collect();
        let every_third: Vec<u32> = (0..n as u32).step_by(3).collect();
        let random: Vec<u32> = (0..n as u32).filter(|_| rng.random::<bool>()).collect();
        let index_sets = [
            ("none", Vec::new()),
            ("all", all),
            ("every third", every_third),
            ("random", random),
        ];
        for (set, indices) in &index_sets {
            let count = indices.len();
            let mut dense = floats(n, 0xde + n as u64, false);
            let mut values = floats(count, 0xfa + n as u64, true);
            // Subnormal sums, which a float atomic would flush to zero.
            if let (Some(&i), Some(v)) = (indices.first(), values.first_mut()) {
                dense[i as usize] = f32::from_bits(0x10);
                *v = f32::from_bits(0x20);
            }
            let sparse = SparseVec::new(n, indices.clone(), values).expect("a valid list");
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let case = format!("scatter_add_{dtype:?}, n={n}, {dtype:?}, {set} indices");
                let mut want = dense.clone();
                let payload = wire::encode(&sparse, CodecId::TopK, dtype);
                wire::scatter_add(&payload, &mut want).expect("a valid payload");
                if dtype == DType::F32 {
                    let mut direct = dense.clone();
                    sparse.scatter_add(&mut direct).expect("the dense length");
                    assert_eq!(
                        bits_of(&direct),
                        bits_of(&want),
                        "{case}: the CPU's two paths"
                    );
                }
                // The values as the receiver uploads them: the payload's last
                // `count` values.
                let bytes = &payload[payload.len() - count * dtype.size_in_bytes()..];
                let le16 = || {
                    bytes
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                };
                let values = match dtype {
                    DType::F32 => Values::F32(
                        bytes
                            .chunks_exact(4)
                            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                            .collect(),
                    ),
                    DType::F16 => Values::F16(le16().collect()),
                    DType::BF16 => Values::Bf16(le16().collect()),
                };
                let got = device_scatter_add(&case, &bits_of(&dense), indices, values);
                let want = bits_of(&want);
                for i in 0..n {
                    let (g, w) = (f32::from_bits(got[i]), f32::from_bits(want[i]));
                    assert!(
                        got[i] == want[i] || (g.is_nan() && w.is_nan()),
                        "{case}: dense[{i}]: device {:#010x} ({g:e}), CPU {:#010x} ({w:e})",
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }
}
