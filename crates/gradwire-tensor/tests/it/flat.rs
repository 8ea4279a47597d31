//! Fusion buffers: pack/unpack round trips for random shape lists and every
//! dtype combination, the layout arithmetic, and all-or-nothing errors.

use crate::common::{any_dtype, mixed_f32, same_f32, through};
use gradwire_tensor::{
    DType, Device, Error, FlatLayout, Shape, Tensor, f16, pack, pack_new, unpack,
};
use proptest::prelude::*;

/// A random list of (shape, dtype, values): 0 to 6 tensors of rank 0 to 3
/// with dimensions 0 to 5, so empty tensors and scalars both occur.
fn tensors() -> impl Strategy<Value = Vec<(Vec<usize>, DType, Vec<f32>)>> {
    let one = (prop::collection::vec(0usize..6, 0..4), any_dtype()).prop_flat_map(|(dims, dt)| {
        let n = dims.iter().product::<usize>();
        (Just(dims), Just(dt), prop::collection::vec(mixed_f32(), n))
    });
    prop::collection::vec(one, 0..7)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Packing into a `flat_dtype` buffer and unpacking into fresh tensors
    /// gives each element rounded to the flat dtype and then to its own
    /// dtype (exactly once each); f32 through f32 is bitwise identity.
    #[test]
    fn pack_unpack_round_trip(list in tensors(), flat_dtype in any_dtype(), zero_first in any::<bool>()) {
        let ts: Vec<Tensor> = list
            .iter()
            .map(|(dims, dt, v)| Tensor::from_f32(v, dims.as_slice(), *dt).unwrap())
            .collect();
        let refs: Vec<&Tensor> = ts.iter().collect();
        let (flat, layout) = pack_new(&refs, flat_dtype).unwrap();

        // Layout arithmetic.
        prop_assert_eq!(layout.len(), ts.len());
        let mut offset = 0;
        for (i, (t, e)) in ts.iter().zip(layout.iter()).enumerate() {
            prop_assert_eq!(e.offset(), offset);
            prop_assert_eq!(e.len(), t.len());
            prop_assert_eq!(e.shape(), t.shape());
            prop_assert_eq!(layout.range(i), Some(offset..offset + t.len()));
            offset += t.len();
        }
        prop_assert_eq!(layout.total(), offset);
        prop_assert_eq!(flat.len(), offset);
        prop_assert_eq!(layout.range(ts.len()), None);

        // Packed contents: each element rounded once to the flat dtype.
        let packed = flat.to_f32_vec().unwrap();
        for (t, e) in ts.iter().zip(&layout) {
            let src = t.to_f32_vec().unwrap();
            for (x, p) in src.iter().zip(&packed[e.range()]) {
                prop_assert!(same_f32(*p, through(*x, flat_dtype)), "{} packed as {}", x, p);
            }
        }

        // Unpack into fresh destinations of the original dtypes (optionally
        // zeroed first, with stale contents).
        let mut outs: Vec<Tensor> = ts
            .iter()
            .map(|t| Tensor::full(9.0, t.shape(), t.dtype(), Device::Cpu).unwrap())
            .collect();
        if zero_first {
            outs.iter_mut().for_each(Tensor::zero_);
        }
        let mut out_refs: Vec<&mut Tensor> = outs.iter_mut().collect();
        unpack(&flat, &layout, &mut out_refs).unwrap();
        for (t, o) in ts.iter().zip(&outs) {
            prop_assert!(!o.is_zeroed());
            let (src, got) = (t.to_f32_vec().unwrap(), o.to_f32_vec().unwrap());
            for (x, g) in src.iter().zip(&got) {
                let want = through(through(*x, flat_dtype), t.dtype());
                prop_assert!(same_f32(*g, want), "{} -> {} want {}", x, g, want);
                if t.dtype() == flat_dtype || flat_dtype == DType::F32 {
                    prop_assert!(same_f32(*g, *x), "lossless path changed {}", x);
                }
            }
        }
    }
}

#[test]
fn f32_into_f16_and_back_is_per_element_rounding() {
    let v = [1.0f32, 1.0 + 2f32.powi(-11), 70000.0, -1e-8, f32::NAN];
    let t = Tensor::from_vec(v.to_vec(), 5).unwrap();
    let (flat, layout) = pack_new(&[&t], DType::F16).unwrap();
    assert_eq!(flat.dtype(), DType::F16);
    let mut back = Tensor::zeros(5, DType::F32, Device::Cpu).unwrap();
    unpack(&flat, &layout, &mut [&mut back]).unwrap();
    let got = back.to_vec::<f32>().unwrap();
    for (x, g) in v.iter().zip(&got) {
        assert!(same_f32(*g, f16::from_f32(*x).to_f32()));
    }
    assert_eq!(got[2], f32::INFINITY);
}

#[test]
fn packing_zeroed_tensors_reads_zeros_and_keeps_flags() {
    let a = Tensor::full(1.0, 2, DType::F32, Device::Cpu).unwrap();
    let mut b = Tensor::full(5.0, (1, 3), DType::BF16, Device::Cpu).unwrap();
    b.zero_();
    let mut flat = Tensor::full(7.0, 5, DType::F32, Device::Cpu).unwrap();
    flat.zero_();
    let layout = pack(&[&a, &b], &mut flat).unwrap();
    assert!(b.is_zeroed());
    assert!(!flat.is_zeroed(), "pack writes the flat buffer");
    assert_eq!(flat.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 0.0, 0.0, 0.0]);
    assert_eq!(
        flat.flat_view::<f32>(layout.range(1).unwrap()).unwrap(),
        &[0.0; 3]
    );

    // A zeroed flat buffer unpacks as zeros into every destination.
    flat.zero_();
    let mut a2 = a.clone();
    let mut b2 = Tensor::full(3.0, (1, 3), DType::BF16, Device::Cpu).unwrap();
    unpack(&flat, &layout, &mut [&mut a2, &mut b2]).unwrap();
    assert_eq!(a2.to_f32_vec().unwrap(), vec![0.0; 2]);
    assert_eq!(b2.to_f32_vec().unwrap(), vec![0.0; 3]);
    assert!(flat.is_zeroed(), "unpack only reads the flat buffer");
}

#[test]
fn errors_change_nothing() {
    let a = Tensor::full(1.0, 2, DType::F32, Device::Cpu).unwrap();
    let b = Tensor::full(2.0, 3, DType::F32, Device::Cpu).unwrap();

    // Wrong flat length.
    let mut short = Tensor::full(4.0, 4, DType::F32, Device::Cpu).unwrap();
    short.zero_();
    let err = pack(&[&a, &b], &mut short).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LengthMismatch {
                op: "pack",
                expected: 5,
                got: 4
            }
        ),
        "{err}"
    );
    assert!(short.is_zeroed());

    let (flat, layout) = pack_new(&[&a, &b], DType::F32).unwrap();
    // Second destination has the wrong shape: the first must stay untouched.
    let mut d0 = Tensor::full(8.0, 2, DType::F32, Device::Cpu).unwrap();
    let mut d1 = Tensor::full(8.0, (3, 1), DType::F32, Device::Cpu).unwrap();
    let err = unpack(&flat, &layout, &mut [&mut d0, &mut d1]).unwrap_err();
    assert!(
        matches!(err, Error::ShapeMismatch { op: "unpack", .. }),
        "{err}"
    );
    assert_eq!(d0.to_vec::<f32>().unwrap(), vec![8.0; 2]);

    // Wrong number of destinations.
    let err = unpack(&flat, &layout, &mut [&mut d0]).unwrap_err();
    assert!(matches!(
        err,
        Error::LengthMismatch {
            op: "unpack",
            expected: 2,
            got: 1
        }
    ));

    // Flat buffer of the wrong length for the layout.
    let other = Tensor::zeros(4, DType::F32, Device::Cpu).unwrap();
    let mut d1 = Tensor::zeros(3, DType::F32, Device::Cpu).unwrap();
    let err = unpack(&other, &layout, &mut [&mut d0, &mut d1]).unwrap_err();
    assert!(matches!(
        err,
        Error::LengthMismatch {
            op: "unpack",
            expected: 5,
            got: 4
        }
    ));
}

#[test]
fn layout_of_nothing_and_overflow() {
    let empty = FlatLayout::new(std::iter::empty::<&Shape>()).unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.total(), 0);
    let (flat, layout) = pack_new(&[], DType::BF16).unwrap();
    assert_eq!((flat.len(), layout.len()), (0, 0));
    unpack(&flat, &layout, &mut []).unwrap();

    let big = Shape::from(usize::MAX / 2 + 1);
    assert_eq!(FlatLayout::new([&big, &big]), Err(Error::ShapeOverflow));
    assert_eq!(
        FlatLayout::new([&Shape::from([usize::MAX, 3])]),
        Err(Error::ShapeOverflow)
    );
}
