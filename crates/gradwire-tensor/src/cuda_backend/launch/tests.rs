//! The typed launch's checks on described arguments (no device memory):
//! a launch as declared passes; a short buffer, a wrong kind, type or
//! count, a null where the kernel takes none, a wrong grid or device and
//! an extent that overflows are refused.

use super::*;
use gradwire_kernels::{elementwise, lowrank, optim, reduce};

/// [`super::check`] on described arguments (no device memory here).
fn check(kernel: &Kernel, args: &[Described], grid: (u32, u32), ordinal: usize) -> Result<()> {
    check_described(kernel, args.iter().copied(), grid, ordinal)
}

fn memory(writes: bool, elem: CType, len: usize) -> Described {
    Described::Memory {
        writes,
        elem,
        len,
        ordinal: 0,
    }
}

fn refused(kernel: &Kernel, args: &[Described], grid: (u32, u32)) -> String {
    match check(kernel, args, grid, 0) {
        Err(Error::InvalidArgument(why)) => why,
        other => panic!("{}: expected a refusal, got {other:?}", kernel.name()),
    }
}

/// axpy_f32(T* y, float a, const T* x, u64 n) for n = 7.
fn axpy(y: usize, x: usize) -> [Described; 4] {
    [
        memory(true, CType::F32, y),
        Described::Value(Value::F32(2.0)),
        memory(false, CType::F32, x),
        Described::Value(Value::U64(7)),
    ]
}

#[test]
fn a_launch_as_declared_passes() {
    let grid = Blocks::Over(7).grid();
    assert_eq!(
        check(&elementwise::AXPY_F32, &axpy(7, 7), grid, 0).ok(),
        Some(())
    );
    // Longer buffers are fine: the kernel touches n elements.
    assert_eq!(
        check(&elementwise::AXPY_F32, &axpy(9, 8), grid, 0).ok(),
        Some(())
    );
}

#[test]
fn a_short_buffer_is_refused_whichever_it_is() {
    let grid = Blocks::Over(7).grid();
    assert!(refused(&elementwise::AXPY_F32, &axpy(6, 7), grid).contains("parameter 0"));
    assert!(refused(&elementwise::AXPY_F32, &axpy(7, 6), grid).contains("parameter 2"));
    // A window past its buffer: lowrank_orthonormalize_f32 at offset 5
    // of a 3 x 2 matrix needs 11 elements.
    let args = [
        memory(true, CType::F32, 10),
        Described::Value(Value::U64(5)),
        Described::Value(Value::U64(3)),
        Described::Value(Value::U64(2)),
    ];
    let why = refused(&lowrank::LOWRANK_ORTHONORMALIZE_F32, &args, (1, 1));
    assert!(
        why.contains("10 elements where the kernel may touch 11"),
        "{why}"
    );
}

#[test]
fn a_wrong_kind_type_or_count_is_refused() {
    let grid = (1, 1);
    let mut args = axpy(7, 7);
    args[1] = Described::Value(Value::U64(2));
    assert!(refused(&elementwise::AXPY_F32, &args, grid).contains("F32 value"));
    let mut args = axpy(7, 7);
    args[2] = memory(false, CType::F16, 7);
    assert!(refused(&elementwise::AXPY_F32, &args, grid).contains("F16 elements"));
    let mut args = axpy(7, 7);
    args[0] = memory(false, CType::F32, 7);
    assert!(refused(&elementwise::AXPY_F32, &args, grid).contains("access"));
    let mut args = axpy(7, 7);
    args[2] = Described::Null;
    assert!(refused(&elementwise::AXPY_F32, &args, grid).contains("device memory"));
    assert!(refused(&elementwise::AXPY_F32, &axpy(7, 7)[..3], grid).contains("3 arguments"));
}

#[test]
fn null_only_where_the_kernel_takes_it() {
    // sgd_f32's momentum buffer may be null (no momentum).
    let sgd = |buf: Described| {
        let mut args = vec![
            memory(true, CType::F32, 5),
            memory(false, CType::F32, 5),
            buf,
            Described::Value(Value::U64(5)),
        ];
        args.extend([Described::Value(Value::F32(0.1)); 4]);
        args.push(Described::Value(Value::I32(0)));
        args
    };
    assert_eq!(
        check(&optim::SGD_F32, &sgd(Described::Null), (1, 1), 0).ok(),
        Some(())
    );
    let short = sgd(memory(true, CType::F32, 4));
    assert!(refused(&optim::SGD_F32, &short, (1, 1)).contains("parameter 2"));
}

#[test]
fn grids_and_devices_are_checked() {
    let partials = |blocks: usize| {
        [
            memory(false, CType::F32, 1000),
            Described::Value(Value::U64(1000)),
            memory(true, CType::F64, blocks),
        ]
    };
    // One partial per block: four blocks need four.
    assert_eq!(
        check(&reduce::SUM_PARTIAL_F32, &partials(4), (4, 1), 0).ok(),
        Some(())
    );
    assert!(refused(&reduce::SUM_PARTIAL_F32, &partials(3), (4, 1)).contains("parameter 2"));
    let finish = [
        memory(false, CType::F64, 4),
        Described::Value(Value::U64(4)),
        memory(true, CType::F64, 1),
    ];
    assert!(refused(&reduce::FINISH_SUM_F64, &finish, (2, 1)).contains("single-block"));
    let elsewhere = Described::Memory {
        writes: true,
        elem: CType::F32,
        len: 7,
        ordinal: 1,
    };
    let mut args = axpy(7, 7);
    args[0] = elsewhere;
    let err = check(&elementwise::AXPY_F32, &args, (1, 1), 0);
    assert!(matches!(err, Err(Error::DeviceMismatch { .. })), "{err:?}");
}

#[test]
fn an_extent_that_overflows_is_refused() {
    let mut args = axpy(7, 7);
    args[3] = Described::Value(Value::U64(u64::MAX));
    assert!(refused(&elementwise::AXPY_F32, &args, (1, 1)).contains("parameter 0"));
    let args = [
        memory(true, CType::F32, 10),
        Described::Value(Value::U64(u64::MAX)),
        Described::Value(Value::U64(3)),
        Described::Value(Value::U64(2)),
    ];
    let err = check(&lowrank::LOWRANK_ORTHONORMALIZE_F32, &args, (1, 1), 0);
    assert!(matches!(err, Err(Error::ShapeOverflow)), "{err:?}");
}
