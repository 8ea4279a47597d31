//! `kernels/cuda/cast.cu` on the CPU: the six dtype conversions bitwise
//! equal to gradwire-tensor's `ops::cast` (one rounding to nearest even when
//! narrowing, NaN payloads included), and the cast codec's `encode_f32_*`
//! equal to gradwire-compress's `cast::encode` (clamp, scale, round; NaN
//! payloads aside, see [`nan_canonical`]), with both buffers aligned (the
//! four-wide path) and misaligned by one to three elements (the scalar path),
//! at every length of [`LENGTHS`], grid-stride launches as the launchers use.

use gradwire_compress::cast::{CastOptions, encode};
use gradwire_kernels::{Blocks, Kernel, cast as k};
use gradwire_kernels_host::{Arg, Element};
use gradwire_tensor::{WithDType, ops};
use half::{bf16, f16};

use crate::common::{LENGTHS, bits, floats, nan_canonical, run_both};

/// Offsets of (source, destination) windows: both aligned, then each or
/// both misaligned.
const OFFSETS: &[(usize, usize)] = &[(0, 0), (1, 0), (0, 3), (2, 2)];

fn check_cast<S: WithDType + Element, D: WithDType + Element>(kernel: &Kernel) {
    for &n in LENGTHS {
        for &(src_at, dst_at) in OFFSETS {
            let src: Vec<S> = floats(n, n as u64, true)
                .into_iter()
                .map(S::from_f32)
                .collect();
            let dst = vec![D::from_f32(7.0); n];
            let (got, _) = run_both(
                kernel,
                Blocks::Over(n),
                &(dst, src.clone()),
                |(dst, src)| {
                    vec![
                        Arg::read_at(src, src_at),
                        Arg::write_at(dst, dst_at),
                        Arg::len(n),
                    ]
                },
            )
            .unwrap_or_else(|e| panic!("{} n = {n}: {e}", kernel.name()));
            let mut want = vec![D::from_f32(0.0); n];
            ops::cast(&src, &mut want).expect("cpu cast");
            assert_eq!(
                bits(&got),
                bits(&want),
                "{} n = {n} offsets ({src_at}, {dst_at})",
                kernel.name()
            );
        }
    }
}

#[test]
fn every_conversion_equals_the_cpu_bitwise() {
    check_cast::<f32, f16>(&k::CAST_F32_F16);
    check_cast::<f32, bf16>(&k::CAST_F32_BF16);
    check_cast::<f16, f32>(&k::CAST_F16_F32);
    check_cast::<bf16, f32>(&k::CAST_BF16_F32);
    check_cast::<f16, bf16>(&k::CAST_F16_BF16);
    check_cast::<bf16, f16>(&k::CAST_BF16_F16);
}

fn check_encode<D: WithDType + Element>(kernel: &Kernel) {
    let options = [
        CastOptions::default(),
        CastOptions {
            clip: Some(0.5),
            scale: 1.0,
        },
        CastOptions {
            clip: Some(0.0),
            scale: 3.0,
        },
        CastOptions {
            clip: None,
            scale: 1024.0,
        },
        CastOptions {
            clip: Some(6.0e4),
            scale: 1.0e-3,
        },
    ];
    for &n in LENGTHS {
        for &(src_at, dst_at) in OFFSETS {
            for opts in &options {
                let src = floats(n, 31 + n as u64, true);
                let dst = vec![D::from_f32(7.0); n];
                // As the launcher passes them (codec_args): a flag, the
                // bound or 0, the scale.
                let has_clip = i32::from(opts.clip.is_some());
                let clip = opts.clip.unwrap_or(0.0);
                let (got, _) = run_both(
                    kernel,
                    Blocks::Over(n),
                    &(dst, src.clone()),
                    |(dst, src)| {
                        vec![
                            Arg::read_at(src, src_at),
                            Arg::write_at(dst, dst_at),
                            Arg::len(n),
                            Arg::value(has_clip),
                            Arg::value(clip),
                            Arg::value(opts.scale),
                        ]
                    },
                )
                .unwrap_or_else(|e| panic!("{} n = {n}: {e}", kernel.name()));
                let mut want = vec![D::from_f32(0.0); n];
                encode(&src, &mut want, opts).expect("cpu encode");
                assert_eq!(
                    nan_canonical(&got),
                    nan_canonical(&want),
                    "{} n = {n} offsets ({src_at}, {dst_at}) {opts:?}",
                    kernel.name()
                );
            }
        }
    }
}

#[test]
fn the_cast_codecs_encode_equals_the_cpu() {
    check_encode::<f16>(&k::ENCODE_F32_F16);
    check_encode::<bf16>(&k::ENCODE_F32_BF16);
}
