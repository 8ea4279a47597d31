//! `kernels/cuda/reduce.cu` on the CPU, with the launch plans of
//! gradwire-tensor's CUDA reductions: sum, sum of squares and dot as
//! per-block f64 partials (`plan::partial_sums`) added by `finish_sum_f64`
//! on one block, within the rounding of f64 additions of gradwire-tensor's
//! CPU sums (every term is exact in f64; two orders of `n` additions differ
//! by at most `2 (n - 1) u` times the sum of the terms' magnitudes, `u` =
//! 2^-53); infinities and NaN as the CPU gives them; `max_abs_key` exactly
//! the CPU's `max_abs`, NaN included. Every dtype, every length of
//! [`LENGTHS`] and a length past several blocks.

use gradwire_kernels::{Blocks, Kernel, plan, reduce as k};
use gradwire_kernels_host::{Arg, Element};
use gradwire_tensor::{WithDType, ops};
use half::{bf16, f16};

use crate::common::{LENGTHS, floats, run_both};

/// The partials of `kernel` over `inputs` (one or two operands), added on
/// one block: the device's sum.
fn device_sum<T: WithDType + Element>(kernel: &Kernel, inputs: &[&[T]], n: usize) -> f64 {
    let blocks = plan::partial_sums(n);
    let partials = vec![f64::NAN; blocks.grid().0 as usize];
    let a = inputs[0].to_vec();
    let b = inputs.get(1).map_or_else(Vec::new, |b| b.to_vec());
    let two = inputs.len() == 2;
    let (partials, ..) = run_both(kernel, blocks, &(partials, a, b), |(partials, a, b)| {
        let mut args = vec![Arg::read(a)];
        if two {
            args.push(Arg::read(b));
        }
        args.push(Arg::len(n));
        args.push(Arg::write(partials));
        args
    })
    .unwrap_or_else(|e| panic!("{} n = {n}: {e}", kernel.name()));
    let count = partials.len();
    let (total, _) = run_both(
        &k::FINISH_SUM_F64,
        Blocks::Exactly(1, 1),
        &(vec![f64::NAN], partials),
        |(out, partials)| vec![Arg::read(partials), Arg::len(count), Arg::write(out)],
    )
    .unwrap_or_else(|e| panic!("finish_sum_f64 after {} n = {n}: {e}", kernel.name()));
    total[0]
}

/// `got` within the rounding of f64 additions of `want`, the sum of `n`
/// terms whose magnitudes add to `magnitude`.
fn assert_close(what: &str, got: f64, want: f64, n: usize, magnitude: f64) {
    if want.is_nan() || want.is_infinite() {
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{what}: {got} where the CPU gives {want}"
        );
        return;
    }
    let bound = 2.0 * n.saturating_sub(1) as f64 * f64::EPSILON / 2.0 * magnitude;
    assert!(
        (got - want).abs() <= bound,
        "{what}: {got} vs the CPU's {want} (bound {bound:e})"
    );
}

fn check_dtype<T: WithDType + Element>(kernels: [&Kernel; 4]) {
    let [sum, sum_sq, dot, max_abs] = kernels;
    let mut lengths = LENGTHS.to_vec();
    lengths.push(70_001);
    for n in lengths {
        for special in [false, true] {
            let a: Vec<T> = floats(n, n as u64, special)
                .into_iter()
                .map(T::from_f32)
                .collect();
            let b: Vec<T> = floats(n, n as u64 + 9, special)
                .into_iter()
                .map(T::from_f32)
                .collect();
            let case = |k: &Kernel| format!("{} n = {n} special {special}", k.name());
            let wide = |x: &T| f64::from(x.to_f32());
            let abs_sum: f64 = a.iter().map(|x| wide(x).abs()).sum();
            let sq_sum: f64 = a.iter().map(|x| wide(x) * wide(x)).sum();
            let dot_abs: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (wide(x) * wide(y)).abs())
                .sum();

            let got = device_sum(sum, &[&a], n);
            assert_close(&case(sum), got, ops::sum(&a), n, abs_sum);
            let got = device_sum(sum_sq, &[&a], n);
            assert_close(&case(sum_sq), got, ops::sum_sq(&a), n, sq_sum);
            let got = device_sum(dot, &[&a, &b], n);
            assert_close(
                &case(dot),
                got,
                ops::dot(&a, &b).expect("cpu dot"),
                n,
                dot_abs,
            );

            let (key, _) = run_both(
                max_abs,
                Blocks::Over(n),
                &(vec![0u32], a.clone()),
                |(key, a)| vec![Arg::read(a), Arg::len(n), Arg::write(key)],
            )
            .unwrap_or_else(|e| panic!("{}: {e}", case(max_abs)));
            // gradwire-tensor's key_to_magnitude.
            let got = if key[0] > 0x7f80_0000 {
                f64::NAN
            } else {
                f64::from(f32::from_bits(key[0]))
            };
            let want = ops::max_abs(&a);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{}: {got} where the CPU gives {want}",
                case(max_abs)
            );
        }
    }
}

#[test]
fn f32_reductions_agree_with_the_cpu() {
    check_dtype::<f32>([
        &k::SUM_PARTIAL_F32,
        &k::SUM_SQ_PARTIAL_F32,
        &k::DOT_PARTIAL_F32,
        &k::MAX_ABS_KEY_F32,
    ]);
}

#[test]
fn f16_reductions_agree_with_the_cpu() {
    check_dtype::<f16>([
        &k::SUM_PARTIAL_F16,
        &k::SUM_SQ_PARTIAL_F16,
        &k::DOT_PARTIAL_F16,
        &k::MAX_ABS_KEY_F16,
    ]);
}

#[test]
fn bf16_reductions_agree_with_the_cpu() {
    check_dtype::<bf16>([
        &k::SUM_PARTIAL_BF16,
        &k::SUM_SQ_PARTIAL_BF16,
        &k::DOT_PARTIAL_BF16,
        &k::MAX_ABS_KEY_BF16,
    ]);
}
