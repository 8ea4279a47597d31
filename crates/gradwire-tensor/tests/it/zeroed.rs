//! The lazy zeroed flag (nnabla's): zero_ is O(1), reads see zeros and keep
//! the flag, writes clear it and start from zeros, clones keep it.

use crate::common;
use crate::common::{mixed_f32, same, tensor_of};
use gradwire_tensor::{DType, Device, Error, Tensor, WithDType, bf16, f16, pack, pack_new, unpack};
use proptest::prelude::*;

/// A tensor holding `stale` values, then zeroed: its memory still holds the
/// stale values, so any op that reads memory instead of honouring the flag
/// gives a visibly wrong answer.
fn stale_zeroed(stale: f32, n: usize, dtype: DType) -> Tensor {
    let mut t = Tensor::full(stale, n, dtype, Device::Cpu).unwrap();
    t.zero_();
    t
}

#[test]
fn new_tensors_are_not_zeroed() {
    for dtype in DType::ALL {
        let fresh = [
            Tensor::zeros(4, dtype, Device::Cpu).unwrap(),
            Tensor::full(1.0, (2, 2), dtype, Device::Cpu).unwrap(),
            Tensor::from_f32(&[1.0, 2.0], 2, dtype).unwrap(),
            Tensor::zeros(0, dtype, Device::Cpu).unwrap(),
        ];
        for t in &fresh {
            assert!(!t.is_zeroed(), "{t:?}");
        }
        // Conversions of a zeroed tensor are new tensors too.
        let z = stale_zeroed(3.0, 4, dtype);
        for d in DType::ALL {
            let c = z.to_dtype(d).unwrap();
            assert!(!c.is_zeroed());
            assert_eq!(c.to_f32_vec().unwrap(), vec![0.0; 4]);
        }
    }
    assert!(!Tensor::from_vec(vec![1.0f32], 1).unwrap().is_zeroed());
    assert!(!Tensor::from_slice(&[f16::ONE], 1).unwrap().is_zeroed());
    let (flat, _) = pack_new(&[&stale_zeroed(1.0, 3, DType::F32)], DType::F16).unwrap();
    assert!(!flat.is_zeroed());
}

#[test]
fn zero_is_o1_and_writes_no_memory() {
    let mut t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], 3).unwrap();
    t.zero_();
    assert!(t.is_zeroed());
    // The raw storage still holds the old values: nothing was written.
    let raw = t.storage().as_cpu().unwrap().as_slice::<f32>().unwrap();
    assert_eq!(raw, &[1.0, 2.0, 3.0]);
}

fn reads_see_zeros<T: WithDType>() {
    let dtype = T::DTYPE;
    let t = stale_zeroed(7.0, 5, dtype);
    let zero = T::from_f32(0.0);
    assert_eq!(t.as_slice::<T>().unwrap(), &[zero; 5]);
    assert_eq!(t.to_vec::<T>().unwrap(), vec![zero; 5]);
    assert_eq!(t.to_f32_vec().unwrap(), vec![0.0; 5]);
    assert_eq!(t.flat_view::<T>(1..4).unwrap(), &[zero; 3]);
    assert_eq!(t.sum().unwrap(), 0.0);
    assert_eq!(t.sum_sq().unwrap(), 0.0);
    assert_eq!(t.max_abs().unwrap(), 0.0);
    let ones = Tensor::full(1.0, 5, dtype, Device::Cpu).unwrap();
    assert_eq!(t.dot(&ones).unwrap(), 0.0);
    assert_eq!(ones.dot(&t).unwrap(), 0.0);
    assert_eq!(t.dot(&t).unwrap(), 0.0);
    let (flat, _) = pack_new(&[&ones, &t], DType::F32).unwrap();
    assert_eq!(
        flat.as_slice::<f32>().unwrap(),
        &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    );
    // None of that cleared the flag or touched the stale memory.
    assert!(t.is_zeroed());
    let raw = t.storage().as_cpu().unwrap().as_slice::<T>().unwrap();
    assert!(raw.iter().all(|x| x.to_f32() == 7.0));
    // Consuming read.
    assert_eq!(t.into_vec::<T>().unwrap(), vec![zero; 5]);
}

#[test]
fn reads_see_zeros_all_dtypes() {
    reads_see_zeros::<f32>();
    reads_see_zeros::<f16>();
    reads_see_zeros::<bf16>();
}

#[test]
fn dot_with_zeroed_is_exactly_dot_with_real_zeros() {
    let z = stale_zeroed(1.0, 3, DType::F32);
    let inf = Tensor::from_vec(vec![1.0f32, f32::INFINITY, 2.0], 3).unwrap();
    let nan = Tensor::from_vec(vec![f32::NAN, 1.0, 2.0], 3).unwrap();
    assert!(z.dot(&inf).unwrap().is_nan());
    assert!(nan.dot(&z).unwrap().is_nan());
    let real = Tensor::zeros(3, DType::F32, Device::Cpu).unwrap();
    assert!(real.dot(&inf).unwrap().is_nan());
}

/// Runs `op` on a zeroed tensor whose stale memory holds 1s, and checks that
/// the flag is cleared and the result equals `op` applied to real zeros.
fn write_clears_and_starts_from_zeros(name: &str, dtype: DType, op: impl Fn(&mut Tensor)) {
    let mut t = stale_zeroed(1.0, 6, dtype);
    op(&mut t);
    assert!(!t.is_zeroed(), "{name} on {dtype} did not clear the flag");
    let mut reference = Tensor::zeros(6, dtype, Device::Cpu).unwrap();
    op(&mut reference);
    let (got, want) = (t.to_f32_vec().unwrap(), reference.to_f32_vec().unwrap());
    assert!(
        got.iter().zip(&want).all(|(a, b)| common::same_f32(*a, *b)),
        "{name} on {dtype}: got {got:?}, want {want:?}"
    );
}

#[test]
fn every_write_clears_the_flag_and_sees_zeros_first() {
    for dtype in DType::ALL {
        let ones = Tensor::full(1.0, 6, dtype, Device::Cpu).unwrap();
        let threes = Tensor::full(3.0, 6, dtype, Device::Cpu).unwrap();
        write_clears_and_starts_from_zeros("axpy", dtype, |t| t.axpy(1.0, &ones).unwrap());
        write_clears_and_starts_from_zeros("add", dtype, |t| t.add(&ones).unwrap());
        write_clears_and_starts_from_zeros("mul", dtype, |t| t.mul(&threes).unwrap());
        write_clears_and_starts_from_zeros("scale", dtype, |t| t.scale(2.0).unwrap());
        write_clears_and_starts_from_zeros("clamp", dtype, |t| t.clamp(0.5).unwrap());
        write_clears_and_starts_from_zeros("fill", dtype, |t| t.fill(5.0).unwrap());
        write_clears_and_starts_from_zeros("fill0", dtype, |t| t.fill(0.0).unwrap());
        write_clears_and_starts_from_zeros("copy_from", dtype, |t| t.copy_from(&threes).unwrap());
        write_clears_and_starts_from_zeros("copy_from zeroed", dtype, |t| {
            t.copy_from(&stale_zeroed(9.0, 6, dtype)).unwrap()
        });
        write_clears_and_starts_from_zeros("flat_view_mut", dtype, |t| match dtype {
            DType::F32 => t.flat_view_mut::<f32>(2..3).unwrap()[0] = 4.0,
            DType::F16 => t.flat_view_mut::<f16>(2..3).unwrap()[0] = f16::from_f32(4.0),
            DType::BF16 => t.flat_view_mut::<bf16>(2..3).unwrap()[0] = bf16::from_f32(4.0),
        });
        write_clears_and_starts_from_zeros("unpack", dtype, |t| {
            let (flat, layout) = pack_new(&[&threes], DType::F32).unwrap();
            unpack(&flat, &layout, &mut [t]).unwrap();
        });
        write_clears_and_starts_from_zeros("pack into", dtype, |t| {
            let parts = [&threes.clone().reshape((2, 3)).unwrap()];
            pack(&parts, t).unwrap();
        });
    }
}

#[test]
fn the_spec_example_axpy_gives_ones_not_twos() {
    for dtype in DType::ALL {
        let ones = Tensor::full(1.0, 4, dtype, Device::Cpu).unwrap();
        let mut g = Tensor::zeros(4, dtype, Device::Cpu).unwrap();
        g.copy_from(&ones).unwrap();
        g.zero_();
        g.axpy(1.0, &ones).unwrap();
        assert_eq!(g.to_f32_vec().unwrap(), vec![1.0; 4]);
    }
}

#[test]
fn as_mut_slice_materialises_zeros() {
    let mut t = stale_zeroed(2.0, 3, DType::BF16);
    // A read first, so the lazily allocated zero view exists.
    assert_eq!(t.as_slice::<bf16>().unwrap(), &[bf16::ZERO; 3]);
    let s = t.as_mut_slice::<bf16>().unwrap();
    assert_eq!(s, &[bf16::ZERO; 3]);
    s[0] = bf16::ONE;
    assert!(!t.is_zeroed());
    assert_eq!(t.to_f32_vec().unwrap(), vec![1.0, 0.0, 0.0]);
    // Zeroing again and reading must not resurrect the old zero view's state.
    t.zero_();
    assert_eq!(t.to_f32_vec().unwrap(), vec![0.0; 3]);
}

#[test]
fn failed_writes_leave_the_flag_alone() {
    let mut t = stale_zeroed(1.0, 4, DType::F32);
    let result = t.clamp(-1.0);
    assert!(
        matches!(&result, Err(Error::InvalidArgument(m)) if m.contains("clamp: bound")),
        "{result:?}"
    );
    let result = t.axpy(1.0, &Tensor::zeros(5, DType::F32, Device::Cpu).unwrap());
    assert!(
        matches!(&result, Err(Error::ShapeMismatch { op: "axpy", lhs, rhs })
            if lhs.dims() == [4] && rhs.dims() == [5]),
        "{result:?}"
    );
    let result = t.as_mut_slice::<f16>().map(|_| ());
    assert_eq!(
        result,
        Err(Error::DTypeMismatch {
            op: "as_mut_slice",
            expected: DType::F32,
            got: DType::F16
        })
    );
    let result = t.flat_view_mut::<f32>(3..9).map(|_| ());
    assert!(
        matches!(&result, Err(Error::InvalidArgument(m)) if m.contains("flat_view_mut: range 3..9 out of bounds")),
        "{result:?}"
    );
    assert!(t.is_zeroed());
}

#[test]
fn clone_keeps_the_flag() {
    let z = stale_zeroed(5.0, 3, DType::F16);
    let c = z.clone();
    assert!(c.is_zeroed());
    assert_eq!(c.to_f32_vec().unwrap(), vec![0.0; 3]);
    let mut c2 = z.clone();
    c2.add(&Tensor::full(1.0, 3, DType::F16, Device::Cpu).unwrap())
        .unwrap();
    assert_eq!(c2.to_f32_vec().unwrap(), vec![1.0; 3]);
    assert!(z.is_zeroed(), "writing the clone touched the original");

    let live = Tensor::full(2.0, 3, DType::F32, Device::Cpu).unwrap();
    let lc = live.clone();
    assert!(!lc.is_zeroed());
    assert_eq!(lc.to_f32_vec().unwrap(), vec![2.0; 3]);
}

#[test]
fn reshape_keeps_the_flag() {
    let t = stale_zeroed(5.0, 6, DType::F32).reshape((2, 3)).unwrap();
    assert!(t.is_zeroed());
    assert_eq!(t.dims(), &[2, 3]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// For any stale contents, a zeroed tensor behaves under axpy exactly
    /// like freshly allocated zeros.
    #[test]
    fn zeroed_axpy_equals_fresh_axpy(
        (stale, x) in (0usize..300).prop_flat_map(|n| (
            prop::collection::vec(mixed_f32(), n),
            prop::collection::vec(mixed_f32(), n),
        )),
        a in mixed_f32(),
        dtype in common::any_dtype(),
    ) {
        let n = stale.len();
        let mut y = tensor_of(&stale, dtype);
        y.zero_();
        let xt = tensor_of(&x, dtype);
        y.axpy(a, &xt).unwrap();
        let mut fresh = Tensor::zeros(n, dtype, Device::Cpu).unwrap();
        fresh.axpy(a, &xt).unwrap();
        prop_assert!(!y.is_zeroed());
        match dtype {
            DType::F32 => check_same::<f32>(&y, &fresh)?,
            DType::F16 => check_same::<f16>(&y, &fresh)?,
            DType::BF16 => check_same::<bf16>(&y, &fresh)?,
        }
    }
}

fn check_same<T: WithDType>(a: &Tensor, b: &Tensor) -> Result<(), TestCaseError> {
    let (a, b) = (a.as_slice::<T>().unwrap(), b.as_slice::<T>().unwrap());
    prop_assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        prop_assert!(same(*x, *y), "{:?} vs {:?}", x, y);
    }
    Ok(())
}

#[test]
fn clone_from_is_a_clone_in_the_tensors_own_memory() {
    for dtype in DType::ALL {
        let source = Tensor::from_f32(&[1.5, -2.0, 3.25], 3, dtype).unwrap();
        let mut target = Tensor::full(9.0, 3, dtype, Device::Cpu).unwrap();
        let address = |t: &Tensor| match t.dtype() {
            DType::F32 => t.as_slice::<f32>().unwrap().as_ptr() as usize,
            DType::F16 => t.as_slice::<f16>().unwrap().as_ptr() as usize,
            DType::BF16 => t.as_slice::<bf16>().unwrap().as_ptr() as usize,
        };
        let before = address(&target);
        target.clone_from(&source);
        // The same memory, the source's values.
        assert_eq!(address(&target), before);
        assert_eq!(target.to_f32_vec().unwrap(), source.to_f32_vec().unwrap());
        assert!(!target.is_zeroed());
        // A zeroed source: the flag, as a clone keeps it.
        target.clone_from(&stale_zeroed(7.0, 3, dtype));
        assert!(target.is_zeroed());
        assert_eq!(target.to_f32_vec().unwrap(), vec![0.0; 3]);
        // Another shape or dtype: a plain clone.
        let other = Tensor::from_f32(&[4.0; 6], (2, 3), dtype).unwrap();
        target.clone_from(&other);
        assert_eq!(target.dims(), &[2, 3]);
        assert_eq!(target.to_f32_vec().unwrap(), vec![4.0; 6]);
    }
}
