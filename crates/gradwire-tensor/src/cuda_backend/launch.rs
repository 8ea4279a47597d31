//! The typed launch: the one place gradwire queues a kernel.
//!
//! A [`Launch`] names a kernel by its signature in gradwire-kernels (a
//! [`Kernel`]), takes its arguments in order (device buffers to read or
//! write, null, values) and, in [`Launch::run`], checks them against the
//! signature before anything is queued: the count; each value's C type; each
//! buffer's element type, access (a buffer the kernel writes must be
//! borrowed mutably, so it aliases no other argument), device, and length
//! against the elements the kernel may touch through it (the signature's
//! extent, computed from the integer arguments and the grid); the grid.
//! Every launch runs [`BLOCK`] threads per block, the block size the block
//! algorithms require. A launch that passes is memory-safe by the kernel's
//! contract, so the crates that launch kernels (gradwire-compress,
//! gradwire-optim, gradwire-algos, gradwire-comm) do so without `unsafe`;
//! a launch that does not is an [`Error::InvalidArgument`] naming the
//! kernel and the parameter.
//!
//! The check itself is gradwire-kernels' [`Kernel::check`] (shared with the
//! CPU execution of the kernels in gradwire-kernels-host), plus the device of
//! each buffer; the grids are gradwire-kernels' launch plans ([`Blocks`]).
//! Also here: the operand checks the launchers share to refuse bad input
//! with their own names before they queue the first of several kernels.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DriverError, LaunchConfig, PushKernelArg};
use gradwire_kernels::{CType, Kernel, Operand as Checked, Refusal};

use super::device_vec::{DeviceScalar, DeviceVec};
use super::driver::{CudaDevice, CudaStorage};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};

pub use gradwire_kernels::{BLOCK, Blocks, MAX_GRID, blocks_for};

/// A driver error as gradwire-tensor's [`Error::Cuda`], naming the call.
pub fn driver_error(call: &str, e: DriverError) -> Error {
    Error::Cuda(format!("{call}: {e:?}"))
}

/// The error of a range of elements outside a buffer of `len`.
pub fn out_of_bounds(op: &str, range: &Range<usize>, len: usize) -> Error {
    Error::InvalidArgument(format!(
        "{op}: range {}..{} out of bounds for {len} elements",
        range.start, range.end
    ))
}

/// `n` as the `gw_u64` length argument every kernel takes.
pub fn len_arg(n: usize) -> Result<u64> {
    u64::try_from(n).map_err(|_| Error::ShapeOverflow)
}

/// `n` as a 32-bit kernel argument or grid size.
pub fn u32_arg(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::InvalidArgument(format!("{what} {n} exceeds u32")))
}

/// The entry of `of` (its f32, f16 and bf16 forms, in that order) for
/// `dtype`.
pub fn by_dtype<T>(dtype: DType, of: [T; 3]) -> T {
    let [f32, f16, bf16] = of;
    match dtype {
        DType::F32 => f32,
        DType::F16 => f16,
        DType::BF16 => bf16,
    }
}

/// `storage` must hold f32 (optimizer buffers, residuals and selection
/// inputs are f32 whatever the parameters' dtype).
pub fn require_f32(op: &'static str, storage: &CudaStorage) -> Result<()> {
    if storage.dtype() == DType::F32 {
        Ok(())
    } else {
        Err(Error::DTypeMismatch {
            op,
            expected: DType::F32,
            got: storage.dtype(),
        })
    }
}

/// `other` must live on `storage`'s device.
pub fn require_same_device(
    op: &'static str,
    storage: &CudaStorage,
    other: &CudaStorage,
) -> Result<()> {
    require_ordinal(op, storage.ordinal(), other.ordinal())
}

/// Memory on CUDA device `got` where device `expected` is required.
pub fn require_ordinal(op: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::DeviceMismatch {
            op,
            expected: Device::Cuda(expected),
            got: Device::Cuda(got),
        })
    }
}

/// Two lengths that must be equal.
pub fn require_len(op: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::LengthMismatch { op, expected, got })
    }
}

/// `other` must be like `storage` (same device, dtype and length): the
/// operands of an elementwise kernel.
pub fn require_like(op: &'static str, storage: &CudaStorage, other: &CudaStorage) -> Result<()> {
    require_same_device(op, storage, other)?;
    if other.dtype() != storage.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            expected: storage.dtype(),
            got: other.dtype(),
        });
    }
    require_len(op, storage.len(), other.len())
}

/// The C type of a storage's elements.
pub(crate) fn ctype(dtype: DType) -> CType {
    match dtype {
        DType::F32 => CType::F32,
        DType::F16 => CType::F16,
        DType::BF16 => CType::BF16,
    }
}

/// A value argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// `gw_u64`.
    U64(u64),
    /// `gw_u32`.
    U32(u32),
    /// `int`.
    I32(i32),
    /// `float`.
    F32(f32),
}

impl Value {
    fn ctype(self) -> CType {
        match self {
            Value::U64(_) => CType::U64,
            Value::U32(_) => CType::U32,
            Value::I32(_) => CType::I32,
            Value::F32(_) => CType::F32,
        }
    }

    /// The value as an extent may read it (integers only).
    fn integer(self) -> Option<u64> {
        match self {
            Value::U64(v) => Some(v),
            Value::U32(v) => Some(u64::from(v)),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::F32(_) => None,
        }
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::U64(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::U32(v)
    }
}

impl From<i32> for Value {
    fn from(v: i32) -> Value {
        Value::I32(v)
    }
}

impl From<f32> for Value {
    fn from(v: f32) -> Value {
        Value::F32(v)
    }
}

/// Device memory a kernel reads: a storage, a range of one, or a
/// [`DeviceVec`].
pub trait DeviceRead<'a> {
    /// The bytes, their element type and count, and the device.
    fn operand(self) -> Result<Operand<'a>>;
}

/// Device memory a kernel writes: a storage, a range of one, or a
/// [`DeviceVec`], borrowed mutably.
pub trait DeviceWrite<'a> {
    /// The bytes, their element type and count, and the device.
    fn operand(self) -> Result<Operand<'a>>;
}

/// One argument of a launch: what [`Launch::run`] checks of it, and the
/// device memory it passes (its bytes and the window of them).
#[derive(Debug)]
pub struct Operand<'a> {
    what: Described,
    bytes: Bytes<'a>,
}

/// The device memory of an argument: a view and the window of it passed.
#[derive(Debug)]
enum Bytes<'a> {
    Read(CudaView<'a, u8>, Range<usize>),
    Write(CudaViewMut<'a, u8>, Range<usize>),
    None,
}

impl<'a> Operand<'a> {
    /// All of `bytes`, read as `len` elements of `elem`.
    pub(crate) fn read(bytes: CudaView<'a, u8>, elem: CType, len: usize, ordinal: usize) -> Self {
        let window = 0..bytes.len();
        Operand {
            what: Described::Memory {
                writes: false,
                elem,
                len,
                ordinal,
            },
            bytes: Bytes::Read(bytes, window),
        }
    }

    /// All of `bytes`, written as `len` elements of `elem`.
    pub(crate) fn write(
        bytes: CudaViewMut<'a, u8>,
        elem: CType,
        len: usize,
        ordinal: usize,
    ) -> Self {
        let window = 0..bytes.len();
        Operand {
            what: Described::Memory {
                writes: true,
                elem,
                len,
                ordinal,
            },
            bytes: Bytes::Write(bytes, window),
        }
    }

    /// A null pointer or a value.
    fn plain(what: Described) -> Self {
        Operand {
            what,
            bytes: Bytes::None,
        }
    }

    /// The elements `range` of this operand (a storage's elements).
    fn window(mut self, range: Range<usize>) -> Result<Self> {
        let (Described::Memory { elem, len, .. }, Bytes::Read(_, window) | Bytes::Write(_, window)) =
            (&mut self.what, &mut self.bytes)
        else {
            return Ok(self);
        };
        if range.start > range.end || range.end > *len {
            return Err(out_of_bounds("window", &range, *len));
        }
        let size = elem.size_in_bytes();
        *window = window.start + range.start * size..window.start + range.end * size;
        *len = range.len();
        Ok(self)
    }
}

/// Elements `range` of a storage, to read or write.
#[derive(Debug)]
pub struct Window<S> {
    storage: S,
    range: Range<usize>,
}

/// Elements `range` of `storage` as a kernel argument.
pub fn window<S>(storage: S, range: Range<usize>) -> Window<S> {
    Window { storage, range }
}

impl<'a> DeviceRead<'a> for &'a CudaStorage {
    fn operand(self) -> Result<Operand<'a>> {
        Ok(Operand::read(
            self.bytes()?,
            ctype(self.dtype()),
            self.len(),
            self.ordinal(),
        ))
    }
}

impl<'a> DeviceWrite<'a> for &'a mut CudaStorage {
    fn operand(self) -> Result<Operand<'a>> {
        let (elem, len, ordinal) = (ctype(self.dtype()), self.len(), self.ordinal());
        Ok(Operand::write(self.bytes_mut()?, elem, len, ordinal))
    }
}

impl<'a> DeviceRead<'a> for Window<&'a CudaStorage> {
    fn operand(self) -> Result<Operand<'a>> {
        self.storage.operand()?.window(self.range)
    }
}

impl<'a> DeviceWrite<'a> for Window<&'a mut CudaStorage> {
    fn operand(self) -> Result<Operand<'a>> {
        self.storage.operand()?.window(self.range)
    }
}

impl<'a, T: DeviceScalar> DeviceRead<'a> for &'a DeviceVec<T> {
    fn operand(self) -> Result<Operand<'a>> {
        Ok(Operand::read(
            self.bytes()?,
            T::CTYPE,
            self.len(),
            self.ordinal(),
        ))
    }
}

impl<'a, T: DeviceScalar> DeviceWrite<'a> for &'a mut DeviceVec<T> {
    fn operand(self) -> Result<Operand<'a>> {
        let (len, ordinal) = (self.len(), self.ordinal());
        Ok(Operand::write(self.bytes_mut()?, T::CTYPE, len, ordinal))
    }
}

impl<'a, T: DeviceScalar> DeviceRead<'a> for Window<&'a DeviceVec<T>> {
    fn operand(self) -> Result<Operand<'a>> {
        self.storage.operand()?.window(self.range)
    }
}

impl<'a, T: DeviceScalar> DeviceWrite<'a> for Window<&'a mut DeviceVec<T>> {
    fn operand(self) -> Result<Operand<'a>> {
        self.storage.operand()?.window(self.range)
    }
}

impl<'a> DeviceRead<'a> for Operand<'a> {
    fn operand(self) -> Result<Operand<'a>> {
        Ok(self)
    }
}

impl<'a> DeviceWrite<'a> for Operand<'a> {
    fn operand(self) -> Result<Operand<'a>> {
        Ok(self)
    }
}

/// One kernel launch being built: see the [module docs](self).
///
/// Arguments go in the kernel's parameter order; an argument that cannot
/// be taken (a range outside its storage) is kept as the launch's error,
/// which [`Launch::run`] returns before anything is queued.
#[derive(Debug)]
#[must_use = "a launch does nothing until it is run"]
pub struct Launch<'a> {
    device: &'a CudaDevice,
    kernel: &'static Kernel,
    stream: Option<&'a Arc<CudaStream>>,
    args: Vec<Operand<'a>>,
    error: Option<Error>,
}

impl<'a> Launch<'a> {
    /// A launch of `kernel` on `device`'s stream.
    pub fn new(device: &'a CudaDevice, kernel: &'static Kernel) -> Launch<'a> {
        Launch {
            device,
            kernel,
            stream: None,
            args: Vec::with_capacity(kernel.params().len()),
            error: None,
        }
    }

    /// Queues the launch on `stream` (a stream of the same device, ordered
    /// by the caller after the work the arguments depend on) instead.
    pub fn on_stream(mut self, stream: &'a Arc<CudaStream>) -> Launch<'a> {
        self.stream = Some(stream);
        self
    }

    fn push(mut self, arg: Result<Operand<'a>>) -> Launch<'a> {
        match arg {
            Ok(arg) => self.args.push(arg),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }

    /// The next argument: memory the kernel reads.
    pub fn read(self, memory: impl DeviceRead<'a>) -> Launch<'a> {
        let arg = memory.operand();
        self.push(arg)
    }

    /// The next argument: memory the kernel writes.
    pub fn write(self, memory: impl DeviceWrite<'a>) -> Launch<'a> {
        let arg = memory.operand();
        self.push(arg)
    }

    /// The next argument, memory the kernel writes when there is some,
    /// else null (a parameter that may be null).
    pub fn write_or_null(self, memory: Option<impl DeviceWrite<'a>>) -> Launch<'a> {
        match memory {
            Some(memory) => self.write(memory),
            None => self.push(Ok(Operand::plain(Described::Null))),
        }
    }

    /// The next argument, memory the kernel reads when there is some, else
    /// null (a parameter that may be null).
    pub fn read_or_null(self, memory: Option<impl DeviceRead<'a>>) -> Launch<'a> {
        match memory {
            Some(memory) => self.read(memory),
            None => self.push(Ok(Operand::plain(Described::Null))),
        }
    }

    /// The next argument: a value.
    pub fn value(self, value: impl Into<Value>) -> Launch<'a> {
        self.push(Ok(Operand::plain(Described::Value(value.into()))))
    }

    /// The next argument: a length, as the `gw_u64` kernels take.
    pub fn len(self, n: usize) -> Launch<'a> {
        let arg = len_arg(n).map(|n| Operand::plain(Described::Value(Value::U64(n))));
        self.push(arg)
    }

    /// Checks the arguments and the grid against the kernel's signature and
    /// queues the kernel (see the [module docs](self)).
    pub fn run(self, blocks: Blocks) -> Result<()> {
        let Launch {
            device,
            kernel,
            stream,
            args,
            error,
        } = self;
        if let Some(error) = error {
            return Err(error);
        }
        let grid = blocks.grid();
        check(kernel, &args, grid, device.ordinal())?;
        let function = device.function(kernel.module(), kernel.name())?;
        let stream = stream.unwrap_or(device.stream());
        let null: u64 = 0;
        let mut args = args;
        let mut views = Vec::with_capacity(args.len());
        for arg in &mut args {
            let outside = || Error::Cuda("a kernel argument outside its buffer".into());
            views.push(match (&mut arg.bytes, arg.what) {
                (Bytes::Read(bytes, window), _) => {
                    View::Read(bytes.try_slice(window.clone()).ok_or_else(outside)?)
                }
                (Bytes::Write(bytes, window), _) => {
                    View::Write(bytes.try_slice_mut(window.clone()).ok_or_else(outside)?)
                }
                (Bytes::None, Described::Value(v)) => View::Value(v),
                (Bytes::None, _) => View::Null,
            });
        }
        let mut builder = stream.launch_builder(&function);
        for view in &mut views {
            match view {
                View::Read(bytes) => builder.arg(&*bytes),
                View::Write(bytes) => builder.arg(bytes),
                View::Null => builder.arg(&null),
                View::Value(Value::U64(v)) => builder.arg(&*v),
                View::Value(Value::U32(v)) => builder.arg(&*v),
                View::Value(Value::I32(v)) => builder.arg(&*v),
                View::Value(Value::F32(v)) => builder.arg(&*v),
            };
        }
        let config = LaunchConfig {
            grid_dim: (grid.0, grid.1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        #[allow(unsafe_code)]
        // SAFETY: `check` proved the arguments to be what the kernel's
        // signature declares, in order: values of the declared C types;
        // pointers to live allocations of this device holding at least the
        // elements the kernel may touch (the signature's extents, computed
        // from these very arguments and grid), of the declared element type
        // (or null where the kernel accepts null); every buffer the kernel
        // writes borrowed mutably, so it aliases no other argument; the grid
        // one the kernel accepts, with the BLOCK threads per block every
        // kernel is written for. The signatures are checked against the PTX
        // by gradwire-kernels' tests; the views live until `builder` is
        // dropped, after the launch is queued (cudarc records the events
        // that keep the memory alive until the kernel is done).
        let result = unsafe { builder.launch(config) };
        result
            .map(|_| ())
            .map_err(|e| driver_error(&format!("launching `{}`", kernel.name()), e))
    }
}

/// What [`check`] knows of an argument: the memory's access, element type,
/// length and device, or null, or the value.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Described {
    Memory {
        writes: bool,
        elem: CType,
        len: usize,
        ordinal: usize,
    },
    Null,
    Value(Value),
}

/// An argument as it is passed: its window of device memory, or its value.
enum View<'b> {
    Read(CudaView<'b, u8>),
    Write(CudaViewMut<'b, u8>),
    Null,
    Value(Value),
}

/// The refusal of a launch, naming the kernel.
fn refuse(kernel: &Kernel, detail: String) -> Error {
    Error::InvalidArgument(format!("launching `{}`: {detail}", kernel.name()))
}

/// Whether `args` on `grid` are what `kernel` declares (see [`Launch::run`]).
/// Allocates nothing: it runs before every launch.
fn check(kernel: &Kernel, args: &[Operand<'_>], grid: (u32, u32), ordinal: usize) -> Result<()> {
    check_described(kernel, args.iter().map(|a| a.what), grid, ordinal)
}

/// [`check`] on what is known of each argument: gradwire-kernels'
/// [`Kernel::check`], then the device of each buffer.
fn check_described(
    kernel: &Kernel,
    args: impl ExactSizeIterator<Item = Described> + Clone,
    grid: (u32, u32),
    ordinal: usize,
) -> Result<()> {
    let checked = args.clone().map(|arg| match arg {
        Described::Memory {
            writes, elem, len, ..
        } => Checked::Memory { writes, elem, len },
        Described::Null => Checked::Null,
        Described::Value(v) => Checked::Value {
            ty: v.ctype(),
            integer: v.integer(),
        },
    });
    kernel
        .check(checked, grid)
        .map_err(|refusal| match refusal {
            Refusal::Overflow { .. } => Error::ShapeOverflow,
            Refusal::Invalid(why) => refuse(kernel, why),
        })?;
    for arg in args {
        if let Described::Memory { ordinal: on, .. } = arg {
            require_ordinal(kernel.name(), ordinal, on)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
