//! `kernels/cuda/elementwise.cu` on the CPU: fill, axpy, scale, add, mul and
//! clamp on f32, f16 and bf16, each bitwise equal to gradwire-tensor's CPU
//! ops (fill and clamp to the bit, NaN payloads included; the arithmetic
//! except for the payloads of NaNs, see [`nan_canonical`]) (`gradwire_tensor::ops`), on aligned and misaligned windows, at every
//! length of [`LENGTHS`], inputs of every float class, grid-stride launches
//! (`Blocks::Over(n)`, as gradwire-tensor's CUDA ops launch them).

use gradwire_kernels::{Blocks, Kernel, elementwise as k};
use gradwire_kernels_host::{Arg, Element};
use gradwire_tensor::{WithDType, ops};

use crate::common::{LENGTHS, bits, floats, nan_canonical, run_both};

/// The six kernels of one dtype: fill, axpy, scale, add, mul, clamp.
type Six = [&'static Kernel; 6];

const F32: Six = [
    &k::FILL_F32,
    &k::AXPY_F32,
    &k::SCALE_F32,
    &k::ADD_F32,
    &k::MUL_F32,
    &k::CLAMP_F32,
];
const F16: Six = [
    &k::FILL_F16,
    &k::AXPY_F16,
    &k::SCALE_F16,
    &k::ADD_F16,
    &k::MUL_F16,
    &k::CLAMP_F16,
];
const BF16: Six = [
    &k::FILL_BF16,
    &k::AXPY_BF16,
    &k::SCALE_BF16,
    &k::ADD_BF16,
    &k::MUL_BF16,
    &k::CLAMP_BF16,
];

/// `y` and `x` of length `n` in `T`, from floats of every class.
fn operands<T: WithDType>(n: usize, seed: u64) -> (Vec<T>, Vec<T>) {
    let y = floats(n, seed, true).into_iter().map(T::from_f32).collect();
    let x = floats(n, seed + 1, true)
        .into_iter()
        .map(T::from_f32)
        .collect();
    (y, x)
}

fn check_dtype<T: WithDType + Element>(kernels: Six) {
    let [fill, axpy, scale, add, mul, clamp] = kernels;
    for &n in LENGTHS {
        for offset in [0, 1] {
            let (y, x) = operands::<T>(n, n as u64 * 7 + offset as u64);
            let case = |kernel: &Kernel| format!("{} n = {n} offset {offset}", kernel.name());

            let got = run_both(fill, Blocks::Over(n), &y, |y| {
                vec![Arg::write_at(y, offset), Arg::len(n), Arg::value(-3.3f32)]
            })
            .unwrap_or_else(|e| panic!("{}: {e}", case(fill)));
            let mut want = y.clone();
            ops::fill(&mut want, -3.3);
            assert_eq!(bits(&got), bits(&want), "{}", case(fill));

            // The read-only operand travels in the state: a launch's
            // arguments borrow from it.
            let both = (y.clone(), x.clone());
            for a in [1.5f32, -0.0, 3.0e-39] {
                let (got, _) = run_both(axpy, Blocks::Over(n), &both, |(y, x)| {
                    vec![
                        Arg::write_at(y, offset),
                        Arg::value(a),
                        Arg::read_at(x, offset),
                        Arg::len(n),
                    ]
                })
                .unwrap_or_else(|e| panic!("{} a = {a}: {e}", case(axpy)));
                let mut want = y.clone();
                ops::axpy(&mut want, a, &x).expect("cpu axpy");
                assert_eq!(
                    nan_canonical(&got),
                    nan_canonical(&want),
                    "{} a = {a}",
                    case(axpy)
                );

                let got = run_both(scale, Blocks::Over(n), &y, |y| {
                    vec![Arg::write_at(y, offset), Arg::value(a), Arg::len(n)]
                })
                .unwrap_or_else(|e| panic!("{} a = {a}: {e}", case(scale)));
                let mut want = y.clone();
                ops::scale(&mut want, a);
                assert_eq!(
                    nan_canonical(&got),
                    nan_canonical(&want),
                    "{} a = {a}",
                    case(scale)
                );
            }

            for (kernel, cpu) in [
                (
                    add,
                    ops::add::<T> as fn(&mut [T], &[T]) -> gradwire_tensor::Result<()>,
                ),
                (
                    mul,
                    ops::mul::<T> as fn(&mut [T], &[T]) -> gradwire_tensor::Result<()>,
                ),
            ] {
                let (got, _) = run_both(kernel, Blocks::Over(n), &both, |(y, x)| {
                    vec![
                        Arg::write_at(y, offset),
                        Arg::read_at(x, offset),
                        Arg::len(n),
                    ]
                })
                .unwrap_or_else(|e| panic!("{}: {e}", case(kernel)));
                let mut want = y.clone();
                cpu(&mut want, &x).expect("cpu op");
                assert_eq!(
                    nan_canonical(&got),
                    nan_canonical(&want),
                    "{}",
                    case(kernel)
                );
            }

            // The launcher normalises the bound (ops::check_clamp_bound:
            // finite or infinite, not negative, not NaN, -0 as +0).
            for c in [0.0f32, 1.0e-40, 0.75, f32::INFINITY] {
                let got = run_both(clamp, Blocks::Over(n), &y, |y| {
                    vec![Arg::write_at(y, offset), Arg::value(c), Arg::len(n)]
                })
                .unwrap_or_else(|e| panic!("{} c = {c}: {e}", case(clamp)));
                let mut want = y.clone();
                ops::clamp(&mut want, c).expect("cpu clamp");
                assert_eq!(bits(&got), bits(&want), "{} c = {c}", case(clamp));
            }
        }
    }
}

#[test]
fn f32_ops_equal_the_cpu_bitwise() {
    check_dtype::<f32>(F32);
}

#[test]
fn f16_ops_equal_the_cpu_bitwise() {
    check_dtype::<half::f16>(F16);
}

#[test]
fn bf16_ops_equal_the_cpu_bitwise() {
    check_dtype::<half::bf16>(BF16);
}
