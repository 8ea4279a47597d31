//! gradwire-kernels-host: gradwire's CUDA kernels run on the CPU, for tests.
//!
//! The build script compiles every `kernels/cuda/*.cu` with the host C++
//! compiler over a small execution layer (`cpp/cuda_host.h`,
//! `cpp/scheduler.cpp`): the threads of a block are cooperative fibers that
//! switch at `__syncthreads` and at warp intrinsics, `__shared__` is per
//! block, warp votes, atomics and intrinsics follow their PTX definitions
//! (a float `atomicAdd` flushes subnormals as `red.global.add.f32` does), and
//! the float arithmetic is IEEE with no contraction, as NVRTC compiles it
//! for the GPU. One launcher per kernel is generated from gradwire-kernels'
//! signature table, with a compile-time check that the kernel's C prototype
//! is exactly the table's.
//!
//! [`launch`] runs a kernel as gradwire-tensor's typed launch queues it on a
//! GPU: the same [`Kernel::check`] of the arguments, the same launch plan
//! ([`Blocks`]), [`BLOCK`](gradwire_kernels::BLOCK) threads a block. Each
//! buffer is staged at a 256-byte aligned address (as `cudaMalloc` gives)
//! holding exactly the elements the signature lets the kernel touch, between
//! guard bytes: a write past either end, or into a buffer the kernel declares
//! read-only, is an [`Error`], and so are a trap, a deadlock, a barrier some
//! threads exited before and a lane missing from a warp intrinsic.
//!
//! What this proves is the kernel bodies and their launch geometry against
//! gradwire's CPU code; not the driver, the memory model, timing, or races
//! that the fibers' fixed order hides ([`Order::Reverse`] runs them the other
//! way round to expose a missing barrier in either direction).

#![deny(missing_docs)]

use std::ffi::{c_char, c_int, c_ulong, c_void};

use gradwire_kernels::{Blocks, CType, Kernel, Operand, Refusal};

mod launchers {
    #![allow(missing_docs)]
    use super::{RawLaunch, RawLauncher};
    use std::ffi::{c_int, c_void};
    include!(concat!(env!("OUT_DIR"), "/launchers.rs"));
}

pub mod selftest;

/// `gw_host::Launch` in `cpp/cuda_host.h`.
#[repr(C)]
pub(crate) struct RawLaunch {
    grid_x: u32,
    grid_y: u32,
    block_x: u32,
    reverse: c_int,
    error: *mut c_char,
    error_len: c_ulong,
}

/// A generated launcher: runs the kernel on the launch's grid with the
/// arguments as `cuLaunchKernel` takes them (pointers to each argument).
pub(crate) type RawLauncher = unsafe extern "C" fn(*mut RawLaunch, *const *mut c_void) -> c_int;

/// The order the scheduler runs a block's threads in between two yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Thread 0 first.
    Forward,
    /// The last thread first.
    Reverse,
}

/// An element type of kernel memory.
pub trait Element: bytemuck::Pod {
    /// Its C type in the kernels.
    const CTYPE: CType;
}

macro_rules! elements {
    ($($t:ty => $c:ident),*) => {
        $(impl Element for $t {
            const CTYPE: CType = CType::$c;
        })*
    };
}
elements!(u8 => U8, u32 => U32, u64 => U64, i32 => I32, half::f16 => F16,
    half::bf16 => BF16, f32 => F32, f64 => F64);

/// A value argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// `gw_u32`.
    U32(u32),
    /// `gw_u64`.
    U64(u64),
    /// `int`.
    I32(i32),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
}

impl Value {
    fn ctype(self) -> CType {
        match self {
            Value::U32(_) => CType::U32,
            Value::U64(_) => CType::U64,
            Value::I32(_) => CType::I32,
            Value::F32(_) => CType::F32,
            Value::F64(_) => CType::F64,
        }
    }

    fn integer(self) -> Option<u64> {
        match self {
            Value::U32(v) => Some(u64::from(v)),
            Value::U64(v) => Some(v),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::F32(_) | Value::F64(_) => None,
        }
    }

    fn bytes(self) -> [u8; 8] {
        let mut out = [0u8; 8];
        match self {
            Value::U32(v) => out[..4].copy_from_slice(&v.to_ne_bytes()),
            Value::U64(v) => out.copy_from_slice(&v.to_ne_bytes()),
            Value::I32(v) => out[..4].copy_from_slice(&v.to_ne_bytes()),
            Value::F32(v) => out[..4].copy_from_slice(&v.to_ne_bytes()),
            Value::F64(v) => out.copy_from_slice(&v.to_ne_bytes()),
        }
        out
    }
}

macro_rules! values {
    ($($t:ty => $v:ident),*) => {
        $(impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$v(v)
            }
        })*
    };
}
values!(u32 => U32, u64 => U64, i32 => I32, f32 => F32, f64 => F64);

/// One argument of a launch.
#[derive(Debug)]
pub enum Arg<'a> {
    /// Memory the kernel only reads.
    Read {
        /// The element type.
        elem: CType,
        /// The elements' bytes.
        bytes: &'a [u8],
        /// Where the buffer starts: this many elements past a 256-byte
        /// aligned address (a window into a larger allocation).
        offset: usize,
    },
    /// Memory the kernel writes (and may read).
    Write {
        /// The element type.
        elem: CType,
        /// The elements' bytes, written back after the launch.
        bytes: &'a mut [u8],
        /// As [`Arg::Read`]'s.
        offset: usize,
    },
    /// A null pointer.
    Null,
    /// A value.
    Value(Value),
}

impl<'a> Arg<'a> {
    /// Memory the kernel reads, at an aligned address.
    pub fn read<T: Element>(elements: &'a [T]) -> Arg<'a> {
        Arg::read_at(elements, 0)
    }

    /// Memory the kernel writes, at an aligned address.
    pub fn write<T: Element>(elements: &'a mut [T]) -> Arg<'a> {
        Arg::write_at(elements, 0)
    }

    /// Memory the kernel reads, `offset` elements past an aligned address.
    pub fn read_at<T: Element>(elements: &'a [T], offset: usize) -> Arg<'a> {
        Arg::Read {
            elem: T::CTYPE,
            bytes: bytemuck::cast_slice(elements),
            offset,
        }
    }

    /// Memory the kernel writes, `offset` elements past an aligned address.
    pub fn write_at<T: Element>(elements: &'a mut [T], offset: usize) -> Arg<'a> {
        Arg::Write {
            elem: T::CTYPE,
            bytes: bytemuck::cast_slice_mut(elements),
            offset,
        }
    }

    /// A value.
    pub fn value(value: impl Into<Value>) -> Arg<'a> {
        Arg::Value(value.into())
    }

    /// A `gw_u64` length.
    pub fn len(n: usize) -> Arg<'a> {
        Arg::Value(Value::U64(n as u64))
    }

    fn operand(&self) -> Operand {
        match self {
            Arg::Read { elem, bytes, .. } => Operand::Memory {
                writes: false,
                elem: *elem,
                len: bytes.len() / elem.size_in_bytes(),
            },
            Arg::Write { elem, bytes, .. } => Operand::Memory {
                writes: true,
                elem: *elem,
                len: bytes.len() / elem.size_in_bytes(),
            },
            Arg::Null => Operand::Null,
            Arg::Value(v) => Operand::Value {
                ty: v.ctype(),
                integer: v.integer(),
            },
        }
    }
}

/// Which end of a buffer a kernel wrote past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Before its first element.
    Before,
    /// After the last element the signature lets it touch.
    After,
}

/// Why a launch failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The arguments or the grid are not what the kernel declares.
    #[error("launching `{kernel}`: {refusal}")]
    Refused {
        /// The kernel.
        kernel: &'static str,
        /// Why ([`Kernel::check`]).
        refusal: Refusal,
    },
    /// The kernel has no launcher in this build.
    #[error("`{kernel}` has no host launcher")]
    NoLauncher {
        /// The kernel.
        kernel: &'static str,
    },
    /// The kernel trapped, deadlocked, reached a barrier some threads had
    /// exited before, or a warp intrinsic some lanes could not reach.
    #[error("`{kernel}` failed: {message}")]
    Failed {
        /// The kernel.
        kernel: &'static str,
        /// The execution layer's message (block, thread, what).
        message: String,
    },
    /// The kernel wrote outside the elements its signature lets it touch.
    #[error("`{kernel}` wrote {side:?} parameter {param}'s {extent} elements")]
    OutOfBounds {
        /// The kernel.
        kernel: &'static str,
        /// The parameter's position.
        param: usize,
        /// Which end.
        side: Side,
        /// The elements it may touch.
        extent: u64,
    },
    /// The kernel wrote memory it declares read-only.
    #[error("`{kernel}` wrote parameter {param}, which it declares read-only")]
    WroteReadOnly {
        /// The kernel.
        kernel: &'static str,
        /// The parameter's position.
        param: usize,
    },
}

/// Runs `launcher` on `grid` blocks of `block` threads in `order`, with
/// the arguments `argv`; the execution layer's message on failure.
///
/// # Safety
///
/// `argv` is what the launcher's kernel takes: one pointer per parameter,
/// to a value of its C type or to a pointer to memory holding every element
/// the kernel touches through it, all live for the call (which runs on this
/// thread and returns when the kernel has finished).
pub(crate) unsafe fn run_raw(
    launcher: RawLauncher,
    grid: (u32, u32),
    block: u32,
    order: Order,
    argv: &[*mut c_void],
) -> Result<(), String> {
    let mut message = vec![0u8; 512];
    let mut raw = RawLaunch {
        grid_x: grid.0,
        grid_y: grid.1,
        block_x: block,
        reverse: c_int::from(order == Order::Reverse),
        error: message.as_mut_ptr().cast(),
        error_len: message.len() as c_ulong,
    };
    // SAFETY: the caller's contract for `argv`; `raw.error` has `error_len`
    // bytes, live for the call.
    if unsafe { launcher(&mut raw, argv.as_ptr()) } == 0 {
        return Ok(());
    }
    let end = message
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(message.len());
    Err(String::from_utf8_lossy(&message[..end]).into_owned())
}

/// A value argument's storage, aligned for any C type.
#[repr(C, align(8))]
struct Slot([u8; 8]);

/// Guard bytes on each side of a staged buffer.
const GUARD: usize = 1024;
/// What the guard bytes hold.
const CANARY: u8 = 0xa5;
/// The alignment of a staged buffer, as `cudaMalloc`'s.
const ALIGN: usize = 256;

/// A buffer staged between guards at an aligned address.
struct Staged {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Staged {
    /// `bytes` staged `offset` bytes past an aligned address.
    fn new(bytes: &[u8], offset: usize) -> Staged {
        let offset = offset % ALIGN;
        let mut storage = vec![CANARY; 2 * ALIGN + 2 * GUARD + bytes.len()];
        let base = storage.as_ptr() as usize + GUARD;
        let start = GUARD + (ALIGN - base % ALIGN) % ALIGN + offset;
        storage[start..start + bytes.len()].copy_from_slice(bytes);
        Staged {
            storage,
            start,
            len: bytes.len(),
        }
    }

    fn pointer(&mut self) -> *mut c_void {
        // In bounds: start + len <= storage.len().
        self.storage[self.start..].as_mut_ptr().cast()
    }

    fn data(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The side whose guard bytes changed, if any.
    fn overrun(&self) -> Option<Side> {
        let before = &self.storage[self.start - GUARD..self.start];
        let after = &self.storage[self.start + self.len..self.start + self.len + GUARD];
        if before.iter().any(|&b| b != CANARY) {
            Some(Side::Before)
        } else if after.iter().any(|&b| b != CANARY) {
            Some(Side::After)
        } else {
            None
        }
    }
}

/// Runs `kernel` on the CPU on the grid `blocks` plans, [`BLOCK`]
/// threads a block, each block's threads scheduled in `order`; the memory
/// in `args` is written back as the kernel leaves it.
///
/// [`BLOCK`]: gradwire_kernels::BLOCK
pub fn launch(
    kernel: &Kernel,
    blocks: Blocks,
    order: Order,
    args: &mut [Arg<'_>],
) -> Result<(), Error> {
    let grid = blocks.grid();
    let name = kernel.name();
    kernel
        .check(args.iter().map(Arg::operand), grid)
        .map_err(|refusal| Error::Refused {
            kernel: name,
            refusal,
        })?;
    let launcher = launchers::launcher(name).ok_or(Error::NoLauncher { kernel: name })?;
    let integers: Vec<Option<u64>> = args
        .iter()
        .map(|a| match a {
            Arg::Value(v) => v.integer(),
            _ => None,
        })
        .collect();

    // Stage each buffer: exactly the elements the kernel may touch.
    let mut staged: Vec<Option<(Staged, u64)>> = Vec::with_capacity(args.len());
    for (i, arg) in args.iter().enumerate() {
        let bytes: Option<(&[u8], CType, usize)> = match arg {
            Arg::Read {
                elem,
                bytes,
                offset,
            } => Some((bytes, *elem, *offset)),
            Arg::Write {
                elem,
                bytes,
                offset,
            } => Some((&bytes[..], *elem, *offset)),
            _ => None,
        };
        staged.push(bytes.map(|(bytes, elem, offset)| {
            // The check proved the extent computable and within the buffer.
            let extent = kernel.extent(i, &integers, grid).unwrap_or(0);
            let size = elem.size_in_bytes();
            let n = usize::try_from(extent)
                .unwrap_or(usize::MAX)
                .saturating_mul(size);
            let stage = Staged::new(&bytes[..n.min(bytes.len())], offset.saturating_mul(size));
            (stage, extent)
        }));
    }
    let mut values: Vec<Slot> = args
        .iter()
        .map(|a| match a {
            Arg::Value(v) => Slot(v.bytes()),
            _ => Slot([0; 8]),
        })
        .collect();
    let mut pointers: Vec<*mut c_void> = staged
        .iter_mut()
        .map(|s| match s {
            Some((s, _)) => s.pointer(),
            None => std::ptr::null_mut(),
        })
        .collect();
    let argv: Vec<*mut c_void> = (0..args.len())
        .map(|i| {
            if matches!(args[i], Arg::Value(_)) {
                values[i].0.as_mut_ptr().cast()
            } else {
                (&mut pointers[i] as *mut *mut c_void).cast()
            }
        })
        .collect();
    // SAFETY: the launcher reads `argv.len()` pointers (the kernel's
    // parameter count, as checked), each to a value of the parameter's C type
    // (`values`, 8 bytes) or to a pointer to staged memory holding exactly the
    // elements the kernel's signature lets it touch, between guard bytes.
    // Everything outlives the call.
    unsafe { run_raw(launcher, grid, gradwire_kernels::BLOCK, order, &argv) }.map_err(
        |message| Error::Failed {
            kernel: name,
            message,
        },
    )?;
    // Every check first, so a failed launch leaves the caller's memory as
    // it was.
    for (i, (arg, stage)) in args.iter().zip(&staged).enumerate() {
        let Some((stage, extent)) = stage else {
            continue;
        };
        if let Some(side) = stage.overrun() {
            return Err(Error::OutOfBounds {
                kernel: name,
                param: i,
                side,
                extent: *extent,
            });
        }
        if let Arg::Read { bytes, .. } = arg
            && bytes[..stage.len] != *stage.data()
        {
            return Err(Error::WroteReadOnly {
                kernel: name,
                param: i,
            });
        }
    }
    for (arg, stage) in args.iter_mut().zip(&staged) {
        if let (Arg::Write { bytes, .. }, Some((stage, _))) = (arg, stage) {
            bytes[..stage.len].copy_from_slice(stage.data());
        }
    }
    Ok(())
}
