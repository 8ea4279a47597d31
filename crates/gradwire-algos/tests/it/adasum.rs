//! AdaSum against the sequential reference for W in 1..=9 and odd lengths,
//! and its algebra: orthogonal gradients are summed, identical ones come back
//! unchanged, scaling every input scales the output, zeros stay zeros, and
//! every rank holds bitwise the same result.

use gradwire_algos::AlgoError;
use gradwire_algos::adasum::{self, AdaSum};
use gradwire_comm::{Communicator, LocalComm, local};
use proptest::prelude::*;
use std::ops::Range;

/// Tensor boundaries for a list of sizes.
use crate::common::{ranges, vector};

/// Runs AdaSum on `world` ranks, each with `inputs[rank]`; returns every
/// rank's result (checked bitwise equal).
fn run(inputs: &[Vec<f32>], tensors: &[Range<usize>], group: Option<usize>) -> Vec<f32> {
    let results = local::run(inputs.len(), |comm: LocalComm| {
        let ada = match group {
            None => AdaSum::new(&comm)?,
            Some(g) => AdaSum::hierarchical(&comm, g)?,
        };
        let mut v = inputs[comm.rank()].clone();
        ada.combine_flat(&comm, &mut v, tensors)?;
        Ok::<_, AlgoError>(v)
    })
    .unwrap();
    let results: Vec<Vec<f32>> = results.into_iter().map(|r| r.unwrap()).collect();
    for (r, v) in results.iter().enumerate() {
        let same = v
            .iter()
            .zip(&results[0])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "rank {r} differs from rank 0");
    }
    results.into_iter().next().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn matches_the_sequential_tree_for_any_world_size(
        world in 1usize..=9,
        sizes in prop::collection::vec(prop::sample::select(vec![1usize, 2, 3, 5, 7, 13, 31, 101]), 1..5),
        seed: u64,
    ) {
        let tensors = ranges(&sizes);
        let n = tensors.last().map_or(0, |t| t.end);
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| vector(seed, r, n)).collect();
        let got = run(&inputs, &tensors, None);
        let want = adasum::reference(inputs.clone(), &tensors).unwrap();
        // The same tree; only the order of f64 partial sums and the f32
        // rounding of each level differ: a few ulps per level.
        let levels = (usize::BITS - world.leading_zeros()) as f32 + 1.0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let bound = 4.0 * levels * f32::EPSILON * (1.0 + w.abs());
            prop_assert!((g - w).abs() <= bound, "index {}: {} vs {}", i, g, w);
        }
    }

    #[test]
    fn scaling_every_input_scales_the_result(world in 2usize..=6, seed: u64) {
        let tensors = ranges(&[17, 4]);
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| vector(seed, r, 21)).collect();
        let scaled: Vec<Vec<f32>> = inputs.iter().map(|v| v.iter().map(|x| x * 8.0).collect()).collect();
        let a = run(&inputs, &tensors, None);
        let b = run(&scaled, &tensors, None);
        for (x, y) in a.iter().zip(&b) {
            prop_assert!((x * 8.0 - y).abs() <= 1e-5 * (1.0 + y.abs()));
        }
    }
}

#[test]
fn orthogonal_gradients_are_summed_and_identical_ones_kept() {
    for world in [2usize, 3, 4, 5, 8] {
        let n = 16;
        let tensors = ranges(&[n]);
        // Disjoint supports: mutually orthogonal.
        let inputs: Vec<Vec<f32>> = (0..world)
            .map(|r| {
                (0..n)
                    .map(|i| if i % world == r { (i + 1) as f32 } else { 0.0 })
                    .collect()
            })
            .collect();
        let sum: Vec<f32> = (0..n).map(|i| inputs.iter().map(|v| v[i]).sum()).collect();
        assert_eq!(
            run(&inputs, &tensors, None),
            sum,
            "orthogonal, world {world}"
        );
        let same: Vec<Vec<f32>> = (0..world).map(|_| vector(3, 0, n)).collect();
        let got = run(&same, &tensors, None);
        for (g, w) in got.iter().zip(&same[0]) {
            assert!(
                (g - w).abs() <= 1e-6,
                "identical, world {world}: {g} vs {w}"
            );
        }
        let zeros = vec![vec![0f32; n]; world];
        assert_eq!(
            run(&zeros, &tensors, None),
            vec![0.0; n],
            "zeros, world {world}"
        );
    }
}

#[test]
fn coefficients_are_per_tensor() {
    // Tensor 0 identical on both ranks (averaged), tensor 1 orthogonal (summed).
    let tensors = ranges(&[2, 2]);
    let inputs = vec![vec![1.0, 2.0, 1.0, 0.0], vec![1.0, 2.0, 0.0, 3.0]];
    assert_eq!(run(&inputs, &tensors, None), vec![1.0, 2.0, 1.0, 3.0]);
}

#[test]
fn hierarchical_averages_in_the_node_then_adasums_across() {
    let tensors = ranges(&[5, 6]);
    for (world, group) in [(4usize, 2usize), (6, 2), (6, 3), (8, 4), (3, 1)] {
        let inputs: Vec<Vec<f32>> = (0..world).map(|r| vector(11, r, 11)).collect();
        let node_means: Vec<Vec<f32>> = (0..world / group)
            .map(|k| {
                (0..11)
                    .map(|i| {
                        // LocalComm's Avg: sum in rank order, then divide.
                        let s = (1..group)
                            .fold(inputs[k * group][i], |a, j| a + inputs[k * group + j][i]);
                        s / group as f32
                    })
                    .collect()
            })
            .collect();
        let want = adasum::reference(node_means, &tensors).unwrap();
        let got = run(&inputs, &tensors, Some(group));
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "world {world}, group {group}: {g} vs {w}"
            );
        }
    }
    let comm = LocalComm::create(1).unwrap().pop().unwrap();
    assert!(matches!(
        AdaSum::hierarchical(&comm, 0),
        Err(AlgoError::InvalidArgument(_))
    ));
}

#[test]
fn tensors_of_every_dtype_combine() {
    use gradwire_tensor::{DType, Tensor};
    let results = local::run(3, |comm: LocalComm| {
        let ada = AdaSum::new(&comm)?;
        let mut list = vec![
            Tensor::from_f32(&vector(5, comm.rank(), 9), 9, DType::F32)?,
            Tensor::from_f32(&vector(6, comm.rank(), 4), 4, DType::BF16)?,
        ];
        ada.combine(&comm, &mut list)?;
        Ok::<_, AlgoError>((list[0].to_f32_vec()?, list[1].dtype()))
    })
    .unwrap();
    for r in results {
        let (values, dtype) = r.unwrap();
        assert_eq!(values.len(), 9);
        assert_eq!(dtype, DType::BF16);
    }
}

#[test]
fn tensor_ranges_outside_the_vector_are_an_error_on_every_rank() {
    let results = local::run(3, |comm: LocalComm| {
        let ada = AdaSum::new(&comm)?;
        let mut v = vector(8, comm.rank(), 5);
        let before = v.clone();
        let outcome = ada.combine_flat(&comm, &mut v, &[0..2, 3..9]);
        Ok::<_, AlgoError>((outcome, v == before))
    })
    .unwrap();
    for r in results {
        let (outcome, unchanged) = r.unwrap();
        assert!(
            matches!(outcome, Err(AlgoError::InvalidArgument(_))),
            "{outcome:?}"
        );
        assert!(unchanged, "nothing is exchanged before the check");
    }
}
