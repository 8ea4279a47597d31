//! A test binary of its own: a GPU suite, which `cargo xtask gpu-bundle`
//! ships alone to a machine with GPUs.
//!
//! DistOpt end to end on the GPU (feature `nccl`): parameters, gradients,
//! fusion buffers, the skip vote's zeros, error-feedback residuals and the
//! optimizer state in device memory, NcclComm between the ranks (one per
//! GPU), against the same training with host tensors on LocalComm, in the
//! dense, half (f16, bf16 clipped), sparse (top-k with error feedback,
//! threshold) and PowerSGD modes.
//!
//! With NcclComm's rank-ordered reduction the device run must equal the
//! host run bit for bit (every kernel is bitwise the CPU, and the reduction
//! is LocalComm's), except PowerSGD, whose orthonormalisation on the GPU is
//! within a few ulps of the CPU's; with NCCL's own collectives every mode
//! must agree within the rounding of a differently ordered sum (f32), of
//! f16 or bf16 sums (half mode), or of that orthonormalisation (PowerSGD).
//! Worlds of 1 to G ranks (G = the GPUs present). Without NCCL or a GPU
//! each test prints a SKIP banner (a failure under GRADWIRE_REQUIRE_GPU=1).
//!
//! And what a steady step allocates on the device, every mode, as the
//! host's counting allocator states it for host memory: counted by
//! gradwire-tensor's `DeviceAllocations`, printed, and never as much as
//! the bucket (the copies kept from before a step are written in place).

#![cfg(feature = "nccl")]

use gradwire_algos::{HalfPrecision, PowerSgdConfig};
use gradwire_comm::nccl::{self, NcclComm, NcclConfig, NcclReduction};
use gradwire_comm::{CommError, Communicator, LocalComm, local};
use gradwire_compress::SparseCodec;
use gradwire_optim::{
    Adam, AdamConfig, AnyOptimizer, DistOpt, DistOptConfig, OptimError, ParamSpec, Schedule, Sgd,
    SgdConfig, StrategyConfig,
};
use gradwire_tensor::{Device, DeviceAllocations, Tensor};
use gradwire_tests::gpu::gpus;

/// The parameters' shapes: a matrix, vectors, a prime length, one element.
const SHAPES: [&[usize]; 5] = [&[64, 33], &[33], &[1009], &[7, 3], &[1]];
const STEPS: usize = 4;

/// Deterministic values in [-1, 1) for (rank, step, parameter).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn specs(device: Device) -> Vec<ParamSpec> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(k, s)| ParamSpec::new(format!("p{k}"), s.to_vec()).on_device(device))
        .collect()
}

fn config(mode: StrategyConfig) -> DistOptConfig {
    DistOptConfig {
        strategy: mode,
        // Small buckets: several per step, some holding one parameter.
        fusion_threshold: 1000,
        ..DistOptConfig::default()
    }
}

/// Adam (its state on the device) for the bitwise comparison; plain SGD,
/// whose steps move with the gradients' rounding linearly, for the
/// comparison within a bound.
#[derive(Debug, Clone, Copy)]
enum Rule {
    Adam,
    Sgd,
}

/// SGD's learning rate.
const SGD_LR: f32 = 0.1;

fn optimizer(rule: Rule) -> Result<AnyOptimizer, OptimError> {
    match rule {
        Rule::Adam => AnyOptimizer::new(Adam::new(AdamConfig {
            lr: Schedule::constant(0.01),
            ..AdamConfig::default()
        })?),
        Rule::Sgd => AnyOptimizer::new(Sgd::new(SgdConfig {
            lr: Schedule::constant(f64::from(SGD_LR)),
            ..SgdConfig::default()
        })?),
    }
}

/// `STEPS` steps of DistOpt on `comm`, tensors on `device`; the final
/// parameters on the host. Parameter 3 is never pushed on rank 1 (the
/// others send it, rank 1 sends zeros), parameter 4 never on any rank in
/// odd steps (skipped by every rank).
fn train<C: Communicator + 'static>(
    comm: C,
    device: Device,
    mode: StrategyConfig,
    rule: Rule,
) -> Result<Vec<Vec<f32>>, OptimError> {
    let rank = comm.rank();
    let mut dist = DistOpt::new(optimizer(rule)?, comm, specs(device), config(mode))?;
    let mut params: Vec<Tensor> = SHAPES
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let n = s.iter().product();
            Tensor::from_vec(values(n, 1000 + k as u64), s.to_vec())?.to_device(device)
        })
        .collect::<Result<_, _>>()?;
    for step in 0..STEPS {
        for (k, shape) in SHAPES.iter().enumerate().rev() {
            if (k == 3 && rank == 1) || (k == 4 && step % 2 == 1) {
                continue;
            }
            let n = shape.iter().product();
            let seed = (rank as u64 * 100 + step as u64) * 10 + k as u64;
            let grad = Tensor::from_vec(values(n, seed), shape.to_vec())?.to_device(device)?;
            dist.push(&format!("p{k}"), grad)?;
        }
        let names: Vec<String> = (0..SHAPES.len()).map(|k| format!("p{k}")).collect();
        dist.finish(names.iter().map(String::as_str).zip(params.iter_mut()))?;
    }
    params
        .iter()
        .map(|p| {
            assert_eq!(p.device(), device, "a parameter left its device");
            Ok(p.to_device(Device::Cpu)?.to_vec::<f32>()?)
        })
        .collect()
}

/// The host run on LocalComm: every rank's final parameters.
fn on_host(world: usize, mode: StrategyConfig, rule: Rule) -> Vec<Vec<Vec<f32>>> {
    local::run(world, |comm: LocalComm| {
        train(comm, Device::Cpu, mode, rule)
    })
    .expect("local run")
    .into_iter()
    .map(|r| r.expect("host training"))
    .collect()
}

/// The device run on NcclComm over `ordinals`: every rank's parameters.
fn on_gpus(
    ordinals: &[usize],
    reduction: NcclReduction,
    mode: StrategyConfig,
    rule: Rule,
) -> Vec<Vec<Vec<f32>>> {
    let config = NcclConfig {
        timeout: Some(gradwire_tests::gpu::nccl_test_timeout()),
        reduction,
        ..NcclConfig::default()
    };
    nccl::run(ordinals, config, |comm: NcclComm| {
        let device = Device::Cuda(comm.device_ordinal());
        train(comm, device, mode, rule).map_err(|e| CommError::InvalidArgument(e.to_string()))
    })
    .expect("nccl run")
    .into_iter()
    .map(|r| r.expect("device training"))
    .collect()
}

/// The modes, the relative precision of their wire (what one differently
/// rounded sum may be off by, per rank), and whether a device run with the
/// rank-ordered reduction is bitwise the host run (PowerSGD's
/// orthonormalisation sums in f64 in another order on the GPU: within a
/// few ulps, which its error feedback carries along).
fn modes() -> [(&'static str, StrategyConfig, f32, bool); 6] {
    [
        ("dense", StrategyConfig::Dense, f32::EPSILON, true),
        (
            "half f16",
            StrategyConfig::Half {
                precision: HalfPrecision::F16,
                clip: None,
            },
            2f32.powi(-10),
            true,
        ),
        (
            "half bf16 clipped",
            StrategyConfig::Half {
                precision: HalfPrecision::BF16,
                clip: Some(0.5),
            },
            2f32.powi(-7),
            true,
        ),
        (
            "top-k 10 % with error feedback",
            StrategyConfig::Sparse {
                codec: SparseCodec::TopK(0.1),
                error_feedback: true,
            },
            f32::EPSILON,
            true,
        ),
        (
            "threshold",
            StrategyConfig::Sparse {
                codec: SparseCodec::Threshold(0.9),
                error_feedback: false,
            },
            f32::EPSILON,
            true,
        ),
        (
            "PowerSGD rank 2",
            StrategyConfig::PowerSgd(PowerSgdConfig {
                rank: 2,
                start_step: 1,
                ..PowerSgdConfig::default()
            }),
            2f32.powi(-14),
            false,
        ),
    ]
}

#[test]
fn rank_ordered_device_training_is_bitwise_the_host_training() {
    let Some(ordinals) = gpus("rank_ordered_device_training_is_bitwise_the_host_training") else {
        return;
    };
    for world in 1..=ordinals.len() {
        for (name, mode, _, bitwise) in modes() {
            if !bitwise {
                continue;
            }
            let host = on_host(world, mode, Rule::Adam);
            let device = on_gpus(
                &ordinals[..world],
                NcclReduction::RankOrdered,
                mode,
                Rule::Adam,
            );
            for (rank, (h, d)) in host.iter().zip(&device).enumerate() {
                for (k, (hp, dp)) in h.iter().zip(d).enumerate() {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(dp),
                        bits(hp),
                        "{name}, world {world}, rank {rank}, parameter {k}"
                    );
                }
            }
        }
    }
}

#[test]
fn device_training_agrees_with_the_host_training_within_rounding() {
    let Some(ordinals) = gpus("device_training_agrees_with_the_host_training_within_rounding")
    else {
        return;
    };
    for world in 1..=ordinals.len() {
        for ((name, mode, precision, _), reduction) in modes()
            .into_iter()
            .flat_map(|m| [(m, NcclReduction::Native), (m, NcclReduction::RankOrdered)])
        {
            let host = on_host(world, mode, Rule::Sgd);
            let device = on_gpus(&ordinals[..world], reduction, mode, Rule::Sgd);
            // Each step's averaged gradient (entries below 1) is off by at
            // most W roundings of the mode's precision (NCCL summing in
            // another order or in f16 / bf16; PowerSGD's orthonormalisation
            // on the GPU); SGD moves the parameters by lr times that, per
            // step.
            let bound = SGD_LR * STEPS as f32 * world as f32 * 2.0 * precision;
            for (rank, d) in device.iter().enumerate() {
                // The ranks agree bitwise among themselves whatever NCCL
                // does: they all receive the same reduced values.
                assert_eq!(
                    d, &device[0],
                    "{name} ({reduction:?}), world {world}: rank {rank} differs"
                );
                for (k, (hp, dp)) in host[rank].iter().zip(d).enumerate() {
                    for (i, (h, g)) in hp.iter().zip(dp).enumerate() {
                        assert!(
                            (h - g).abs() <= bound,
                            "{name} ({reduction:?}), world {world}, parameter {k}[{i}]: host {h}, device {g}"
                        );
                    }
                }
            }
        }
    }
}

/// The one parameter of the allocation count: a bucket of 1 MiB.
const STEADY_SHAPE: [usize; 2] = [512, 512];
/// Steps before the count (past PowerSGD's dense first step and every
/// buffer's first growth), and steps counted.
const WARM_STEPS: usize = 4;
const COUNTED_STEPS: usize = 4;

/// What DistOpt allocated on the device in `COUNTED_STEPS` steady steps on
/// `comm` (one rank: the count is the process's), every step's gradient
/// made before the count.
fn steady_allocations(
    comm: NcclComm,
    mode: StrategyConfig,
) -> Result<DeviceAllocations, OptimError> {
    let device = Device::Cuda(comm.device_ordinal());
    let n = STEADY_SHAPE.iter().product();
    let specs = vec![ParamSpec::new("w", STEADY_SHAPE.to_vec()).on_device(device)];
    let mut dist = DistOpt::new(optimizer(Rule::Adam)?, comm, specs, config(mode))?;
    let mut param = Tensor::from_vec(values(n, 1), STEADY_SHAPE.to_vec())?.to_device(device)?;
    let grads = (0..WARM_STEPS + COUNTED_STEPS)
        .map(|step| {
            Tensor::from_vec(values(n, 7 + step as u64), STEADY_SHAPE.to_vec())?.to_device(device)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut before = DeviceAllocations::now();
    for (step, grad) in grads.into_iter().enumerate() {
        if step == WARM_STEPS {
            before = DeviceAllocations::now();
        }
        dist.push("w", grad)?;
        dist.finish(std::iter::once(("w", &mut param)))?;
    }
    Ok(DeviceAllocations::now().since(before))
}

#[test]
fn steady_device_steps_allocate_less_than_their_bucket() {
    let Some(ordinals) = gpus("steady_device_steps_allocate_less_than_their_bucket") else {
        return;
    };
    let bucket_bytes = 4 * STEADY_SHAPE.iter().product::<usize>() as u64;
    let config = NcclConfig {
        timeout: Some(gradwire_tests::gpu::nccl_test_timeout()),
        ..NcclConfig::default()
    };
    for (name, mode, _, _) in modes() {
        let counted = nccl::run(&ordinals[..1], config.clone(), |comm: NcclComm| {
            steady_allocations(comm, mode).map_err(|e| CommError::InvalidArgument(e.to_string()))
        })
        .expect("nccl run")
        .into_iter()
        .map(|r| r.expect("device training"))
        .next()
        .expect("one rank");
        let steps = COUNTED_STEPS as u64;
        println!(
            "device allocations per steady step, {name}: {:.1} ({} bytes; the bucket {bucket_bytes})",
            counted.count as f64 / steps as f64,
            counted.bytes / steps
        );
        // Before the copies kept in place, the residual's copy on write
        // alone was the bucket's size every step (top-k, PowerSGD).
        assert!(
            counted.bytes / steps < bucket_bytes,
            "{name}: {counted:?} in {steps} steps, the bucket {bucket_bytes} bytes"
        );
        // Every working buffer is kept (the reductions' partials, the
        // selection's scratch, the staging room of gathered lists): a
        // sparse step allocates the list it selects (indices and values),
        // plus the staging room's growth at most once; the others nothing.
        let at_most = match mode {
            StrategyConfig::Sparse { .. } => 2 * steps + 2,
            _ => 0,
        };
        assert!(
            counted.count <= at_most,
            "{name}: {counted:?} in {steps} steps, at most {at_most} allocations"
        );
    }
}
