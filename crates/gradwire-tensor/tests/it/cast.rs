//! Conversions between f32, f16 and bf16: round to nearest even, NaN stays
//! NaN, ±inf stays ±inf, overflow goes to inf, subnormals handled, and
//! half -> f32 -> half is the identity.

use crate::common::same_f32;
use gradwire_tensor::{DType, Tensor, WithDType, bf16, f16, ops};
use proptest::prelude::*;

/// Every f16 or bf16 bit pattern.
fn all_halves<T: WithDType>(from_bits: fn(u16) -> T) -> Vec<T> {
    (0..=u16::MAX).map(from_bits).collect()
}

/// half -> f32 -> half is the identity for every bit pattern (NaN stays
/// NaN), through the tensor API.
fn half_round_trip<T: WithDType>(from_bits: fn(u16) -> T, to_bits: fn(T) -> u16) {
    let all = all_halves(from_bits);
    let t = Tensor::from_vec(all.clone(), all.len()).unwrap();
    let wide = t.to_dtype(DType::F32).unwrap();
    let back = wide.to_dtype(T::DTYPE).unwrap().into_vec::<T>().unwrap();
    let widened = wide.as_slice::<f32>().unwrap();
    let mut nans = 0;
    for ((orig, got), w) in all.iter().zip(&back).zip(widened) {
        assert_eq!(w.to_bits(), orig.to_f32().to_bits(), "widening of {orig:?}");
        if orig.to_f32().is_nan() {
            nans += 1;
            assert!(got.to_f32().is_nan(), "NaN {:#06x} lost", to_bits(*orig));
        } else {
            assert_eq!(to_bits(*got), to_bits(*orig), "{orig:?} -> {got:?}");
        }
    }
    assert!(nans > 0);
}

#[test]
fn f16_f32_f16_is_identity_for_all_65536_patterns() {
    half_round_trip(f16::from_bits, f16::to_bits);
}

#[test]
fn bf16_f32_bf16_is_identity_for_all_65536_patterns() {
    half_round_trip(bf16::from_bits, bf16::to_bits);
}

#[test]
fn f16_to_bf16_rounds_once_for_all_patterns() {
    let all = all_halves(f16::from_bits);
    let t = Tensor::from_vec(all.clone(), all.len()).unwrap();
    let b = t.to_dtype(DType::BF16).unwrap().into_vec::<bf16>().unwrap();
    for (h, got) in all.iter().zip(&b) {
        let want = bf16::from_f32(h.to_f32());
        assert!(
            same_f32(got.to_f32(), want.to_f32()),
            "{h:?}: {got:?} vs {want:?}"
        );
    }
    // And back: every bf16 pattern to f16 is one rounding of its f32 value.
    let all = all_halves(bf16::from_bits);
    let mut out = vec![f16::ZERO; all.len()];
    ops::cast(&all, &mut out).unwrap();
    for (b, got) in all.iter().zip(&out) {
        assert!(
            same_f32(got.to_f32(), f16::from_f32(b.to_f32()).to_f32()),
            "{b:?}"
        );
    }
}

#[test]
fn nearest_even_hand_cases() {
    let p = |e: i32| 2f32.powi(e);
    let bf = |x: f32| bf16::from_f32(x).to_f32();
    let hf = |x: f32| f16::from_f32(x).to_f32();
    // bf16: 7 mantissa bits, ulp(1) = 2^-7.
    assert_eq!(<bf16 as WithDType>::from_f32(1.0 + p(-8)).to_f32(), 1.0); // tie -> even (down)
    assert_eq!(bf(1.0 + 3.0 * p(-8)), 1.0 + p(-6)); // tie -> even (up)
    assert_eq!(bf(1.0 + p(-8) + p(-20)), 1.0 + p(-7)); // above the tie -> up
    assert_eq!(bf(f32::MAX), f32::INFINITY); // rounds past bf16::MAX
    // f16: 10 mantissa bits, ulp(1) = 2^-10, max 65504.
    assert_eq!(<f16 as WithDType>::from_f32(1.0 + p(-11)).to_f32(), 1.0);
    assert_eq!(hf(1.0 + 3.0 * p(-11)), 1.0 + p(-9));
    assert_eq!(hf(65504.0), 65504.0);
    assert_eq!(hf(65519.0), 65504.0);
    assert_eq!(hf(65520.0), f32::INFINITY); // tie -> even is inf
    assert_eq!(hf(-1.0e6), f32::NEG_INFINITY);
    // f16 subnormals: smallest is 2^-24.
    assert_eq!(hf(p(-24)), p(-24));
    assert_eq!(hf(p(-25)), 0.0); // tie -> even (zero)
    assert_eq!(hf(3.0 * p(-26)), p(-24));
    assert_eq!(hf(-p(-26)).to_bits(), (-0.0f32).to_bits()); // sign of zero kept
    assert!(hf(f32::NAN).is_nan() && bf(f32::NAN).is_nan());
}

/// Checks one narrowing direction through every public path: the scalar
/// trait method, the slice conversion, `ops::cast`, `Tensor::from_f32` and
/// `Tensor::to_dtype` (f32 -> T -> f32).
fn narrow_matches_half<T: WithDType>(
    xs: &[f32],
    reference: impl Fn(f32) -> f32,
) -> Result<(), TestCaseError> {
    let n = xs.len();
    let mut via_slice = vec![T::from_f32(0.0); n];
    T::from_f32_slice(xs, &mut via_slice).unwrap();
    let mut via_cast = vec![T::from_f32(0.0); n];
    ops::cast(xs, &mut via_cast).unwrap();
    let via_from = Tensor::from_f32(xs, n, T::DTYPE).unwrap();
    let via_to = Tensor::from_vec(xs.to_vec(), n)
        .unwrap()
        .to_dtype(T::DTYPE)
        .unwrap();
    let back = via_to.to_dtype(DType::F32).unwrap();
    let mut widened = vec![0.0f32; n];
    T::to_f32_slice(&via_slice, &mut widened).unwrap();
    for i in 0..n {
        let want = reference(xs[i]);
        prop_assert!(
            same_f32(T::from_f32(xs[i]).to_f32(), want),
            "scalar {}",
            xs[i]
        );
        prop_assert!(
            same_f32(widened[i], want),
            "slice {} -> {} vs {}",
            xs[i],
            widened[i],
            want
        );
        prop_assert!(same_f32(via_cast[i].to_f32(), want), "cast {}", xs[i]);
        prop_assert!(same_f32(
            via_from.as_slice::<T>().unwrap()[i].to_f32(),
            want
        ));
        prop_assert!(
            same_f32(back.as_slice::<f32>().unwrap()[i], want),
            "to_dtype {}",
            xs[i]
        );
    }
    Ok(())
}

fn any_bits_vec() -> impl Strategy<Value = Vec<f32>> {
    // Up to 600 elements: crosses the 256-element blocks and SIMD tails.
    prop::collection::vec(any::<u32>().prop_map(f32::from_bits), 0..600)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn f32_to_f16_matches_half(xs in any_bits_vec()) {
        narrow_matches_half::<f16>(&xs, |x| f16::from_f32(x).to_f32())?;
    }

    #[test]
    fn f32_to_bf16_matches_half(xs in any_bits_vec()) {
        narrow_matches_half::<bf16>(&xs, |x| bf16::from_f32(x).to_f32())?;
    }

    #[test]
    fn f32_to_f32_is_bitwise_identity(xs in any_bits_vec()) {
        let t = Tensor::from_vec(xs.clone(), xs.len()).unwrap();
        let c = t.to_dtype(DType::F32).unwrap();
        let got: Vec<u32> = c.as_slice::<f32>().unwrap().iter().map(|x| x.to_bits()).collect();
        let want: Vec<u32> = xs.iter().map(|x| x.to_bits()).collect();
        prop_assert_eq!(got, want);
    }

    /// Narrowing is monotone and the error is at most half an ulp: the
    /// result is the nearest representable value (checked on finite,
    /// in-range inputs against the two neighbours).
    #[test]
    fn f16_rounding_is_nearest(x in -65504.0f32..65504.0) {
        let r = f16::from_f32(x);
        let err = (f64::from(r.to_f32()) - f64::from(x)).abs();
        let up = f16::from_bits(r.to_bits().wrapping_add(1)).to_f32();
        let down = f16::from_bits(r.to_bits().wrapping_sub(1)).to_f32();
        for nb in [up, down] {
            if nb.is_finite() {
                prop_assert!(err <= (f64::from(nb) - f64::from(x)).abs());
            }
        }
    }
}
