//! `gradwire bench kernels` (feature `cuda`): the device codecs on CUDA
//! device 0, each beside a device-to-device copy of the same bytes measured
//! in the same run (the GPU's memcpy), so the figures are ratios.
//!
//! Each timed run queues the codec and waits for the device's stream (the
//! selections also wait for their counts, as a caller does), and inputs
//! rotate over four buffers (`ROTATION`) so that no run finds its input in
//! L2. The same data as `gradwire bench compress` (`bench::gradient`).
//!
//! With the `nccl` feature, [`nccl_device_rows`] times NcclComm's
//! all-reduce of CUDA tensors beside NCCL's own `ncclAllReduce` called
//! directly (`NcclComm::time_library_all_reduce`), in the same run.

use super::{Budget, CompressRow, gradient, median_time};
use crate::error::{ExperimentError, Result};
use gradwire_compress::cast::CastOptions;
use gradwire_compress::cuda::lowrank::{self, Window, WindowMut};
use gradwire_compress::cuda::{self, CudaErrorFeedback, DeviceBytes, DeviceSelectScratch};
use gradwire_compress::{Quantizer, SparseCodec};
use gradwire_tensor::{CpuStorage, CudaDevice, CudaStorage, DType};
use std::hint::black_box;
use std::sync::Arc;

/// Input buffers each measurement cycles through.
const ROTATION: usize = 4;

/// The codecs `gradwire bench kernels` knows.
pub const KERNEL_CODECS: &[&str] = &[
    "f16",
    "bf16",
    "threshold",
    "topk",
    "sampled-topk",
    "ef-topk",
    "onebit",
    "qsgd",
    "qsgd4",
    "e3m0",
    "uint8",
    "powersgd",
    "powersgd-project",
    "powersgd-orthonormalize",
    "powersgd-project-back",
    "powersgd-reconstruct",
];

fn device() -> Result<Arc<CudaDevice>> {
    Ok(CudaDevice::get(0)?)
}

/// `ROTATION` device copies of `x`.
fn inputs(x: &[f32]) -> Result<Vec<CudaStorage>> {
    (0..ROTATION)
        .map(|_| Ok(CudaStorage::from_cpu(&CpuStorage::F32(x.to_vec()), 0)?))
        .collect()
}

/// The median seconds of `f(input)` over the rotating inputs, each run
/// waited for.
fn timed(
    budget: Budget,
    device: &CudaDevice,
    inputs: &[CudaStorage],
    mut f: impl FnMut(&CudaStorage) -> Result<()>,
) -> Result<f64> {
    let mut next = 0;
    median_time(budget, || {
        f(&inputs[next % inputs.len()])?;
        next += 1;
        device.synchronize()?;
        Ok(())
    })
}

/// A device-to-device copy of `n` f32 values.
fn copy_secs(device: &CudaDevice, inputs: &[CudaStorage], budget: Budget) -> Result<f64> {
    let n = inputs[0].len();
    let mut dst = CudaStorage::alloc_zeros(n, DType::F32, 0)?;
    let stream = Arc::clone(device.stream());
    timed(budget, device, inputs, |src| {
        let from = src.bytes()?;
        let mut to = dst.bytes_mut()?;
        stream
            .memcpy_dtod(&from, &mut to)
            .map_err(|e| ExperimentError::Usage(format!("cuMemcpyDtoD: {e:?}")))
    })
}

/// Each codec on `elements` f32 values on device 0, beside the copy.
pub fn kernels(codecs: &[String], elements: &[usize], budget: Budget) -> Result<Vec<CompressRow>> {
    budget.check()?;
    super::check_elements(elements.iter().copied())?;
    for codec in codecs {
        if !KERNEL_CODECS.contains(&codec.as_str()) {
            return Err(ExperimentError::Usage(format!(
                "unknown codec {codec:?} (one of: {})",
                KERNEL_CODECS.join(", ")
            )));
        }
    }
    let device = device()?;
    let mut rows = Vec::new();
    for &n in elements {
        let x = gradient(n);
        let xs = inputs(&x)?;
        let copy = copy_secs(&device, &xs, budget)?;
        for codec in codecs {
            let secs = codec_secs(codec, &device, &xs, budget)?;
            rows.push(CompressRow::new(codec, n, secs, copy));
        }
    }
    Ok(rows)
}

fn codec_secs(codec: &str, device: &CudaDevice, xs: &[CudaStorage], budget: Budget) -> Result<f64> {
    let n = xs[0].len();
    let opts = CastOptions::default();
    Ok(match codec {
        "f16" | "bf16" => {
            let dtype = if codec == "f16" {
                DType::F16
            } else {
                DType::BF16
            };
            let mut wire = CudaStorage::alloc_zeros(n, dtype, 0)?;
            timed(budget, device, xs, |x| {
                Ok(cuda::encode(x, &mut wire, &opts)?)
            })?
        }
        // The selections keep their working memory from call to call, as
        // a strategy's bucket does.
        "threshold" | "topk" | "sampled-topk" => {
            let codec = match codec {
                "threshold" => SparseCodec::Threshold(0.0097),
                "topk" => SparseCodec::TopK(0.01),
                _ => SparseCodec::SampledTopK(0.01),
            };
            let mut scratch = DeviceSelectScratch::default();
            timed(budget, device, xs, |x| {
                black_box(cuda::select_with(x, &codec, &mut scratch)?);
                Ok(())
            })?
        }
        "ef-topk" => {
            let mut memory = CudaErrorFeedback::new(n, 0)?;
            let codec = SparseCodec::TopK(0.01);
            let mut scratch = DeviceSelectScratch::default();
            timed(budget, device, xs, |x| {
                black_box(memory.compress_with(x, &codec, &mut scratch)?);
                Ok(())
            })?
        }
        "onebit" => quantize_round_trip(Quantizer::Sign, device, xs, budget)?,
        "qsgd" => quantize_round_trip(
            Quantizer::Qsgd {
                levels: 127,
                seed: 7,
                norm: gradwire_compress::QsgdNorm::L2,
            },
            device,
            xs,
            budget,
        )?,
        "qsgd4" => quantize_round_trip(super::QSGD_4BIT, device, xs, budget)?,
        "e3m0" => quantize_round_trip(super::E3M0, device, xs, budget)?,
        "uint8" => quantize_round_trip(Quantizer::MinMaxU8, device, xs, budget)?,
        "powersgd" => powersgd_step(device, xs, budget, &PRODUCTS)?,
        "powersgd-project" => powersgd_step(device, xs, budget, &[Product::Project])?,
        "powersgd-orthonormalize" => powersgd_step(device, xs, budget, &[Product::Orthonormalize])?,
        "powersgd-project-back" => powersgd_step(device, xs, budget, &[Product::ProjectBack])?,
        "powersgd-reconstruct" => powersgd_step(device, xs, budget, &[Product::Reconstruct])?,
        other => return Err(ExperimentError::Usage(format!("unknown codec {other:?}"))),
    })
}

/// An encode into a kept payload and a decode back.
fn quantize_round_trip(
    q: Quantizer,
    device: &CudaDevice,
    xs: &[CudaStorage],
    budget: Budget,
) -> Result<f64> {
    let n = xs[0].len();
    let mut payload = DeviceBytes::zeros(q.encoded_len(n), 0)?;
    let mut out = CudaStorage::alloc_zeros(n, DType::F32, 0)?;
    let mut stream = 0u64;
    timed(budget, device, xs, |x| {
        stream += 1;
        cuda::quant_encode_into(&q, x, stream, &mut payload)?;
        cuda::quant_decode(&q, &payload, &mut out)?;
        Ok(())
    })
}

/// A PowerSGD step's products, in the order a step runs them (`powersgd`
/// times all four; `powersgd-<product>` one, to find the slow kernel).
#[derive(Debug, Clone, Copy)]
enum Product {
    Project,
    Orthonormalize,
    ProjectBack,
    Reconstruct,
}

/// Every product of a step.
const PRODUCTS: [Product; 4] = [
    Product::Project,
    Product::Orthonormalize,
    Product::ProjectBack,
    Product::Reconstruct,
];

/// A rank-4 PowerSGD step's products on 1024 rows (as `gradwire bench
/// compress` times them on the CPU), those of `timed_products` timed; the
/// others run once before, so that each timed one has its real operands.
fn powersgd_step(
    device: &CudaDevice,
    xs: &[CudaStorage],
    budget: Budget,
    timed_products: &[Product],
) -> Result<f64> {
    const ROWS: usize = 1024;
    const RANK: usize = 4;
    let n = xs[0].len();
    let cols = (n / ROWS).max(1);
    let rows = n.min(ROWS * cols) / cols;
    let mut q = vec![0f32; RANK * cols];
    gradwire_compress::lowrank::init_q(3, &mut q);
    let mut qt = CudaStorage::from_cpu(&CpuStorage::F32(q), 0)?;
    let mut p = CudaStorage::alloc_zeros(rows * RANK, DType::F32, 0)?;
    let mut approx = CudaStorage::alloc_zeros(rows * cols, DType::F32, 0)?;
    let mut step = |x: &CudaStorage, products: &[Product]| -> Result<()> {
        let m = Window::new(x, 0..rows * cols)?;
        for product in products {
            match product {
                Product::Project => lowrank::project(
                    &m,
                    rows,
                    cols,
                    &Window::whole(&qt)?,
                    &mut WindowMut::whole(&mut p)?,
                )?,
                Product::Orthonormalize => {
                    lowrank::orthonormalize(&mut WindowMut::whole(&mut p)?, rows, RANK)?
                }
                Product::ProjectBack => lowrank::project_back(
                    &m,
                    rows,
                    cols,
                    &Window::whole(&p)?,
                    &mut WindowMut::whole(&mut qt)?,
                )?,
                Product::Reconstruct => lowrank::reconstruct(
                    &Window::whole(&p)?,
                    &Window::whole(&qt)?,
                    rows,
                    cols,
                    &mut WindowMut::whole(&mut approx)?,
                )?,
            }
        }
        Ok(())
    };
    step(&xs[0], &PRODUCTS)?;
    timed(budget, device, xs, |x| step(x, timed_products))
}

/// NcclComm's all-reduce of f32 CUDA tensors of each size (inputs rotating
/// over `ROTATION` tensors) and NCCL's own `ncclAllReduce` of the same
/// bytes called directly, on every rank of `comm` (rank 0's figures);
/// `memcpy` gives the host copy the rows are also compared with.
#[cfg(feature = "nccl")]
pub fn nccl_device_rows(
    comm: &gradwire_comm::NcclComm,
    sizes: &[usize],
    budget: Budget,
    memcpy: impl Fn(usize) -> Result<f64>,
) -> Result<Vec<super::AllReduceRow>> {
    use super::AllReduceRow;
    use gradwire_comm::{Communicator, ReduceOp};
    use gradwire_tensor::{Device, Tensor};
    let world = comm.world_size();
    let device = Device::Cuda(comm.device_ordinal());
    let mut rows = Vec::new();
    for &bytes in sizes {
        let len = bytes / 4;
        let mut memcpy = [if comm.rank() == 0 {
            memcpy(bytes)?
        } else {
            0.0
        }];
        let mut tensors = (0..ROTATION)
            .map(|_| Ok(Tensor::from_vec(vec![0f32; len], len)?.to_device(device)?))
            .collect::<Result<Vec<_>>>()?;
        let mut next = 0;
        let mut secs = [super::time_collective(comm, budget, || {
            comm.all_reduce_tensor(&mut tensors[next % ROTATION], ReduceOp::Sum)?;
            next += 1;
            Ok(())
        })?];
        // As many library calls as fill the budget at NcclComm's pace, the
        // same count on every rank.
        let mut runs = [((budget.min_secs / secs[0].max(1e-9)).ceil() as u64).clamp(5, 100_000)];
        comm.broadcast(&mut runs, 0)?;
        let runs = usize::try_from(runs[0]).unwrap_or(5);
        let mut library = [comm.time_library_all_reduce(len, runs)?];
        comm.broadcast(&mut secs, 0)?;
        comm.broadcast(&mut library, 0)?;
        comm.broadcast(&mut memcpy, 0)?;
        rows.push(AllReduceRow::new(
            "nccl (device tensors)",
            world,
            bytes,
            secs[0],
            memcpy[0],
        ));
        rows.push(AllReduceRow::new(
            "ncclAllReduce alone",
            world,
            bytes,
            library[0],
            memcpy[0],
        ));
    }
    Ok(rows)
}
