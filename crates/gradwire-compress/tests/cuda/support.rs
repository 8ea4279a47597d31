//! Helpers of the device suites: the device-or-skip gate, deterministic
//! inputs, copies to and from device 0, and the non-finite input every codec
//! must refuse the same way.

use gradwire_compress::CompressError;
use gradwire_tensor::cuda_backend::testing;
use gradwire_tensor::{CpuStorage, CudaStorage};

/// Whether device 0 is there (else `testing::device_or_skip` printed the
/// SKIP line; a missing device fails under `GRADWIRE_REQUIRE_GPU=1`).
pub fn device_or_skip(test: &str) -> bool {
    testing::device_or_skip(test)
        .expect("CUDA device 0")
        .is_some()
}

/// Deterministic values (splitmix64); with `levels`, magnitudes quantised
/// to that many values so that ties at the k-th magnitude are common.
pub fn values(n: usize, seed: u64, levels: Option<u32>) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n as u64;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            let unit = (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            match levels {
                Some(l) => (unit * l as f32).round() / l as f32,
                None => unit * 2f32.powi(((z >> 8) % 16) as i32 - 8),
            }
        })
        .collect()
}

pub fn on_device(v: &[f32]) -> CudaStorage {
    CudaStorage::from_cpu(&CpuStorage::F32(v.to_vec()), 0).expect("to device")
}

pub fn host_f32(s: &CudaStorage) -> Vec<f32> {
    s.read_f32(0..s.len()).expect("to host")
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Values with an infinity at 4321 and a NaN after it, and the error every
/// codec (CPU or device) must give for them: the first one.
pub fn non_finite_input() -> (Vec<f32>, CompressError) {
    let mut x = values(10_007, 3, None);
    x[4321] = f32::NEG_INFINITY;
    x[9000] = f32::NAN;
    let expected = CompressError::NonFinite {
        index: 4321,
        value: f32::NEG_INFINITY,
    };
    (x, expected)
}
