//! PowerSGD's low-rank products on the device against the CPU's: the three
//! products bitwise, for windows at offsets inside larger buffers (nothing
//! outside a window written); the orthonormalisation deterministic and
//! within a few ulps of the CPU's; a whole power iteration; the CPU's
//! refusals.

use gradwire_compress::CompressError;
use gradwire_compress::cuda::lowrank::{self, Window, WindowMut};
use gradwire_compress::lowrank as cpu;
use gradwire_tensor::{CpuStorage, CudaStorage, DType};

use crate::support::{bits, device_or_skip, host_f32, on_device, values};

/// Elements of padding on each side of a window.
const PAD: usize = 5;

/// `v` on the device with [`PAD`] sentinel values on each side.
fn padded(v: &[f32]) -> CudaStorage {
    let mut host = vec![f32::from_bits(0x7fc0_0bad); PAD];
    host.extend_from_slice(v);
    host.extend(std::iter::repeat_n(f32::from_bits(0x7fc0_0bad), PAD));
    on_device(&host)
}

/// The window of a [`padded`] storage.
fn inner(s: &CudaStorage) -> Window<'_> {
    Window::new(s, PAD..s.len() - PAD).expect("window")
}

fn inner_mut(s: &mut CudaStorage) -> WindowMut<'_> {
    let len = s.len();
    WindowMut::new(s, PAD..len - PAD).expect("window")
}

/// The window's values, after checking the padding is untouched.
fn unpadded(what: &str, s: &CudaStorage) -> Vec<f32> {
    let all = host_f32(s);
    let pad = [0x7fc0_0badu32; PAD];
    assert_eq!(bits(&all[..PAD]), pad, "{what}: wrote before its window");
    assert_eq!(
        bits(&all[all.len() - PAD..]),
        pad,
        "{what}: wrote after its window"
    );
    all[PAD..all.len() - PAD].to_vec()
}

/// Shapes with every remainder of the eight-lane dot, single rows and
/// columns, sizes beyond one grid's worth of blocks, and sums of several
/// spans (`lowrank::SPAN`) split across threads: a wide matrix (project)
/// and a tall one (project back).
const SHAPES: [(usize, usize); 10] = [
    (1, 1),
    (3, 7),
    (2, 8),
    (5, 9),
    (31, 13),
    (64, 64),
    (101, 127),
    (1024, 1000),
    (33, 70_001),
    (40_003, 17),
];

#[test]
fn products_match_the_cpu_bitwise() {
    if !device_or_skip("products_match_the_cpu_bitwise") {
        return;
    }
    for (seed, &(rows, cols)) in SHAPES.iter().enumerate() {
        for rank in 1..=4 {
            let what = format!("{rows}x{cols} rank {rank}");
            let seed = seed as u64 * 10 + rank as u64;
            let m = values(rows * cols, seed, None);
            let qt = values(rank * cols, seed + 1, None);
            let dm = padded(&m);
            let dqt = padded(&qt);

            let mut p = vec![0f32; rows * rank];
            cpu::project(&m, rows, cols, &qt, &mut p).expect("cpu project");
            let mut dp = padded(&vec![0f32; rows * rank]);
            lowrank::project(
                &inner(&dm),
                rows,
                cols,
                &inner(&dqt),
                &mut inner_mut(&mut dp),
            )
            .expect("gpu project");
            assert_eq!(bits(&unpadded(&what, &dp)), bits(&p), "{what}: project");

            let mut q2 = vec![0f32; rank * cols];
            cpu::project_back(&m, rows, cols, &p, &mut q2).expect("cpu project_back");
            let mut dq2 = padded(&vec![1f32; rank * cols]);
            lowrank::project_back(
                &inner(&dm),
                rows,
                cols,
                &inner(&dp),
                &mut inner_mut(&mut dq2),
            )
            .expect("gpu project_back");
            assert_eq!(
                bits(&unpadded(&what, &dq2)),
                bits(&q2),
                "{what}: project_back"
            );

            let mut out = vec![0f32; rows * cols];
            cpu::reconstruct(&p, &q2, rows, cols, &mut out).expect("cpu reconstruct");
            let mut dout = padded(&vec![1f32; rows * cols]);
            lowrank::reconstruct(
                &inner(&dp),
                &inner(&dq2),
                rows,
                cols,
                &mut inner_mut(&mut dout),
            )
            .expect("gpu reconstruct");
            assert_eq!(
                bits(&unpadded(&what, &dout)),
                bits(&out),
                "{what}: reconstruct"
            );
        }
    }
}

/// The bound on a device orthonormalisation's difference from the CPU's:
/// entries of orthonormal columns are at most 1 in magnitude, and the two
/// differ only where an f64 sum's rounding moved an f32 rounding.
const ORTHO_TOLERANCE: f32 = 8.0 * f32::EPSILON;

fn orthonormalized_on_device(p: &[f32], rows: usize, rank: usize) -> Vec<f32> {
    let mut dp = padded(p);
    lowrank::orthonormalize(&mut inner_mut(&mut dp), rows, rank).expect("gpu orthonormalize");
    unpadded("orthonormalize", &dp)
}

#[test]
fn orthonormalize_is_deterministic_and_within_ulps_of_the_cpu() {
    if !device_or_skip("orthonormalize_is_deterministic_and_within_ulps_of_the_cpu") {
        return;
    }
    for &rows in &[1usize, 2, 7, 255, 256, 257, 4099, 100_003] {
        for rank in 1..=6 {
            let what = format!("{rows} rows, rank {rank}");
            let p = values(rows * rank, rows as u64 + rank as u64, None);
            let mut want = p.clone();
            cpu::orthonormalize(&mut want, rows, rank).expect("cpu");
            let got = orthonormalized_on_device(&p, rows, rank);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= ORTHO_TOLERANCE,
                    "{what}: entry {i}: device {g} vs cpu {w}"
                );
            }
            let again = orthonormalized_on_device(&p, rows, rank);
            assert_eq!(bits(&again), bits(&got), "{what}: not deterministic");
            // Orthonormal columns (those the CPU kept; rows < rank leaves
            // the later columns without a direction).
            for j in 0..rank {
                for k in 0..=j {
                    let dot: f64 = (0..rows)
                        .map(|i| f64::from(got[i * rank + j]) * f64::from(got[i * rank + k]))
                        .sum();
                    let kept = |c: usize| want[c..].iter().step_by(rank).any(|&v| v != 0.0);
                    let expected = if j == k && kept(j) { 1.0 } else { 0.0 };
                    assert!(
                        (dot - expected).abs() < 1e-5,
                        "{what}: column {j} . column {k} = {dot}"
                    );
                }
            }
        }
    }
}

#[test]
fn degenerate_columns_become_zero_on_the_device() {
    if !device_or_skip("degenerate_columns_become_zero_on_the_device") {
        return;
    }
    let rows = 300;
    let rank = 3;
    // Column 1 repeats column 0; column 2 is zero.
    let base = values(rows, 5, None);
    let p: Vec<f32> = (0..rows).flat_map(|i| [base[i], base[i], 0.0]).collect();
    let got = orthonormalized_on_device(&p, rows, rank);
    assert!(got.iter().all(|v| v.is_finite()), "NaN or infinity");
    for i in 0..rows {
        assert_eq!(got[i * rank + 1], 0.0, "row {i}: the repeated column");
        assert_eq!(got[i * rank + 2], 0.0, "row {i}: the zero column");
    }
    let zero = orthonormalized_on_device(&vec![0f32; rows * rank], rows, rank);
    assert!(zero.iter().all(|&v| v == 0.0), "a zero factor stays zero");
}

#[test]
fn a_power_iteration_matches_the_cpu() {
    if !device_or_skip("a_power_iteration_matches_the_cpu") {
        return;
    }
    let (rows, cols, rank) = (512, 777, 4);
    let m = values(rows * cols, 77, None);
    let mut qt = vec![0f32; rank * cols];
    cpu::init_q(3, &mut qt);

    let mut p = vec![0f32; rows * rank];
    cpu::project(&m, rows, cols, &qt, &mut p).expect("cpu");
    cpu::orthonormalize(&mut p, rows, rank).expect("cpu");
    let mut q2 = vec![0f32; rank * cols];
    cpu::project_back(&m, rows, cols, &p, &mut q2).expect("cpu");
    let mut approx = vec![0f32; rows * cols];
    cpu::reconstruct(&p, &q2, rows, cols, &mut approx).expect("cpu");

    let dm = on_device(&m);
    let dqt = on_device(&qt);
    let mut dp = on_device(&vec![0f32; rows * rank]);
    let mut dq2 = on_device(&vec![0f32; rank * cols]);
    let mut dapprox = on_device(&vec![0f32; rows * cols]);
    let w = |s| Window::whole(s).expect("window");
    lowrank::project(
        &w(&dm),
        rows,
        cols,
        &w(&dqt),
        &mut WindowMut::whole(&mut dp).unwrap(),
    )
    .expect("gpu");
    lowrank::orthonormalize(&mut WindowMut::whole(&mut dp).unwrap(), rows, rank).expect("gpu");
    lowrank::project_back(
        &w(&dm),
        rows,
        cols,
        &w(&dp),
        &mut WindowMut::whole(&mut dq2).unwrap(),
    )
    .expect("gpu");
    lowrank::reconstruct(
        &w(&dp),
        &w(&dq2),
        rows,
        cols,
        &mut WindowMut::whole(&mut dapprox).unwrap(),
    )
    .expect("gpu");

    // The orthonormal P may differ by a few ulps; the products of a
    // `rows`-term (Q) and `rank`-term (P Qᵀ) sum carry that forward.
    let close = |what: &str, got: &[f32], want: &[f32], terms: usize| {
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs())).max(1.0);
        let bound = 16.0 * terms as f32 * f32::EPSILON * scale;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= bound,
                "{what} {i}: {g} vs {w} (bound {bound})"
            );
        }
    };
    close("P", &host_f32(&dp), &p, 1);
    close("Q", &host_f32(&dq2), &q2, rows);
    close("P Qt", &host_f32(&dapprox), &approx, rows * rank);
}

#[test]
fn bad_operands_are_refused_like_the_cpu() {
    if !device_or_skip("bad_operands_are_refused_like_the_cpu") {
        return;
    }
    let (rows, cols) = (6, 10);
    let m = values(rows * cols, 1, None);
    let dm = on_device(&m);
    // A Q of 25 entries cannot go with 10 columns; a P of the wrong rank;
    // an M of the wrong size.
    for (q_len, p_len, m_len) in [(25, 12, 60), (20, 18, 60), (20, 12, 59), (0, 0, 60)] {
        let q = vec![0f32; q_len];
        let mut p = vec![0f32; p_len];
        let want = cpu::project(&m[..m_len], rows, cols, &q, &mut p).expect_err("cpu refuses");
        let dq = on_device(&q);
        let mut dp = on_device(&p);
        let got = lowrank::project(
            &Window::new(&dm, 0..m_len).unwrap(),
            rows,
            cols,
            &Window::new(&dq, 0..q_len).unwrap(),
            &mut WindowMut::new(&mut dp, 0..p_len).unwrap(),
        )
        .expect_err("device refuses");
        assert_eq!(
            got.to_string(),
            want.to_string(),
            "q {q_len} p {p_len} m {m_len}"
        );
    }
    let mut p = vec![0f32; 7];
    let want = cpu::orthonormalize(&mut p, 3, 2).expect_err("cpu refuses");
    let mut dp = on_device(&p);
    let got = lowrank::orthonormalize(&mut WindowMut::whole(&mut dp).unwrap(), 3, 2)
        .expect_err("device refuses");
    assert_eq!(got.to_string(), want.to_string());
    // A window outside its buffer, or on a buffer that is not f32.
    let outside = Window::new(&dm, 50..61);
    assert!(
        matches!(&outside, Err(gradwire_tensor::Error::InvalidArgument(m)) if m.contains("out of bounds")),
        "{outside:?}"
    );
    let half = CudaStorage::from_cpu(&CpuStorage::zeros(DType::F16, 8), 0).expect("f16");
    assert!(matches!(
        Window::whole(&half).map_err(CompressError::from),
        Err(CompressError::Tensor(_))
    ));
}
