//! Support for GPU test suites: every crate's GPU-vs-CPU tests start with
//! [`device_or_skip`], so that on a machine without a GPU they say loudly
//! that they skipped (a [`skip_line`] that `cargo xtask test` counts), and
//! on a GPU machine they can be told to insist.

pub mod skip_line;

use std::io::Write;
use std::sync::Arc;

use super::CudaDevice;
use crate::error::{Error, Result};

/// The environment variable that turns a missing GPU into a failure.
pub const REQUIRE_GPU: &str = "GRADWIRE_REQUIRE_GPU";

/// CUDA device 0 for the test named `test`; or, when there is none, `None`
/// after [`report_skip`] printed `SKIP GPU <package>: <test> did not run its
/// GPU part: no CUDA device (...)`.
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
            report_skip(test, &format!("no CUDA device ({why})"));
            Ok(None)
        }
        Err(other) => Err(other),
    }
}

/// The [`skip_line`] of `test`, which skipped because of `why`, in the
/// package under test: the one cargo names in `CARGO_PKG_NAME` when it runs
/// a test, else the test binary's name.
pub fn skip_line_for(test: &str, why: &str) -> String {
    let package = std::env::var("CARGO_PKG_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.file_stem()?.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    skip_line::format(&package, test, why)
}

/// Writes [`skip_line_for`] `test` to stderr in one write, past the test
/// harness's capture of `eprintln!` (a skip must be seen, and counted).
pub fn report_skip(test: &str, why: &str) {
    let _ = std::io::stderr().write_all(skip_line_for(test, why).as_bytes());
}
