//! The device codecs (feature `cuda`) against the CPU codecs: the same
//! selections (indices and value bits), the same error-feedback memories
//! step after step, the same casts and scatter-adds, the same quantized
//! payloads (bytes) and decoded values (bits), the same refusals.
//!
//! Without a CUDA device each test prints `SKIP`; `GRADWIRE_REQUIRE_GPU=1`
//! makes a missing device a failure.

#![cfg(feature = "cuda")]

use gradwire_compress::cast::{self, CastOptions};
use gradwire_compress::cuda::{self, CudaErrorFeedback, DeviceBytes, DeviceSparse};
use gradwire_compress::quant::{QUANT_CHUNK, Quantizer};
use gradwire_compress::{CompressError, ErrorFeedback, SparseCodec, SparseVec, select};
use gradwire_tensor::cuda_backend::testing;
use gradwire_tensor::{CpuStorage, CudaStorage, DType, bf16, f16};

/// Whether device 0 is there (else `testing::device_or_skip` printed the
/// SKIP line; a missing device fails under `GRADWIRE_REQUIRE_GPU=1`).
fn device_or_skip(test: &str) -> bool {
    testing::device_or_skip(test)
        .expect("CUDA device 0")
        .is_some()
}

/// Deterministic values (splitmix64); with `levels`, magnitudes quantised
/// to that many values so that ties at the k-th magnitude are common.
fn values(n: usize, seed: u64, levels: Option<u32>) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n as u64;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let unit = (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            match levels {
                Some(l) => (unit * l as f32).round() / l as f32,
                None => unit * 2f32.powi(((z >> 8) % 16) as i32 - 8),
            }
        })
        .collect()
}

fn on_device(v: &[f32]) -> CudaStorage {
    CudaStorage::from_cpu(&CpuStorage::F32(v.to_vec()), 0).expect("to device")
}

fn host_f32(s: &CudaStorage) -> Vec<f32> {
    s.read_f32(0..s.len()).expect("to host")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn assert_same_sparse(what: &str, gpu: &DeviceSparse, cpu: &SparseVec) {
    assert_eq!(gpu.dense_len(), cpu.dense_len(), "{what}: dense length");
    let (indices, values) = gpu.to_host().expect("sparse to host");
    assert_eq!(indices, cpu.indices(), "{what}: indices");
    assert_eq!(bits(&values), bits(cpu.values()), "{what}: values");
}

const LENGTHS: [usize; 8] = [0, 1, 7, 257, 4099, 65_537, 262_147, 1_000_003];

#[test]
fn selections_match_the_cpu() {
    if !device_or_skip("selections_match_the_cpu") {
        return;
    }
    for (seed, &n) in LENGTHS.iter().enumerate() {
        for levels in [None, Some(7), Some(1000)] {
            let x = values(n, seed as u64, levels);
            let dx = on_device(&x);
            let what = |op: &str| format!("{op} n={n} levels={levels:?}");
            for t in [0.0f32, 0.01, 0.5, 0.999] {
                let cpu = select::threshold(&x, t).expect("cpu");
                let gpu = cuda::threshold(&dx, t).expect("gpu");
                assert_same_sparse(&what(&format!("threshold {t}")), &gpu, &cpu);
            }
            for ratio in [0.001, 0.01, 0.1, 0.5, 1.0] {
                let cpu = select::top_k(&x, ratio).expect("cpu");
                let gpu = cuda::top_k(&dx, ratio).expect("gpu");
                assert_same_sparse(&what(&format!("top_k {ratio}")), &gpu, &cpu);
                let cpu = select::sampled_top_k(&x, ratio).expect("cpu");
                let gpu = cuda::sampled_top_k(&dx, ratio).expect("gpu");
                assert_same_sparse(&what(&format!("sampled_top_k {ratio}")), &gpu, &cpu);
            }
            for k in [0usize, 1, n / 3, n] {
                let cpu = select::top_k_count(&x, k).expect("cpu");
                let gpu = cuda::top_k_count(&dx, k).expect("gpu");
                assert_same_sparse(&what(&format!("top_k_count {k}")), &gpu, &cpu);
            }
        }
    }
}

/// Values with an infinity at 4321 and a NaN after it, and the error every
/// codec (CPU or device) must give for them: the first one.
fn non_finite_input() -> (Vec<f32>, CompressError) {
    let mut x = values(10_007, 3, None);
    x[4321] = f32::NEG_INFINITY;
    x[9000] = f32::NAN;
    let expected = CompressError::NonFinite {
        index: 4321,
        value: f32::NEG_INFINITY,
    };
    (x, expected)
}

#[test]
fn non_finite_input_is_refused_like_the_cpu() {
    if !device_or_skip("non_finite_input_is_refused_like_the_cpu") {
        return;
    }
    let (x, expected) = non_finite_input();
    let dx = on_device(&x);
    assert_eq!(select::threshold(&x, 0.1).unwrap_err(), expected);
    assert_eq!(cuda::threshold(&dx, 0.1).unwrap_err(), expected);
    assert_eq!(cuda::top_k(&dx, 0.1).unwrap_err(), expected);
    assert_eq!(cuda::top_k_count(&dx, 0).unwrap_err(), expected);
    assert_eq!(cuda::sampled_top_k(&dx, 0.01).unwrap_err(), expected);
    // Nothing changes in a memory that refuses a gradient.
    let mut memory = CudaErrorFeedback::new(x.len(), 0).expect("memory");
    let before = memory.state().expect("state");
    assert_eq!(
        memory.compress(&dx, &SparseCodec::TopK(0.1)).unwrap_err(),
        expected
    );
    let random = SparseCodec::RandomK {
        ratio: 0.1,
        seed: 1,
    };
    let finite = on_device(&values(x.len(), 4, None));
    assert!(matches!(
        memory.compress(&finite, &random),
        Err(CompressError::InvalidArgument(_))
    ));
    assert_eq!(memory.state().expect("state"), before);
}

#[test]
fn error_feedback_steps_match_the_cpu() {
    if !device_or_skip("error_feedback_steps_match_the_cpu") {
        return;
    }
    let codecs = [
        SparseCodec::Threshold(0.3),
        SparseCodec::TopK(0.01),
        SparseCodec::SampledTopK(0.01),
    ];
    for n in [1usize, 1021, 100_003] {
        for codec in codecs {
            for mu in [None, Some(0.9f32)] {
                let (mut cpu, mut gpu) = match mu {
                    None => (ErrorFeedback::new(n), CudaErrorFeedback::new(n, 0).unwrap()),
                    Some(mu) => (
                        ErrorFeedback::with_momentum(n, mu).unwrap(),
                        CudaErrorFeedback::with_momentum(n, mu, 0).unwrap(),
                    ),
                };
                for step in 0..4u64 {
                    let g = values(n, 100 + step, None);
                    let sent_cpu = cpu.compress(&g, &codec).expect("cpu");
                    let sent_gpu = gpu.compress(&on_device(&g), &codec).expect("gpu");
                    let what = format!("{codec:?} mu={mu:?} n={n} step {step}");
                    assert_same_sparse(&what, &sent_gpu, &sent_cpu);
                    assert_eq!(gpu.state().unwrap(), cpu.state(), "{what}: memory");
                }
            }
        }
    }
}

#[test]
fn casts_with_feedback_match_the_cpu() {
    if !device_or_skip("casts_with_feedback_match_the_cpu") {
        return;
    }
    let options = [
        CastOptions::default(),
        CastOptions {
            clip: Some(0.25),
            scale: 1.0,
        },
        CastOptions {
            clip: None,
            scale: 1024.0,
        },
        CastOptions {
            clip: Some(2.0),
            scale: 0.125,
        },
    ];
    for n in [0usize, 1, 257, 65_537] {
        for opts in options {
            let x = values(n, 9, None);
            let dx = on_device(&x);
            // Plain encode.
            let mut h16 = vec![f16::ZERO; n];
            cast::encode(&x, &mut h16, &opts).unwrap();
            let mut d16 = CudaStorage::alloc_zeros(n, DType::F16, 0).unwrap();
            cuda::encode(&dx, &mut d16, &opts).unwrap();
            assert_eq!(
                d16.to_cpu().unwrap(),
                CpuStorage::F16(h16),
                "encode f16 {opts:?}"
            );
            let mut hb = vec![bf16::ZERO; n];
            cast::encode(&x, &mut hb, &opts).unwrap();
            let mut db = CudaStorage::alloc_zeros(n, DType::BF16, 0).unwrap();
            cuda::encode(&dx, &mut db, &opts).unwrap();
            assert_eq!(
                db.to_cpu().unwrap(),
                CpuStorage::BF16(hb),
                "encode bf16 {opts:?}"
            );
            // With error feedback, over a few steps, into each dtype.
            for dtype in [DType::F16, DType::BF16, DType::F32] {
                let mut cpu = ErrorFeedback::new(n);
                let mut gpu = CudaErrorFeedback::new(n, 0).unwrap();
                for step in 0..3u64 {
                    let g = values(n, 50 + step, None);
                    let mut sent = CudaStorage::alloc_zeros(n, dtype, 0).unwrap();
                    gpu.compress_cast(&on_device(&g), &mut sent, &opts).unwrap();
                    let sent_cpu = match dtype {
                        DType::F16 => {
                            let mut d = vec![f16::ZERO; n];
                            cpu.compress_cast(&g, &mut d, &opts).unwrap();
                            CpuStorage::F16(d)
                        }
                        DType::BF16 => {
                            let mut d = vec![bf16::ZERO; n];
                            cpu.compress_cast(&g, &mut d, &opts).unwrap();
                            CpuStorage::BF16(d)
                        }
                        DType::F32 => {
                            let mut d = vec![0f32; n];
                            cpu.compress_cast(&g, &mut d, &opts).unwrap();
                            CpuStorage::F32(d)
                        }
                    };
                    let what = format!("{dtype:?} {opts:?} n={n} step {step}");
                    assert_eq!(sent.to_cpu().unwrap(), sent_cpu, "{what}: sent");
                    assert_eq!(gpu.state().unwrap(), cpu.state(), "{what}: memory");
                }
            }
        }
    }
}

#[test]
fn scatter_add_matches_the_cpu() {
    if !device_or_skip("scatter_add_matches_the_cpu") {
        return;
    }
    for n in [1usize, 257, 100_003] {
        let x = values(n, 11, None);
        let sparse = select::top_k(&x, 0.05).unwrap();
        let device_sparse = cuda::top_k(&on_device(&x), 0.05).unwrap();
        let base = values(n, 12, None);
        let mut dense_cpu = base.clone();
        sparse.scatter_add(&mut dense_cpu).unwrap();
        let mut dense_gpu = on_device(&base);
        cuda::scatter_add(&device_sparse, &mut dense_gpu).unwrap();
        assert_eq!(bits(&host_f32(&dense_gpu)), bits(&dense_cpu), "n={n}");
        // From host indices (a decoded payload) too.
        let values_on_device = on_device(sparse.values());
        let from_host =
            DeviceSparse::from_host_indices(n, sparse.indices(), values_on_device).unwrap();
        let mut again = on_device(&base);
        cuda::scatter_add(&from_host, &mut again).unwrap();
        assert_eq!(
            bits(&host_f32(&again)),
            bits(&dense_cpu),
            "n={n} from host indices"
        );
    }
    // Unsorted host indices are refused.
    let values_on_device = on_device(&[1.0, 2.0]);
    assert!(DeviceSparse::from_host_indices(4, &[2, 1], values_on_device).is_err());
}

const QUANT_LENGTHS: [usize; 8] = [0, 1, 7, 511, 512, 513, 4099, 1_000_003];

fn quantizers() -> [Quantizer; 5] {
    [
        Quantizer::Sign,
        Quantizer::Qsgd { levels: 1, seed: 7 },
        Quantizer::Qsgd {
            levels: 7,
            seed: 42,
        },
        Quantizer::Qsgd {
            levels: 127,
            seed: u64::MAX,
        },
        Quantizer::MinMaxU8,
    ]
}

/// Inputs of `n` entries that take every path of the quantizers: spread
/// magnitudes, few distinct values, signed zeros (where f32::min / max may
/// pick either zero), magnitudes whose f32 sum and range overflow (the f64
/// fallbacks), subnormals (QSGD's scale so small its inverse is infinite),
/// and chunk remainders much larger than the rest (the order the sum adds
/// them in shows).
fn quant_inputs(n: usize) -> Vec<(&'static str, Vec<f32>)> {
    let spread = values(n, 21, None);
    let mut inputs = vec![("spread", spread.clone())];
    if n > 100_000 {
        return inputs;
    }
    let map = |f: &dyn Fn(usize, f32) -> f32| -> Vec<f32> {
        spread.iter().enumerate().map(|(i, &v)| f(i, v)).collect()
    };
    inputs.push(("levels", values(n, 22, Some(3))));
    inputs.push((
        "signed zeros",
        map(&|i, _| if i % 3 == 0 { -0.0 } else { 0.0 }),
    ));
    inputs.push((
        "zeros and values",
        map(&|i, v| match i % 5 {
            0 => v,
            1 | 3 => -0.0,
            _ => 0.0,
        }),
    ));
    inputs.push(("huge", map(&|_, v| v.signum() * f32::MAX * 0.75)));
    inputs.push(("huge spread", map(&|_, v| v * 1e36)));
    inputs.push((
        "subnormal",
        map(&|i, _| if i % 3 == 0 { f32::from_bits(1) } else { 0.0 }),
    ));
    inputs.push(("tiny", map(&|_, v| v * 1e-40)));
    inputs.push((
        "large remainder",
        map(&|i, v| if i >= n / 8 * 8 { v * 1000.0 + 0.1 } else { v }),
    ));
    inputs
}

#[test]
fn quantizers_match_the_cpu() {
    if !device_or_skip("quantizers_match_the_cpu") {
        return;
    }
    for q in quantizers() {
        for &n in &QUANT_LENGTHS {
            for (name, x) in quant_inputs(n) {
                let dx = on_device(&x);
                let base = values(n, 23, None);
                let mut reused = DeviceBytes::zeros(q.encoded_len(n), 0).unwrap();
                for stream in [0u64, 0x1234_5678_9abc] {
                    let what = format!("{q:?} n={n} {name} stream={stream}");
                    let mut cpu = vec![0u8; q.encoded_len(n)];
                    q.encode(&x, stream, &mut cpu).expect("cpu encode");
                    let gpu = cuda::quant_encode(&q, &dx, stream).expect("gpu encode");
                    assert_eq!(gpu.to_host().unwrap(), cpu, "{what}: payload");
                    cuda::quant_encode_into(&q, &dx, stream, &mut reused).expect("gpu into");
                    assert_eq!(reused.to_host().unwrap(), cpu, "{what}: payload into");
                    // Decode the CPU's payload on the device, into stale
                    // values and onto an accumulator.
                    let payload = DeviceBytes::from_host(&cpu, 0).unwrap();
                    let mut decoded = vec![0f32; n];
                    q.decode(&cpu, &mut decoded).expect("cpu decode");
                    let mut out = on_device(&base);
                    cuda::quant_decode(&q, &payload, &mut out).expect("gpu decode");
                    assert_eq!(bits(&host_f32(&out)), bits(&decoded), "{what}: decode");
                    let mut sum = base.clone();
                    q.decode_add(&cpu, &mut sum).expect("cpu decode_add");
                    let mut acc = on_device(&base);
                    cuda::quant_decode_add(&q, &payload, &mut acc).expect("gpu decode_add");
                    assert_eq!(bits(&host_f32(&acc)), bits(&sum), "{what}: decode_add");
                }
            }
        }
    }
}

#[test]
fn quantizers_refuse_non_finite_input_like_the_cpu() {
    if !device_or_skip("quantizers_refuse_non_finite_input_like_the_cpu") {
        return;
    }
    let (x, expected) = non_finite_input();
    let dx = on_device(&x);
    let mut nan_first = x.clone();
    nan_first[700] = f32::NAN;
    let d_nan_first = on_device(&nan_first);
    for q in quantizers() {
        let mut cpu = vec![0u8; q.encoded_len(x.len())];
        assert_eq!(q.encode(&x, 5, &mut cpu).unwrap_err(), expected, "{q:?}");
        assert_eq!(
            cuda::quant_encode(&q, &dx, 5).unwrap_err(),
            expected,
            "{q:?}"
        );
        let mut payload = DeviceBytes::zeros(q.encoded_len(x.len()), 0).unwrap();
        assert_eq!(
            cuda::quant_encode_into(&q, &dx, 5, &mut payload).unwrap_err(),
            expected,
            "{q:?}"
        );
        // A NaN is reported at the same index (NaN != NaN: by its bits).
        let nan_at_700 = |e: CompressError| matches!(e, CompressError::NonFinite { index: 700, value } if value.is_nan());
        assert!(nan_at_700(q.encode(&nan_first, 5, &mut cpu).unwrap_err()));
        assert!(nan_at_700(
            cuda::quant_encode(&q, &d_nan_first, 5).unwrap_err()
        ));
        // A payload of the wrong length, as the CPU.
        let mut short = DeviceBytes::zeros(q.encoded_len(x.len()) - 1, 0).unwrap();
        let finite = on_device(&values(x.len(), 4, None));
        assert_eq!(
            cuda::quant_encode_into(&q, &finite, 5, &mut short).unwrap_err(),
            q.encode(&values(x.len(), 4, None), 5, &mut cpu[1..])
                .unwrap_err(),
            "{q:?}"
        );
    }
    // Settings are checked first, on both.
    let bad = Quantizer::Qsgd { levels: 0, seed: 1 };
    let mut cpu = vec![0u8; bad.encoded_len(x.len())];
    assert!(matches!(
        bad.encode(&x, 0, &mut cpu),
        Err(CompressError::InvalidArgument(_))
    ));
    assert!(matches!(
        cuda::quant_encode(&bad, &dx, 0),
        Err(CompressError::InvalidArgument(_))
    ));
}

#[test]
fn corrupt_quantized_payloads_are_refused_like_the_cpu() {
    if !device_or_skip("corrupt_quantized_payloads_are_refused_like_the_cpu") {
        return;
    }
    let n = 3000;
    let x = values(n, 5, None);
    let base = values(n, 6, None);
    let scale_at = |p: &mut Vec<u8>, at: usize, v: f32| {
        p[at..at + 4].copy_from_slice(&v.to_le_bytes());
    };
    for q in quantizers() {
        let mut good = vec![0u8; q.encoded_len(n)];
        q.encode(&x, 9, &mut good).unwrap();
        let stride = q.encoded_len(QUANT_CHUNK);
        let mut corrupt: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut p = good.clone();
        scale_at(&mut p, 3 * stride, f32::NAN);
        scale_at(&mut p, 5 * stride, f32::INFINITY);
        corrupt.push(("NaN scale", p));
        let mut p = good.clone();
        scale_at(&mut p, 5 * stride, f32::NEG_INFINITY);
        corrupt.push(("infinite scale in the last chunk", p));
        match q {
            Quantizer::Qsgd { levels, .. } => {
                let mut p = good.clone();
                p[2 * stride + 4 + 100] = 0x80; // -128: beyond any levels
                p[4 * stride + 4] = levels + 1;
                corrupt.push(("level -128", p));
                if levels < 127 {
                    let mut p = good.clone();
                    p[stride + 4 + 17] = (-(levels as i8) - 1) as u8;
                    corrupt.push(("level beyond", p));
                }
            }
            Quantizer::MinMaxU8 => {
                let mut p = good.clone();
                scale_at(&mut p, 4 * stride, 2.0);
                scale_at(&mut p, 4 * stride + 4, 1.0);
                corrupt.push(("minimum above maximum", p));
                let mut p = good.clone();
                scale_at(&mut p, stride + 4, f32::NAN);
                corrupt.push(("NaN maximum", p));
            }
            Quantizer::Sign => {}
        }
        for (what, bytes) in corrupt {
            let mut out = vec![0f32; n];
            let cpu = q.decode(&bytes, &mut out).unwrap_err();
            assert!(matches!(cpu, CompressError::Corrupt(_)), "{q:?} {what}");
            let payload = DeviceBytes::from_host(&bytes, 0).unwrap();
            let mut dout = on_device(&base);
            assert_eq!(
                cuda::quant_decode(&q, &payload, &mut dout).unwrap_err(),
                cpu,
                "{q:?} {what}"
            );
            assert_eq!(
                cuda::quant_decode_add(&q, &payload, &mut dout).unwrap_err(),
                cpu,
                "{q:?} {what}: add"
            );
            // Nothing was written.
            assert_eq!(bits(&host_f32(&dout)), bits(&base), "{q:?} {what}");
        }
        // A payload of the wrong length.
        let short = DeviceBytes::from_host(&good[1..], 0).unwrap();
        let mut out = vec![0f32; n];
        let cpu = q.decode(&good[1..], &mut out).unwrap_err();
        let mut dout = on_device(&base);
        assert_eq!(
            cuda::quant_decode(&q, &short, &mut dout).unwrap_err(),
            cpu,
            "{q:?} short"
        );
        assert_eq!(bits(&host_f32(&dout)), bits(&base), "{q:?} short");
    }
}
