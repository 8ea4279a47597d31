//! A test binary of its own: a GPU suite, which `cargo xtask gpu-bundle`
//! ships alone to a machine with a GPU.
//!
//! AdaSum on CUDA tensors (feature `cuda`) against AdaSum on the CPU: the
//! pairwise rule's kernels and the whole recursive-halving combination on
//! world sizes 1 to 8 agree within the rounding of the f64 partial sums.
//!
//! Without a CUDA device each test prints `SKIP`; `GRADWIRE_REQUIRE_GPU=1`
//! makes a missing device a failure.

#![cfg(feature = "cuda")]

use gradwire_algos::AlgoError;
use gradwire_algos::adasum::kernels;
use gradwire_algos::adasum::{self, AdaSum};
use gradwire_comm::{Communicator, LocalComm, local};
use gradwire_tensor::cuda_backend::testing;
use gradwire_tensor::{CpuStorage, CudaStorage, Device, Tensor};

/// Whether device 0 is there (else `testing::device_or_skip` printed the
/// SKIP line; a missing device fails under `GRADWIRE_REQUIRE_GPU=1`).
fn device_or_skip(test: &str) -> bool {
    testing::device_or_skip(test)
        .expect("CUDA device 0")
        .is_some()
}

#[path = "it/common.rs"]
mod common;
use common::{ranges, vector};

fn host(s: &CudaStorage) -> Vec<f32> {
    s.read_f32(0..s.len()).unwrap()
}

/// The device and CPU results differ only through the f64 partial sums,
/// which differ by at most `n eps` relative to the sums of magnitudes; the
/// coefficients then move by a few f64 ulps and each pairwise combination's
/// f32 result by at most one rounding, which the later levels carry along.
/// Allow `levels + 1` f32 ulps of each element's magnitude (at least
/// `scale`, the inputs' magnitude, so that cancellation does not shrink it).
fn assert_close(what: &str, gpu: &[f32], cpu: &[f32], scale: f32, levels: u32) {
    assert_eq!(gpu.len(), cpu.len(), "{what}");
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        let tolerance = (levels + 1) as f32 * f32::EPSILON * c.abs().max(scale);
        assert!(
            (g - c).abs() <= tolerance,
            "{what}: element {i}: gpu {g} cpu {c} (tolerance {tolerance})"
        );
    }
}

#[test]
fn pairwise_kernels_match_the_cpu() {
    if !device_or_skip("pairwise_kernels_match_the_cpu") {
        return;
    }
    for sizes in [
        vec![1],
        vec![7, 0, 13],
        vec![257; 9],
        vec![65_537, 3, 100_003],
    ] {
        let tensors = ranges(&sizes);
        let n: usize = sizes.iter().sum();
        let (a, b) = (vector(1, 0, n), vector(2, 0, n));
        let mut cpu = a.clone();
        adasum::pairwise(&mut cpu, &b, &tensors).unwrap();
        let da = CudaStorage::from_cpu(&CpuStorage::F32(a.clone()), 0).unwrap();
        let db = CudaStorage::from_cpu(&CpuStorage::F32(b.clone()), 0).unwrap();
        let mut gpu = da.clone();
        kernels::pairwise(&mut gpu, &db, &tensors).unwrap();
        assert_close(&format!("pairwise {sizes:?}"), &host(&gpu), &cpu, 0.5, 1);
        // The partials over a piece, against an f64 reference.
        let piece = n / 3..n;
        let sums = kernels::partials(&da, &db, &tensors, piece.clone()).unwrap();
        for (t, s) in tensors.iter().zip(sums.chunks_exact(3)) {
            let (lo, hi) = (t.start.max(piece.start), t.end.min(piece.end));
            let (mut dot, mut aa, mut bb) = (0f64, 0f64, 0f64);
            for i in lo..hi.max(lo) {
                let (x, y) = (f64::from(a[i]), f64::from(b[i]));
                dot += x * y;
                aa += x * x;
                bb += y * y;
            }
            let bound = 2.0 * (hi.max(lo) - lo) as f64 * f64::EPSILON * (aa + bb);
            assert!((s[0] - dot).abs() <= bound, "dot {} vs {dot}", s[0]);
            assert!((s[1] - aa).abs() <= bound, "aa {} vs {aa}", s[1]);
            assert!((s[2] - bb).abs() <= bound, "bb {} vs {bb}", s[2]);
        }
    }
}

/// AdaSum on `world` ranks, every rank's tensors on device 0, against the
/// CPU AdaSum on the same inputs.
fn combine_on_both(world: usize, sizes: &[usize], group: Option<usize>) {
    let tensors = ranges(sizes);
    let n: usize = sizes.iter().sum();
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| vector(10, r, n)).collect();
    let results = local::run(world, |comm: LocalComm| {
        let ada = match group {
            None => AdaSum::new(&comm)?,
            Some(g) => AdaSum::hierarchical(&comm, g)?,
        };
        let mut cpu = inputs[comm.rank()].clone();
        ada.combine_flat(&comm, &mut cpu, &tensors)?;
        // The same through Tensors on the device (pack, combine, unpack).
        let mut parts: Vec<Tensor> = tensors
            .iter()
            .map(|t| {
                Tensor::from_slice(&inputs[comm.rank()][t.clone()], t.len())
                    .and_then(|t| t.to_device(Device::Cuda(0)))
            })
            .collect::<Result<_, _>>()?;
        ada.combine(&comm, &mut parts)?;
        let mut gpu = Vec::with_capacity(n);
        for part in &parts {
            assert_eq!(part.device(), Device::Cuda(0));
            gpu.extend(part.to_device(Device::Cpu)?.to_vec::<f32>()?);
        }
        Ok::<_, AlgoError>((cpu, gpu))
    })
    .unwrap();
    let results: Vec<(Vec<f32>, Vec<f32>)> = results.into_iter().map(|r| r.unwrap()).collect();
    let first_gpu = &results[0].1;
    for (rank, (cpu, gpu)) in results.iter().enumerate() {
        let what = format!("world {world} sizes {sizes:?} group {group:?} rank {rank}");
        assert_eq!(
            gpu.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            first_gpu.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{what}: ranks disagree on the device"
        );
        // The fold, log2 levels of halving, and a hierarchy's average.
        let levels = world.next_power_of_two().trailing_zeros() + 2;
        assert_close(&what, gpu, cpu, 0.5, levels);
    }
}

#[test]
fn device_adasum_matches_the_cpu_on_world_sizes_1_to_8() {
    if !device_or_skip("device_adasum_matches_the_cpu_on_world_sizes_1_to_8") {
        return;
    }
    for world in 1..=8 {
        combine_on_both(world, &[1], None);
        combine_on_both(world, &[13, 0, 257, 7], None);
        combine_on_both(world, &[100_003, 31], None);
    }
    combine_on_both(4, &[1021, 5], Some(2));
    combine_on_both(6, &[1021, 5], Some(3));
}
