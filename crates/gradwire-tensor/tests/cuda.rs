//! A test binary of its own: a GPU suite, which `cargo xtask gpu-bundle`
//! ships alone to a machine with a GPU.
//!
//! CUDA storage (feature `cuda`): run on every machine, exercised on a GPU.
//!
//! Without a CUDA device each test checks that the device is refused with
//! [`Error::CudaUnavailable`] (never a panic) and prints a loud
//! `SKIP GPU` line; `GRADWIRE_REQUIRE_GPU=1` turns a missing
//! device into a failure, for GPU machines.

#![cfg(feature = "cuda")]

use gradwire_tensor::cuda_backend::testing;
use gradwire_tensor::{
    CpuStorage, CudaDevice, CudaStorage, DType, Device, Error, Tensor, bf16, f16,
};
use std::sync::Arc;

/// Device 0, or `None` after `testing::device_or_skip` printed why the
/// test is skipped (a failure under `GRADWIRE_REQUIRE_GPU=1`).
fn device_or_skip(test: &str) -> Option<Arc<CudaDevice>> {
    testing::device_or_skip(test).expect("CUDA device 0")
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

// ---------------------------------------------------------------------------
// The CUDA forms of the tensor operations against the CPU's.

/// Lengths that exercise empty, single-element, partial-block, prime and
/// multi-grid launches (more than `MAX_GRID * BLOCK` = 1 048 576 elements,
/// so grid-stride loops go round more than once).
const LENGTHS: [usize; 10] = [0, 1, 2, 7, 31, 256, 257, 1021, 65_537, 1_048_583];

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Deterministic values (splitmix64): magnitudes spread over many binades,
/// both signs, and with `specials` some NaN, ±inf, ±0 and subnormals.
fn values(len: usize, seed: u64, specials: bool) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ len as u64;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..len)
        .map(|_| {
            let r = next();
            if specials && r % 61 == 0 {
                return [
                    f32::NAN,
                    f32::INFINITY,
                    f32::NEG_INFINITY,
                    0.0,
                    -0.0,
                    1e-40,
                    -3e-39,
                ][(r >> 8) as usize % 7];
            }
            let unit = (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            let exponent = ((r >> 8) % 24) as i32 - 12;
            unit * 2f32.powi(exponent)
        })
        .collect()
}

/// The elements' bits in the tensor's own dtype (f16/bf16 widened to u32),
/// so NaN payloads and signed zeros are compared too.
fn native_bits(t: &Tensor) -> Vec<u32> {
    let host = t.to_device(Device::Cpu).expect("to host");
    match host.dtype() {
        DType::F32 => host
            .to_vec::<f32>()
            .expect("f32")
            .iter()
            .map(|v| v.to_bits())
            .collect(),
        DType::F16 => host
            .to_vec::<f16>()
            .expect("f16")
            .iter()
            .map(|v| u32::from(v.to_bits()))
            .collect(),
        DType::BF16 => host
            .to_vec::<bf16>()
            .expect("bf16")
            .iter()
            .map(|v| u32::from(v.to_bits()))
            .collect(),
    }
}

/// A CPU tensor of `dtype` from `values` and its copy on device 0.
fn pair(values: &[f32], dtype: DType) -> (Tensor, Tensor) {
    let cpu = Tensor::from_f32(values, values.len(), dtype).expect("host tensor");
    let gpu = cpu.to_device(Device::Cuda(0)).expect("to device");
    (cpu, gpu)
}

/// `bits` with every NaN replaced by the dtype's canonical quiet NaN: a NaN
/// that arithmetic creates has a sign and payload chosen by the hardware
/// (x86 gives `0xffc00000`, NVIDIA GPUs `0x7fffffff`), so results of
/// arithmetic are compared bitwise except for the payload of their NaNs.
fn nan_canonical(dtype: DType, bits: Vec<u32>) -> Vec<u32> {
    let (magnitude, infinity, quiet) = match dtype {
        DType::F32 => (0x7fff_ffff, 0x7f80_0000, 0x7fc0_0000),
        DType::F16 => (0x7fff, 0x7c00, 0x7e00),
        DType::BF16 => (0x7fff, 0x7f80, 0x7fc0),
    };
    bits.into_iter()
        .map(|b| if b & magnitude > infinity { quiet } else { b })
        .collect()
}

/// The results of arithmetic agree bitwise, NaN payloads aside.
fn assert_same(what: &str, gpu: &Tensor, cpu: &Tensor) {
    assert_eq!(
        gpu.device(),
        Device::Cuda(0),
        "{what}: result left the device"
    );
    assert_eq!(gpu.dtype(), cpu.dtype(), "{what}");
    assert_eq!(
        nan_canonical(gpu.dtype(), native_bits(gpu)),
        nan_canonical(cpu.dtype(), native_bits(cpu)),
        "{what}"
    );
}

/// Copies and conversions agree bitwise, NaN payloads included.
fn assert_identical(what: &str, gpu: &Tensor, cpu: &Tensor) {
    assert_eq!(
        gpu.device(),
        Device::Cuda(0),
        "{what}: result left the device"
    );
    assert_eq!(native_bits(gpu), native_bits(cpu), "{what}");
}

#[test]
fn elementwise_ops_match_the_cpu_bitwise() {
    if device_or_skip("elementwise_ops_match_the_cpu_bitwise").is_none() {
        return;
    }
    for dtype in DTYPES {
        for (seed, &n) in LENGTHS.iter().enumerate() {
            let seed = seed as u64;
            let what = |op: &str| format!("{op} {dtype:?} n={n}");
            let (y_cpu, y_gpu) = pair(&values(n, seed, true), dtype);
            let (x_cpu, x_gpu) = pair(&values(n, seed + 100, true), dtype);
            for a in [0.75f32, -3.0e-3, f32::INFINITY] {
                let (mut c, mut g) = (y_cpu.clone(), y_gpu.clone());
                c.axpy(a, &x_cpu).expect("cpu axpy");
                g.axpy(a, &x_gpu).expect("gpu axpy");
                assert_same(&what(&format!("axpy a={a}")), &g, &c);
                let (mut c, mut g) = (y_cpu.clone(), y_gpu.clone());
                c.scale(a).expect("cpu scale");
                g.scale(a).expect("gpu scale");
                assert_same(&what(&format!("scale a={a}")), &g, &c);
            }
            let (mut c, mut g) = (y_cpu.clone(), y_gpu.clone());
            c.add(&x_cpu).expect("cpu add");
            g.add(&x_gpu).expect("gpu add");
            assert_same(&what("add"), &g, &c);
            let (mut c, mut g) = (y_cpu.clone(), y_gpu.clone());
            c.mul(&x_cpu).expect("cpu mul");
            g.mul(&x_gpu).expect("gpu mul");
            assert_same(&what("mul"), &g, &c);
            for bound in [0.0f32, -0.0, 0.01, 1.0, f32::INFINITY] {
                let (mut c, mut g) = (y_cpu.clone(), y_gpu.clone());
                c.clamp(bound).expect("cpu clamp");
                g.clamp(bound).expect("gpu clamp");
                assert_same(&what(&format!("clamp {bound}")), &g, &c);
            }
            for v in [0.0f32, -0.0, 1.0 / 3.0, 70_000.0, f32::NAN] {
                let (mut c, mut g) = (y_cpu.clone(), y_gpu.clone());
                c.fill(v).expect("cpu fill");
                g.fill(v).expect("gpu fill");
                assert_same(&what(&format!("fill {v}")), &g, &c);
            }
            let mut g = y_gpu.clone();
            g.copy_from(&x_gpu).expect("gpu copy");
            assert_identical(&what("copy_from"), &g, &x_cpu);
            // The clone the op wrote did not write the original (copy on
            // write of shared device buffers).
            assert_identical(&what("untouched original"), &y_gpu, &y_cpu);
        }
    }
}

#[test]
fn casts_match_the_cpu_bitwise() {
    if device_or_skip("casts_match_the_cpu_bitwise").is_none() {
        return;
    }
    for (seed, &n) in LENGTHS.iter().enumerate() {
        // Values beyond f16's range too, to check overflow to inf.
        let mut v = values(n, seed as u64 + 7, true);
        for (i, x) in v.iter_mut().enumerate().step_by(13) {
            *x = if i % 2 == 0 { 1e6 } else { -3.0e38 };
        }
        for src in DTYPES {
            let (cpu, gpu) = pair(&v, src);
            for dst in DTYPES {
                let c = cpu.to_dtype(dst).expect("cpu cast");
                let g = gpu.to_dtype(dst).expect("gpu cast");
                assert_eq!(g.dtype(), dst);
                assert_identical(&format!("cast {src:?} -> {dst:?} n={n}"), &g, &c);
            }
        }
    }
}

/// The elements' bits of host storage (f16/bf16 widened to u32).
fn storage_bits(storage: &CpuStorage) -> Vec<u32> {
    match storage {
        CpuStorage::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        CpuStorage::F16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
        CpuStorage::BF16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
    }
}

/// Conversions between windows at every offset modulo four (the cast
/// kernels access four elements at a time only where both pointers are
/// aligned for it, and one at a time elsewhere): the window converted
/// bitwise, everything around it untouched.
#[test]
fn casts_between_windows_at_any_offset_match_the_cpu() {
    if device_or_skip("casts_between_windows_at_any_offset_match_the_cpu").is_none() {
        return;
    }
    for src in DTYPES {
        for dst in DTYPES.into_iter().filter(|&d| d != src) {
            for n in [0usize, 1, 3, 4, 5, 7, 257, 1021] {
                for src_offset in 0..4 {
                    for dst_offset in 0..4 {
                        let v = values(src_offset + n + 3, n as u64 + 11, true);
                        let (cpu, gpu) = pair(&v, src);
                        let converted = native_bits(&cpu.to_dtype(dst).expect("cpu cast"));
                        let mut expected = vec![0u32; dst_offset + n + 2];
                        expected[dst_offset..dst_offset + n]
                            .copy_from_slice(&converted[src_offset..src_offset + n]);
                        let source = gpu.cuda_storage().expect("device storage");
                        let mut target =
                            CudaStorage::alloc_zeros(expected.len(), dst, 0).expect("alloc");
                        target
                            .copy_range_from(dst_offset, &source, src_offset..src_offset + n)
                            .expect("windowed cast");
                        assert_eq!(
                            storage_bits(&target.to_cpu().expect("to host")),
                            expected,
                            "{src:?} -> {dst:?} n={n} from {src_offset} to {dst_offset}"
                        );
                    }
                }
            }
        }
    }
}

/// `|gpu - cpu|` allowed for an f64 sum of `n` terms whose magnitudes add
/// up to `sum_abs`: both are within `(n - 1) * eps * sum_abs` of the exact
/// sum (the terms themselves are exact in f64).
fn sum_tolerance(n: usize, sum_abs: f64) -> f64 {
    2.0 * n as f64 * f64::EPSILON * sum_abs
}

#[test]
fn reductions_match_the_cpu_within_the_f64_rounding() {
    if device_or_skip("reductions_match_the_cpu_within_the_f64_rounding").is_none() {
        return;
    }
    for dtype in DTYPES {
        for (seed, &n) in LENGTHS.iter().enumerate() {
            let (a_cpu, a_gpu) = pair(&values(n, seed as u64 + 3, false), dtype);
            let (b_cpu, b_gpu) = pair(&values(n, seed as u64 + 5, false), dtype);
            let a = a_cpu.to_f32_vec().expect("a");
            let b = b_cpu.to_f32_vec().expect("b");
            let abs_sum: f64 = a.iter().map(|x| f64::from(x.abs())).sum();
            let abs_sq: f64 = a.iter().map(|x| f64::from(*x) * f64::from(*x)).sum();
            let abs_dot: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (f64::from(*x) * f64::from(*y)).abs())
                .sum();
            let checks = [
                ("sum", a_gpu.sum(), a_cpu.sum(), abs_sum),
                ("sum_sq", a_gpu.sum_sq(), a_cpu.sum_sq(), abs_sq),
                ("dot", a_gpu.dot(&b_gpu), a_cpu.dot(&b_cpu), abs_dot),
            ];
            for (op, gpu, cpu, magnitude) in checks {
                let (gpu, cpu) = (gpu.expect("gpu"), cpu.expect("cpu"));
                let tolerance = sum_tolerance(n, magnitude);
                assert!(
                    (gpu - cpu).abs() <= tolerance,
                    "{op} {dtype:?} n={n}: gpu {gpu} cpu {cpu} tolerance {tolerance}"
                );
            }
            let (s_cpu, s_gpu) = pair(&values(n, seed as u64 + 11, true), dtype);
            let (gpu, cpu) = (s_gpu.max_abs().expect("gpu"), s_cpu.max_abs().expect("cpu"));
            assert!(
                gpu == cpu || (gpu.is_nan() && cpu.is_nan()),
                "max_abs {dtype:?} n={n}: gpu {gpu} cpu {cpu}"
            );
        }
    }
}

#[test]
fn the_zeroed_flag_works_on_the_device() {
    let Some(_device) = device_or_skip("the_zeroed_flag_works_on_the_device") else {
        return;
    };
    let stale = values(1021, 1, false);
    let (_, mut y) = pair(&stale, DType::F32);
    let (x_cpu, x) = pair(&values(1021, 2, false), DType::F32);
    y.zero_();
    assert_eq!(y.sum().expect("sum"), 0.0, "a zeroed tensor sums to 0");
    assert_eq!(y.max_abs().expect("max_abs"), 0.0);
    // An update starts from real zeros, never the stale memory.
    y.axpy(2.0, &x).expect("axpy");
    assert!(!y.is_zeroed());
    let mut expected = Tensor::zeros(1021, DType::F32, Device::Cpu).expect("zeros");
    expected.axpy(2.0, &x_cpu).expect("cpu axpy");
    assert_same("axpy onto a zeroed tensor", &y, &expected);
    // A zeroed operand counts as zeros, `0 * inf = NaN` included.
    let mut x_zeroed = x.clone();
    x_zeroed.zero_();
    let mut z = y.clone();
    z.axpy(f32::INFINITY, &x_zeroed)
        .expect("axpy with a zeroed operand");
    let mut expected_nan = expected.clone();
    expected_nan
        .axpy(
            f32::INFINITY,
            &Tensor::zeros(1021, DType::F32, Device::Cpu).expect("zeros"),
        )
        .expect("cpu");
    assert_same("axpy of a zeroed operand", &z, &expected_nan);
    // Copies and casts of a zeroed tensor are real zeros.
    let mut w = y.clone();
    w.copy_from(&x_zeroed).expect("copy");
    assert_eq!(w.sum_sq().expect("sum_sq"), 0.0);
    let half = x_zeroed.to_dtype(DType::BF16).expect("cast");
    assert_eq!(half.device(), Device::Cuda(0));
    assert!(!half.is_zeroed());
    assert_eq!(native_bits(&half), vec![0; 1021]);
}

#[test]
fn flat_pack_and_unpack_on_the_device_match_the_cpu() {
    use gradwire_tensor::flat::{pack_new, unpack};
    if device_or_skip("flat_pack_and_unpack_on_the_device_match_the_cpu").is_none() {
        return;
    }
    let shapes: [&[usize]; 5] = [&[3, 5], &[0], &[1], &[257], &[7, 11, 13]];
    let dtypes = [DType::F32, DType::BF16, DType::F16, DType::F32, DType::F16];
    let mut cpu = Vec::new();
    let mut gpu = Vec::new();
    for (i, (shape, dtype)) in shapes.iter().zip(dtypes).enumerate() {
        let n: usize = shape.iter().product();
        let t = Tensor::from_f32(&values(n, i as u64, true), shape.to_vec(), dtype).expect("t");
        gpu.push(t.to_device(Device::Cuda(0)).expect("to device"));
        cpu.push(t);
    }
    // A zeroed tensor packs as zeros.
    cpu[3].zero_();
    gpu[3].zero_();
    for wire in DTYPES {
        let (flat_cpu, layout_cpu) =
            pack_new(&cpu.iter().collect::<Vec<_>>(), wire).expect("cpu pack");
        let (flat_gpu, layout_gpu) =
            pack_new(&gpu.iter().collect::<Vec<_>>(), wire).expect("gpu pack");
        assert_eq!(layout_cpu, layout_gpu);
        assert_identical(&format!("pack into {wire:?}"), &flat_gpu, &flat_cpu);
        let mut out_cpu: Vec<Tensor> = cpu
            .iter()
            .map(|t| {
                let mut t = t.clone();
                t.zero_();
                t
            })
            .collect();
        let mut out_gpu: Vec<Tensor> = gpu
            .iter()
            .map(|t| {
                let mut t = t.clone();
                t.zero_();
                t
            })
            .collect();
        unpack(
            &flat_cpu,
            &layout_cpu,
            &mut out_cpu.iter_mut().collect::<Vec<_>>(),
        )
        .expect("cpu unpack");
        unpack(
            &flat_gpu,
            &layout_gpu,
            &mut out_gpu.iter_mut().collect::<Vec<_>>(),
        )
        .expect("gpu unpack");
        for (i, (g, c)) in out_gpu.iter().zip(&out_cpu).enumerate() {
            assert!(!g.is_zeroed(), "unpack writes every destination");
            assert_identical(&format!("unpack {i} from {wire:?}"), g, c);
        }
    }
    // Mixing devices is refused before anything is written.
    let mixed = [&cpu[0], &gpu[2]];
    let err = pack_new(&mixed, DType::F32).expect_err("mixed devices");
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err:?}");
}
