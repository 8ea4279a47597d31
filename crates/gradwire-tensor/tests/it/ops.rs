//! Elementwise ops and reductions against references: reductions against an
//! f64 reference with a bound scaling with length and magnitude (and against
//! the documented lane order, bitwise); elementwise ops exactly, per element,
//! against "compute in f32, round once".

use crate::common;
use crate::common::{any_len, mixed_f32, round_all, same, wide_f32, widen};
use gradwire_tensor::{DType, Device, Tensor, WithDType, bf16, f16, ops};
use proptest::prelude::*;

/// Two equally long vectors from [`common::LENS`], scaled by a random power
/// of two so the tolerance has to scale with magnitude.
fn pair() -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (any_len(), -16i32..16).prop_flat_map(|(n, e)| {
        let s = 2f32.powi(e);
        (
            prop::collection::vec(wide_f32(), n),
            prop::collection::vec(wide_f32(), n),
        )
            .prop_map(move |(a, b)| {
                (
                    a.iter().map(|x| x * s).collect(),
                    b.iter().map(|x| x * s).collect(),
                )
            })
    })
}

/// The documented accumulation order: term `i` into lane `i % 8`, lanes
/// combined as `((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))`.
fn lanes(terms: impl Iterator<Item = f64>) -> f64 {
    let mut l = [0.0f64; 8];
    for (i, t) in terms.enumerate() {
        l[i % 8] += t;
    }
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// |got - want| within the error bound of summing `n` f64 terms whose
/// magnitudes sum to `abs_sum` (in any order): (n + 8) eps * abs_sum. Equal
/// infinities and NaN/NaN (f16 overflow at large scales) also match.
fn close(got: f64, want: f64, n: usize, abs_sum: f64) -> bool {
    if got == want || (got.is_nan() && want.is_nan()) {
        return true;
    }
    let tol = (n as f64 + 8.0) * f64::EPSILON * abs_sum + f64::MIN_POSITIVE;
    (got - want).abs() <= tol
}

fn check_reductions<T: WithDType>(a32: &[f32], b32: &[f32]) -> Result<(), TestCaseError> {
    let (a, b) = (round_all::<T>(a32), round_all::<T>(b32));
    let (aw, bw) = (widen(&a), widen(&b));
    let n = a.len();
    let ta = Tensor::from_vec(a.clone(), n).unwrap();
    let tb = Tensor::from_vec(b.clone(), n).unwrap();

    let prod = || {
        aw.iter()
            .zip(&bw)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
    };
    let sq = || aw.iter().map(|x| f64::from(*x) * f64::from(*x));
    let id = || aw.iter().map(|x| f64::from(*x));

    // Sequential f64 references, with the bound.
    let dot = ta.dot(&tb).unwrap();
    prop_assert!(
        close(dot, prod().sum(), n, prod().map(f64::abs).sum()),
        "dot {} vs {}",
        dot,
        prod().sum::<f64>()
    );
    let ss = ta.sum_sq().unwrap();
    prop_assert!(close(ss, sq().sum(), n, sq().sum()));
    let s = ta.sum().unwrap();
    prop_assert!(
        close(s, id().sum(), n, id().map(f64::abs).sum()),
        "sum {} vs {}",
        s,
        id().sum::<f64>()
    );
    let m = ta.max_abs().unwrap();
    prop_assert_eq!(m, id().map(f64::abs).fold(0.0, f64::max));

    // The documented order, bitwise, for every dtype.
    prop_assert_eq!(dot.to_bits(), lanes(prod()).to_bits());
    prop_assert_eq!(ss.to_bits(), lanes(sq()).to_bits());
    prop_assert_eq!(s.to_bits(), lanes(id()).to_bits());

    // Slice API agrees with the tensor API bitwise.
    prop_assert_eq!(ops::dot(&a, &b).unwrap().to_bits(), dot.to_bits());
    prop_assert_eq!(ops::sum_sq(&a).to_bits(), ss.to_bits());
    prop_assert_eq!(ops::sum(&a).to_bits(), s.to_bits());
    prop_assert_eq!(ops::max_abs(&a).to_bits(), m.to_bits());

    // Deterministic across dtypes: the same (widened) values in f32 give
    // bitwise the same result.
    let fa = Tensor::from_vec(aw.clone(), n).unwrap();
    let fb = Tensor::from_vec(bw.clone(), n).unwrap();
    prop_assert_eq!(fa.dot(&fb).unwrap().to_bits(), dot.to_bits());
    prop_assert_eq!(fa.sum().unwrap().to_bits(), s.to_bits());
    Ok(())
}

type Elementwise = fn(f32, f32, f32) -> f32;

/// Runs the tensor op and the slice op on `T` values and compares each
/// element with `T::from_f32(reference(y, a, x))`, bitwise (NaN: both NaN).
fn check_elementwise<T: WithDType>(
    y32: &[f32],
    a: f32,
    x32: &[f32],
    reference: Elementwise,
    tensor_op: impl Fn(&mut Tensor, f32, &Tensor),
    slice_op: impl Fn(&mut [T], f32, &[T]),
) -> Result<(), TestCaseError> {
    let (y, x) = (round_all::<T>(y32), round_all::<T>(x32));
    let n = y.len();
    let mut ty = Tensor::from_vec(y.clone(), n).unwrap();
    tensor_op(&mut ty, a, &Tensor::from_vec(x.clone(), n).unwrap());
    let mut sy = y.clone();
    slice_op(&mut sy, a, &x);
    let got = ty.as_slice::<T>().unwrap();
    for i in 0..n {
        let want = T::from_f32(reference(y[i].to_f32(), a, x[i].to_f32()));
        prop_assert!(
            same(got[i], want),
            "{:?} at {}: y {:?} a {} x {:?}: got {:?} want {:?}",
            T::DTYPE,
            i,
            y[i],
            a,
            x[i],
            got[i],
            want
        );
        prop_assert!(same(sy[i], want), "slice op at {}", i);
    }
    Ok(())
}

fn clamp_ref(y: f32, c: f32, _: f32) -> f32 {
    if y.is_nan() { y } else { y.max(-c).min(c) }
}

fn all_elementwise<T: WithDType>(
    y: &[f32],
    a: f32,
    x: &[f32],
    c: f32,
) -> Result<(), TestCaseError> {
    check_elementwise::<T>(
        y,
        a,
        x,
        |y, a, x| y + a * x,
        |t, a, x| t.axpy(a, x).unwrap(),
        |s, a, x| ops::axpy(s, a, x).unwrap(),
    )?;
    check_elementwise::<T>(
        y,
        a,
        x,
        |y, a, _| y * a,
        |t, a, _| t.scale(a).unwrap(),
        |s, a, _| ops::scale(s, a),
    )?;
    check_elementwise::<T>(
        y,
        a,
        x,
        |y, _, x| y + x,
        |t, _, x| t.add(x).unwrap(),
        |s, _, x| ops::add(s, x).unwrap(),
    )?;
    check_elementwise::<T>(
        y,
        a,
        x,
        |y, _, x| y * x,
        |t, _, x| t.mul(x).unwrap(),
        |s, _, x| ops::mul(s, x).unwrap(),
    )?;
    check_elementwise::<T>(
        y,
        c,
        x,
        clamp_ref,
        |t, c, _| t.clamp(c).unwrap(),
        |s, c, _| ops::clamp(s, c).unwrap(),
    )?;
    check_elementwise::<T>(
        y,
        a,
        x,
        |_, a, _| a,
        |t, a, _| t.fill(a).unwrap(),
        |s, a, _| ops::fill(s, a),
    )?;
    check_elementwise::<T>(
        y,
        a,
        x,
        |_, _, x| x,
        |t, _, x| t.copy_from(x).unwrap(),
        |s, _, x| ops::copy(s, x).unwrap(),
    )?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn reductions_match_f64_reference((a, b) in pair()) {
        check_reductions::<f32>(&a, &b)?;
        check_reductions::<f16>(&a, &b)?;
        check_reductions::<bf16>(&a, &b)?;
    }

    #[test]
    fn elementwise_ops_round_once(
        (y, x) in any_len().prop_flat_map(|n| (
            prop::collection::vec(mixed_f32(), n),
            prop::collection::vec(mixed_f32(), n),
        )),
        a in mixed_f32(),
        c in prop_oneof![0.0f32..2.0e3, Just(0.0), Just(f32::INFINITY)],
    ) {
        all_elementwise::<f32>(&y, a, &x, c)?;
        all_elementwise::<f16>(&y, a, &x, c)?;
        all_elementwise::<bf16>(&y, a, &x, c)?;
    }
}

#[test]
fn reductions_of_special_values() {
    for dtype in DType::ALL {
        let empty = Tensor::zeros(0, dtype, Device::Cpu).unwrap();
        assert_eq!(empty.max_abs().unwrap(), 0.0);
        assert_eq!(empty.sum().unwrap(), 0.0);
        assert_eq!(empty.dot(&empty).unwrap(), 0.0);

        let t = common::tensor_of(&[1.0, f32::NEG_INFINITY, -3.0], dtype);
        assert_eq!(t.max_abs().unwrap(), f64::INFINITY);
        assert_eq!(t.sum().unwrap(), f64::NEG_INFINITY);
        let t = common::tensor_of(&[1.0, f32::INFINITY, f32::NAN, -3.0], dtype);
        assert!(
            t.max_abs().unwrap().is_nan(),
            "{dtype}: NaN must not be skipped"
        );
        assert!(t.sum_sq().unwrap().is_nan());
        let t = common::tensor_of(&[-0.0, -2.5, 1.0], dtype);
        assert_eq!(t.max_abs().unwrap(), 2.5);
    }
}

#[test]
fn f64_accumulation_is_exact_where_f32_would_not_be() {
    // 2^24 + 1 + 1 + ... : an f32 accumulator would drop every 1.
    let mut v = vec![1.0f32; 1031];
    v[0] = 16_777_216.0;
    let t = Tensor::from_vec(v, 1031).unwrap();
    assert_eq!(t.sum().unwrap(), 16_777_216.0 + 1030.0);
    // Products are exact in f64.
    let a = Tensor::from_vec(vec![1.0f32 + f32::EPSILON; 3], 3).unwrap();
    let want = 3.0 * (1.0 + f64::from(f32::EPSILON)).powi(2);
    assert_eq!(a.dot(&a).unwrap(), want);
}

#[test]
fn clamp_keeps_nan_and_accepts_infinite_bound() {
    let mut t = Tensor::from_vec(vec![f32::NAN, 5.0, -5.0, 0.5, f32::NEG_INFINITY], 5).unwrap();
    t.clamp(1.0).unwrap();
    let v = t.to_vec::<f32>().unwrap();
    assert!(v[0].is_nan());
    assert_eq!(&v[1..], &[1.0, -1.0, 0.5, -1.0]);
    t.clamp(f32::INFINITY).unwrap();
    assert_eq!(&t.to_vec::<f32>().unwrap()[1..], &[1.0, -1.0, 0.5, -1.0]);
    t.clamp(0.0).unwrap();
    assert_eq!(&t.to_vec::<f32>().unwrap()[1..], &[0.0, 0.0, 0.0, 0.0]);
}

#[test]
fn half_axpy_rounds_once_not_twice() {
    // y = 1, a * x = 2^-11 + 2^-20. In f32 the sum is just above the f16 tie
    // between 1 and 1 + 2^-10, so one rounding gives 1 + 2^-10. Rounding
    // a * x to f16 first would drop the 2^-20, land exactly on the tie and
    // round to even, 1.0.
    let p = |e: i32| 2f32.powi(e);
    let mut y = Tensor::from_f32(&[1.0], 1, DType::F16).unwrap();
    let x = Tensor::from_f32(&[1.0], 1, DType::F16).unwrap();
    y.axpy(p(-11) + p(-20), &x).unwrap();
    assert_eq!(y.to_f32_vec().unwrap(), vec![1.0 + p(-10)]);
    // The same for bf16 one scale up (ulp(1) = 2^-7).
    let mut y = Tensor::from_f32(&[1.0], 1, DType::BF16).unwrap();
    let x = Tensor::from_f32(&[1.0], 1, DType::BF16).unwrap();
    y.axpy(p(-8) + p(-20), &x).unwrap();
    assert_eq!(y.to_f32_vec().unwrap(), vec![1.0 + p(-7)]);
}
