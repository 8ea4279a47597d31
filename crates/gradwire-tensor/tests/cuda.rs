//! CUDA storage (feature `cuda`): run on every machine, exercised on a GPU.
//!
//! Without a CUDA device each test checks that the device is refused with
//! [`Error::CudaUnavailable`] (never a panic) and prints a loud
//! `SKIP: no CUDA device` line; `GRADWIRE_REQUIRE_GPU=1` turns a missing
//! device into a failure, for GPU machines.

#![cfg(feature = "cuda")]

use gradwire_tensor::{CudaDevice, DType, Device, Error, Tensor, bf16, f16};
use std::sync::Arc;

/// Device 0, or `None` after printing why the test is skipped. Any error
/// other than `CudaUnavailable` fails the test; so does a missing device
/// under `GRADWIRE_REQUIRE_GPU=1`.
fn device_or_skip(test: &str) -> Option<Arc<CudaDevice>> {
    match CudaDevice::get(0) {
        Ok(device) => Some(device),
        Err(Error::CudaUnavailable(why)) => {
            assert!(
                std::env::var("GRADWIRE_REQUIRE_GPU").as_deref() != Ok("1"),
                "GRADWIRE_REQUIRE_GPU=1 but no CUDA device: {why}"
            );
            eprintln!("SKIP: no CUDA device ({why}): {test} did not run its GPU part");
            None
        }
        Err(other) => panic!("CudaDevice::get(0) failed with {other:?}"),
    }
}

#[test]
fn a_missing_device_is_an_error_value() {
    // Far beyond any machine's device count: an error, not a panic, with or
    // without a driver.
    match CudaDevice::get(1 << 20) {
        Err(Error::CudaUnavailable(why)) => assert!(!why.is_empty()),
        other => panic!("expected CudaUnavailable, got {other:?}"),
    }
    let zeros = Tensor::zeros(vec![2, 3], DType::F32, Device::Cuda(1 << 20));
    assert!(matches!(zeros, Err(Error::CudaUnavailable(_))), "{zeros:?}");
    let host = Tensor::from_vec(vec![1f32, 2.0], 2).expect("host tensor");
    let moved = host.to_device(Device::Cuda(1 << 20));
    assert!(matches!(moved, Err(Error::CudaUnavailable(_))), "{moved:?}");
}

#[test]
fn host_device_round_trips_are_bitwise() {
    let Some(device) = device_or_skip("host_device_round_trips_are_bitwise") else {
        // No device: creating one on ordinal 0 must fail the same typed way.
        let t = Tensor::zeros(4, DType::F16, Device::Cuda(0));
        assert!(matches!(t, Err(Error::CudaUnavailable(_))), "{t:?}");
        return;
    };
    let values: Vec<f32> = vec![
        0.0,
        -0.0,
        1.5,
        -3.25e-3,
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::NAN,
    ];
    let host = Tensor::from_vec(values.clone(), values.len()).expect("f32 tensor");
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let typed = host.to_dtype(dtype).expect("cast");
        let on_gpu = typed.to_device(Device::Cuda(0)).expect("to device");
        assert_eq!(on_gpu.device(), Device::Cuda(device.ordinal()));
        assert_eq!(on_gpu.dtype(), dtype);
        let back = on_gpu.to_device(Device::Cpu).expect("to host");
        let bits = |t: &Tensor| -> Vec<u32> {
            match dtype {
                DType::F32 => t
                    .to_vec::<f32>()
                    .expect("f32")
                    .iter()
                    .map(|v| v.to_bits())
                    .collect(),
                DType::F16 => t
                    .to_vec::<f16>()
                    .expect("f16")
                    .iter()
                    .map(|v| u32::from(v.to_bits()))
                    .collect(),
                DType::BF16 => t
                    .to_vec::<bf16>()
                    .expect("bf16")
                    .iter()
                    .map(|v| u32::from(v.to_bits()))
                    .collect(),
            }
        };
        assert_eq!(bits(&back), bits(&typed), "{dtype:?}");
    }
    let zeros = Tensor::zeros(5, DType::BF16, Device::Cuda(0)).expect("device zeros");
    let back = zeros.to_device(Device::Cpu).expect("to host");
    assert_eq!(back.to_vec::<bf16>().expect("bf16"), vec![bf16::ZERO; 5]);
}

#[test]
fn every_kernel_loads_and_modules_are_cached() {
    let Some(device) = device_or_skip("every_kernel_loads_and_modules_are_cached") else {
        return;
    };
    for m in gradwire_kernels::MODULES {
        let first = device.module(m.name).expect("PTX loads");
        let again = device.module(m.name).expect("cached");
        assert!(Arc::ptr_eq(&first, &again), "{} loaded twice", m.name);
        for kernel in m.entries {
            device.function(m.name, kernel).expect("kernel resolves");
        }
    }
    assert!(matches!(
        device.module("no_such_module"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(Arc::ptr_eq(
        &device,
        &CudaDevice::get(0).expect("cached device")
    ));
}
