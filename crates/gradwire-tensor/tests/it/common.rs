//! Helpers shared by the integration tests: reference conversions and
//! NaN-aware bitwise comparisons.

#![allow(dead_code)]

use gradwire_tensor::{DType, Tensor, WithDType, bf16, f16};
use proptest::prelude::*;

/// Lengths the numeric tests sweep: empty, one, and primes (so no length is
/// a multiple of the 8 accumulator lanes or the 256-element block, except by
/// accident of the block loop).
pub const LENS: [usize; 11] = [0, 1, 2, 3, 5, 7, 13, 31, 127, 257, 1031];

/// Equal bit patterns, or both NaN (NaN payloads are not part of any claim).
pub fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// [`same_f32`] after exact widening.
pub fn same<T: WithDType>(a: T, b: T) -> bool {
    same_f32(a.to_f32(), b.to_f32())
}

/// Rounds every value to `T`.
pub fn round_all<T: WithDType>(v: &[f32]) -> Vec<T> {
    v.iter().map(|&x| T::from_f32(x)).collect()
}

/// Widens every value to f32.
pub fn widen<T: WithDType>(v: &[T]) -> Vec<f32> {
    v.iter().map(|&x| x.to_f32()).collect()
}

/// `f32` values drawn mostly from a finite range, sometimes from arbitrary
/// bit patterns (NaN, ±inf, subnormals, ±0).
pub fn mixed_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -1.0e4f32..1.0e4f32,
        1 => any::<u32>().prop_map(f32::from_bits),
        1 => prop::sample::select(vec![0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.0e-40]),
    ]
}

/// Finite, non-zero f32 values with a full random 24-bit significand and an
/// exponent in `-12..12`. Uniform range strategies put values on a fixed
/// grid, on which f64 sums are exact and every summation order agrees; these
/// make the f64 roundings (and so the order) observable.
pub fn wide_f32() -> impl Strategy<Value = f32> {
    (any::<bool>(), 0u32..(1 << 23), -12i32..12).prop_map(|(neg, m, e)| {
        let v = f32::from_bits((127 << 23) | m) * 2f32.powi(e);
        if neg { -v } else { v }
    })
}

/// A length from [`LENS`].
pub fn any_len() -> impl Strategy<Value = usize> {
    prop::sample::select(LENS.to_vec())
}

/// A dtype.
pub fn any_dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

/// A 1-d tensor of `dtype` from f32 values (rounded once).
pub fn tensor_of(values: &[f32], dtype: DType) -> Tensor {
    Tensor::from_f32(values, values.len(), dtype).expect("valid tensor")
}

/// Rounds `x` to `dtype` and widens it back: what a `dtype` tensor built
/// from `x` holds.
pub fn through(x: f32, dtype: DType) -> f32 {
    match dtype {
        DType::F32 => x,
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
    }
}
