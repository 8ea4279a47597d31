//! The selections, error feedback, casts and scatter-add on the device
//! against the CPU's.

use gradwire_compress::cast::{self, CastOptions};
use gradwire_compress::cuda::{
    self, CudaErrorFeedback, DeviceSelectScratch, DeviceSparse, SparseStaging,
};
use gradwire_compress::wire::{self, CodecId};
use gradwire_compress::{CompressError, ErrorFeedback, SparseCodec, SparseVec, select};
use gradwire_tensor::{CpuStorage, CudaStorage, DType, bf16, f16};

use crate::support::{bits, device_or_skip, host_f32, non_finite_input, on_device, values};

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

/// One kept scratch across lengths that shrink and grow (its buffers then
/// longer than a call needs) selects what a fresh one does.
#[test]
fn a_kept_scratch_selects_as_a_fresh_one() {
    if !device_or_skip("a_kept_scratch_selects_as_a_fresh_one") {
        return;
    }
    let mut scratch = DeviceSelectScratch::default();
    for (seed, &n) in [262_147usize, 7, 1_000_003, 0, 4099, 1, 65_537]
        .iter()
        .enumerate()
    {
        let x = values(n, 40 + seed as u64, Some(1000));
        let dx = on_device(&x);
        for codec in [
            SparseCodec::Threshold(0.5),
            SparseCodec::TopK(0.01),
            SparseCodec::SampledTopK(0.01),
            SparseCodec::TopK(1.0),
        ] {
            let cpu = match codec {
                SparseCodec::Threshold(t) => select::threshold(&x, t),
                SparseCodec::TopK(r) => select::top_k(&x, r),
                SparseCodec::SampledTopK(r) => select::sampled_top_k(&x, r),
                SparseCodec::RandomK { .. } => unreachable!("not in the list"),
            }
            .expect("cpu");
            let gpu = cuda::select_with(&dx, &codec, &mut scratch).expect("gpu");
            assert_same_sparse(&format!("{codec:?} n={n} kept scratch"), &gpu, &cpu);
        }
    }
    // Random-k has no device form: refused with a typed error.
    let refused = cuda::select_with(
        &on_device(&[1.0, 2.0]),
        &SparseCodec::RandomK {
            ratio: 0.5,
            seed: 1,
        },
        &mut scratch,
    );
    assert!(
        matches!(refused, Err(CompressError::InvalidArgument(_))),
        "{refused:?}"
    );
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
            // With error feedback, over a few steps, into each dtype. A cast
            // that overflows (f16 at scale 1024) sends an infinity and leaves
            // one in the memory, which the next step refuses and resets: the
            // device must do the same, step by step.
            for dtype in [DType::F16, DType::BF16, DType::F32] {
                let mut cpu = ErrorFeedback::new(n);
                let mut gpu = CudaErrorFeedback::new(n, 0).unwrap();
                for step in 0..3u64 {
                    let g = values(n, 50 + step, None);
                    let mut sent = CudaStorage::alloc_zeros(n, dtype, 0).unwrap();
                    let on_gpu = gpu.compress_cast(&on_device(&g), &mut sent, &opts);
                    let (on_cpu, sent_cpu) = match dtype {
                        DType::F16 => {
                            let mut d = vec![f16::ZERO; n];
                            (cpu.compress_cast(&g, &mut d, &opts), CpuStorage::F16(d))
                        }
                        DType::BF16 => {
                            let mut d = vec![bf16::ZERO; n];
                            (cpu.compress_cast(&g, &mut d, &opts), CpuStorage::BF16(d))
                        }
                        DType::F32 => {
                            let mut d = vec![0f32; n];
                            (cpu.compress_cast(&g, &mut d, &opts), CpuStorage::F32(d))
                        }
                    };
                    let what = format!("{dtype:?} {opts:?} n={n} step {step}");
                    match (on_gpu, on_cpu) {
                        (Ok(()), Ok(())) => {
                            assert_eq!(sent.to_cpu().unwrap(), sent_cpu, "{what}: sent");
                        }
                        (
                            Err(CompressError::NonFinite { index: gi, .. }),
                            Err(CompressError::NonFinite { index: ci, .. }),
                        ) => assert_eq!(gi, ci, "{what}: the refused index"),
                        (gpu_result, cpu_result) => {
                            panic!("{what}: device {gpu_result:?}, CPU {cpu_result:?}")
                        }
                    }
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
    // Subnormal sums, which a float atomic would flush to zero.
    let n = 1000usize;
    let base: Vec<f32> = (0..n).map(|i| f32::from_bits(1 + i as u32 * 3)).collect();
    let indices: Vec<u32> = (0..n as u32).step_by(7).collect();
    let subnormal: Vec<f32> = indices
        .iter()
        .map(|&i| -f32::from_bits(2 + i * 5))
        .collect();
    let sparse = SparseVec::new(n, indices.clone(), subnormal.clone()).unwrap();
    let mut dense_cpu = base.clone();
    sparse.scatter_add(&mut dense_cpu).unwrap();
    let from_host = DeviceSparse::from_host_indices(n, &indices, on_device(&subnormal)).unwrap();
    let mut dense_gpu = on_device(&base);
    cuda::scatter_add(&from_host, &mut dense_gpu).unwrap();
    assert_eq!(bits(&host_f32(&dense_gpu)), bits(&dense_cpu), "subnormals");
    assert!(
        dense_cpu
            .iter()
            .any(|v| *v != 0.0 && v.abs() < f32::MIN_POSITIVE)
    );
    // Lists from the host through one kept staging room, growing and
    // shrinking: each added as the CPU adds it.
    let mut staging = SparseStaging::default();
    for (seed, &(n, ratio)) in [(257usize, 0.5), (100_003, 0.05), (7, 1.0), (100_003, 0.01)]
        .iter()
        .enumerate()
    {
        let list = select::top_k(&values(n, 60 + seed as u64, None), ratio).unwrap();
        let base = values(n, 70 + seed as u64, None);
        let mut dense_cpu = base.clone();
        list.scatter_add(&mut dense_cpu).unwrap();
        let mut dense_gpu = on_device(&base);
        staging
            .scatter_add(list.indices(), list.values(), &mut dense_gpu)
            .unwrap();
        assert_eq!(
            bits(&host_f32(&dense_gpu)),
            bits(&dense_cpu),
            "n={n} ratio={ratio} staged"
        );
        // The same list as a wire payload, decoded into the kept vectors.
        let bytes = wire::encode(&list, CodecId::TopK, DType::F32);
        let mut from_payload = on_device(&base);
        staging
            .scatter_add_payload(&wire::decode(&bytes).unwrap(), &mut from_payload)
            .unwrap();
        assert_eq!(
            bits(&host_f32(&from_payload)),
            bits(&dense_cpu),
            "n={n} ratio={ratio} from a payload"
        );
    }
    for (indices, values, why) in [
        (&[2u32, 1][..], &[1.0f32, 2.0][..], "strictly increasing"),
        (&[1, 4], &[1.0, 2.0], "below 4"),
    ] {
        let mut dense = on_device(&[0.0; 4]);
        let result = staging.scatter_add(indices, values, &mut dense);
        assert!(
            matches!(&result, Err(CompressError::Tensor(gradwire_tensor::Error::InvalidArgument(m))) if m.contains(why)),
            "{result:?}"
        );
    }
    let result = staging.scatter_add(&[1], &[1.0, 2.0], &mut on_device(&[0.0; 4]));
    assert!(
        matches!(
            &result,
            Err(CompressError::Tensor(
                gradwire_tensor::Error::LengthMismatch { .. }
            ))
        ),
        "{result:?}"
    );
    // Unsorted host indices are refused.
    let values_on_device = on_device(&[1.0, 2.0]);
    let result = DeviceSparse::from_host_indices(4, &[2, 1], values_on_device);
    assert!(
        matches!(&result, Err(gradwire_tensor::Error::InvalidArgument(m)) if m.contains("strictly increasing")),
        "{result:?}"
    );
}
