//! gradwire-kernels: gradwire's CUDA kernels, as data.
//!
//! The CUDA C sources live in `kernels/cuda/`; `cargo xtask ptx` compiles them
//! with NVRTC 12.2 to PTX for `compute_70` in `kernels/ptx/` and generates the
//! table re-exported here ([`MODULES`], and one module of constants per source,
//! e.g. [`select::RADIX_HISTOGRAM_F32`]), so this crate has no build script and
//! no dependencies and builds on any machine. gradwire-tensor loads a module's
//! PTX lazily, on first use on a device, and caches it.
//!
//! The tests of this crate fail when a source changed after its PTX was
//! generated (the hashes in `kernels/ptx/manifest.txt`, see [`fnv`]) and
//! when the table names a kernel its PTX does not define.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod fnv;
mod generated;

pub use generated::*;

/// One CUDA source file compiled to PTX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtxModule {
    /// The module name (the source file's stem).
    pub name: &'static str,
    /// The PTX text.
    pub ptx: &'static str,
    /// The `.visible .entry` functions the launchers call.
    pub entries: &'static [&'static str],
}

/// The module called `name`, if there is one.
pub fn module(name: &str) -> Option<&'static PtxModule> {
    MODULES.iter().find(|m| m.name == name)
}
