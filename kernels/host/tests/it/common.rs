//! Shared by the kernel suites: launching in both thread orders, the lengths
//! the device suites use, inputs with every class of float.

use gradwire_kernels::{Blocks, Kernel};
use gradwire_kernels_host::{Arg, Error, Order, launch};

/// Lengths the device suites use: empty, one, primes, around a block and a
/// 4-wide vector, and several blocks.
pub const LENGTHS: &[usize] = &[0, 1, 2, 3, 5, 7, 31, 255, 256, 257, 1021, 4099];

/// State compared bit for bit (so NaN payloads and signed zeros count):
/// vectors of plain elements and tuples of them.
pub trait Bitwise: Clone + std::fmt::Debug {
    /// The bytes of every element, in order.
    fn bytes(&self) -> Vec<u8>;
}

impl<T: bytemuck::Pod + std::fmt::Debug> Bitwise for Vec<T> {
    fn bytes(&self) -> Vec<u8> {
        bytemuck::cast_slice(self).to_vec()
    }
}

macro_rules! bitwise_tuple {
    ($($t:ident $i:tt),*) => {
        impl<$($t: Bitwise),*> Bitwise for ($($t,)*) {
            fn bytes(&self) -> Vec<u8> {
                let mut out = Vec::new();
                $(out.extend(self.$i.bytes());)*
                out
            }
        }
    };
}
bitwise_tuple!(A 0, B 1);
bitwise_tuple!(A 0, B 1, C 2);
bitwise_tuple!(A 0, B 1, C 2, D 3);
bitwise_tuple!(A 0, B 1, C 2, D 3, E 4);
bitwise_tuple!(A 0, B 1, C 2, D 3, E 4, F 5);

/// Runs `kernel` on `blocks` in both thread orders on fresh copies of
/// `state` (the memory `args` lends the launch), checks both leave it
/// bitwise equal, and returns the forward run's. Read-only operands travel
/// in the state too: the arguments borrow from it.
pub fn run_both<S: Bitwise>(
    kernel: &Kernel,
    blocks: Blocks,
    state: &S,
    args: impl Fn(&mut S) -> Vec<Arg<'_>>,
) -> Result<S, Error> {
    let mut forward = state.clone();
    launch(kernel, blocks, Order::Forward, &mut args(&mut forward))?;
    let mut reverse = state.clone();
    launch(kernel, blocks, Order::Reverse, &mut args(&mut reverse))?;
    assert!(
        forward.bytes() == reverse.bytes(),
        "{}: the two thread orders disagree:\n{forward:?}\n{reverse:?}",
        kernel.name()
    );
    Ok(forward)
}

/// `n` floats of every class, from `seed`: magnitudes across the whole
/// exponent range, f32 subnormals, values below f16's smallest subnormal,
/// ±0, exact f16 and bf16 rounding ties, and, when `special`, infinities and
/// NaNs with payloads.
pub fn floats(n: usize, seed: u64, special: bool) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let sign = if rng.random::<bool>() { -1.0f32 } else { 1.0 };
            let class = rng.random_range(0..if special { 10 } else { 8 });
            match class {
                0 => sign * rng.random::<f32>(),
                1 => sign * f32::from_bits(rng.random_range(1..0x0080_0000u32)),
                2 => sign * 2f32.powi(rng.random_range(-30..-24)) * rng.random::<f32>(),
                3 => sign * 0.0,
                // A tie in f16: 11 significant bits and a half.
                4 => sign * f32::from_bits((rng.random_range(100..140u32) << 23) | 0x1000),
                // A tie in bf16.
                5 => sign * f32::from_bits((rng.random_range(1..254u32) << 23) | 0x8000),
                6 => sign * 2f32.powi(rng.random_range(-126..127)) * (1.0 + rng.random::<f32>()),
                7 => sign * rng.random_range(1.0f32..70000.0),
                8 => sign * f32::INFINITY,
                _ => {
                    f32::from_bits(0x7f80_0001 | rng.random_range(0..0x0040_0000u32) | 0x0040_0000)
                        * sign
                }
            }
        })
        .collect()
}

/// Bit patterns, for bitwise comparisons that tell NaN payloads apart.
pub fn bits<T: bytemuck::Pod>(values: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

/// The bits of `values` with every NaN replaced by the dtype's canonical
/// quiet NaN: a NaN that arithmetic creates has a sign and payload chosen by
/// the hardware (x86 keeps an operand's, NVIDIA GPUs give `0x7fffffff`), so
/// results of arithmetic are compared bitwise except for the payload of their
/// NaNs, as gradwire-tensor's GPU suite compares them. Conversions keep
/// payloads and are compared with [`bits`].
pub fn nan_canonical<T: gradwire_tensor::WithDType>(values: &[T]) -> Vec<u32> {
    use gradwire_tensor::DType;
    let (magnitude, infinity, quiet) = match T::DTYPE {
        DType::F32 => (0x7fff_ffffu32, 0x7f80_0000u32, 0x7fc0_0000u32),
        DType::F16 => (0x7fff, 0x7c00, 0x7e00),
        DType::BF16 => (0x7fff, 0x7f80, 0x7fc0),
    };
    let raw: Vec<u32> = match T::DTYPE {
        DType::F32 => bytemuck::cast_slice::<T, u32>(values).to_vec(),
        DType::F16 | DType::BF16 => bytemuck::cast_slice::<T, u16>(values)
            .iter()
            .map(|&b| u32::from(b))
            .collect(),
    };
    raw.into_iter()
        .map(|b| if b & magnitude > infinity { quiet } else { b })
        .collect()
}
