//! `kernels/cuda/adasum.cu` on the CPU against gradwire-algos's CPU AdaSum,
//! run as gradwire-algos's launcher (`adasum/kernels.rs`) runs it: each
//! tensor range clipped to the piece, nothing launched for no tensors or
//! empty clipped ranges, `adasum_partials_f32` then `adasum_finish_f64` on
//! the grids of `plan::adasum_partials` and `plan::adasum_finish` (with
//! `plan::adasum_columns` block columns), the sums brought to the host, and
//! `adasum_combine_f32` on the grid of `plan::adasum_combine`.
//!
//! - The partials add the same exact f64 terms (products of two f32 are
//!   exact in f64) in another order than the CPU, so they must agree with
//!   the CPU's sequential sums within the rounding of f64 additions: any
//!   order of `m - 1` additions of `m` terms is within `γ(m - 1) Σ|t|` of
//!   the exact sum (`γ(k) = k u / (1 - k u)`, `u = 2^-53`), so the two
//!   sums within twice that, `m` the clipped range's length.
//! - From the same sums, the combine is bitwise the CPU's: the test gives
//!   it sums in the CPU's order and compares with
//!   `gradwire_algos::adasum::pairwise` on the piece (which computes those
//!   sums itself), and checks nothing outside the clipped ranges changes.
//! - The whole launcher sequence (partials, finish, host, combine) is
//!   bitwise `pairwise` on inputs whose sums are exact in any order
//!   (small integers times a power of two per tensor, from f32 subnormals
//!   to 2^115).
//!
//! Every length of [`LENGTHS`], one tensor or several (an empty one, one
//! with `a = ±0` and one with `b = ±0`, which keep their coefficient at 1,
//! a gap between two), whole vectors and the pieces AdaSum's halving
//! passes (halves and a quarter), inputs of every finite class of float.
//! The launcher passes whole device allocations, so every buffer is
//! aligned.

use std::ops::Range;

use gradwire_algos::adasum;
use gradwire_kernels::{adasum as k, plan};
use gradwire_kernels_host::Arg;

use crate::common::{LENGTHS, bits, floats, run_both};

/// The launcher's `partials`: `(a.b, |a|^2, |b|^2)` of every tensor over
/// `piece`, from the two kernels. The column partials and the sums are
/// poisoned with NaN (the launcher zeroes them), so that a cell the kernels
/// leave unwritten shows.
fn device_partials(
    a: &[f32],
    b: &[f32],
    tensors: &[Range<usize>],
    piece: &Range<usize>,
    case: &str,
) -> Vec<f64> {
    let count = tensors.len();
    if count == 0 {
        return Vec::new();
    }
    let (ranges, longest) = plan::adasum_ranges(tensors, piece);
    if longest == 0 {
        return vec![0.0; 3 * count];
    }
    let n = a.len();
    let columns = plan::adasum_columns(longest);
    let state = (
        a.to_vec(),
        b.to_vec(),
        ranges,
        vec![f64::NAN; 3 * count * columns],
    );
    let (.., column_partials) = run_both(
        &k::ADASUM_PARTIALS_F32,
        plan::adasum_partials(longest, count),
        &state,
        |(a, b, ranges, partials)| {
            vec![
                Arg::read(a),
                Arg::read(b),
                Arg::len(n),
                Arg::read(ranges),
                Arg::len(count),
                Arg::write(partials),
            ]
        },
    )
    .unwrap_or_else(|e| panic!("{case}: {e}"));
    let (_, sums) = run_both(
        &k::ADASUM_FINISH_F64,
        plan::adasum_finish(count),
        &(column_partials, vec![f64::NAN; 3 * count]),
        |(partials, sums)| {
            vec![
                Arg::read(partials),
                Arg::len(count),
                Arg::len(columns),
                Arg::write(sums),
            ]
        },
    )
    .unwrap_or_else(|e| panic!("{case}: {e}"));
    sums
}

/// The launcher's `combine`: `a = ca a + cb b` on every tensor over
/// `piece` with the coefficients of `sums`.
fn device_combine(
    a: &mut Vec<f32>,
    b: &[f32],
    tensors: &[Range<usize>],
    piece: &Range<usize>,
    sums: &[f64],
    case: &str,
) {
    let count = tensors.len();
    let (ranges, longest) = plan::adasum_ranges(tensors, piece);
    if count == 0 || longest == 0 {
        return;
    }
    let n = a.len();
    let state = (a.clone(), b.to_vec(), ranges, sums.to_vec());
    let (combined, ..) = run_both(
        &k::ADASUM_COMBINE_F32,
        plan::adasum_combine(longest, count),
        &state,
        |(a, b, ranges, sums)| {
            vec![
                Arg::write(a),
                Arg::read(b),
                Arg::len(n),
                Arg::read(ranges),
                Arg::len(count),
                Arg::read(sums),
            ]
        },
    )
    .unwrap_or_else(|e| panic!("{case}: {e}"));
    *a = combined;
}

/// The CPU's partials over `piece` (gradwire-algos's `partials`: f64 terms
/// added in element order from 0), with each sum's term count and the sum
/// of its terms' magnitudes.
fn cpu_partials(
    a: &[f32],
    b: &[f32],
    tensors: &[Range<usize>],
    piece: &Range<usize>,
) -> (Vec<f64>, Vec<(usize, f64)>) {
    let mut sums = Vec::new();
    let mut sizes = Vec::new();
    for t in tensors {
        let (lo, hi) = (t.start.max(piece.start), t.end.min(piece.end));
        let (mut dot, mut aa, mut bb, mut magnitude) = (0f64, 0f64, 0f64, 0f64);
        for i in lo..hi.max(lo) {
            let (x, y) = (f64::from(a[i]), f64::from(b[i]));
            dot += x * y;
            aa += x * x;
            bb += y * y;
            magnitude += (x * y).abs();
        }
        let m = hi.saturating_sub(lo);
        sums.extend([dot, aa, bb]);
        sizes.extend([(m, magnitude), (m, aa), (m, bb)]);
    }
    (sums, sizes)
}

/// The kinds of inputs ([`inputs`]).
const KINDS: [&str; 2] = ["every class", "moderate"];

/// `γ(k)`: the relative bound of `k` rounded f64 additions.
fn gamma(k: usize) -> f64 {
    let ku = k as f64 * f64::EPSILON / 2.0;
    ku / (1.0 - ku)
}

/// Tensor ranges of a fused vector and the pieces the launcher is given.
struct Layout {
    /// What the ranges are.
    name: &'static str,
    /// The tensors' ranges.
    tensors: Vec<Range<usize>>,
    /// The pieces.
    pieces: Vec<Range<usize>>,
}

/// The layouts of one length.
fn layouts(n: usize) -> [Layout; 2] {
    let whole: Vec<Range<usize>> = std::iter::once(0..n).collect();
    // Layers: an empty one, a gap of one element (when there is room), the
    // a = ±0 layer (index 2) and the b = ±0 layer (index 3).
    let (p, q, r) = (n / 5, n / 2, (3 * n) / 4);
    let gap = (q + 1).min(r);
    let layers = vec![0..p, p..p, p..q, gap..r, r..n];
    // The whole vector, the halves of the first level of AdaSum's halving
    // and a quarter of the second.
    let pieces = vec![0..n, 0..q, q..n, n / 4..q];
    [
        Layout {
            name: "one tensor",
            tensors: whole,
            pieces: pieces.clone(),
        },
        Layout {
            name: "layers",
            tensors: layers,
            pieces,
        },
    ]
}

/// `n` floats of either sign within a few binades of 1, in all their bits:
/// sums of their products round at nearly every addition, and no term
/// dominates, so the order of the additions shows.
fn moderate(n: usize, seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let v = rng.random_range(0.5f32..1.0) * 2f32.powi(rng.random_range(-6..6));
            if rng.random::<bool>() { -v } else { v }
        })
        .collect()
}

/// Inputs of every finite class (`every class`) or of moderate magnitudes
/// (`moderate`), with `a` ±0 on layer 2 and `b` on layer 3 of a layered
/// layout.
fn inputs(n: usize, tensors: &[Range<usize>], kind: &str, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let (mut a, mut b) = if kind == "moderate" {
        (moderate(n, seed), moderate(n, seed + 1))
    } else {
        (floats(n, seed, false), floats(n, seed + 1, false))
    };
    if tensors.len() == 5 {
        for (i, x) in tensors[2].clone().enumerate() {
            a[x] = if i % 2 == 0 { 0.0 } else { -0.0 };
        }
        for (i, y) in tensors[3].clone().enumerate() {
            b[y] = if i % 3 == 0 { -0.0 } else { 0.0 };
        }
    }
    (a, b)
}

#[test]
fn partials_agree_with_the_cpu_within_the_rounding_of_f64_additions() {
    for &n in LENGTHS {
        for Layout {
            name: layout,
            tensors,
            pieces,
        } in layouts(n)
        {
            for kind in KINDS {
                let (a, b) = inputs(n, &tensors, kind, n as u64);
                for piece in &pieces {
                    // As AdaSum's halving passes them: the lower rank's
                    // vector as `a`, and the other way round.
                    for (name, a, b) in [("a, b", &a, &b), ("b, a", &b, &a)] {
                        let case = format!(
                            "n = {n}, {layout} {tensors:?}, {kind}, piece {piece:?}, {name}"
                        );
                        let got = device_partials(a, b, &tensors, piece, &case);
                        let (want, sizes) = cpu_partials(a, b, &tensors, piece);
                        assert_eq!(got.len(), want.len(), "{case}");
                        for (j, ((g, w), &(m, magnitude))) in
                            got.iter().zip(&want).zip(&sizes).enumerate()
                        {
                            let gm = gamma(m.saturating_sub(1));
                            // The magnitude is itself a sum of m terms.
                            let bound = 2.0 * gm * magnitude / (1.0 - gm);
                            assert!(
                                (g - w).abs() <= bound,
                                "{case}: tensor {} sum {}: the kernels give {g:e}, the CPU {w:e} \
                             (m = {m}, bound {bound:e})",
                                j / 3,
                                j % 3
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn combine_is_bitwise_the_cpu_rule_from_the_same_partials() {
    for &n in LENGTHS {
        for Layout {
            name: layout,
            tensors,
            pieces,
        } in layouts(n)
        {
            for kind in KINDS {
                let (a, b) = inputs(n, &tensors, kind, n as u64 + 1000);
                for piece in &pieces {
                    let piece = piece.clone();
                    let case = format!("n = {n}, {layout} {tensors:?}, {kind}, piece {piece:?}");
                    let (sums, _) = cpu_partials(&a, &b, &tensors, &piece);
                    let mut got = a.clone();
                    device_combine(&mut got, &b, &tensors, &piece, &sums, &case);

                    // The CPU: pairwise on the piece, the ranges clipped and
                    // shifted into it (an empty one to 0..0); it adds the same
                    // partials itself.
                    let mut want = a.clone();
                    let (ranges, _) = plan::adasum_ranges(&tensors, &piece);
                    let local: Vec<Range<usize>> = ranges
                        .chunks_exact(2)
                        .map(|r| (r[0] as usize, r[1] as usize))
                        .map(|(lo, hi)| {
                            if lo == hi {
                                0..0
                            } else {
                                lo - piece.start..hi - piece.start
                            }
                        })
                        .collect();
                    adasum::pairwise(&mut want[piece.clone()], &b[piece.clone()], &local)
                        .unwrap_or_else(|e| panic!("{case}: the CPU: {e}"));
                    assert!(
                        bits(&got) == bits(&want),
                        "{case}: the kernel gives\n{got:?}\nthe CPU\n{want:?}"
                    );
                }
            }
        }
    }
}

/// Inputs whose partials are exact in f64 in any order: per tensor, small
/// integers (|i| < 256) times `2^(e + 0..8)`, `e` from the tensor's scale.
fn exact_inputs(n: usize, tensors: &[Range<usize>], seed: u64) -> (Vec<f32>, Vec<f32>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // f32 subnormals, around 1, small normals, large.
    const SCALES: [i32; 5] = [-149, -4, -120, 100, 0];
    let mut a = vec![0f32; n];
    let mut b = vec![0f32; n];
    for (t, range) in tensors.iter().enumerate() {
        let scale = SCALES[t % SCALES.len()];
        for i in range.clone() {
            let mut draw = || {
                let k = rng.random_range(-255i32..=255);
                let v = k as f32 * 2f32.powi(scale + rng.random_range(0..8));
                if k == 0 && rng.random::<bool>() {
                    -v
                } else {
                    v
                }
            };
            a[i] = draw();
            b[i] = draw();
        }
    }
    (a, b)
}

#[test]
fn the_launchers_sequence_is_bitwise_pairwise_where_the_sums_are_exact() {
    for &n in LENGTHS {
        for Layout {
            name: layout,
            tensors,
            ..
        } in layouts(n)
        {
            let (a, b) = exact_inputs(n, &tensors, n as u64 + 2000);
            let case = format!("n = {n}, {layout} {tensors:?}");
            // The launcher's `pairwise`: partials and combine over 0..n.
            let all = 0..n;
            let sums = device_partials(&a, &b, &tensors, &all, &case);
            let mut got = a.clone();
            device_combine(&mut got, &b, &tensors, &all, &sums, &case);
            let mut want = a.clone();
            adasum::pairwise(&mut want, &b, &tensors)
                .unwrap_or_else(|e| panic!("{case}: the CPU: {e}"));
            assert!(
                bits(&got) == bits(&want),
                "{case}: the kernels give\n{got:?}\nthe CPU\n{want:?}"
            );
        }
    }
}
