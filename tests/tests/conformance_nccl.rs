//! A test binary of its own: a GPU suite, which `cargo xtask gpu-bundle`
//! ships alone to a machine with GPUs.
//!
//! The conformance suite on NcclComm (feature `nccl`): every case on worlds
//! of 1 to G ranks, one per GPU of this machine (G = the number of CUDA
//! devices; NCCL allows one rank per device in a communicator), in-process
//! through `nccl::run`, under both reductions: `RankOrdered`, whose sums
//! must be bitwise LocalComm's, and `Native` (NCCL's own collectives, the
//! default), whose sums are compared with an f64 reference within the
//! rounding of W additions in the element type (`Reductions::Library`).
//! Plus the CUDA-tensor path: `all_reduce_tensor` on device tensors gives
//! bitwise what LocalComm gives (rank-ordered; and native for the exact
//! operators), or the reference within that bound (native sums).
//!
//! Without NCCL or a GPU every test prints a loud SKIP banner and passes;
//! with `GRADWIRE_REQUIRE_GPU=1` (for GPU machines) that is a failure.

#![cfg(feature = "nccl")]

use gradwire_comm::nccl::{self, NcclComm, NcclConfig, NcclReduction};
use gradwire_comm::{Communicator, LocalComm, ReduceOp, local};
use gradwire_tensor::{CudaDevice, DType, Device, Tensor};
use gradwire_tests::conformance::{Case, Reductions, assert_passed, cases, run_case_with};
use gradwire_tests::gpu::gpus;

/// Both settings, the default first.
const REDUCTIONS: [NcclReduction; 2] = [NcclReduction::Native, NcclReduction::RankOrdered];

fn config(reduction: NcclReduction) -> NcclConfig {
    // A hang is a failure with a message, not a stuck job.
    // With the timeline on, as every harness (the case `timeline` reads it).
    NcclConfig {
        timeout: Some(gradwire_tests::gpu::nccl_test_timeout()),
        reduction,
        timeline: true,
        ..NcclConfig::default()
    }
}

/// What the suite compares a setting's sums with.
fn reductions(reduction: NcclReduction) -> Reductions {
    match reduction {
        NcclReduction::Native => Reductions::Library,
        NcclReduction::RankOrdered => Reductions::RankOrdered,
    }
}

/// The reductions to run: both, or the one `GRADWIRE_NCCL_REDUCTION` names
/// (`native` or `rank-ordered`; `gpu_suite.sh` runs the fault matrix's
/// two side by side).
fn reductions_to_run() -> Vec<NcclReduction> {
    match std::env::var("GRADWIRE_NCCL_REDUCTION").as_deref() {
        Err(_) => REDUCTIONS.to_vec(),
        Ok("native") => vec![NcclReduction::Native],
        Ok("rank-ordered") => vec![NcclReduction::RankOrdered],
        Ok(other) => panic!("GRADWIRE_NCCL_REDUCTION={other}: expected native or rank-ordered"),
    }
}

/// Runs the case called `name` on 1..=G GPUs under both reductions and
/// fails with every rank's failures.
fn conform(name: &'static str) {
    let Some(ordinals) = gpus(name) else {
        return;
    };
    for reduction in reductions_to_run() {
        for world in 1..=ordinals.len() {
            let verdicts = nccl::run(&ordinals[..world], config(reduction), move |comm| {
                let all = cases::<NcclComm>();
                let case: &Case<NcclComm> =
                    all.iter().find(|c| c.name == name).ok_or_else(|| {
                        gradwire_comm::CommError::InvalidArgument(format!("no case {name}"))
                    })?;
                run_case_with(&comm, case, reductions(reduction))
            })
            .unwrap_or_else(|e| panic!("{name} ({reduction:?}), world {world}: {e}"));
            assert_passed(&format!("{name} ({reduction:?})"), world, verdicts);
        }
    }
}

gradwire_tests::conformance_tests!(conform);

/// Rank `rank`'s input of length `len`: varied magnitudes and signs, so
/// that the order of the additions shows in the low bits.
fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let x = ((i * 7919 + rank * 104_729) % 10_007) as f32 / 997.0 - 5.0;
            x * (1.0 + rank as f32 * 1e-3) * if i % 3 == 0 { 1e3 } else { 1.0 }
        })
        .collect()
}

/// The precision of a dtype's storage (unit roundoff) and its smallest
/// positive value NCCL's scaled inputs may round to.
fn unit_roundoff(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (f64::from(f32::EPSILON) / 2.0, f64::from(f32::MIN_POSITIVE)),
        DType::F16 => (1.0 / 2048.0, 1.0 / 16_777_216.0),
        DType::BF16 => (1.0 / 256.0, f64::from(f32::MIN_POSITIVE)),
    }
}

/// The device path of `all_reduce_tensor`, under both reductions, for every
/// dtype, op, world size and length, including a zeroed tensor: bitwise
/// LocalComm's results where the reduction is rank-ordered (every op under
/// `RankOrdered`; Max and Min under `Native`, which are exact and keep
/// NaN), else (NCCL's sums) within the rounding of W additions in the
/// dtype of the f64 sum of the inputs as held.
#[test]
fn cuda_tensor_all_reduce_matches_local() {
    let test = "cuda_tensor_all_reduce_matches_local";
    let Some(ordinals) = gpus(test) else {
        return;
    };
    const LENGTHS: &[usize] = &[0, 1, 2, 7, 257, 4099, 65_537];
    for reduction in REDUCTIONS {
        for world in 1..=ordinals.len() {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                for op in ReduceOp::ALL {
                    // The reference: LocalComm on host tensors of the same
                    // values, and the inputs as held (rounded to dtype).
                    let expected = local::run(world, move |comm: LocalComm| {
                        LENGTHS
                            .iter()
                            .map(|&len| {
                                let mut t = Tensor::from_f32(&input(comm.rank(), len), len, dtype)?;
                                comm.all_reduce_tensor(&mut t, op)?;
                                Ok(t.to_f32_vec()?)
                            })
                            .collect::<Result<Vec<_>, gradwire_comm::CommError>>()
                    })
                    .expect("LocalComm ran");
                    let held = |rank: usize, len: usize| -> Vec<f64> {
                        Tensor::from_f32(&input(rank, len), len, dtype)
                            .and_then(|t| t.to_f32_vec())
                            .expect("host tensor")
                            .into_iter()
                            .map(f64::from)
                            .collect()
                    };
                    let got = nccl::run(&ordinals[..world], config(reduction), move |comm| {
                        let device = Device::Cuda(comm.device_ordinal());
                        LENGTHS
                            .iter()
                            .map(|&len| {
                                let host = Tensor::from_f32(&input(comm.rank(), len), len, dtype)?;
                                let mut t = host.to_device(device)?;
                                comm.all_reduce_tensor(&mut t, op)?;
                                Ok(t.to_device(Device::Cpu)?.to_f32_vec()?)
                            })
                            .collect::<Result<Vec<_>, gradwire_comm::CommError>>()
                    })
                    .expect("NcclComm ran");
                    let bitwise = reduction == NcclReduction::RankOrdered
                        || world == 1
                        || matches!(op, ReduceOp::Max | ReduceOp::Min);
                    let (u, tiny) = unit_roundoff(dtype);
                    let steps = world as f64;
                    let gamma = steps * u / (1.0 - steps * u);
                    for (rank, (want, have)) in expected.into_iter().zip(got).enumerate() {
                        let (want, have) = (want.expect("local rank"), have.expect("nccl rank"));
                        for ((&len, w), h) in LENGTHS.iter().zip(&want).zip(&have) {
                            let what = format!(
                                "{reduction:?}, world {world}, {dtype:?}, {op}, length {len}, rank {rank}"
                            );
                            assert_eq!(w.len(), h.len(), "{what}: length");
                            if bitwise {
                                let same = w.iter().zip(h).all(|(a, b)| a.to_bits() == b.to_bits());
                                assert!(same, "{what}: device result differs from LocalComm's");
                                continue;
                            }
                            let inputs: Vec<Vec<f64>> = (0..world).map(|r| held(r, len)).collect();
                            for (i, &value) in h.iter().enumerate() {
                                let sum: f64 = inputs.iter().map(|x| x[i]).sum();
                                let abs: f64 = inputs.iter().map(|x| x[i].abs()).sum();
                                let reference = if op == ReduceOp::Avg {
                                    sum / steps
                                } else {
                                    sum
                                };
                                let got = f64::from(value);
                                let allowed =
                                    gamma * abs + u * reference.abs().max(got.abs()) + steps * tiny;
                                assert!(
                                    (got - reference).abs() <= allowed,
                                    "{what} at {i}: got {got}, want {reference} within {allowed}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// NCCL's own all-reduce timed (`time_library_all_reduce`, the bench's
/// baseline): a positive time per call on every rank when the ranks agree;
/// a length or a count of runs that differs on one rank is a `Mismatch` on
/// every rank, before any raw call, and the communicator works afterwards.
#[test]
fn library_all_reduce_agrees_first() {
    let Some(ordinals) = gpus("library_all_reduce_agrees_first") else {
        return;
    };
    for world in 1..=ordinals.len() {
        let verdicts = nccl::run(&ordinals[..world], config(NcclReduction::Native), |comm| {
            let secs = comm.time_library_all_reduce(1 << 16, 8)?;
            let last = comm.world_size() - 1;
            let len = if comm.rank() == last {
                1 << 15
            } else {
                1 << 16
            };
            let mismatched_len = comm.time_library_all_reduce(len, 8);
            let runs = if comm.rank() == last { 9 } else { 8 };
            let mismatched_runs = comm.time_library_all_reduce(1 << 16, runs);
            let mut after = vec![1f32; 7];
            comm.all_reduce(&mut after, ReduceOp::Sum)?;
            Ok((secs, mismatched_len, mismatched_runs, after))
        })
        .unwrap_or_else(|e| panic!("world {world}: {e}"));
        for (rank, verdict) in verdicts.into_iter().enumerate() {
            let (secs, len, runs, after) =
                verdict.unwrap_or_else(|e| panic!("world {world}, rank {rank}: {e}"));
            assert!(secs > 0.0 && secs.is_finite(), "rank {rank}: {secs}");
            if world > 1 {
                assert!(
                    matches!(len, Err(gradwire_comm::CommError::Mismatch { .. })),
                    "world {world}, rank {rank}: {len:?}"
                );
                assert!(
                    matches!(runs, Err(gradwire_comm::CommError::Mismatch { .. })),
                    "world {world}, rank {rank}: {runs:?}"
                );
            }
            assert_eq!(after, vec![world as f32; 7], "rank {rank}: the next call");
        }
    }
}

/// Without a GPU the typed error path runs here: a CUDA tensor cannot even
/// be made, and NcclComm cannot start (no panic in either).
#[test]
fn without_gpus_everything_is_a_typed_error() {
    let device = CudaDevice::get(0);
    let have_gpu = NcclComm::nccl_version().is_ok() && device.is_ok();
    if have_gpu {
        // The GPU tests above cover this machine.
        return;
    }
    // (A GPU without NCCL makes its tensors; only NcclComm is refused.)
    if device.is_err() {
        let t = Tensor::zeros(4, DType::F32, Device::Cuda(0));
        assert!(
            matches!(t, Err(gradwire_tensor::Error::CudaUnavailable(_))),
            "{t:?}"
        );
    }
    let ran = nccl::run(&[0], config(NcclReduction::Native), |comm| Ok(comm.rank()));
    assert!(
        matches!(ran, Err(gradwire_comm::CommError::NcclUnavailable(_))),
        "{ran:?}"
    );
}
