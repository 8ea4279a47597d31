//! Support for GPU test suites: every crate's GPU-vs-CPU tests start with
//! [`device_or_skip`], so that on a machine without a GPU they say loudly
//! that they skipped, and on a GPU machine they can be told to insist.

use std::sync::Arc;

use super::CudaDevice;
use crate::error::{Error, Result};

/// The environment variable that turns a missing GPU into a failure.
pub const REQUIRE_GPU: &str = "GRADWIRE_REQUIRE_GPU";

/// CUDA device 0 for the test named `test`; or, when there is none, `None`
/// after printing `SKIP: no CUDA device (...): <test> did not run its GPU
/// part` to stderr.
///
/// With `GRADWIRE_REQUIRE_GPU=1` a missing device is the
/// [`Error::CudaUnavailable`] it is, for GPU machines where a skip would
/// hide a broken driver; any other error is returned as well.
pub fn device_or_skip(test: &str) -> Result<Option<Arc<CudaDevice>>> {
    match CudaDevice::get(0) {
        Ok(device) => Ok(Some(device)),
        Err(Error::CudaUnavailable(why)) => {
            if std::env::var(REQUIRE_GPU).as_deref() == Ok("1") {
                return Err(Error::CudaUnavailable(format!(
                    "{REQUIRE_GPU}=1 but no CUDA device: {why}"
                )));
            }
            eprintln!("SKIP: no CUDA device ({why}): {test} did not run its GPU part");
            Ok(None)
        }
        Err(other) => Err(other),
    }
}
