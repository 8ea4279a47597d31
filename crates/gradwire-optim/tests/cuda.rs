//! A test binary of its own: a GPU suite, which `cargo xtask gpu-bundle`
//! ships alone to a machine with a GPU.
//!
//! The optimizers on CUDA parameters (feature `cuda`) against the same
//! optimizers on the CPU: several steps of every rule, in every parameter
//! dtype, give bitwise the same parameters and the same state; state moves
//! through checkpoints and between devices.
//!
//! Without a CUDA device each test prints `SKIP` and checks only the typed
//! error; `GRADWIRE_REQUIRE_GPU=1` makes a missing device a failure.

#![cfg(feature = "cuda")]

use gradwire_optim::StateBuffers as _;
use gradwire_optim::{
    AdaGrad, AdaGradConfig, Adam, AdamConfig, AdamW, OptimError, Optimizer, RmsProp, RmsPropConfig,
    Schedule, Sgd, SgdConfig,
};
use gradwire_tensor::cuda_backend::testing;
use gradwire_tensor::{DType, Device, Error, Tensor};

/// Whether device 0 is there (else `testing::device_or_skip` printed the
/// SKIP line; a missing device fails under `GRADWIRE_REQUIRE_GPU=1`).
fn device_or_skip(test: &str) -> bool {
    testing::device_or_skip(test)
        .expect("CUDA device 0")
        .is_some()
}

/// Deterministic values in about [-scale, scale] (splitmix64).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn bits(t: &Tensor) -> Vec<u32> {
    let host = t.to_device(Device::Cpu).expect("to host");
    host.to_dtype(DType::F32)
        .expect("widen")
        .to_vec::<f32>()
        .expect("f32")
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Runs `steps` updates of the same optimizer on a CPU and a CUDA copy of
/// one parameter and compares the parameters after every step and the
/// exported states at the end.
fn same_on_both<O: Optimizer + Clone>(what: &str, optimizer: O, dtype: DType, n: usize) {
    let mut cpu_opt = optimizer.clone();
    let mut gpu_opt = optimizer;
    let init = values(n, 1, 1.0);
    let mut p_cpu = Tensor::from_f32(&init, n, dtype).expect("param");
    let mut p_gpu = p_cpu.to_device(Device::Cuda(0)).expect("to device");
    for step in 0..5u64 {
        let g = Tensor::from_f32(&values(n, 10 + step, 0.5), n, dtype).expect("grad");
        let g_gpu = g.to_device(Device::Cuda(0)).expect("grad to device");
        cpu_opt.update("w", &mut p_cpu, &g).expect("cpu update");
        gpu_opt.update("w", &mut p_gpu, &g_gpu).expect("gpu update");
        assert_eq!(p_gpu.device(), Device::Cuda(0));
        assert_eq!(
            bits(&p_gpu),
            bits(&p_cpu),
            "{what} {dtype:?} n={n} step {step}"
        );
        cpu_opt.step();
        gpu_opt.step();
    }
    let (cpu_state, gpu_state) = (cpu_opt.state().expect("cpu"), gpu_opt.state().expect("gpu"));
    assert_eq!(
        gpu_state, cpu_state,
        "{what} {dtype:?} n={n}: exported state"
    );
}

#[test]
fn every_rule_updates_cuda_parameters_bitwise_as_the_cpu() {
    if !device_or_skip("every_rule_updates_cuda_parameters_bitwise_as_the_cpu") {
        return;
    }
    let decay = Schedule::constant(0.01);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for n in [1usize, 7, 257, 65_537] {
            same_on_both("sgd", Sgd::new(SgdConfig::default()).unwrap(), dtype, n);
            same_on_both(
                "sgd momentum",
                Sgd::new(
                    SgdConfig::default()
                        .momentum(0.9)
                        .dampening(0.1)
                        .weight_decay(0.01),
                )
                .unwrap(),
                dtype,
                n,
            );
            same_on_both(
                "sgd nesterov",
                Sgd::new(
                    SgdConfig::default()
                        .momentum(0.9)
                        .nesterov(true)
                        .weight_decay(0.01),
                )
                .unwrap(),
                dtype,
                n,
            );
            same_on_both(
                "sgd decay only",
                Sgd::new(SgdConfig::default().weight_decay(0.01)).unwrap(),
                dtype,
                n,
            );
            let rms = RmsPropConfig {
                weight_decay: decay,
                ..RmsPropConfig::default()
            };
            same_on_both("rmsprop", RmsProp::new(rms).unwrap(), dtype, n);
            let ada = AdaGradConfig {
                weight_decay: decay,
                ..AdaGradConfig::default()
            };
            same_on_both("adagrad", AdaGrad::new(ada).unwrap(), dtype, n);
            same_on_both("adam", Adam::new(AdamConfig::default()).unwrap(), dtype, n);
            same_on_both(
                "adam l2",
                Adam::new(AdamConfig::default().lr(1e-3).weight_decay(0.01)).unwrap(),
                dtype,
                n,
            );
            same_on_both(
                "adamw",
                AdamW::new(AdamConfig::adamw().lr(1e-3).weight_decay(0.1)).unwrap(),
                dtype,
                n,
            );
            same_on_both(
                "adamw no decay",
                AdamW::new(AdamConfig::adamw().weight_decay(0.0)).unwrap(),
                dtype,
                n,
            );
        }
    }
}

#[test]
fn device_state_round_trips_and_follows_the_parameter() {
    if !device_or_skip("device_state_round_trips_and_follows_the_parameter") {
        // Without a device a CUDA parameter cannot even be made.
        let p = Tensor::zeros(3, DType::F32, Device::Cuda(0));
        assert!(matches!(p, Err(Error::CudaUnavailable(_))), "{p:?}");
        return;
    }
    let n = 1021;
    let mut reference = Adam::new(AdamConfig::default().lr(1e-2)).unwrap();
    let mut mixed = reference.clone();
    let mut p_ref = Tensor::from_f32(&values(n, 3, 1.0), n, DType::F32).unwrap();
    let mut p_gpu = p_ref.to_device(Device::Cuda(0)).unwrap();
    let grads: Vec<Tensor> = (0..6)
        .map(|s| Tensor::from_f32(&values(n, 20 + s, 0.1), n, DType::F32).unwrap())
        .collect();
    // Steps 0-1 on the GPU, a checkpoint, 2-3 on the CPU, 4-5 on the GPU
    // again; the reference does all six on the CPU.
    for (step, g) in grads.iter().enumerate() {
        reference.update("w", &mut p_ref, g).unwrap();
        reference.step();
        if step == 2 {
            let saved = mixed.state().unwrap();
            assert!(
                mixed.param_state("w").unwrap().buffers.is_empty(),
                "device buffers are not mirrored on the host"
            );
            assert_eq!(
                saved.params["w"].buffers.len(),
                2,
                "state() copies them out"
            );
            let mut restored = Adam::new(AdamConfig::default().lr(1e-2)).unwrap();
            restored.load_state(&saved).unwrap();
            mixed = restored;
            p_gpu = p_gpu.to_device(Device::Cpu).unwrap();
        }
        if step == 4 {
            p_gpu = p_gpu.to_device(Device::Cuda(0)).unwrap();
        }
        let g = g.to_device(p_gpu.device()).unwrap();
        mixed.update("w", &mut p_gpu, &g).unwrap();
        mixed.step();
        assert_eq!(bits(&p_gpu), bits(&p_ref), "step {step}");
    }
    assert_eq!(mixed.state().unwrap(), reference.state().unwrap());
}

#[test]
fn cuda_updates_refuse_what_the_kernels_cannot_do() {
    if !device_or_skip("cuda_updates_refuse_what_the_kernels_cannot_do") {
        return;
    }
    let mut sgd = Sgd::new(SgdConfig::default().momentum(0.9)).unwrap();
    let mut p = Tensor::zeros(4, DType::F16, Device::Cuda(0)).unwrap();
    // A gradient of another dtype, or on the host, is refused before any
    // state changes.
    let g32 = Tensor::zeros(4, DType::F32, Device::Cuda(0)).unwrap();
    let result = sgd.update("p", &mut p, &g32);
    assert!(
        matches!(
            result,
            Err(OptimError::Tensor(Error::DTypeMismatch {
                expected: DType::F16,
                got: DType::F32,
                ..
            }))
        ),
        "{result:?}"
    );
    let host = Tensor::zeros(4, DType::F16, Device::Cpu).unwrap();
    let result = sgd.update("p", &mut p, &host);
    assert!(
        matches!(
            result,
            Err(OptimError::Tensor(Error::DeviceMismatch {
                expected: Device::Cuda(0),
                got: Device::Cpu,
                ..
            }))
        ),
        "{result:?}"
    );
    assert!(sgd.param_state("p").is_none_or(|s| s.updates == 0));
    // A zeroed gradient is skipped, as on the CPU.
    let mut g = Tensor::full(1.0, 4, DType::F16, Device::Cuda(0)).unwrap();
    g.zero_();
    sgd.update("p", &mut p, &g).unwrap();
    assert!(sgd.param_state("p").is_none_or(|s| s.updates == 0));
}

#[test]
fn set_buffer_writes_a_device_buffer_in_place() {
    if !device_or_skip("set_buffer_writes_a_device_buffer_in_place") {
        return;
    }
    let n = 257;
    let mut adam = Adam::new(AdamConfig::default()).unwrap();
    let mut p = Tensor::from_f32(&values(n, 5, 1.0), n, DType::F32)
        .unwrap()
        .to_device(Device::Cuda(0))
        .unwrap();
    let g = Tensor::from_f32(&values(n, 6, 0.1), n, DType::F32)
        .unwrap()
        .to_device(Device::Cuda(0))
        .unwrap();
    adam.update("w", &mut p, &g).unwrap();
    let replacement = values(n, 7, 0.01);
    adam.set_buffer("w", &[n], "m", replacement.clone())
        .unwrap();
    let state = adam.state().unwrap();
    assert_eq!(
        bits_of(&state.params["w"].buffers["m"]),
        bits_of(&replacement)
    );
    assert_eq!(state.params["w"].updates, 1);
    // A buffer of the wrong length is refused, on the device as on the host.
    let result = adam.set_buffer("w", &[n], "m", vec![0.0; n - 1]);
    assert!(
        matches!(&result, Err(OptimError::ShapeMismatch { got, .. }) if got == &[n - 1]),
        "{result:?}"
    );
    let state = adam.state().unwrap();
    assert_eq!(
        bits_of(&state.params["w"].buffers["m"]),
        bits_of(&replacement)
    );
}

fn bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}
