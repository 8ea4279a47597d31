//! `kernels/cuda/lowrank.cu` on the CPU against gradwire-compress's
//! PowerSGD arithmetic (`gradwire_compress::lowrank`), each kernel launched
//! as gradwire-compress's CUDA launcher (`cuda/kernels/lowrank.rs`) launches
//! it, every matrix a window of its buffer (the `_at` element offsets, the
//! buffers at aligned and misaligned addresses; nothing before a window
//! written):
//!
//! - `lowrank_project_f32` and `lowrank_project_back_f32` on the launcher's
//!   launches ([`plan::lowrank_project`], [`plan::lowrank_project_back`]:
//!   a long sum's spans side by side), `lowrank_reconstruct_f32` on a
//!   grid-stride launch: bitwise the CPU's `project`, `project_back`, `reconstruct`,
//!   on shapes with one row or column, primes, every remainder of the
//!   eight-lane dot and several blocks, ranks 1 to 4 and 7, inputs with
//!   subnormals and ±0 (sums of signed zeros); the device suite's largest
//!   shapes; a `P` of more than [`MAX_GRID`] blocks of outputs, where the
//!   launcher's grid stops growing and the projection's blocks stride, and
//!   the same loop on grids smaller than the outputs; the same bits with
//!   any number of a long sum's spans side by side (`slots` 1 to 32), and
//!   a trap outside that;
//! - `lowrank_orthonormalize_f32` on its one block
//!   ([`plan::lowrank_orthonormalize`]): the same bits in both thread
//!   orders, within the launcher's stated bound of the CPU's modified
//!   Gram-Schmidt (its f64 sums are block reductions: a few f32 ulps of
//!   entries at most 1), orthonormal columns, and the CPU's zero columns
//!   (zero, repeated, subnormal, more columns than rows);
//! - a whole power iteration (project, orthonormalize, project back,
//!   reconstruct) within the device suite's bounds of the CPU's.

use gradwire_compress::lowrank as cpu;
use gradwire_kernels::{Blocks, Kernel, MAX_GRID, lowrank as k, plan};
use gradwire_kernels_host::{Arg, Error};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::common::{floats, run_both};

/// `(rows, cols)`: single rows and columns, primes, every remainder of the
/// eight-lane dot, products over several blocks.
const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (1, 17),
    (17, 1),
    (3, 7),
    (2, 8),
    (5, 9),
    (4, 10),
    (3, 12),
    (7, 30),
    (31, 13),
    (64, 64),
    (101, 127),
    (257, 3),
    (13, 1031),
];

const RANKS: &[usize] = &[1, 2, 3, 4, 7];

/// What a buffer holds before its window: a NaN the products would carry.
const BEFORE: u32 = 0x7fc0_0bad;
/// What an output window holds before the kernel writes it.
const STALE: u32 = 0x7fc0_5a1e;

/// Where the operands of a launch lie: each matrix `at` elements into its
/// buffer (the `_at` argument), each buffer `offset` elements past an
/// aligned address.
#[derive(Debug, Clone, Copy)]
struct Place {
    at: [usize; 3],
    offset: usize,
}

const PLACES: [Place; 2] = [
    Place {
        at: [0, 0, 0],
        offset: 0,
    },
    Place {
        at: [3, 6, 1],
        offset: 1,
    },
];

/// `v` placed `at` elements into a buffer.
fn placed(v: &[f32], at: usize) -> Vec<f32> {
    let mut buffer = vec![f32::from_bits(BEFORE); at];
    buffer.extend_from_slice(v);
    buffer
}

/// The window of a [`placed`] buffer, after checking nothing before it
/// was written.
fn window(buffer: &[f32], at: usize, what: &str) -> Vec<f32> {
    assert!(
        buffer[..at].iter().all(|v| v.to_bits() == BEFORE),
        "{what}: wrote before its window"
    );
    buffer[at..].to_vec()
}

/// Asserts `got` and `want` have the same bits, naming `what` and the
/// first entry that differs.
fn assert_bitwise(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: entry {i} of {}: kernel {:e} ({:#010x}), cpu {:e} ({:#010x})",
            got.len(),
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

/// The shape arguments of the products.
#[derive(Debug, Clone, Copy)]
struct Shape {
    rows: usize,
    cols: usize,
    rank: usize,
}

/// How a product is launched: its grid, and the projections' last
/// argument, `slots`.
#[derive(Debug, Clone, Copy)]
struct On {
    blocks: Blocks,
    slots: Option<usize>,
}

impl On {
    /// The launcher's launch of `lowrank_project_f32` for shape `s`.
    fn project(s: Shape) -> On {
        On::spans(plan::lowrank_project(s.rows * s.rank, s.cols))
    }

    /// The launcher's launch of `lowrank_project_back_f32` for shape `s`.
    fn project_back(s: Shape) -> On {
        On::spans(plan::lowrank_project_back(s.rank * s.cols, s.rows))
    }

    fn spans(launch: plan::SpanLaunch) -> On {
        On {
            blocks: launch.blocks,
            slots: Some(launch.slots),
        }
    }

    /// The launcher's grid-stride launch of `lowrank_reconstruct_f32`.
    fn reconstruct(s: Shape) -> On {
        On {
            blocks: Blocks::Over(s.rows * s.cols),
            slots: None,
        }
    }
}

/// One of the launcher's `launch_product`s on the host: `kernel(a, a_at,
/// b, b_at, out, out_at, rows, cols, rank[, slots])` on `on`, into a stale
/// output of `out_len`, in both thread orders; the output window.
fn product_on_host(
    kernel: &Kernel,
    on: On,
    (a, b): (&[f32], &[f32]),
    out_len: usize,
    s: Shape,
    place: Place,
) -> Result<Vec<f32>, Error> {
    let [a_at, b_at, out_at] = place.at;
    let off = place.offset;
    let state = (
        placed(a, a_at),
        placed(b, b_at),
        placed(&vec![f32::from_bits(STALE); out_len], out_at),
    );
    let (_, _, out) = run_both(kernel, on.blocks, &state, |(a, b, out)| {
        let mut args = vec![
            Arg::read_at(&a[..], off),
            Arg::len(a_at),
            Arg::read_at(&b[..], off),
            Arg::len(b_at),
            Arg::write_at(&mut out[..], off),
            Arg::len(out_at),
            Arg::len(s.rows),
            Arg::len(s.cols),
            Arg::len(s.rank),
        ];
        args.extend(on.slots.map(Arg::len));
        args
    })?;
    Ok(window(&out, out_at, kernel.name()))
}

/// Floats of every finite class (subnormals, ±0, ties), those of 2^16 and
/// more scaled by 2^-112 (exactly) to below 2^16, so that no product or sum
/// overflows (an overflow's NaN would have the hardware's payload).
fn tame(n: usize, seed: u64) -> Vec<f32> {
    floats(n, seed, false)
        .into_iter()
        .map(|v| {
            if v.abs() >= 65536.0 {
                v * 2f32.powi(-112)
            } else {
                v
            }
        })
        .collect()
}

/// Uniform in [-1, 1) times 2^-8 .. 2^7 (the device suite's inputs).
fn spread(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * 2f32.powi(rng.random_range(-8..8)))
        .collect()
}

/// Every shape and rank with `M` and `Qᵀ` of every class, and with an `M`
/// of signed zeros only (every product and sum a zero whose sign shows).
fn cases() -> Vec<(String, Shape, Vec<f32>, Vec<f32>)> {
    let mut cases = Vec::new();
    for (i, &(rows, cols)) in SHAPES.iter().enumerate() {
        for &rank in RANKS {
            let s = Shape { rows, cols, rank };
            let seed = 1000 * i as u64 + rank as u64;
            let qt = tame(rank * cols, seed + 1);
            let m = tame(rows * cols, seed);
            let zeros = m.iter().map(|v| 0f32.copysign(*v)).collect();
            let name = |input| format!("{rows}x{cols} rank {rank} {input}");
            cases.push((name("every class"), s, m, qt.clone()));
            cases.push((name("signed zeros"), s, zeros, qt));
        }
    }
    cases
}

#[test]
fn project_equals_the_cpu_bitwise() {
    for (case, s, m, qt) in cases() {
        let mut want = vec![0f32; s.rows * s.rank];
        cpu::project(&m, s.rows, s.cols, &qt, &mut want).expect("cpu project");
        for place in PLACES {
            let what = format!("lowrank_project_f32 {case} {place:?}");
            let got = product_on_host(
                &k::LOWRANK_PROJECT_F32,
                On::project(s),
                (&m, &qt),
                want.len(),
                s,
                place,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_bitwise(&got, &want, &what);
        }
    }
}

#[test]
fn project_back_equals_the_cpu_bitwise() {
    for (case, s, m, qt) in cases() {
        let mut p = vec![0f32; s.rows * s.rank];
        cpu::project(&m, s.rows, s.cols, &qt, &mut p).expect("cpu project");
        // A P of every class, beside the product's.
        for (input, p) in [
            ("P = M Q", p),
            ("P of every class", tame(s.rows * s.rank, 9)),
        ] {
            let mut want = vec![0f32; s.rank * s.cols];
            cpu::project_back(&m, s.rows, s.cols, &p, &mut want).expect("cpu project_back");
            for place in PLACES {
                let what = format!("lowrank_project_back_f32 {case} {input} {place:?}");
                let got = product_on_host(
                    &k::LOWRANK_PROJECT_BACK_F32,
                    On::project_back(s),
                    (&m, &p),
                    want.len(),
                    s,
                    place,
                )
                .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_bitwise(&got, &want, &what);
            }
        }
    }
}

#[test]
fn reconstruct_equals_the_cpu_bitwise() {
    for (case, s, m, qt) in cases() {
        // P of every class (of signed zeros for the signed-zero case).
        let p: Vec<f32> = tame(s.rows * s.rank, 11)
            .into_iter()
            .zip(m.iter().cycle())
            .map(|(p, m)| if *m == 0.0 { 0f32.copysign(p) } else { p })
            .collect();
        let mut want = vec![0f32; s.rows * s.cols];
        cpu::reconstruct(&p, &qt, s.rows, s.cols, &mut want).expect("cpu reconstruct");
        for place in PLACES {
            let what = format!("lowrank_reconstruct_f32 {case} {place:?}");
            let got = product_on_host(
                &k::LOWRANK_RECONSTRUCT_F32,
                On::reconstruct(s),
                (&p, &qt),
                want.len(),
                s,
                place,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_bitwise(&got, &want, &what);
        }
    }
}

/// `n` floats as [`tame`]'s, drawn once and spread (the generator is slow
/// in a debug build).
fn tame_pooled(n: usize, seed: u64) -> Vec<f32> {
    let pool = tame(8191, seed);
    (0..n).map(|i| pool[i * 31 % pool.len()]).collect()
}

/// The three products on the device suite's largest shapes, and on a `P`
/// of more than `MAX_GRID` blocks of 32 outputs, where the launcher's grid
/// stops growing and each block of the projection takes every
/// `MAX_GRID`-th group.
fn large_products(rows: usize, cols: usize, rank: usize) {
    let s = Shape { rows, cols, rank };
    let case = format!("{rows}x{cols} rank {rank}");
    let m = tame_pooled(rows * cols, 31);
    let qt = tame_pooled(rank * cols, 32);
    let place = PLACES[1];
    let mut p = vec![0f32; rows * rank];
    cpu::project(&m, rows, cols, &qt, &mut p).expect("cpu project");
    let what = format!("lowrank_project_f32 {case}");
    let got = product_on_host(
        &k::LOWRANK_PROJECT_F32,
        On::project(s),
        (&m, &qt),
        p.len(),
        s,
        place,
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_bitwise(&got, &p, &what);
    let mut q2 = vec![0f32; rank * cols];
    cpu::project_back(&m, rows, cols, &p, &mut q2).expect("cpu project_back");
    let what = format!("lowrank_project_back_f32 {case}");
    let got = product_on_host(
        &k::LOWRANK_PROJECT_BACK_F32,
        On::project_back(s),
        (&m, &p),
        q2.len(),
        s,
        place,
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_bitwise(&got, &q2, &what);
    let mut out = vec![0f32; rows * cols];
    cpu::reconstruct(&p, &q2, rows, cols, &mut out).expect("cpu reconstruct");
    let what = format!("lowrank_reconstruct_f32 {case}");
    let got = product_on_host(
        &k::LOWRANK_RECONSTRUCT_F32,
        On::reconstruct(s),
        (&p, &q2),
        out.len(),
        s,
        place,
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_bitwise(&got, &out, &what);
}

#[test]
fn products_of_a_large_matrix_equal_the_cpu_bitwise() {
    large_products(1024, 1000, 4);
}

#[test]
fn products_of_a_wide_matrix_equal_the_cpu_bitwise() {
    large_products(33, 70_001, 4);
}

#[test]
fn products_past_the_grid_equal_the_cpu_bitwise() {
    let s = Shape {
        rows: 32_769,
        cols: 3,
        rank: 4,
    };
    assert_eq!(On::project(s).blocks, Blocks::Exactly(MAX_GRID, 1));
    // 33 spans of rows, 32 side by side: two rounds.
    assert_eq!(On::project_back(s).slots, Some(32));
    large_products(s.rows, s.cols, s.rank);
}

#[test]
fn the_launch_plans_split_long_sums_into_spans() {
    assert_eq!(plan::LOWRANK_SPAN, cpu::SPAN);
    let project = |outputs, cols| plan::lowrank_project(outputs, cols);
    // Short rows: one slot, 32 outputs a block, as many blocks as needed
    // up to MAX_GRID.
    assert_eq!(project(1, 1).blocks, Blocks::Exactly(1, 1));
    assert_eq!(project(33, 1024).blocks, Blocks::Exactly(2, 1));
    assert_eq!(project(33, 1024).slots, 1);
    assert_eq!(
        project(32 * MAX_GRID as usize + 1, 7).blocks,
        Blocks::Exactly(MAX_GRID, 1)
    );
    // Longer rows: their spans side by side (a power of two, at most 32),
    // fewer outputs a block.
    for (cols, slots) in [(1025, 2), (3 * 1024, 4), (5 * 1024 + 1, 8), (40_000, 32)] {
        let launch = project(4096, cols);
        assert_eq!(launch.slots, slots, "{cols} columns");
        assert_eq!(
            launch.blocks,
            Blocks::Exactly((4096 * slots / 32) as u32, 1),
            "{cols} columns"
        );
    }
    // project_back: BLOCK threads a block, `slots` per output.
    let back = plan::lowrank_project_back(1000, 3000);
    assert_eq!(back.slots, 4);
    assert_eq!(back.blocks, Blocks::Exactly(1000_u32.div_ceil(64), 1));
    assert_eq!(plan::lowrank_project_back(1, 1).slots, 1);
}

/// The projections of shape `s` on `blocks` with `slots` spans side by
/// side, against the CPU's bits (`want_p`, `want_q`).
fn projections_on(
    s: Shape,
    (m, qt, p): (&[f32], &[f32], &[f32]),
    want: (&[f32], &[f32]),
    blocks: u32,
    slots: usize,
) {
    let case = format!(
        "{}x{} rank {} on {blocks} blocks, {slots} slots",
        s.rows, s.cols, s.rank
    );
    let on = On {
        blocks: Blocks::Exactly(blocks, 1),
        slots: Some(slots),
    };
    let what = format!("lowrank_project_f32 {case}");
    let got = product_on_host(
        &k::LOWRANK_PROJECT_F32,
        on,
        (m, qt),
        want.0.len(),
        s,
        PLACES[1],
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_bitwise(&got, want.0, &what);
    let what = format!("lowrank_project_back_f32 {case}");
    let got = product_on_host(
        &k::LOWRANK_PROJECT_BACK_F32,
        on,
        (m, p),
        want.1.len(),
        s,
        PLACES[1],
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_bitwise(&got, want.1, &what);
}

#[test]
fn the_projections_give_the_cpu_bits_whatever_the_slots_and_grid() {
    // The order of every sum is the spans', whichever threads take them:
    // any slots from 1 to 32 (powers of two or not, more or fewer than
    // the spans), on grids smaller than the outputs (the blocks stride).
    // A wide shape (7 spans of columns: project splits) and a tall one
    // (6 spans of rows: project_back splits), each with a short last span.
    for (rows, cols, rank) in [(5, 6 * 1024 + 7, 3), (5 * 1024 + 3, 9, 2)] {
        let s = Shape { rows, cols, rank };
        let m = tame_pooled(rows * cols, 41);
        let qt = tame_pooled(rank * cols, 42);
        let p = tame_pooled(rows * rank, 43);
        let mut want_p = vec![0f32; rows * rank];
        cpu::project(&m, rows, cols, &qt, &mut want_p).expect("cpu project");
        let mut want_q = vec![0f32; rank * cols];
        cpu::project_back(&m, rows, cols, &p, &mut want_q).expect("cpu project_back");
        for slots in [1, 2, 3, 7, 8, 31, 32] {
            for blocks in [1, 2] {
                projections_on(s, (&m, &qt, &p), (&want_p, &want_q), blocks, slots);
            }
        }
    }
}

#[test]
fn project_strides_over_its_outputs_on_smaller_grids() {
    // The loop the launcher's grid takes past MAX_GRID blocks, on grids
    // smaller than the outputs.
    for (rows, cols, rank) in [(101, 127, 4), (257, 3, 3), (40, 9, 1)] {
        let s = Shape { rows, cols, rank };
        let m = tame(rows * cols, 21);
        let qt = tame(rank * cols, 22);
        let p = tame(rows * rank, 23);
        let mut want_p = vec![0f32; rows * rank];
        cpu::project(&m, rows, cols, &qt, &mut want_p).expect("cpu project");
        let mut want_q = vec![0f32; rank * cols];
        cpu::project_back(&m, rows, cols, &p, &mut want_q).expect("cpu project_back");
        for blocks in [1, 3] {
            projections_on(s, (&m, &qt, &p), (&want_p, &want_q), blocks, 1);
        }
    }
}

#[test]
fn the_projections_trap_on_slots_out_of_range() {
    let s = Shape {
        rows: 3,
        cols: 5,
        rank: 2,
    };
    let (m, qt, p) = (tame(15, 51), tame(10, 52), tame(6, 53));
    // (kernel, its second input, its output's length)
    let launches = [
        (&k::LOWRANK_PROJECT_F32, &qt, 6),
        (&k::LOWRANK_PROJECT_BACK_F32, &p, 10),
    ];
    for (kernel, input, out_len) in launches {
        for slots in [0, plan::LOWRANK_MAX_SLOTS + 1] {
            let on = On {
                blocks: Blocks::Exactly(1, 1),
                slots: Some(slots),
            };
            match product_on_host(kernel, on, (&m, input), out_len, s, PLACES[0]) {
                Err(Error::Failed { message, .. }) => {
                    assert!(message.ends_with("__trap"), "{}: {message}", kernel.name())
                }
                other => panic!("{} with {slots} slots: {other:?}", kernel.name()),
            }
        }
    }
}

/// The launcher's `orthonormalize` on the host: `p` (`rows x rank`) placed
/// `at` elements into a buffer `offset` elements past an aligned address,
/// on one block, in both thread orders (so the same bits both ways).
fn orthonormalize_on_host(
    p: &[f32],
    rows: usize,
    rank: usize,
    place: Place,
) -> Result<Vec<f32>, Error> {
    let at = place.at[2];
    let out = run_both(
        &k::LOWRANK_ORTHONORMALIZE_F32,
        plan::lowrank_orthonormalize(),
        &placed(p, at),
        |p| {
            vec![
                Arg::write_at(&mut p[..], place.offset),
                Arg::len(at),
                Arg::len(rows),
                Arg::len(rank),
            ]
        },
    )?;
    Ok(window(&out, at, "lowrank_orthonormalize_f32"))
}

/// The launcher's bound on an orthonormalisation's difference from the
/// CPU's (the device suite's): entries of orthonormal columns are at most
/// 1 in magnitude, and the two differ only where an f64 sum's rounding
/// moved an f32 rounding.
const ORTHO_TOLERANCE: f32 = 8.0 * f32::EPSILON;

/// Asserts `got` is within [`ORTHO_TOLERANCE`] of the CPU's `want`, every
/// entry finite, a zero wherever the CPU zeroed a whole column, and the
/// columns the CPU kept orthonormal.
fn assert_orthonormalized(got: &[f32], want: &[f32], rows: usize, rank: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite() && (g - w).abs() <= ORTHO_TOLERANCE,
            "{what}: entry {i} (row {}, column {}): kernel {g:e}, cpu {w:e}",
            i / rank,
            i % rank
        );
    }
    let kept = |j: usize| (0..rows).any(|i| want[i * rank + j] != 0.0);
    for j in 0..rank {
        if !kept(j) {
            let column: Vec<f32> = (0..rows).map(|i| got[i * rank + j]).collect();
            assert!(
                column.iter().all(|&v| v == 0.0),
                "{what}: column {j}, zero on the CPU: {column:?}"
            );
        }
        for l in 0..=j {
            let dot: f64 = (0..rows)
                .map(|i| f64::from(got[i * rank + j]) * f64::from(got[i * rank + l]))
                .sum();
            let expected = if j == l && kept(j) { 1.0 } else { 0.0 };
            assert!(
                (dot - expected).abs() < 1e-5,
                "{what}: column {j} . column {l} = {dot}"
            );
        }
    }
}

/// The orthonormalisation of `input(len, seed)` factors of every shape
/// against the CPU's.
fn orthonormalizes_as_the_cpu(input: fn(usize, u64) -> Vec<f32>, name: &str) {
    let shapes = [1usize, 2, 7, 255, 256, 257, 4099]
        .into_iter()
        .flat_map(|rows| (1..=6).map(move |rank| (rows, rank)))
        .chain([(100_003, 1), (100_003, 6)]);
    for (rows, rank) in shapes {
        let p = input(rows * rank, (rows * 10 + rank) as u64);
        let mut want = p.clone();
        cpu::orthonormalize(&mut want, rows, rank).expect("cpu orthonormalize");
        for place in PLACES {
            let what =
                format!("lowrank_orthonormalize_f32 {rows} rows rank {rank} {name} {place:?}");
            let got = orthonormalize_on_host(&p, rows, rank, place)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_orthonormalized(&got, &want, rows, rank, &what);
        }
    }
}

#[test]
fn orthonormalize_is_within_ulps_of_the_cpu() {
    orthonormalizes_as_the_cpu(spread, "spread");
}

#[test]
fn orthonormalize_of_every_class_is_within_ulps_of_the_cpu() {
    orthonormalizes_as_the_cpu(tame, "every class");
}

#[test]
fn degenerate_columns_become_zero_as_on_the_cpu() {
    let rank = 6;
    for rows in [1usize, 3, 300, 1031] {
        // Column 0 of subnormals (a norm below f32's smallest normal),
        // 1 of values, 2 a multiple of 1, 3 zero, 4 signed zeros, 5 values.
        let base = spread(rows, 5);
        let other = spread(rows, 6);
        let p: Vec<f32> = (0..rows)
            .flat_map(|i| {
                let sub = f32::from_bits(1 + i as u32 % 7).copysign(base[i]);
                [
                    sub,
                    base[i],
                    -2.0 * base[i],
                    0.0,
                    0f32.copysign(-other[i]),
                    other[i],
                ]
            })
            .collect();
        let mut want = p.clone();
        cpu::orthonormalize(&mut want, rows, rank).expect("cpu orthonormalize");
        let what = format!("lowrank_orthonormalize_f32 {rows} rows, degenerate columns");
        let got = orthonormalize_on_host(&p, rows, rank, PLACES[1])
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_orthonormalized(&got, &want, rows, rank, &what);
        for j in [0, 2, 3, 4] {
            assert!(
                (0..rows).all(|i| want[i * rank + j] == 0.0),
                "{what}: the CPU keeps column {j}"
            );
        }
        let zero = orthonormalize_on_host(&vec![0.0; rows * rank], rows, rank, PLACES[0])
            .unwrap_or_else(|e| panic!("{what} (zero): {e}"));
        assert!(
            zero.iter().all(|&v| v == 0.0),
            "{what}: a zero factor stays zero"
        );
    }
}

#[test]
fn a_power_iteration_matches_the_cpu() {
    let (rows, cols, rank) = (257, 131, 4);
    let s = Shape { rows, cols, rank };
    let m = spread(rows * cols, 77);
    let mut qt = vec![0f32; rank * cols];
    cpu::init_q(3, &mut qt);

    let mut p = vec![0f32; rows * rank];
    cpu::project(&m, rows, cols, &qt, &mut p).expect("cpu");
    cpu::orthonormalize(&mut p, rows, rank).expect("cpu");
    let mut q2 = vec![0f32; rank * cols];
    cpu::project_back(&m, rows, cols, &p, &mut q2).expect("cpu");
    let mut approx = vec![0f32; rows * cols];
    cpu::reconstruct(&p, &q2, rows, cols, &mut approx).expect("cpu");

    let place = PLACES[1];
    let what = "power iteration";
    let run = |r: Result<Vec<f32>, Error>, kernel: &str| {
        r.unwrap_or_else(|e| panic!("{what}: {kernel}: {e}"))
    };
    let dp = run(
        product_on_host(
            &k::LOWRANK_PROJECT_F32,
            On::project(s),
            (&m, &qt),
            rows * rank,
            s,
            place,
        ),
        "project",
    );
    let dp = run(
        orthonormalize_on_host(&dp, rows, rank, place),
        "orthonormalize",
    );
    let dq2 = run(
        product_on_host(
            &k::LOWRANK_PROJECT_BACK_F32,
            On::project_back(s),
            (&m, &dp),
            rank * cols,
            s,
            place,
        ),
        "project_back",
    );
    let dapprox = run(
        product_on_host(
            &k::LOWRANK_RECONSTRUCT_F32,
            On::reconstruct(s),
            (&dp, &dq2),
            rows * cols,
            s,
            place,
        ),
        "reconstruct",
    );

    // The device suite's bounds: the orthonormal P may differ by a few
    // ulps; the products of a `rows`-term (Q) and `rank`-term (P Qᵀ) sum
    // carry that forward.
    let close = |step: &str, got: &[f32], want: &[f32], terms: usize| {
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs())).max(1.0);
        let bound = 16.0 * terms as f32 * f32::EPSILON * scale;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= bound,
                "{what}: {step} entry {i}: kernel {g:e}, cpu {w:e} (bound {bound:e})"
            );
        }
    };
    close("P", &dp, &p, 1);
    close("Q", &dq2, &q2, rows);
    close("P Qt", &dapprox, &approx, rows * rank);
    // And from the kernel's own P, the products are the CPU's bits.
    let mut want = vec![0f32; rank * cols];
    cpu::project_back(&m, rows, cols, &dp, &mut want).expect("cpu");
    assert_bitwise(&dq2, &want, &format!("{what}: Q from the kernel's P"));
    let mut want = vec![0f32; rows * cols];
    cpu::reconstruct(&dp, &dq2, rows, cols, &mut want).expect("cpu");
    assert_bitwise(
        &dapprox,
        &want,
        &format!("{what}: P Qt from the kernel's factors"),
    );
}
