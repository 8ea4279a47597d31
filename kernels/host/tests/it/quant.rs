//! `kernels/cuda/quant.cu` on the CPU against gradwire-compress's
//! quantizers (`gradwire_compress::quant`: 1-bit scaled sign, QSGD with the
//! 2-norm and the max norm, its levels in bytes and, up to 7 levels, in
//! nibbles, E3M0, min-max uint8), each kernel launched as
//! gradwire-compress's CUDA launcher (`cuda/kernels/quant.rs`) launches it:
//!
//! - the encoders on the launcher's grid ([`plan::quant_encode`]) give the
//!   CPU's payload byte for byte, over stale payloads, at every length of
//!   [`LENGTHS`] and around the 512-entry chunks, on inputs of every finite
//!   class (subnormals, ±0, ties of the rounding, sums and ranges that
//!   overflow f32, remainders past the eight lanes, exact powers of two
//!   around E3M0's smallest), for two streams of QSGD's and E3M0's draws;
//! - decoding runs the launcher's sequence: the check kernel (the first
//!   chunk the CPU refuses, found on the CPU chunk by chunk), then, only when
//!   it passes, the decode kernel into stale values or onto an accumulator:
//!   bitwise the CPU's `decode` / `decode_add`, on the CPU's payloads, on
//!   arbitrary well-formed payloads (every code, signed-zero and overflowing
//!   headers), and on corrupt ones, which leave the output untouched;
//! - past [`MAX_GRID`] chunks (2^21 entries), where the launcher's grid
//!   stops growing and each block strides over the chunks: every quantizer
//!   on the launcher's grids, and every setting on smaller grids;
//! - payloads at any byte offset (the kernels read and write them byte by
//!   byte; the launcher's own payloads are whole allocations, as its inputs
//!   and outputs, so it passes no windows).

use gradwire_compress::QsgdNorm;
use gradwire_compress::quant::{QSGD_NIBBLE_LEVELS, QUANT_CHUNK, Quantizer};
use gradwire_kernels::{Blocks, Kernel, MAX_GRID, plan, quant as k};
use gradwire_kernels_host::{Arg, Error};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::common::{LENGTHS, floats, run_both};

/// [`LENGTHS`] and the lengths around the chunks, their eights and bytes.
fn lengths() -> Vec<usize> {
    let mut all: Vec<usize> = LENGTHS.to_vec();
    all.extend([8, 9, 511, 512, 513, 1024, 1025]);
    all.sort_unstable();
    all
}

/// The QSGD settings the device suite uses (7 levels the most in nibbles,
/// 8 the fewest in bytes: the boundary of quant.rs, quant.cu and the
/// kernel table alike), and the max norm.
fn qsgd() -> [Quantizer; 6] {
    let q = |levels, seed, norm| Quantizer::Qsgd { levels, seed, norm };
    [
        q(1, 7, QsgdNorm::L2),
        q(7, 42, QsgdNorm::L2),
        q(8, 5, QsgdNorm::L2),
        q(127, u64::MAX, QsgdNorm::L2),
        q(7, 3, QsgdNorm::Max),
        q(127, 11, QsgdNorm::Max),
    ]
}

/// E3M0 with a seed (the others with 0, its only setting).
const E3M0: Quantizer = Quantizer::E3m0 { seed: 13 };

/// Every quantizer: one setting each but QSGD's (all of [`qsgd`]).
fn every() -> impl Iterator<Item = Quantizer> {
    [Quantizer::Sign, Quantizer::MinMaxU8, E3M0]
        .into_iter()
        .chain(qsgd())
}

/// Streams of QSGD's and E3M0's draws.
const STREAMS: [u64; 2] = [0, 0x1234_5678_9abc];

/// QSGD's levels as the launcher passes them (0 for the others).
fn levels(q: Quantizer) -> u32 {
    match q {
        Quantizer::Qsgd { levels, .. } => u32::from(levels),
        Quantizer::Sign | Quantizer::E3m0 { .. } | Quantizer::MinMaxU8 => 0,
    }
}

/// The encoder, check and decoder of `q`.
fn kernels(q: Quantizer) -> [&'static Kernel; 3] {
    match q {
        Quantizer::Sign => [
            &k::QUANT_SIGN_ENCODE_F32,
            &k::QUANT_SIGN_CHECK,
            &k::QUANT_SIGN_DECODE_F32,
        ],
        Quantizer::Qsgd { .. } => [
            &k::QUANT_QSGD_ENCODE_F32,
            &k::QUANT_QSGD_CHECK,
            &k::QUANT_QSGD_DECODE_F32,
        ],
        Quantizer::E3m0 { .. } => [
            &k::QUANT_E3M0_ENCODE_F32,
            &k::QUANT_E3M0_CHECK,
            &k::QUANT_E3M0_DECODE_F32,
        ],
        Quantizer::MinMaxU8 => [
            &k::QUANT_MINMAX_ENCODE_F32,
            &k::QUANT_MINMAX_CHECK,
            &k::QUANT_MINMAX_DECODE_F32,
        ],
    }
}

/// The launcher's grid for encoding `n` entries.
fn encode_grid(n: usize) -> Blocks {
    plan::quant_encode(n.div_ceil(QUANT_CHUNK))
}

/// `kernels::quant::encode` on the host: `x` encoded over `stale` (the
/// payload, `at` bytes past an aligned address) on `blocks`, in both thread
/// orders. Nothing is launched for no entries, as in the launcher.
fn encode_on_host(
    q: Quantizer,
    stream: u64,
    x: &[f32],
    stale: &[u8],
    at: usize,
    blocks: Blocks,
) -> Result<Vec<u8>, Error> {
    let n = x.len();
    if n == 0 {
        return Ok(stale.to_vec());
    }
    let [encode, _, _] = kernels(q);
    let (levels, key) = (levels(q), q.stream_key(stream));
    let max_norm = matches!(
        q,
        Quantizer::Qsgd {
            norm: QsgdNorm::Max,
            ..
        }
    );
    let state = (x.to_vec(), stale.to_vec());
    let (_, payload) = run_both(encode, blocks, &state, |(x, payload)| match q {
        Quantizer::Qsgd { .. } => vec![
            Arg::read(&x[..]),
            Arg::len(n),
            Arg::value(levels),
            Arg::value(u32::from(max_norm)),
            Arg::value(key),
            Arg::write_at(&mut payload[..], at),
        ],
        Quantizer::E3m0 { .. } => vec![
            Arg::read(&x[..]),
            Arg::len(n),
            Arg::value(key),
            Arg::write_at(&mut payload[..], at),
        ],
        Quantizer::Sign | Quantizer::MinMaxU8 => vec![
            Arg::read(&x[..]),
            Arg::len(n),
            Arg::write_at(&mut payload[..], at),
        ],
    })?;
    Ok(payload)
}

/// `kernels::quant::decode` on the host, in both thread orders: the check
/// (a first-index cell of `u64::MAX`, on the launcher's grid), then, when
/// no chunk is refused, the decode (or decode-add) into `out`. Returns the
/// refused chunk, if any, and `out` as the kernels leave it.
fn decode_on_host(
    q: Quantizer,
    payload: &[u8],
    at: usize,
    out: &[f32],
    add: bool,
) -> Result<(Option<usize>, Vec<f32>), Error> {
    let n = out.len();
    if n == 0 {
        return Ok((None, out.to_vec()));
    }
    let [_, check, decode] = kernels(q);
    let levels = levels(q);
    let check_blocks = match q {
        Quantizer::Qsgd { .. } | Quantizer::E3m0 { .. } => Blocks::Over(n),
        Quantizer::Sign | Quantizer::MinMaxU8 => Blocks::Over(n.div_ceil(QUANT_CHUNK)),
    };
    let state = (payload.to_vec(), vec![u64::MAX]);
    let (_, first) = run_both(check, check_blocks, &state, |(payload, first)| match q {
        Quantizer::Qsgd { .. } => vec![
            Arg::read_at(&payload[..], at),
            Arg::len(n),
            Arg::value(levels),
            Arg::write(&mut first[..]),
        ],
        Quantizer::Sign | Quantizer::E3m0 { .. } | Quantizer::MinMaxU8 => vec![
            Arg::read_at(&payload[..], at),
            Arg::len(n),
            Arg::write(&mut first[..]),
        ],
    })?;
    if first[0] != u64::MAX {
        let chunk = usize::try_from(first[0]).expect("a chunk index");
        return Ok((Some(chunk), out.to_vec()));
    }
    let state = (payload.to_vec(), out.to_vec());
    let (_, out) = run_both(decode, Blocks::Over(n), &state, |(payload, out)| match q {
        Quantizer::Qsgd { .. } => vec![
            Arg::read_at(&payload[..], at),
            Arg::len(n),
            Arg::value(levels),
            Arg::write(&mut out[..]),
            Arg::value(i32::from(add)),
        ],
        Quantizer::Sign | Quantizer::E3m0 { .. } | Quantizer::MinMaxU8 => vec![
            Arg::read_at(&payload[..], at),
            Arg::len(n),
            Arg::write(&mut out[..]),
            Arg::value(i32::from(add)),
        ],
    })?;
    Ok((None, out))
}

/// The first chunk of `payload` (of `n` entries) that the CPU's decode
/// refuses, each chunk decoded on its own.
fn cpu_first_refused(q: Quantizer, payload: &[u8], n: usize) -> Option<usize> {
    (0..n.div_ceil(QUANT_CHUNK)).find(|&c| {
        let entries = (n - c * QUANT_CHUNK).min(QUANT_CHUNK);
        let start = c * q.chunk_bytes();
        let bytes = &payload[start..start + q.encoded_len(entries)];
        q.decode(bytes, &mut vec![0.0; entries]).is_err()
    })
}

/// Decodes `payload` (of `base.len()` entries) on the host into `base` and
/// onto it, and checks both against the CPU's decode and decode-add: the
/// same bits, or, for a payload the CPU refuses, the first chunk it refuses
/// and `base` untouched.
fn check_decodes(q: Quantizer, payload: &[u8], at: usize, base: &[f32], case: &str) {
    let n = base.len();
    let refused = cpu_first_refused(q, payload, n);
    let [_, check, decode] = kernels(q);
    for add in [false, true] {
        let what = format!("{} {case} add={add}", decode.name());
        let mut want = base.to_vec();
        let cpu = if add {
            q.decode_add(payload, &mut want)
        } else {
            q.decode(payload, &mut want)
        };
        assert_eq!(
            cpu.is_err(),
            refused.is_some(),
            "{what}: the CPU's decode ({cpu:?}) against its chunks ({refused:?})"
        );
        let (first, got) =
            decode_on_host(q, payload, at, base, add).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            first,
            refused,
            "{} then {what}: the first refused chunk",
            check.name()
        );
        let want = if refused.is_some() { base } else { &want };
        assert_same(
            &bits(&got),
            &bits(want),
            &format!("{what}: decoded bits (or, refused, the untouched output)"),
        );
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Asserts `got == want`, naming `what` and the first element that differs.
fn assert_same<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        let differ = (0..got.len()).filter(|&i| got[i] != want[i]).count();
        panic!(
            "{what}: element {i} of {} (one of {differ} that differ): kernel {:?}, cpu {:?}",
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// Uniform in [-1, 1) times 2^-8 .. 2^7: magnitudes of a gradient.
fn spread(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * 2f32.powi(rng.random_range(-8..8)))
        .collect()
}

/// Finite inputs of `n` entries that take every path of the quantizers
/// (the device suite's and more).
fn inputs(n: usize) -> Vec<(&'static str, Vec<f32>)> {
    let spread = spread(n, n as u64);
    let map = |f: &dyn Fn(usize, f32) -> f32| -> Vec<f32> {
        spread.iter().enumerate().map(|(i, &v)| f(i, v)).collect()
    };
    vec![
        ("every class", floats(n, 100 + n as u64, false)),
        ("spread", spread.clone()),
        // Few distinct values: ties of QSGD's ratios and min-max's steps.
        (
            "levels",
            map(&|_, v| (v.signum() * (v.abs() * 3.0).round()) / 3.0),
        ),
        // Over [0, 255/64] the step is 64: every odd entry rounds a tie.
        ("steps", map(&|i, _| (i % 511) as f32 / 128.0)),
        ("constant", map(&|_, _| 0.3)),
        (
            "signed zeros",
            map(&|i, _| if i % 3 == 0 { -0.0 } else { 0.0 }),
        ),
        (
            "zeros and values",
            map(&|i, v| match i % 5 {
                0 => v,
                1 | 3 => -0.0,
                _ => 0.0,
            }),
        ),
        // Sums, ranges and 2-norms past f32: the f64 fallbacks.
        ("huge", map(&|_, v| v.signum() * f32::MAX * 0.75)),
        ("huge spread", map(&|_, v| v * 1e36)),
        (
            "subnormal",
            map(&|i, v| match i % 3 {
                0 => f32::from_bits(1).copysign(v),
                1 => f32::from_bits(0x0007_ffff).copysign(v),
                _ => 0.0,
            }),
        ),
        ("tiny", map(&|_, v| v * 1e-40)),
        // Ratios to the largest that are exact powers of two, 1 down to
        // 2^-9: E3M0's codes exactly, and below its smallest (2^-6).
        (
            "powers of two",
            map(&|i, v| v.signum() * 2f32.powi(-((i % 10) as i32))),
        ),
        (
            "large remainder",
            map(&|i, v| if i >= n / 8 * 8 { v * 1000.0 + 0.1 } else { v }),
        ),
    ]
}

/// A stale payload of `len` bytes: every byte the encoder leaves unwritten
/// shows.
fn stale(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 37 + 11) as u8).collect()
}

/// Every length and input: the encoder on the launcher's grid against the
/// CPU's payload, then the decoders on that payload.
fn encodes_and_decodes_as_the_cpu(q: Quantizer) {
    let encode = kernels(q)[0].name();
    for n in lengths() {
        let base = floats(n, 7 + n as u64, false);
        for (input, x) in inputs(n) {
            let streams: &[u64] = match q {
                Quantizer::Qsgd { .. } | Quantizer::E3m0 { .. } => &STREAMS,
                Quantizer::Sign | Quantizer::MinMaxU8 => &STREAMS[..1],
            };
            for &stream in streams {
                let case = format!("{q:?} n={n} {input} stream={stream}");
                let mut want = vec![0u8; q.encoded_len(n)];
                q.encode(&x, stream, &mut want)
                    .unwrap_or_else(|e| panic!("{case}: cpu encode: {e}"));
                let got = encode_on_host(q, stream, &x, &stale(want.len()), 0, encode_grid(n))
                    .unwrap_or_else(|e| panic!("{encode} {case}: {e}"));
                assert_same(&got, &want, &format!("{encode} {case}: payload bytes"));
                check_decodes(q, &want, 0, &base, &case);
            }
        }
    }
}

#[test]
fn sign_encodes_and_decodes_as_the_cpu() {
    encodes_and_decodes_as_the_cpu(Quantizer::Sign);
}

#[test]
fn qsgd_encodes_and_decodes_as_the_cpu() {
    for q in &qsgd()[..4] {
        encodes_and_decodes_as_the_cpu(*q);
    }
}

#[test]
fn qsgd_max_norm_encodes_and_decodes_as_the_cpu() {
    for q in &qsgd()[4..] {
        encodes_and_decodes_as_the_cpu(*q);
    }
}

#[test]
fn e3m0_encodes_and_decodes_as_the_cpu() {
    encodes_and_decodes_as_the_cpu(E3M0);
}

#[test]
fn minmax_encodes_and_decodes_as_the_cpu() {
    encodes_and_decodes_as_the_cpu(Quantizer::MinMaxU8);
}

/// A well-formed payload of `n` entries that no encoder need give: random
/// codes (QSGD's within its levels, E3M0's any but its negative zero)
/// under headers of every class: random finite scales (E3M0's
/// non-negative), ±0, subnormals, and min-max pairs that are equal, of
/// opposite zeros, or whose range overflows f32.
fn arbitrary_payload(q: Quantizer, n: usize, seed: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut payload: Vec<u8> = (0..q.encoded_len(n)).map(|_| rng.random()).collect();
    let headers = floats(2 * n.div_ceil(QUANT_CHUNK), seed, false);
    for c in 0..n.div_ceil(QUANT_CHUNK) {
        let chunk = &mut payload[c * q.chunk_bytes()..];
        let entries = (n - c * QUANT_CHUNK).min(QUANT_CHUNK);
        let (a, b) = (headers[2 * c], headers[2 * c + 1]);
        match q {
            Quantizer::Sign => chunk[..4].copy_from_slice(&a.to_le_bytes()),
            Quantizer::Qsgd { levels, .. } => {
                chunk[..4].copy_from_slice(&a.to_le_bytes());
                let l = i16::from(levels);
                if levels <= QSGD_NIBBLE_LEVELS {
                    // The padding nibble of an odd chunk zero, as decoding asks.
                    chunk[4..4 + entries.div_ceil(2)].fill(0);
                }
                for j in 0..entries {
                    set_code(chunk, j, rng.random_range(-l..=l) as i8, levels);
                }
            }
            Quantizer::E3m0 { .. } => {
                chunk[..4].copy_from_slice(&a.abs().to_le_bytes());
                // Every nibble but 8; the padding zero.
                chunk[4..4 + entries.div_ceil(2)].fill(0);
                for j in 0..entries {
                    let code = rng.random_range(0..15u8);
                    set_nibble(chunk, j, if code >= 8 { code + 1 } else { code });
                }
            }
            Quantizer::MinMaxU8 => {
                let (lo, hi) = match c % 5 {
                    0 => (a.min(b), a.max(b)),
                    1 => (-f32::MAX, f32::MAX),
                    2 => (-0.0, 0.0),
                    3 => (0.0, -0.0),
                    _ => (a, a),
                };
                chunk[..4].copy_from_slice(&lo.to_le_bytes());
                chunk[4..8].copy_from_slice(&hi.to_le_bytes());
            }
        }
    }
    payload
}

/// Sets entry `j`'s QSGD code in `chunk` (from its header on) to `level`,
/// as `levels` lays codes out: a byte, or up to [`QSGD_NIBBLE_LEVELS`] the
/// low 4 bits of `level` in half of byte `j / 2` (the low half for even
/// `j`).
fn set_code(chunk: &mut [u8], j: usize, level: i8, levels: u8) {
    if levels <= QSGD_NIBBLE_LEVELS {
        set_nibble(chunk, j, level as u8);
    } else {
        chunk[4 + j] = level as u8;
    }
}

/// Sets entry `j`'s nibble in `chunk` (from its 4-byte header on) to the
/// low 4 bits of `code`: half of byte `j / 2`, the low half for even `j`.
fn set_nibble(chunk: &mut [u8], j: usize, code: u8) {
    let shift = 4 * (j % 2);
    let byte = &mut chunk[4 + j / 2];
    *byte = (*byte & !(0x0f << shift)) | ((code & 0x0f) << shift);
}

#[test]
fn arbitrary_payloads_decode_as_on_the_cpu() {
    for q in every() {
        for n in lengths() {
            let payload = arbitrary_payload(q, n, 1000 + n as u64);
            let base = floats(n, 2000 + n as u64, false);
            check_decodes(q, &payload, 0, &base, &format!("{q:?} n={n} arbitrary"));
        }
    }
}

#[test]
fn corrupt_payloads_are_refused_at_the_cpus_chunk() {
    let scale_at =
        |p: &mut [u8], at: usize, v: f32| p[at..at + 4].copy_from_slice(&v.to_le_bytes());
    for q in every() {
        for n in [1usize, 513, 3000] {
            let chunks = n.div_ceil(QUANT_CHUNK);
            let last = chunks - 1;
            let stride = q.chunk_bytes();
            let mut good = vec![0u8; q.encoded_len(n)];
            q.encode(&spread(n, 5), 9, &mut good).expect("cpu encode");
            let mut corrupt: Vec<(String, Vec<u8>)> = Vec::new();
            let mut with = |what: &str, f: &dyn Fn(&mut Vec<u8>)| {
                let mut p = good.clone();
                f(&mut p);
                corrupt.push((what.to_string(), p));
            };
            with("NaN scale", &|p| scale_at(p, last / 2 * stride, f32::NAN));
            with("NaN with a payload, then +inf", &|p| {
                scale_at(p, last * stride, f32::from_bits(0xffc0_1234));
                if last > 0 {
                    scale_at(p, (last - 1) * stride, f32::INFINITY);
                }
            });
            with("-inf scale in the last chunk", &|p| {
                scale_at(p, last * stride, f32::NEG_INFINITY)
            });
            match q {
                Quantizer::Qsgd { levels, .. } => {
                    let last_entry = (n - 1) % QUANT_CHUNK;
                    // The most negative code: an i8's -128, a nibble's -8.
                    let lowest = if levels <= QSGD_NIBBLE_LEVELS {
                        -8
                    } else {
                        i8::MIN
                    };
                    with("the lowest code in the last entry", &|p| {
                        set_code(&mut p[last * stride..], last_entry, lowest, levels);
                    });
                    with("level beyond, two chunks", &|p| {
                        set_code(
                            &mut p[last * stride..],
                            0,
                            (levels as i8).wrapping_add(1),
                            levels,
                        );
                        set_code(&mut p[last / 2 * stride..], last_entry, lowest, levels);
                    });
                    if levels < 127 {
                        with("level below -levels", &|p| {
                            let level = -(levels as i8) - 1;
                            set_code(&mut p[last * stride..], last_entry / 2, level, levels);
                        });
                    }
                    // An odd last chunk's padding nibble set.
                    if levels <= QSGD_NIBBLE_LEVELS && (last_entry + 1) % 2 == 1 {
                        with("a padding nibble set", &|p| {
                            p[last * stride + 4 + last_entry / 2] |= 0x10;
                        });
                    }
                }
                Quantizer::MinMaxU8 => {
                    with("minimum above maximum", &|p| {
                        scale_at(p, last * stride, 2.0);
                        scale_at(p, last * stride + 4, 1.0);
                    });
                    with("minimum above maximum by one ulp", &|p| {
                        scale_at(p, last / 2 * stride, f32::from_bits(1));
                        scale_at(p, last / 2 * stride + 4, 0.0);
                    });
                    with("NaN maximum", &|p| scale_at(p, last * stride + 4, f32::NAN));
                    with("infinite maximum", &|p| {
                        scale_at(p, last / 2 * stride + 4, f32::INFINITY)
                    });
                }
                Quantizer::E3m0 { .. } => {
                    let last_entry = (n - 1) % QUANT_CHUNK;
                    with("a negative zero in the last entry", &|p| {
                        set_nibble(&mut p[last * stride..], last_entry, 8);
                    });
                    with("a negative zero, then a negative scale", &|p| {
                        set_nibble(&mut p[last * stride..], 0, 8);
                        scale_at(p, last / 2 * stride, -1.0);
                    });
                    with("a negative zero scale", &|p| {
                        scale_at(p, last * stride, -0.0)
                    });
                    with("the lowest subnormal negative scale", &|p| {
                        scale_at(p, last / 2 * stride, -f32::from_bits(1))
                    });
                    if (last_entry + 1) % 2 == 1 {
                        with("a padding nibble set", &|p| {
                            p[last * stride + 4 + last_entry / 2] |= 0x10;
                        });
                        with("a padding nibble of 8", &|p| {
                            p[last * stride + 4 + last_entry / 2] |= 0x80;
                        });
                    }
                }
                Quantizer::Sign => {}
            }
            let base = floats(n, 6, false);
            for (what, payload) in corrupt {
                check_decodes(q, &payload, 0, &base, &format!("{q:?} n={n} {what}"));
            }
        }
    }
}

/// Entries past [`MAX_GRID`] chunks: the launcher's grid stops growing and
/// each block encodes every `MAX_GRID`-th chunk; the grid-stride decoders
/// take two entries a thread.
const PAST_THE_GRID: usize = (MAX_GRID as usize + 1) * QUANT_CHUNK + 5;

/// Encodes and decodes `PAST_THE_GRID` entries on the launcher's grids.
fn past_the_grid(q: Quantizer) {
    let n = PAST_THE_GRID;
    assert_eq!(encode_grid(n), Blocks::Exactly(MAX_GRID, 1));
    let encode = kernels(q)[0].name();
    // Floats of every class, drawn once and spread over the chunks (the
    // generator is slow in a debug build).
    let pool = floats(8191, 600, false);
    let x: Vec<f32> = (0..n).map(|i| pool[i * 31 % pool.len()]).collect();
    let base: Vec<f32> = (0..n).map(|i| pool[i * 17 % pool.len()]).collect();
    let case = format!("{q:?} n={n}");
    let mut want = vec![0u8; q.encoded_len(n)];
    q.encode(&x, STREAMS[1], &mut want).expect("cpu encode");
    let got = encode_on_host(q, STREAMS[1], &x, &stale(want.len()), 0, encode_grid(n))
        .unwrap_or_else(|e| panic!("{encode} {case}: {e}"));
    assert_same(&got, &want, &format!("{encode} {case}: payload bytes"));
    check_decodes(q, &want, 0, &base, &case);
}

#[test]
fn sign_past_the_grid() {
    past_the_grid(Quantizer::Sign);
}

#[test]
fn qsgd_past_the_grid() {
    past_the_grid(qsgd()[1]);
}

#[test]
fn qsgd_max_norm_past_the_grid() {
    past_the_grid(qsgd()[5]);
}

#[test]
fn e3m0_past_the_grid() {
    past_the_grid(E3M0);
}

#[test]
fn minmax_past_the_grid() {
    past_the_grid(Quantizer::MinMaxU8);
}

#[test]
fn encoders_stride_over_the_chunks_on_smaller_grids() {
    // The loop the launcher's grid takes past MAX_GRID chunks, on every
    // setting: grids smaller than the chunks.
    for q in every() {
        let encode = kernels(q)[0].name();
        for (n, grid) in [(4099, 2), (4099, 4), (2600, 3), (513, 1)] {
            let x = floats(n, 300 + n as u64, false);
            let stream = STREAMS[1];
            let mut want = vec![0u8; q.encoded_len(n)];
            q.encode(&x, stream, &mut want).expect("cpu encode");
            let got = encode_on_host(
                q,
                stream,
                &x,
                &stale(want.len()),
                0,
                Blocks::Exactly(grid, 1),
            )
            .unwrap_or_else(|e| panic!("{encode} {q:?} n={n} grid {grid}: {e}"));
            assert_same(
                &got,
                &want,
                &format!("{encode} {q:?} n={n} grid {grid}: payload bytes"),
            );
        }
    }
}

#[test]
fn payloads_at_any_byte_offset() {
    // The kernels read and write the payload's scales byte by byte.
    for q in every() {
        let encode = kernels(q)[0].name();
        for n in [1usize, 513, 1025] {
            let x = floats(n, 400 + n as u64, false);
            let base = floats(n, 500 + n as u64, false);
            let mut want = vec![0u8; q.encoded_len(n)];
            q.encode(&x, 77, &mut want).expect("cpu encode");
            for at in [1, 2, 3] {
                let case = format!("{q:?} n={n} payload at byte {at}");
                let got = encode_on_host(q, 77, &x, &stale(want.len()), at, encode_grid(n))
                    .unwrap_or_else(|e| panic!("{encode} {case}: {e}"));
                assert_same(&got, &want, &format!("{encode} {case}: payload bytes"));
                check_decodes(q, &want, at, &base, &case);
            }
        }
    }
}
