//! The quantizers (1-bit sign, QSGD, E3M0, min-max uint8) on the device
//! against the CPU's: payload bytes, decoded bits, refusals.

use gradwire_compress::CompressError;
use gradwire_compress::cuda::{self, DeviceBytes};
use gradwire_compress::quant::{QUANT_CHUNK, Quantizer};

use crate::support::{bits, device_or_skip, host_f32, non_finite_input, on_device, values};

const QUANT_LENGTHS: [usize; 8] = [0, 1, 7, 511, 512, 513, 4099, 1_000_003];

/// 1 and 7 QSGD levels in nibbles, 8 and 127 in bytes; E3M0.
fn quantizers() -> [Quantizer; 7] {
    [
        Quantizer::Sign,
        Quantizer::Qsgd {
            levels: 1,
            seed: 7,
            norm: gradwire_compress::QsgdNorm::L2,
        },
        Quantizer::Qsgd {
            levels: 7,
            seed: 42,
            norm: gradwire_compress::QsgdNorm::L2,
        },
        Quantizer::Qsgd {
            levels: 8,
            seed: 5,
            norm: gradwire_compress::QsgdNorm::L2,
        },
        Quantizer::Qsgd {
            levels: 127,
            seed: u64::MAX,
            norm: gradwire_compress::QsgdNorm::L2,
        },
        Quantizer::E3m0 { seed: 13 },
        Quantizer::MinMaxU8,
    ]
}

/// Inputs of `n` entries that take every path of the quantizers: spread
/// magnitudes, few distinct values, signed zeros (where f32::min / max may
/// pick either zero), magnitudes whose f32 sum and range overflow (the f64
/// fallbacks), subnormals (QSGD's scale so small its inverse is infinite),
/// and chunk remainders much larger than the rest (the order the sum adds
/// them in shows).
fn quant_inputs(n: usize) -> Vec<(&'static str, Vec<f32>)> {
    let spread = values(n, 21, None);
    let mut inputs = vec![("spread", spread.clone())];
    if n > 100_000 {
        return inputs;
    }
    let map = |f: &dyn Fn(usize, f32) -> f32| -> Vec<f32> {
        spread.iter().enumerate().map(|(i, &v)| f(i, v)).collect()
    };
    inputs.push(("levels", values(n, 22, Some(3))));
    inputs.push((
        "signed zeros",
        map(&|i, _| if i % 3 == 0 { -0.0 } else { 0.0 }),
    ));
    inputs.push((
        "zeros and values",
        map(&|i, v| match i % 5 {
            0 => v,
            1 | 3 => -0.0,
            _ => 0.0,
        }),
    ));
    inputs.push(("huge", map(&|_, v| v.signum() * f32::MAX * 0.75)));
    inputs.push(("huge spread", map(&|_, v| v * 1e36)));
    inputs.push((
        "subnormal",
        map(&|i, _| if i % 3 == 0 { f32::from_bits(1) } else { 0.0 }),
    ));
    inputs.push(("tiny", map(&|_, v| v * 1e-40)));
    // Ratios to the largest that are powers of two, 1 down to 2^-9:
    // E3M0's codes exactly, and below its smallest.
    inputs.push((
        "powers of two",
        map(&|i, v| v.signum() * 2f32.powi(-((i % 10) as i32))),
    ));
    inputs.push((
        "large remainder",
        map(&|i, v| if i >= n / 8 * 8 { v * 1000.0 + 0.1 } else { v }),
    ));
    inputs
}

#[test]
fn quantizers_match_the_cpu() {
    if !device_or_skip("quantizers_match_the_cpu") {
        return;
    }
    for q in quantizers() {
        for &n in &QUANT_LENGTHS {
            for (name, x) in quant_inputs(n) {
                let dx = on_device(&x);
                let base = values(n, 23, None);
                let mut reused = DeviceBytes::zeros(q.encoded_len(n), 0).unwrap();
                for stream in [0u64, 0x1234_5678_9abc] {
                    let what = format!("{q:?} n={n} {name} stream={stream}");
                    let mut cpu = vec![0u8; q.encoded_len(n)];
                    q.encode(&x, stream, &mut cpu).expect("cpu encode");
                    let gpu = cuda::quant_encode(&q, &dx, stream).expect("gpu encode");
                    assert_eq!(gpu.to_host().unwrap(), cpu, "{what}: payload");
                    cuda::quant_encode_into(&q, &dx, stream, &mut reused).expect("gpu into");
                    assert_eq!(reused.to_host().unwrap(), cpu, "{what}: payload into");
                    // Decode the CPU's payload on the device, into stale
                    // values and onto an accumulator.
                    let payload = DeviceBytes::from_host(&cpu, 0).unwrap();
                    let mut decoded = vec![0f32; n];
                    q.decode(&cpu, &mut decoded).expect("cpu decode");
                    let mut out = on_device(&base);
                    cuda::quant_decode(&q, &payload, &mut out).expect("gpu decode");
                    assert_eq!(bits(&host_f32(&out)), bits(&decoded), "{what}: decode");
                    let mut sum = base.clone();
                    q.decode_add(&cpu, &mut sum).expect("cpu decode_add");
                    let mut acc = on_device(&base);
                    cuda::quant_decode_add(&q, &payload, &mut acc).expect("gpu decode_add");
                    assert_eq!(bits(&host_f32(&acc)), bits(&sum), "{what}: decode_add");
                }
            }
        }
    }
}

#[test]
fn quantizers_refuse_non_finite_input_like_the_cpu() {
    if !device_or_skip("quantizers_refuse_non_finite_input_like_the_cpu") {
        return;
    }
    let (x, expected) = non_finite_input();
    let dx = on_device(&x);
    let mut nan_first = x.clone();
    nan_first[700] = f32::NAN;
    let d_nan_first = on_device(&nan_first);
    for q in quantizers() {
        let mut cpu = vec![0u8; q.encoded_len(x.len())];
        assert_eq!(q.encode(&x, 5, &mut cpu).unwrap_err(), expected, "{q:?}");
        assert_eq!(
            cuda::quant_encode(&q, &dx, 5).unwrap_err(),
            expected,
            "{q:?}"
        );
        let mut payload = DeviceBytes::zeros(q.encoded_len(x.len()), 0).unwrap();
        assert_eq!(
            cuda::quant_encode_into(&q, &dx, 5, &mut payload).unwrap_err(),
            expected,
            "{q:?}"
        );
        // A NaN is reported at the same index (NaN != NaN: by its bits).
        let nan_at_700 = |e: CompressError| matches!(e, CompressError::NonFinite { index: 700, value } if value.is_nan());
        assert!(nan_at_700(q.encode(&nan_first, 5, &mut cpu).unwrap_err()));
        assert!(nan_at_700(
            cuda::quant_encode(&q, &d_nan_first, 5).unwrap_err()
        ));
        // A payload of the wrong length, as the CPU.
        let mut short = DeviceBytes::zeros(q.encoded_len(x.len()) - 1, 0).unwrap();
        let finite = on_device(&values(x.len(), 4, None));
        assert_eq!(
            cuda::quant_encode_into(&q, &finite, 5, &mut short).unwrap_err(),
            q.encode(&values(x.len(), 4, None), 5, &mut cpu[1..])
                .unwrap_err(),
            "{q:?}"
        );
    }
    // Settings are checked first, on both.
    let bad = Quantizer::Qsgd {
        levels: 0,
        seed: 1,
        norm: gradwire_compress::QsgdNorm::L2,
    };
    let mut cpu = vec![0u8; bad.encoded_len(x.len())];
    assert!(matches!(
        bad.encode(&x, 0, &mut cpu),
        Err(CompressError::InvalidArgument(_))
    ));
    assert!(matches!(
        cuda::quant_encode(&bad, &dx, 0),
        Err(CompressError::InvalidArgument(_))
    ));
}

#[test]
fn corrupt_quantized_payloads_are_refused_like_the_cpu() {
    if !device_or_skip("corrupt_quantized_payloads_are_refused_like_the_cpu") {
        return;
    }
    // Six chunks, the last of 441 entries: odd, so in nibbles its last
    // byte holds a padding half.
    let n = 3001;
    let x = values(n, 5, None);
    let base = values(n, 6, None);
    let scale_at = |p: &mut Vec<u8>, at: usize, v: f32| {
        p[at..at + 4].copy_from_slice(&v.to_le_bytes());
    };
    for q in quantizers() {
        let mut good = vec![0u8; q.encoded_len(n)];
        q.encode(&x, 9, &mut good).unwrap();
        let stride = q.encoded_len(QUANT_CHUNK);
        let mut corrupt: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut p = good.clone();
        scale_at(&mut p, 3 * stride, f32::NAN);
        scale_at(&mut p, 5 * stride, f32::INFINITY);
        corrupt.push(("NaN scale", p));
        let mut p = good.clone();
        scale_at(&mut p, 5 * stride, f32::NEG_INFINITY);
        corrupt.push(("infinite scale in the last chunk", p));
        match q {
            Quantizer::Qsgd { levels, .. } => {
                let mut p = good.clone();
                // -128 in a byte, -8 in the high half of a nibble byte:
                // beyond any levels either way.
                p[2 * stride + 4 + 100] = 0x80;
                // levels + 1 in a byte; in the low nibble 2 for 1 level,
                // -8 for 7.
                p[4 * stride + 4] = levels + 1;
                corrupt.push(("the lowest code", p));
                if levels < 127 {
                    let mut p = good.clone();
                    // -levels - 1 in a byte or in a low nibble.
                    p[stride + 4 + 17] = (-(levels as i8) - 1) as u8;
                    corrupt.push(("level beyond", p));
                }
                if levels <= gradwire_compress::quant::QSGD_NIBBLE_LEVELS {
                    // Entry 3000, the last, in the low half of its byte.
                    let mut p = good.clone();
                    p[5 * stride + 4 + 440 / 2] |= 0x10;
                    corrupt.push(("a padding nibble set", p));
                }
            }
            Quantizer::MinMaxU8 => {
                let mut p = good.clone();
                scale_at(&mut p, 4 * stride, 2.0);
                scale_at(&mut p, 4 * stride + 4, 1.0);
                corrupt.push(("minimum above maximum", p));
                let mut p = good.clone();
                scale_at(&mut p, stride + 4, f32::NAN);
                corrupt.push(("NaN maximum", p));
            }
            Quantizer::E3m0 { .. } => {
                // A negative zero (8) in the high half of a byte, a
                // negative scale in a later chunk: the first is refused.
                let mut p = good.clone();
                p[2 * stride + 4 + 100] = (p[2 * stride + 4 + 100] & 0x0f) | 0x80;
                scale_at(&mut p, 4 * stride, -1.0);
                corrupt.push(("a negative zero", p));
                let mut p = good.clone();
                scale_at(&mut p, stride, -0.0);
                corrupt.push(("a negative zero scale", p));
                // Entry 3000, the last, in the low half of its byte.
                let mut p = good.clone();
                p[5 * stride + 4 + 440 / 2] |= 0x10;
                corrupt.push(("a padding nibble set", p));
            }
            Quantizer::Sign => {}
        }
        for (what, bytes) in corrupt {
            let mut out = vec![0f32; n];
            let cpu = q.decode(&bytes, &mut out).unwrap_err();
            assert!(matches!(cpu, CompressError::Corrupt(_)), "{q:?} {what}");
            let payload = DeviceBytes::from_host(&bytes, 0).unwrap();
            let mut dout = on_device(&base);
            assert_eq!(
                cuda::quant_decode(&q, &payload, &mut dout).unwrap_err(),
                cpu,
                "{q:?} {what}"
            );
            assert_eq!(
                cuda::quant_decode_add(&q, &payload, &mut dout).unwrap_err(),
                cpu,
                "{q:?} {what}: add"
            );
            // Nothing was written.
            assert_eq!(bits(&host_f32(&dout)), bits(&base), "{q:?} {what}");
        }
        // A payload of the wrong length.
        let short = DeviceBytes::from_host(&good[1..], 0).unwrap();
        let mut out = vec![0f32; n];
        let cpu = q.decode(&good[1..], &mut out).unwrap_err();
        let mut dout = on_device(&base);
        assert_eq!(
            cuda::quant_decode(&q, &short, &mut dout).unwrap_err(),
            cpu,
            "{q:?} short"
        );
        assert_eq!(bits(&host_f32(&dout)), bits(&base), "{q:?} short");
    }
}
