//! What fuzzing the quantizers' decoders (`gradwire_compress::Quantizer`:
//! 1-bit sign, QSGD, E3M0, min-max uint8) with arbitrary payloads checks.
//!
//! A payload comes from a peer: decoding it must never panic. The input's
//! first byte picks the quantizer (QSGD's levels 1 to 127, either norm), the
//! next two the entry count; the rest is the payload, cut to the encoded
//! length when it is longer (so the fuzzer reaches the chunks' checks) and
//! kept whole when it is shorter (a length the decoder refuses). What is
//! refused is refused as corrupt and leaves the output as it was; what is
//! accepted decodes to finite values, and `decode_add` into zeros gives
//! the same values (both check every chunk before writing any).
//!
//! One function for `fuzz_targets/quant.rs` (libFuzzer) and for the
//! corpus replay of `cargo xtask test` (gradwire-tests' `fuzz_corpus`),
//! both including this file with `#[path]`.

use gradwire_compress::quant::QsgdNorm;
use gradwire_compress::{CompressError, Quantizer};

/// The quantizer `selector` names.
fn quantizer(selector: u8, levels: u8) -> Quantizer {
    match selector % 5 {
        0 => Quantizer::Sign,
        1 => Quantizer::E3m0 { seed: 0 },
        2 => Quantizer::MinMaxU8,
        norm => Quantizer::Qsgd {
            levels: 1 + levels % 127,
            seed: 0,
            norm: if norm == 3 {
                QsgdNorm::L2
            } else {
                QsgdNorm::Max
            },
        },
    }
}

/// Checks one input; a failed check panics.
pub fn check(data: &[u8]) {
    let [selector, levels, n_low, n_high, payload @ ..] = data else {
        return;
    };
    let q = quantizer(*selector, *levels);
    // Up to 2047 entries: three whole chunks of 512 and a partial fourth.
    let n = usize::from(u16::from_le_bytes([*n_low, *n_high]) % 2048);
    let payload = &payload[..payload.len().min(q.encoded_len(n))];
    let sentinel: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
    let untouched = |v: &[f32]| {
        v.iter()
            .zip(&sentinel)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    };
    let mut out = sentinel.clone();
    match q.decode(payload, &mut out) {
        Err(e) => {
            assert!(matches!(e, CompressError::Corrupt(_)), "{q:?}: {e}");
            assert!(
                untouched(&out),
                "{q:?}: a refused payload wrote to the output"
            );
            let mut acc = sentinel.clone();
            assert!(
                q.decode_add(payload, &mut acc).is_err(),
                "{q:?}: decode_add accepted"
            );
            assert!(untouched(&acc), "{q:?}: a refused payload was added");
        }
        Ok(()) => {
            assert_eq!(
                payload.len(),
                q.encoded_len(n),
                "{q:?}: a payload of another length"
            );
            assert!(
                out.iter().all(|v| v.is_finite()),
                "{q:?}: an accepted payload decoded to a non-finite value"
            );
            let mut acc = vec![0f32; n];
            q.decode_add(payload, &mut acc)
                .unwrap_or_else(|e| panic!("{q:?}: decode accepted, decode_add refused: {e}"));
            assert!(acc == out, "{q:?}: decode_add into zeros is not decode");
        }
    }
}
