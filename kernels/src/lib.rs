//! gradwire-kernels: gradwire's CUDA kernels, as data.
//!
//! The CUDA C sources live in `kernels/cuda/`; `cargo xtask ptx` compiles them
//! with NVRTC 12.2 to PTX for `compute_70` in `kernels/ptx/` and generates the
//! table of modules re-exported here ([`MODULES`]), so this crate has no build
//! script and no dependencies and builds on any machine. Beside it, one module
//! per source declares each kernel's typed signature (e.g.
//! [`select::RADIX_HISTOGRAM_F32`], a [`Kernel`]) and [`Kernel::check`], the
//! one check of a launch against it (gradwire-tensor's typed launch on a GPU,
//! gradwire-kernels-host's execution on the CPU), with the launch
//! [`plan`]s both use. gradwire-tensor loads every module and
//! kernel when it opens a device.
//!
//! The tests of this crate fail when a source changed after its PTX was
//! generated (the hashes in `kernels/ptx/manifest.txt`, see [`fnv`]), when a
//! PTX entry has no signature or a signature no entry, and when a signature's
//! parameters differ from its entry's in count, order or width, and when a
//! module's PTX breaks a rule of [`lint`] (float atomics, `.ftz`,
//! approximations, fused multiply-adds, partial warp masks).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod check;
pub mod fnv;
mod generated;
pub mod lint;
pub mod plan;
mod signature;
mod table;

pub use check::{Operand, Refusal};
pub use generated::MODULES;
pub use plan::{BLOCK, Blocks, MAX_GRID, blocks_for};
pub use signature::{Access, CType, Extent, Grid, Kernel, LaunchShape, Param};
pub use table::{
    ALL, adasum, cast, comm, elementwise, feedback, lowrank, optim, quant, reduce, select,
};

/// One CUDA source file compiled to PTX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtxModule {
    /// The module name (the source file's stem).
    pub name: &'static str,
    /// The PTX text.
    pub ptx: &'static str,
    /// The `.visible .entry` functions it defines, in PTX order.
    pub entries: &'static [&'static str],
}

/// The module called `name`, if there is one.
pub fn module(name: &str) -> Option<&'static PtxModule> {
    MODULES.iter().find(|m| m.name == name)
}
