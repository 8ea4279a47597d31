//! PowerSGD's low-rank arithmetic against an f64 reference: the three
//! products, the orthonormalisation (orthonormal columns spanning what the
//! input spanned; degenerate columns become zero, never NaN), and which
//! shapes are worth compressing.

use gradwire_compress::{CompressError, lowrank};
use proptest::prelude::*;

/// Deterministic values in [-1, 1).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `a (r x k) * b (k x c)` in f64, with `b` given transposed when `bt`.
fn matmul(a: &[f32], r: usize, k: usize, b: &[f32], c: usize, a_t: bool, b_t: bool) -> Vec<f64> {
    let at = |i: usize, l: usize| f64::from(if a_t { a[l * r + i] } else { a[i * k + l] });
    let bt = |l: usize, j: usize| f64::from(if b_t { b[j * k + l] } else { b[l * c + j] });
    let mut out = vec![0.0; r * c];
    for i in 0..r {
        for j in 0..c {
            out[i * c + j] = (0..k).map(|l| at(i, l) * bt(l, j)).sum();
        }
    }
    out
}

/// f32 products of `k` terms of magnitude at most `scale` each: rounding
/// grows with `k`.
fn assert_close(got: &[f32], want: &[f64], k: usize, scale: f64) {
    assert_eq!(got.len(), want.len());
    let bound = 4.0 * (k as f64 + 1.0) * f64::from(f32::EPSILON) * scale;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(*g) - w).abs() <= bound,
            "index {i}: {g} vs {w} (bound {bound})"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn products_match_the_f64_reference(
        // Past lowrank::SPAN (1024) too: sums of several spans.
        rows in prop::sample::select(vec![1usize, 2, 3, 7, 31, 64, 101, 1031, 2053]),
        cols in prop::sample::select(vec![1usize, 2, 5, 13, 64, 127, 1031, 3079]),
        rank in 1usize..=4,
        seed: u64,
    ) {
        let m = values(seed, rows * cols);
        // Q is kept transposed: rank x cols.
        let qt = values(seed ^ 1, rank * cols);
        let mut p = vec![0.0f32; rows * rank];
        lowrank::project(&m, rows, cols, &qt, &mut p).unwrap();
        assert_close(&p, &matmul(&m, rows, cols, &qt, rank, false, true), cols, 1.0);

        let mut qt2 = vec![0.0f32; rank * cols];
        lowrank::project_back(&m, rows, cols, &p, &mut qt2).unwrap();
        let p_scale = p.iter().fold(0f64, |a, v| a.max(f64::from(v.abs())));
        assert_close(&qt2, &matmul(&p, rank, rows, &m, cols, true, false), rows, p_scale);

        let mut out = vec![0.0f32; rows * cols];
        lowrank::reconstruct(&p, &qt2, rows, cols, &mut out).unwrap();
        let q_scale = qt2.iter().fold(0f64, |a, v| a.max(f64::from(v.abs())));
        assert_close(&out, &matmul(&p, rows, rank, &qt2, cols, false, false), rank, p_scale * q_scale);
    }

    #[test]
    fn orthonormalize_gives_orthonormal_columns_spanning_the_input(
        rows in prop::sample::select(vec![4usize, 5, 17, 64, 211]),
        rank in 1usize..=4,
        seed: u64,
    ) {
        let input = values(seed, rows * rank);
        let mut p = input.clone();
        lowrank::orthonormalize(&mut p, rows, rank).unwrap();
        // PᵀP = I, to f32 rounding of sums of `rows` terms.
        let gram = matmul(&p, rank, rows, &p, rank, true, false);
        let bound = 8.0 * rows as f64 * f64::from(f32::EPSILON);
        for i in 0..rank {
            for j in 0..rank {
                let want = if i == j { 1.0 } else { 0.0 };
                prop_assert!((gram[i * rank + j] - want).abs() <= bound, "gram[{i}][{j}] = {}", gram[i * rank + j]);
            }
        }
        // Every input column lies in the span: P Pᵀ x = x.
        let ptx = matmul(&p, rank, rows, &input, rank, true, false);
        let ptx: Vec<f32> = ptx.iter().map(|&v| v as f32).collect();
        let back = matmul(&p, rows, rank, &ptx, rank, false, false);
        for (i, (b, x)) in back.iter().zip(&input).enumerate() {
            prop_assert!((b - f64::from(*x)).abs() < 1e-4, "index {i}: {b} vs {x}");
        }
    }
}

#[test]
fn degenerate_columns_become_zero_not_nan() {
    // Column 1 is twice column 0; column 2 is zero; column 3 is independent.
    let rows = 5;
    let mut p = Vec::new();
    for i in 0..rows {
        let a = (i as f32 + 1.0) * 0.5;
        p.extend_from_slice(&[a, 2.0 * a, 0.0, if i == 2 { 1.0 } else { 0.0 }]);
    }
    lowrank::orthonormalize(&mut p, rows, 4).unwrap();
    assert!(p.iter().all(|v| v.is_finite()));
    let column = |j: usize| (0..rows).map(|i| p[i * 4 + j]).collect::<Vec<_>>();
    assert!(column(1).iter().all(|&v| v == 0.0), "{:?}", column(1));
    assert!(column(2).iter().all(|&v| v == 0.0));
    let norm = |c: Vec<f32>| c.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!((norm(column(0)) - 1.0).abs() < 1e-6);
    assert!((norm(column(3)) - 1.0).abs() < 1e-6);
}

#[test]
fn a_rank_r_matrix_is_recovered_by_one_iteration() {
    let (rows, cols, rank) = (37, 23, 3);
    let u = values(1, rows * rank);
    let v = values(2, cols * rank);
    let mut m = vec![0.0f32; rows * cols];
    lowrank::reconstruct(&u, &v, rows, cols, &mut m).unwrap();
    let mut q = vec![0.0f32; cols * rank];
    lowrank::init_q(42, &mut q);
    let mut p = vec![0.0f32; rows * rank];
    lowrank::project(&m, rows, cols, &q, &mut p).unwrap();
    lowrank::orthonormalize(&mut p, rows, rank).unwrap();
    lowrank::project_back(&m, rows, cols, &p, &mut q).unwrap();
    let mut approx = vec![0.0f32; rows * cols];
    lowrank::reconstruct(&p, &q, rows, cols, &mut approx).unwrap();
    for (a, b) in m.iter().zip(&approx) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

#[test]
fn init_q_is_seeded_and_standard_normal() {
    let (mut a, mut b, mut c) = (vec![0.0f32; 4096], vec![0.0f32; 4096], vec![0.0f32; 4096]);
    lowrank::init_q(9, &mut a);
    lowrank::init_q(9, &mut b);
    lowrank::init_q(10, &mut c);
    assert_eq!(a, b);
    assert_ne!(a, c);
    let mean = a.iter().map(|&v| f64::from(v)).sum::<f64>() / 4096.0;
    let var = a
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / 4096.0;
    // 5 standard errors.
    assert!(mean.abs() < 5.0 / 64.0, "mean {mean}");
    assert!(
        (var - 1.0).abs() < 5.0 * (2.0f64 / 4096.0).sqrt(),
        "variance {var}"
    );
}

#[test]
fn which_shapes_are_compressed() {
    // Vectors and scalars never; a matrix when its factors are more than
    // min_rate times smaller.
    assert_eq!(lowrank::matrix_shape(&[], 2, 2.0), None);
    assert_eq!(lowrank::matrix_shape(&[100], 2, 2.0), None);
    assert_eq!(lowrank::matrix_shape(&[100, 100], 2, 2.0), Some((100, 100)));
    // A conv kernel: [out, in, kh, kw] as out x (in kh kw).
    assert_eq!(
        lowrank::matrix_shape(&[64, 32, 3, 3], 4, 2.0),
        Some((64, 288))
    );
    // 4 x 4 at rank 2: 16 values vs 16 in the factors.
    assert_eq!(lowrank::matrix_shape(&[4, 4], 2, 2.0), None);
    // PyTorch's `_should_compress` is strict: (n + m) r rate < n m. 8 x 8 at
    // rank 2 and rate 2 is exactly equal (64 = 2 x 32): dense; 9 x 8 is
    // compressed (68 < 72), and at rate 1 so is 8 x 8 (32 < 64).
    assert_eq!(lowrank::matrix_shape(&[8, 8], 2, 2.0), None);
    assert_eq!(lowrank::matrix_shape(&[9, 8], 2, 2.0), Some((9, 8)));
    assert_eq!(lowrank::matrix_shape(&[8, 8], 2, 1.0), Some((8, 8)));
    assert_eq!(lowrank::matrix_shape(&[0, 10], 1, 1.0), None);
    assert_eq!(lowrank::matrix_shape(&[10, 10], 0, 1.0), None);
    assert_eq!(lowrank::matrix_shape(&[usize::MAX, 3], 1, 1.0), None);
}

#[test]
fn bad_lengths_are_typed_errors() {
    fn length(op: &'static str, expected: usize, got: usize) -> Result<(), CompressError> {
        Err(CompressError::LengthMismatch { op, expected, got })
    }
    /// A factor whose length is no multiple of its rows or columns, or an
    /// empty dimension or factor: no rank to infer.
    fn no_rank(result: Result<(), CompressError>) {
        assert!(
            matches!(&result, Err(CompressError::InvalidArgument(m)) if m.contains("cannot go with")),
            "{result:?}"
        );
    }
    let mut p = vec![0.0f32; 6];
    assert_eq!(
        lowrank::project(&[0.0; 5], 2, 3, &[0.0; 6], &mut p),
        length("project (m)", 6, 5)
    );
    no_rank(lowrank::project(&[0.0; 6], 2, 3, &[0.0; 5], &mut p));
    assert_eq!(
        lowrank::orthonormalize(&mut p, 4, 2),
        length("orthonormalize", 8, 6)
    );
    let mut out = vec![0.0f32; 5];
    assert_eq!(
        lowrank::reconstruct(&[0.0; 4], &[0.0; 6], 2, 3, &mut out),
        length("reconstruct (out)", 6, 5)
    );
    no_rank(lowrank::project_back(&[0.0; 6], 0, 3, &[], &mut out));
    // Empty dimensions and factors: errors, not panics.
    no_rank(lowrank::project_back(&[], 2, 0, &[0.0; 2], &mut []));
    no_rank(lowrank::reconstruct(&[0.0; 2], &[], 2, 0, &mut []));
    no_rank(lowrank::project(&[0.0; 6], 2, 3, &[], &mut []));
}
