//! Every documented failure is a specific error variant, never a panic.

use gradwire_tensor::{CpuStorage, DType, Device, Error, Shape, Tensor, WithDType, bf16, f16, ops};

fn ones(n: usize) -> Tensor {
    Tensor::full(1.0, n, DType::F32, Device::Cpu).unwrap()
}

#[test]
fn wrong_dtype_accessors() {
    let mut t = ones(3);
    assert!(matches!(
        t.as_slice::<f16>(),
        Err(Error::DTypeMismatch {
            expected: DType::F32,
            got: DType::F16,
            ..
        })
    ));
    assert!(matches!(
        t.as_mut_slice::<bf16>(),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        t.to_vec::<f16>(),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        t.flat_view::<bf16>(0..1),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        t.clone().into_vec::<f16>(),
        Err(Error::DTypeMismatch { .. })
    ));
    t.zero_();
    assert!(matches!(
        t.as_slice::<f16>(),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        t.into_vec::<bf16>(),
        Err(Error::DTypeMismatch { .. })
    ));
}

#[test]
fn construction_length_mismatch() {
    assert!(matches!(
        Tensor::from_vec(vec![1.0f32; 5], (2, 3)),
        Err(Error::LengthMismatch {
            op: "from_vec",
            expected: 6,
            got: 5
        })
    ));
    assert!(matches!(
        Tensor::from_slice(&[f16::ONE; 7], (2, 3)),
        Err(Error::LengthMismatch {
            expected: 6,
            got: 7,
            ..
        })
    ));
    assert!(matches!(
        Tensor::from_f32(&[1.0; 2], Shape::scalar(), DType::BF16),
        Err(Error::LengthMismatch {
            expected: 1,
            got: 2,
            ..
        })
    ));
    assert!(matches!(
        Tensor::from_storage(CpuStorage::zeros(DType::F16, 3), 4),
        Err(Error::LengthMismatch {
            expected: 4,
            got: 3,
            ..
        })
    ));
}

#[test]
fn shape_overflow() {
    assert_eq!(
        Tensor::zeros([usize::MAX, 2], DType::F32, Device::Cpu).unwrap_err(),
        Error::ShapeOverflow
    );
    // Element count fits, byte size does not.
    assert_eq!(
        Tensor::zeros(usize::MAX / 2, DType::F32, Device::Cpu).unwrap_err(),
        Error::ShapeOverflow
    );
    assert_eq!(
        Tensor::from_vec(Vec::<f32>::new(), [usize::MAX, usize::MAX]).unwrap_err(),
        Error::ShapeOverflow
    );
}

#[test]
fn binary_op_mismatches() {
    let mut y = ones(3);
    let err = y.axpy(1.0, &ones(4)).unwrap_err();
    assert!(
        matches!(&err, Error::ShapeMismatch { op: "axpy", lhs, rhs } if lhs.dims() == [3] && rhs.dims() == [4]),
        "{err}"
    );
    let r = ones(6).reshape((2, 3)).unwrap();
    let mut y6 = ones(6);
    assert!(matches!(
        y6.add(&r),
        Err(Error::ShapeMismatch { op: "add", .. })
    ));
    let h = Tensor::full(1.0, 3, DType::F16, Device::Cpu).unwrap();
    assert!(matches!(
        y.axpy(1.0, &h),
        Err(Error::DTypeMismatch {
            op: "axpy",
            expected: DType::F32,
            got: DType::F16
        })
    ));
    assert!(matches!(y.mul(&h), Err(Error::DTypeMismatch { .. })));
    assert!(matches!(y.copy_from(&h), Err(Error::DTypeMismatch { .. })));
    assert!(matches!(
        y.dot(&ones(2)),
        Err(Error::ShapeMismatch { op: "dot", .. })
    ));
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0; 3], "failed ops wrote");
}

#[test]
fn slice_length_mismatches() {
    let mut y = [1.0f32; 3];
    assert!(matches!(
        ops::axpy(&mut y, 1.0, &[1.0; 2]),
        Err(Error::LengthMismatch { .. })
    ));
    assert!(matches!(
        ops::add(&mut y, &[1.0; 4]),
        Err(Error::LengthMismatch { .. })
    ));
    assert!(matches!(
        ops::mul(&mut y, &[]),
        Err(Error::LengthMismatch { .. })
    ));
    assert!(matches!(
        ops::copy(&mut y, &[1.0; 4]),
        Err(Error::LengthMismatch { .. })
    ));
    assert!(matches!(
        ops::dot(&y, &[1.0; 2]),
        Err(Error::LengthMismatch { .. })
    ));
    let mut h = [f16::ZERO; 2];
    assert!(matches!(
        ops::cast(&y, &mut h),
        Err(Error::LengthMismatch { .. })
    ));
    assert!(matches!(
        f16::from_f32_slice(&y, &mut h),
        Err(Error::LengthMismatch { .. })
    ));
    let mut w = [0.0f32; 1];
    assert!(matches!(
        bf16::to_f32_slice(&[bf16::ONE; 2], &mut w),
        Err(Error::LengthMismatch { .. })
    ));
    assert_eq!(y, [1.0; 3]);
}

#[test]
fn unknown_dtype_string() {
    assert_eq!(
        "f64".parse::<DType>(),
        Err(Error::UnknownDType("f64".into()))
    );
    assert_eq!("".parse::<DType>(), Err(Error::UnknownDType(String::new())));
    assert_eq!("bf16".parse::<DType>(), Ok(DType::BF16));
}

/// Without the `cuda` feature a CUDA device is refused at once (with it,
/// `tests/cuda.rs` checks `CudaUnavailable` on machines without a GPU).
#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_is_refused_when_built_without_it() {
    assert_eq!(
        Tensor::zeros(4, DType::F32, Device::Cuda(0)).unwrap_err(),
        Error::NotCompiledWithCuda
    );
    assert_eq!(
        Tensor::full(1.0, 4, DType::F16, Device::Cuda(1)).unwrap_err(),
        Error::NotCompiledWithCuda
    );
    assert_eq!(
        ones(2).to_device(Device::Cuda(0)).unwrap_err(),
        Error::NotCompiledWithCuda
    );
    assert!(matches!(
        gradwire_tensor::CudaStorage::alloc_zeros(4, DType::BF16, 0),
        Err(Error::NotCompiledWithCuda)
    ));
    assert!(matches!(
        gradwire_tensor::CudaStorage::from_cpu(&CpuStorage::zeros(DType::F32, 1), 0),
        Err(Error::NotCompiledWithCuda)
    ));
    assert!(ones(2).to_device(Device::Cpu).unwrap().device().is_cpu());
}

#[test]
fn flat_view_out_of_range() {
    let mut t = ones(4);
    assert!(matches!(
        t.flat_view::<f32>(2..5),
        Err(Error::InvalidArgument(_))
    ));
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = 3..1;
    assert!(matches!(
        t.flat_view::<f32>(reversed),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        t.flat_view::<f32>(usize::MAX..usize::MAX),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        t.flat_view_mut::<f32>(0..5),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(t.flat_view::<f32>(4..4).unwrap(), &[] as &[f32]);
    assert_eq!(t.flat_view::<f32>(1..3).unwrap(), &[1.0, 1.0]);
}

#[test]
fn clamp_bound_must_be_non_negative() {
    let mut t = ones(2);
    for c in [-1.0, f32::NAN, f32::NEG_INFINITY, -f32::MIN_POSITIVE] {
        assert!(matches!(t.clamp(c), Err(Error::InvalidArgument(_))), "{c}");
        assert!(matches!(
            ops::clamp(&mut [1.0f32], c),
            Err(Error::InvalidArgument(_))
        ));
    }
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0; 2]);
}

#[test]
fn reshape_mismatch() {
    let err = ones(6).reshape((4, 2)).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { op: "reshape", .. }));
    assert_eq!(ones(6).reshape((3, 2)).unwrap().dims(), &[3, 2]);
    assert_eq!(
        ones(1).reshape(Shape::scalar()).unwrap().dims(),
        &[] as &[usize]
    );
}

#[test]
fn errors_display_their_context() {
    let err = ones(2).reshape(3).unwrap_err();
    assert_eq!(
        err.to_string(),
        "reshape: shape mismatch, lhs [2] vs rhs [3]"
    );
    let err = "half".parse::<DType>().unwrap_err();
    assert!(err.to_string().contains("\"half\""));
}

#[test]
fn with_dtype_constants() {
    assert_eq!(<f32 as WithDType>::DTYPE, DType::F32);
    assert_eq!(<f16 as WithDType>::DTYPE, DType::F16);
    assert_eq!(<bf16 as WithDType>::DTYPE, DType::BF16);
}
