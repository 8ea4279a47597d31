//! `kernels/cuda/select.cu` on the CPU against gradwire-compress's
//! selections (`gradwire_compress::select`).
//!
//! Every kernel runs on the grid its launcher in
//! `gradwire-compress/src/cuda/kernels/select.rs` computes (a grid-stride
//! `Blocks::Over`, one block, or the tiles of `plan::select_tiles`), in both
//! thread orders, and the multi-kernel algorithms run as that launcher and
//! `gradwire-compress/src/cuda.rs` sequence them, host steps included: the
//! refusal of non-finite input (`first_non_finite_f32`), the radix select
//! of the k-th largest magnitude (`radix_init`, then `radix_histogram_f32`
//! and `radix_select_digit` per shift of `plan::RADIX_SHIFTS`), the
//! compaction (`select_count_f32`, the totals read back, two
//! `exclusive_scan_u64`, `select_compact_f32`), and sampled top-k's loop
//! (`sample_strided_f32`, a radix select on the sample,
//! `selection_all_ties`, the survivors, and an exact selection among them
//! through `src_index`). Indices and values must equal the CPU's bitwise, on
//! `LENGTHS`, with subnormals, ±0 and heavy ties, the input at an aligned
//! address and one element past it (the kernels' unaligned paths). Device
//! memory the launchers leave uninitialised or zeroed for the kernels to fill
//! starts here as garbage, so a kernel that skips an entry is seen.

use gradwire_compress::CompressError;
use gradwire_compress::select::{
    self as cpu, SAMPLE_STRIDE, SAMPLED_MIN_LEN, SAMPLED_TOP_K_SLACK, count_for_ratio,
};
use gradwire_kernels::plan::{SampledOutcome, SampledRule};
use gradwire_kernels::{Blocks, Kernel, plan, select as k};
use gradwire_kernels_host::{Arg, Order, launch};

use crate::common::{LENGTHS, floats};

/// `GW_NO_INDEX`: what the launchers put in a first-index cell.
pub(crate) const NO_INDEX: u64 = u64::MAX;

/// Device memory the kernel must overwrite starts as this (u64).
const GARBAGE_U64: u64 = 0xdead_beef_0bad_f00d;
/// The same for u32 (as f32, a NaN).
const GARBAGE_U32: u32 = 0x7fc0_dead;

/// f32 bit patterns as the kernels' f32.
pub(crate) fn f32s(bits: &[u32]) -> &[f32] {
    bytemuck::cast_slice(bits)
}

/// The same, writable.
pub(crate) fn f32s_mut(bits: &mut [u32]) -> &mut [f32] {
    bytemuck::cast_slice_mut(bits)
}

/// The bit patterns of `x`.
pub(crate) fn bits_of(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Runs `kernel` on `blocks` in both thread orders on copies of `state`,
/// checks both leave the memory bitwise equal (the state holds floats as
/// bits), and returns the memory as the forward run leaves it. Panics naming
/// `case` and the kernel.
pub(crate) fn both<S: Clone + PartialEq>(
    case: &str,
    kernel: &Kernel,
    blocks: Blocks,
    state: S,
    args: impl Fn(&mut S) -> Vec<Arg<'_>>,
) -> S {
    let name = kernel.name();
    let mut forward = state.clone();
    launch(kernel, blocks, Order::Forward, &mut args(&mut forward))
        .unwrap_or_else(|e| panic!("{case}: {name}: {e}"));
    let mut reverse = state;
    launch(kernel, blocks, Order::Reverse, &mut args(&mut reverse))
        .unwrap_or_else(|e| panic!("{case}: {name} in reverse order: {e}"));
    assert!(
        forward == reverse,
        "{case}: {name} leaves different memory in the two thread orders"
    );
    forward
}

/// Asserts two lists of bit patterns are equal, naming the first difference.
pub(crate) fn assert_bits(case: &str, what: &str, got: &[u32], want: &[u32]) {
    assert_eq!(
        got.len(),
        want.len(),
        "{case}: {what}: {} entries on the device, {} on the CPU",
        got.len(),
        want.len()
    );
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{case}: {what}[{i}]: device {:#010x} ({:e}), CPU {:#010x} ({:e})",
            got[i],
            f32::from_bits(got[i]),
            want[i],
            f32::from_bits(want[i])
        );
    }
}

/// The magnitude key of an f32 bit pattern (gradwire-compress's `key`).
fn key(bits: u32) -> u32 {
    bits & 0x7fff_ffff
}

// ---------------------------------------------------------------------------
// The launchers, step by step (gradwire-compress/src/cuda/kernels/select.rs
// and the selections of gradwire-compress/src/cuda.rs).

/// `first_non_finite`: the smallest index of a NaN or an infinity in `x`
/// (bits), `x` staged `offset` elements past an aligned address.
pub(crate) fn first_non_finite(case: &str, x: &[u32], offset: usize) -> Option<usize> {
    let n = x.len();
    if n == 0 {
        return None;
    }
    let (_, first) = both(
        case,
        &k::FIRST_NON_FINITE_F32,
        Blocks::Over(n),
        (x.to_vec(), vec![NO_INDEX]),
        |(x, first)| {
            vec![
                Arg::read_at(f32s(x), offset),
                Arg::len(n),
                Arg::write(first),
            ]
        },
    );
    (first[0] != NO_INDEX).then(|| usize::try_from(first[0]).expect("an index"))
}

/// `kth_largest`: the radix select's state (key, ties, above, mask) of the
/// `kth` largest key of `x` (`1 <= kth <= n`).
fn kth_largest(case: &str, x: &[u32], offset: usize, kth: usize) -> Vec<u64> {
    let n = x.len();
    assert!((1..=n).contains(&kth), "{case}: k = {kth} outside 1..={n}");
    let (mut state, mut hist) = both(
        case,
        &k::RADIX_INIT,
        Blocks::Exactly(1, 1),
        (vec![GARBAGE_U64; 4], vec![GARBAGE_U64; 256]),
        |(state, hist)| vec![Arg::write(state), Arg::write(hist), Arg::len(kth)],
    );
    for shift in plan::RADIX_SHIFTS {
        let (_, _, counted) = both(
            case,
            &k::RADIX_HISTOGRAM_F32,
            Blocks::Over(n),
            (x.to_vec(), state.clone(), hist),
            |(x, state, hist)| {
                vec![
                    Arg::read_at(f32s(x), offset),
                    Arg::len(n),
                    Arg::read(state),
                    Arg::write(hist),
                    Arg::value(shift),
                ]
            },
        );
        (state, hist) = both(
            case,
            &k::RADIX_SELECT_DIGIT,
            Blocks::Exactly(1, 1),
            (state, counted),
            |(state, hist)| vec![Arg::write(state), Arg::write(hist), Arg::value(shift)],
        );
    }
    assert!(
        hist.iter().all(|&c| c == 0),
        "{case}: radix_select_digit left a histogram that is not cleared"
    );
    state
}

/// A selection: the state (key, ties, ...) and the ties when the host knows
/// them (`Selection::ties_on_host`).
struct Selection {
    state: Vec<u64>,
    ties_on_host: Option<u64>,
}

impl Selection {
    /// `Selection::at_least`.
    fn at_least(key: u32) -> Selection {
        Selection {
            state: vec![u64::from(key), NO_INDEX, 0, 0],
            ties_on_host: Some(NO_INDEX),
        }
    }

    /// After `kth_largest`: the ties are read back from the state.
    fn found(state: Vec<u64>) -> Selection {
        Selection {
            state,
            ties_on_host: None,
        }
    }

    /// `Selection::keep_all_ties`.
    fn keep_all_ties(&mut self, case: &str) {
        let before = self.state.clone();
        self.state = both(
            case,
            &k::SELECTION_ALL_TIES,
            Blocks::Exactly(1, 1),
            std::mem::take(&mut self.state),
            |state| vec![Arg::write(state)],
        );
        let want = [before[0], NO_INDEX, before[2], before[3]];
        assert_eq!(self.state, want, "{case}: selection_all_ties");
        self.ties_on_host = Some(NO_INDEX);
    }

    fn ties(&self) -> u64 {
        self.ties_on_host.unwrap_or(self.state[1])
    }
}

/// `sample_strided`: `x[0], x[stride], ...`.
fn sample_strided(case: &str, x: &[u32], offset: usize, stride: usize) -> Vec<u32> {
    let n = x.len();
    let m = n.div_ceil(stride);
    if m == 0 {
        return Vec::new();
    }
    let (_, out) = both(
        case,
        &k::SAMPLE_STRIDED_F32,
        Blocks::Over(m),
        (x.to_vec(), vec![GARBAGE_U32; m]),
        |(x, out)| {
            vec![
                Arg::read_at(f32s(x), offset),
                Arg::len(n),
                Arg::len(stride),
                Arg::write(f32s_mut(out)),
            ]
        },
    );
    out
}

/// A selection's result on the device: indices and value bits.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Selected {
    /// The indices.
    pub indices: Vec<u32>,
    /// The values' bits.
    pub values: Vec<u32>,
}

/// `compact` on the launcher's tiles.
fn compact(
    case: &str,
    x: &[u32],
    offset: usize,
    selection: &Selection,
    src_index: Option<&[u32]>,
) -> Selected {
    let n = x.len();
    if n == 0 {
        return Selected {
            indices: Vec::new(),
            values: Vec::new(),
        };
    }
    let (tile, tiles) = plan::select_tiles(n);
    compact_on(case, x, offset, selection, src_index, tile, tiles)
}

/// `compact`'s kernels with `tiles` tiles of `tile` elements.
fn compact_on(
    case: &str,
    x: &[u32],
    offset: usize,
    selection: &Selection,
    src_index: Option<&[u32]>,
    tile: usize,
    tiles: u32,
) -> Selected {
    let n = x.len();
    if let Some(src) = src_index {
        assert_eq!(src.len(), n, "{case}: src_index");
    }
    let grid = Blocks::Exactly(tiles, 1);
    let t = tiles as usize;
    let (_, _, counts_gt, counts_eq, totals) = both(
        case,
        &k::SELECT_COUNT_F32,
        grid,
        (
            x.to_vec(),
            selection.state.clone(),
            vec![GARBAGE_U64; t],
            vec![GARBAGE_U64; t],
            vec![0u64; 2],
        ),
        |(x, sel, gt, eq, totals)| {
            vec![
                Arg::read_at(f32s(x), offset),
                Arg::len(n),
                Arg::len(tile),
                Arg::read(sel),
                Arg::write(gt),
                Arg::write(eq),
                Arg::write(totals),
            ]
        },
    );
    let above = totals[0];
    let equal = totals[1];
    let nnz = usize::try_from(above.saturating_add(equal.min(selection.ties()))).expect("nnz");
    if nnz == 0 {
        return Selected {
            indices: Vec::new(),
            values: Vec::new(),
        };
    }
    let scan = |counts: Vec<u64>| -> Vec<u64> {
        let (_, offsets) = both(
            case,
            &k::EXCLUSIVE_SCAN_U64,
            Blocks::Exactly(1, 1),
            (counts, vec![GARBAGE_U64; t + 1]),
            |(counts, offsets)| vec![Arg::read(counts), Arg::len(t), Arg::write(offsets)],
        );
        offsets
    };
    let offsets_gt = scan(counts_gt);
    let offsets_eq = scan(counts_eq);
    let src = src_index.map(<[u32]>::to_vec);
    let (.., indices, values) = both(
        case,
        &k::SELECT_COMPACT_F32,
        grid,
        (
            x.to_vec(),
            selection.state.clone(),
            offsets_gt,
            offsets_eq,
            src,
            vec![GARBAGE_U32; nnz],
            vec![GARBAGE_U32; nnz],
        ),
        |(x, sel, gt, eq, src, indices, values)| {
            vec![
                Arg::read_at(f32s(x), offset),
                Arg::len(n),
                Arg::len(tile),
                Arg::read(sel),
                Arg::read(gt),
                Arg::read(eq),
                match src {
                    Some(src) => Arg::read(src),
                    None => Arg::Null,
                },
                Arg::write(indices),
                Arg::write(f32s_mut(values)),
                Arg::len(nnz),
            ]
        },
    );
    Selected { indices, values }
}

/// A selection codec as the device forms take it (parameters checked).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Codec {
    /// `threshold`.
    Threshold(f32),
    /// `top_k_count`.
    TopK(usize),
    /// `sampled_top_k`, with its ratio.
    SampledTopK(f64),
}

/// `threshold_finite`, `top_k_finite` or `sampled_top_k_finite`.
pub(crate) fn select_finite(case: &str, x: &[u32], offset: usize, codec: Codec) -> Selected {
    match codec {
        Codec::Threshold(t) => threshold_finite(case, x, offset, t),
        Codec::TopK(kth) => top_k_finite(case, x, offset, kth).0,
        Codec::SampledTopK(ratio) => {
            let kth = count_for_ratio(ratio, x.len()).expect("a valid ratio");
            sampled_top_k_finite(case, x, offset, ratio, kth).0
        }
    }
}

fn threshold_finite(case: &str, x: &[u32], offset: usize, t: f32) -> Selected {
    compact(
        case,
        x,
        offset,
        &Selection::at_least(key(t.to_bits())),
        None,
    )
}

/// `top_k_finite`, with the radix select's state when it ran.
fn top_k_finite(case: &str, x: &[u32], offset: usize, kth: usize) -> (Selected, Option<Vec<u64>>) {
    let kth = kth.min(x.len());
    if kth == 0 {
        let none = Selection::at_least(u32::MAX);
        return (compact(case, x, offset, &none, None), None);
    }
    let state = kth_largest(case, x, offset, kth);
    let selection = Selection::found(state.clone());
    (compact(case, x, offset, &selection, None), Some(state))
}

fn sampled_top_k_finite(
    case: &str,
    x: &[u32],
    offset: usize,
    ratio: f64,
    kth: usize,
) -> (Selected, SampledOutcome) {
    let mut steps = SampledOnHost {
        case,
        x,
        offset,
        sample: Vec::new(),
    };
    let rule = SampledRule {
        min_len: SAMPLED_MIN_LEN,
        stride: SAMPLE_STRIDE,
        slack: SAMPLED_TOP_K_SLACK,
    };
    match plan::sampled_top_k(&mut steps, x.len(), kth, ratio, rule) {
        Ok(done) => done,
        Err(never) => match never {},
    }
}

/// Sampled top-k's steps on the CPU execution of the kernels, as
/// `plan::sampled_top_k` sequences them for the CUDA launcher.
struct SampledOnHost<'a> {
    case: &'a str,
    x: &'a [u32],
    offset: usize,
    sample: Vec<u32>,
}

impl plan::SampledSteps for SampledOnHost<'_> {
    type Selected = Selected;
    type Error = std::convert::Infallible;

    fn exact(&mut self, k: usize) -> Result<Selected, Self::Error> {
        Ok(top_k_finite(self.case, self.x, self.offset, k).0)
    }

    fn sample(&mut self, stride: usize) -> Result<usize, Self::Error> {
        self.sample = sample_strided(self.case, self.x, self.offset, stride);
        Ok(self.sample.len())
    }

    fn survivors(&mut self, take: usize) -> Result<(Selected, usize), Self::Error> {
        let mut estimate = Selection::found(kth_largest(self.case, &self.sample, 0, take));
        estimate.keep_all_ties(self.case);
        let survivors = compact(self.case, self.x, self.offset, &estimate, None);
        let count = survivors.indices.len();
        Ok((survivors, count))
    }

    fn best_among(&mut self, survivors: Selected, k: usize) -> Result<Selected, Self::Error> {
        let best = Selection::found(kth_largest(self.case, &survivors.values, 0, k));
        Ok(compact(
            self.case,
            &survivors.values,
            0,
            &best,
            Some(&survivors.indices),
        ))
    }
}

// ---------------------------------------------------------------------------
// Inputs and the CPU side.

/// Magnitudes from a few values (±0, the smallest subnormal, 1.5, 3, the
/// smallest normal) with random signs: ties at every magnitude, across signs.
fn ties(n: usize, seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let magnitudes = [0.0, f32::from_bits(1), 1.5, 3.0, f32::MIN_POSITIVE];
    (0..n)
        .map(|_| {
            let m = magnitudes[rng.random_range(0..magnitudes.len())];
            if rng.random::<bool>() { -m } else { m }
        })
        .collect()
}

/// ±0 only.
fn zeros(n: usize, seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| if rng.random::<bool>() { -0.0 } else { 0.0 })
        .collect()
}

/// The finite inputs of the selection tests, by name.
fn finite_inputs(n: usize) -> Vec<(&'static str, Vec<f32>)> {
    let seed = n as u64;
    vec![
        ("floats", floats(n, 0x5e1e_c700 + seed, false)),
        ("ties", ties(n, 0x71e5 + seed)),
        ("zeros", zeros(n, 0x2e50 + seed)),
    ]
}

/// The CPU's selection as (indices, value bits), or the index it refuses.
pub(crate) fn cpu_result(
    result: gradwire_compress::Result<gradwire_compress::SparseVec>,
    n: usize,
    case: &str,
) -> Result<Selected, usize> {
    match result {
        Ok(sparse) => {
            assert_eq!(sparse.dense_len(), n, "{case}: the CPU's dense length");
            Ok(Selected {
                indices: sparse.indices().to_vec(),
                values: bits_of(sparse.values()),
            })
        }
        Err(CompressError::NonFinite { index, .. }) => Err(index),
        Err(e) => panic!("{case}: the CPU fails: {e}"),
    }
}

/// Asserts the device's selection is the CPU's, bitwise.
pub(crate) fn assert_selected(case: &str, got: &Selected, want: &Selected) {
    assert_eq!(
        got.indices.len(),
        want.indices.len(),
        "{case}: the device selects {} entries, the CPU {}",
        got.indices.len(),
        want.indices.len()
    );
    if let Some(j) = (0..got.indices.len()).find(|&j| got.indices[j] != want.indices[j]) {
        panic!(
            "{case}: entry {j}: device index {}, CPU index {}",
            got.indices[j], want.indices[j]
        );
    }
    assert_bits(case, "values", &got.values, &want.values);
}

/// The offsets of the input: aligned, and one element past (not 16-byte
/// aligned, so the kernels take their one-at-a-time paths).
const OFFSETS: [usize; 2] = [0, 1];

// ---------------------------------------------------------------------------
// The tests.

#[test]
fn first_non_finite_finds_the_index_the_cpu_refuses() {
    for &n in LENGTHS {
        let mut inputs = vec![
            ("finite", floats(n, 0xf1 + n as u64, false)),
            ("specials", floats(n, 0xf2 + n as u64, true)),
        ];
        if n > 0 {
            let mut nan_last = floats(n, 0xf3, false);
            nan_last[n - 1] = f32::from_bits(0x7fa0_0001);
            let mut inf_first = floats(n, 0xf4, false);
            inf_first[0] = f32::NEG_INFINITY;
            let mut two = floats(n, 0xf5, false);
            two[n / 2] = f32::INFINITY;
            two[n - 1] = -f32::NAN;
            inputs.extend([
                ("a NaN last", nan_last),
                ("-inf first", inf_first),
                ("inf in the middle, NaN last", two),
            ]);
        }
        for (input, x) in &inputs {
            // The CPU's refusal: every selector and the error feedback
            // report the first non-finite entry.
            let want = match cpu::threshold(x, 0.0) {
                Ok(_) => None,
                Err(CompressError::NonFinite { index, .. }) => Some(index),
                Err(e) => panic!("n={n} {input}: the CPU fails: {e}"),
            };
            assert_eq!(
                want,
                x.iter().position(|v| !v.is_finite()),
                "n={n} {input}: the CPU's threshold refuses the first non-finite entry"
            );
            let bits = bits_of(x);
            for offset in [0, 1, 3] {
                let case = format!("first_non_finite_f32, n={n}, f32, {input}, offset {offset}");
                assert_eq!(first_non_finite(&case, &bits, offset), want, "{case}");
            }
        }
    }
}

#[test]
fn sample_strided_takes_the_cpus_sample() {
    for &n in LENGTHS {
        let x = bits_of(&floats(n, 0x5a + n as u64, true));
        for stride in [1, 3, SAMPLE_STRIDE] {
            let want: Vec<u32> = x.iter().step_by(stride).copied().collect();
            for offset in OFFSETS {
                let case =
                    format!("sample_strided_f32, n={n}, f32, stride {stride}, offset {offset}");
                assert_bits(
                    &case,
                    "sample",
                    &sample_strided(&case, &x, offset, stride),
                    &want,
                );
            }
        }
    }
}

#[test]
fn threshold_selects_what_the_cpu_selects() {
    let thresholds = [0.0, -0.0, f32::from_bits(1), 1.0, 1.5, f32::MAX];
    for &n in LENGTHS {
        for (input, x) in finite_inputs(n) {
            let bits = bits_of(&x);
            for t in thresholds {
                let want = cpu_result(cpu::threshold(&x, t), n, "threshold")
                    .unwrap_or_else(|i| panic!("n={n} {input}: the CPU refuses entry {i}"));
                for offset in OFFSETS {
                    let case = format!("threshold {t:e}, n={n}, f32, {input}, offset {offset}");
                    assert_eq!(first_non_finite(&case, &bits, offset), None, "{case}");
                    let got = threshold_finite(&case, &bits, offset, t);
                    assert_selected(&case, &got, &want);
                }
            }
        }
    }
}

#[test]
fn top_k_selects_what_the_cpu_selects_ties_to_the_lower_indices() {
    for &n in LENGTHS {
        let mut ks = vec![0, 1, 2, n / 3, n / 2 + 1, n.saturating_sub(1), n];
        ks.retain(|&kth| kth <= n);
        ks.sort_unstable();
        ks.dedup();
        for (input, x) in finite_inputs(n) {
            let bits = bits_of(&x);
            for &kth in &ks {
                let case = format!("top_k k={kth}, n={n}, f32, {input}");
                let want = cpu_result(cpu::top_k_count(&x, kth), n, &case)
                    .unwrap_or_else(|i| panic!("{case}: the CPU refuses entry {i}"));
                assert_eq!(want.indices.len(), kth, "{case}: the CPU keeps k entries");
                for offset in OFFSETS {
                    let case = format!("{case}, offset {offset}");
                    let (got, state) = top_k_finite(&case, &bits, offset, kth);
                    assert_selected(&case, &got, &want);
                    // The radix select itself: the k-th largest key, and how
                    // many of its equals (and how many above) the CPU keeps.
                    if let Some(state) = state {
                        let keys: Vec<u32> = want.values.iter().map(|&v| key(v)).collect();
                        let kth_key = keys.iter().copied().min().expect("k >= 1");
                        let ties = keys.iter().filter(|&&kv| kv == kth_key).count() as u64;
                        let above = keys.iter().filter(|&&kv| kv > kth_key).count() as u64;
                        assert_eq!(
                            state,
                            vec![u64::from(kth_key), ties, above, 0xffff_ffff],
                            "{case}: the radix select's (key, ties, above, mask)"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn sampled_top_k_selects_what_the_cpu_selects() {
    let n: usize = 4099;
    let (sample_len, ratio) = (n.div_ceil(SAMPLE_STRIDE), 0.1);
    assert_eq!(sample_len, 41);
    // The sample's 5th largest is 5.0 and 450 more entries lie above it:
    // 455 survivors, between k = 410 and the cap 533.
    let mut within = vec![0.25f32; n];
    for (j, v) in within.iter_mut().enumerate() {
        if j % SAMPLE_STRIDE == 0 {
            *v = if j / SAMPLE_STRIDE < 5 { -5.0 } else { 1.0 };
        } else if j < 455 {
            *v = if j % 2 == 0 { 10.0 } else { -10.0 };
        }
    }
    assert_eq!(within.iter().filter(|v| v.abs() >= 5.0).count(), 455);
    // Every entry has the same magnitude: all survive, the exact top k among
    // them keeps the lowest indices.
    let all_equal: Vec<f32> = zeros(n, 1).iter().map(|z| (1.0f32).copysign(*z)).collect();
    // Only the sampled entries and 100 others are large: never k survivors,
    // the sample runs out and exact top-k decides.
    let mut too_few = vec![0.5f32; n];
    for (j, v) in too_few.iter_mut().enumerate() {
        if j % SAMPLE_STRIDE == 0 {
            *v = 1.0;
        } else if j % 40 == 1 && j < 4001 {
            *v = -3.0;
        }
    }
    let cases: Vec<(&str, Vec<f32>, f64, Option<SampledOutcome>)> = vec![
        (
            "survivors within the cap",
            within,
            ratio,
            Some(SampledOutcome::Survivors),
        ),
        (
            "all equal",
            all_equal,
            ratio,
            Some(SampledOutcome::AmongSurvivors),
        ),
        (
            "too few survivors",
            too_few,
            ratio,
            Some(SampledOutcome::Fallback),
        ),
        ("ties", ties(n, 3), ratio, None),
        ("floats", floats(n, 4, false), 0.01, None),
        ("floats", floats(n, 5, false), 0.3, None),
        (
            "floats, short",
            floats(1021, 6, false),
            ratio,
            Some(SampledOutcome::Small),
        ),
    ];
    for (input, x, ratio, path) in cases {
        let n = x.len();
        let kth = count_for_ratio(ratio, n).expect("a valid ratio");
        let bits = bits_of(&x);
        let want = cpu_result(cpu::sampled_top_k(&x, ratio), n, input)
            .unwrap_or_else(|i| panic!("{input}: the CPU refuses entry {i}"));
        for offset in OFFSETS {
            let case = format!("sampled_top_k ratio {ratio}, n={n}, f32, {input}, offset {offset}");
            let (got, went) = sampled_top_k_finite(&case, &bits, offset, ratio, kth);
            if let Some(path) = path {
                assert_eq!(went, path, "{case}: the path the input was built for");
            }
            assert_selected(&case, &got, &want);
        }
    }
}

#[test]
fn exclusive_scan_gives_the_prefix_sums() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5ca9);
    // Tile counts the plans give (up to MAX_GRID), across the scan's chunks.
    for m in [1usize, 2, 17, 255, 256, 257, 1021, plan::MAX_GRID as usize] {
        let counts: Vec<u64> = (0..m).map(|_| rng.random_range(0..1u64 << 40)).collect();
        let mut want = Vec::with_capacity(m + 1);
        let mut sum = 0u64;
        for &c in &counts {
            want.push(sum);
            sum += c;
        }
        want.push(sum);
        let case = format!("exclusive_scan_u64, m={m}, u64");
        let (_, got) = both(
            &case,
            &k::EXCLUSIVE_SCAN_U64,
            Blocks::Exactly(1, 1),
            (counts, vec![GARBAGE_U64; m + 1]),
            |(counts, out)| vec![Arg::read(counts), Arg::len(m), Arg::write(out)],
        );
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn tiles_of_several_rounds_compact_as_the_cpu_selects() {
    // `select_tiles` gives tiles longer than a block only past
    // MAX_GRID * BLOCK elements, where the whole top-k pipeline takes too
    // long here (the compaction alone runs on that plan below): the radix
    // select and the compaction at the suites' lengths on tiles of two and
    // three blocks (the carry between a tile's rounds, ties split by them).
    for n in [1021usize, 4099] {
        let (tile, _) = plan::select_tiles(n);
        assert_eq!(tile, plan::BLOCK as usize, "n={n}: one round a tile");
        for (input, x) in finite_inputs(n) {
            let bits = bits_of(&x);
            let kth = n / 3;
            let want_top = cpu_result(cpu::top_k_count(&x, kth), n, input).expect("finite");
            let want_threshold = cpu_result(cpu::threshold(&x, 1.5), n, input).expect("finite");
            for tile in [2 * plan::BLOCK as usize, 3 * plan::BLOCK as usize] {
                let tiles = u32::try_from(n.div_ceil(tile)).expect("a few tiles");
                for offset in OFFSETS {
                    let case =
                        format!("top_k k={kth}, n={n}, f32, {input}, tile {tile}, offset {offset}");
                    let state = kth_largest(&case, &bits, offset, kth);
                    let sel = Selection::found(state);
                    let got = compact_on(&case, &bits, offset, &sel, None, tile, tiles);
                    assert_selected(&case, &got, &want_top);
                    let case =
                        format!("threshold 1.5, n={n}, f32, {input}, tile {tile}, offset {offset}");
                    let sel = Selection::at_least(key(1.5f32.to_bits()));
                    let got = compact_on(&case, &bits, offset, &sel, None, tile, tiles);
                    assert_selected(&case, &got, &want_threshold);
                }
            }
        }
    }
}

#[test]
fn the_plans_tiles_of_two_rounds_compact_as_the_cpu_selects() {
    // Past MAX_GRID * BLOCK elements `select_tiles` gives tiles of two
    // blocks: the compaction on that plan, with the selection of the CPU's
    // top-k (its k-th key and how many of its many ties to keep; the radix
    // select itself is checked above, and costs too much at this length).
    let n = plan::MAX_GRID as usize * plan::BLOCK as usize + 1;
    let (tile, tiles) = plan::select_tiles(n);
    assert_eq!(
        (tile, tiles),
        (2 * plan::BLOCK as usize, 2049),
        "n={n}: the plan"
    );
    let x = ties(n, 9);
    let kth = n / 3;
    let case = format!("top_k k={kth}, n={n}, f32, ties, the plan's tiles");
    let want = cpu_result(cpu::top_k_count(&x, kth), n, &case).expect("finite");
    let keys: Vec<u32> = want.values.iter().map(|&v| key(v)).collect();
    let kth_key = keys.iter().copied().min().expect("k >= 1");
    let ties = keys.iter().filter(|&&kv| kv == kth_key).count() as u64;
    let above = keys.iter().filter(|&&kv| kv > kth_key).count() as u64;
    let selection = Selection::found(vec![u64::from(kth_key), ties, above, 0xffff_ffff]);
    let got = compact(&case, &bits_of(&x), 0, &selection, None);
    assert_selected(&case, &got, &want);
}
