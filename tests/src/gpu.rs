//! The gate of the NCCL suites (feature `nccl`): the CUDA devices of this
//! machine, or a loud SKIP banner when there are none (a failure under
//! `GRADWIRE_REQUIRE_GPU=1`, for GPU machines).

use std::io::Write;

use gradwire_comm::nccl::NcclComm;
use gradwire_tensor::CudaDevice;
use gradwire_tensor::cuda_backend::testing;

/// Skips loudly, or fails when a GPU is required.
pub fn unavailable(test: &str, why: &str) {
    let required = std::env::var("GRADWIRE_REQUIRE_GPU").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "GRADWIRE_REQUIRE_GPU=1 but {test} cannot run: {why}"
    );
    // Straight to the file descriptor: the harness captures eprintln! of
    // passing tests, and a skip must be seen (and counted by `cargo xtask
    // test`, from its `SKIP GPU` line).
    let banner = format!(
        "\n==================== SKIP ====================\n\
         {}\
         (the NCCL tests need NVIDIA GPUs, a driver and libnccl.so.2;\n\
         GRADWIRE_REQUIRE_GPU=1 makes this a failure)\n\
         ==============================================\n",
        testing::skip_line_for(test, why)
    );
    let _ = std::io::stderr().write_all(banner.as_bytes());
}

/// The CUDA devices of this machine (ordinals 0..G), or `None` after
/// reporting why the test cannot run (no NCCL, no device).
pub fn gpus(test: &str) -> Option<Vec<usize>> {
    if let Err(e) = NcclComm::nccl_version() {
        unavailable(test, &e.to_string());
        return None;
    }
    let ordinals: Vec<usize> = (0..64)
        .take_while(|&i| CudaDevice::get(i).is_ok())
        .collect();
    if ordinals.is_empty() {
        let why = CudaDevice::get(0)
            .err()
            .map_or_else(String::new, |e| e.to_string());
        unavailable(test, &format!("no CUDA device ({why})"));
        return None;
    }
    Some(ordinals)
}

/// How long an NCCL test waits for a collective before the communicator
/// aborts it (`NcclConfig::timeout`): `GRADWIRE_NCCL_TEST_TIMEOUT` seconds,
/// 60 by default, well below the per-binary limit of `gpu_suite.sh`, so
/// that a hang ends as a failed test with its message, not as a killed
/// binary without a result line.
pub fn nccl_test_timeout() -> std::time::Duration {
    let secs = std::env::var("GRADWIRE_NCCL_TEST_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(60);
    std::time::Duration::from_secs(secs)
}
