//! The real CUDA backend (feature `cuda`): devices, lazily loaded kernel
//! modules and device memory, through cudarc's driver API.
//!
//! cudarc loads `libcuda` at run time (no toolkit is needed to build) and is
//! pinned to CUDA 12.2's API (feature `cuda-12020`): drivers from R535 on.
//! Calling into a missing library would panic inside cudarc, so
//! [`CudaDevice::get`] first probes for it and answers
//! [`Error::CudaUnavailable`] on a machine without an NVIDIA driver, as it
//! does for an ordinal with no device.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, CudaViewMut,
};
use half::{bf16, f16};

use super::allocations::note_device_allocation;
use super::launch::{driver_error, out_of_bounds};
use super::ops::ReductionScratch;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::storage::CpuStorage;

/// Whether the CUDA driver library can be loaded (probed once per process).
fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        #[allow(unsafe_code)]
        // SAFETY: `is_culib_present` only tries to dlopen the driver library
        // under its usual names and drops the handle; it calls no CUDA
        // function and has no precondition.
        unsafe {
            cudarc::driver::sys::is_culib_present()
        }
    })
}

/// The oldest CUDA version whose driver JIT-compiles the shipped PTX (ISA
/// 8.2): CUDA 12.2, driver R535, as `cuDriverGetVersion` reports it.
const OLDEST_DRIVER: i32 = 12020;

/// The CUDA version the installed driver supports, if it answers.
fn driver_version() -> Option<i32> {
    let mut version = 0;
    #[allow(unsafe_code)]
    // SAFETY: `version` is a valid out-pointer for the call, and
    // cuDriverGetVersion needs no initialisation (the library was found
    // loadable by `driver_present`).
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    (status == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then_some(version)
}

/// Keeps the memory freed by stream-ordered frees in device `device`'s
/// default memory pool (which cudarc's allocations use) instead of
/// returning it to the driver at every synchronisation. CUDA's default
/// release threshold is 0, so each training step's scratch buffers would
/// come from the driver afresh; with the threshold at its maximum a steady
/// step's allocations are served from the pool, as PyTorch's caching
/// allocator serves them.
fn keep_freed_memory(device: cudarc::driver::sys::CUdevice) -> Result<()> {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    #[allow(unsafe_code)]
    // SAFETY: `pool` is a valid out-pointer; the driver was initialised by
    // the context creation before this call.
    let status = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, device) };
    if status == sys::CUresult::CUDA_ERROR_NOT_SUPPORTED {
        // No memory pools on this device: cudarc allocates synchronously
        // (`cuMemAlloc`), and there is no pool to keep.
        return Ok(());
    }
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::CudaUnavailable(format!(
            "cuDeviceGetDefaultMemPool: {status:?}"
        )));
    }
    let mut threshold = u64::MAX;
    #[allow(unsafe_code)]
    // SAFETY: `pool` is the device's live default pool, and the release
    // threshold's value is a cuuint64_t, which `threshold` is; the driver
    // copies it.
    let status = unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut threshold).cast(),
        )
    };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::CudaUnavailable(format!(
            "cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD): {status:?}"
        )));
    }
    Ok(())
}

/// Why a driver supporting CUDA `version` (`cuDriverGetVersion`'s
/// encoding, 1000 major + 10 minor) cannot load gradwire's kernels, or
/// `None` when it can: every module load would fail with
/// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, which says nothing of the driver.
fn driver_too_old(version: i32) -> Option<String> {
    (version < OLDEST_DRIVER).then(|| {
        format!(
            "the CUDA driver supports CUDA {}.{}; gradwire's kernels (PTX ISA 8.2) need \
             CUDA 12.2 (driver R535) or later",
            version / 1000,
            (version % 1000) / 10
        )
    })
}

/// One CUDA device: its primary context, the stream gradwire uses on it and
/// every kernel module and function of gradwire-kernels, loaded when the
/// device is opened. Shared (`Arc`) by every tensor on it;
/// [`CudaDevice::get`] returns the same one for the same ordinal.
///
/// Loading everything up front keeps module loads out of a training step: a
/// load may synchronise the context, which would stall behind a collective
/// another communicator (NcclComm's shadow) has running on the device. For
/// the same reason the device's memory pool keeps what is freed
/// (`keep_freed_memory`): a step's allocations come from the pool, not
/// from the driver.
pub struct CudaDevice {
    ordinal: usize,
    /// The default stream of the device's primary context (which it keeps
    /// alive, as do the modules).
    stream: Arc<CudaStream>,
    modules: HashMap<&'static str, Arc<CudaModule>>,
    /// Every kernel, by (module, entry).
    functions: HashMap<(&'static str, &'static str), CudaFunction>,
    /// The reductions' working memory, kept between calls (taken by one
    /// call at a time: a call that finds it taken makes its own). It holds
    /// `Arc`s of this device, which the cache of [`CudaDevice::get`] keeps
    /// for the whole process anyway.
    reductions: Mutex<ReductionScratch>,
}

impl CudaDevice {
    /// Runs `reduce` with the reductions' kept working memory, taken for
    /// the call (empty when another call holds it: it makes its own) and
    /// kept again after it, whatever it returns.
    pub(crate) fn with_reductions<T>(&self, reduce: impl FnOnce(&mut ReductionScratch) -> T) -> T {
        let lock = || {
            self.reductions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        let mut kept = std::mem::take(&mut *lock());
        let result = reduce(&mut kept);
        *lock() = kept;
        result
    }
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// The device with this ordinal, created on first use and cached.
    ///
    /// [`Error::CudaUnavailable`] when the driver library is missing or
    /// older than CUDA 12.2 (R535, which the kernels' PTX needs), when
    /// there is no device `ordinal`, or when the driver fails to initialise;
    /// never a panic.
    pub fn get(ordinal: usize) -> Result<Arc<CudaDevice>> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
        if !driver_present() {
            return Err(Error::CudaUnavailable(
                "the CUDA driver library (libcuda.so) is not installed".into(),
            ));
        }
        if let Some(why) = driver_version().and_then(driver_too_old) {
            return Err(Error::CudaUnavailable(why));
        }
        let devices = DEVICES.get_or_init(Mutex::default);
        let mut devices = devices.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(device) = devices.get(&ordinal) {
            return Ok(Arc::clone(device));
        }
        let count = CudaContext::device_count()
            .map_err(|e| Error::CudaUnavailable(format!("cuDeviceGetCount: {e:?}")))?;
        if usize::try_from(count).map_or(true, |count| ordinal >= count) {
            return Err(Error::CudaUnavailable(format!(
                "no CUDA device {ordinal} (the driver sees {count})"
            )));
        }
        let context = CudaContext::new(ordinal)
            .map_err(|e| Error::CudaUnavailable(format!("device {ordinal}: {e:?}")))?;
        keep_freed_memory(context.cu_device())?;
        let stream = context.default_stream();
        let mut modules = HashMap::new();
        let mut functions = HashMap::new();
        for ptx in gradwire_kernels::MODULES {
            let module = context
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx.ptx))
                .map_err(|e| driver_error(&format!("loading the PTX of `{}`", ptx.name), e))?;
            for &entry in ptx.entries {
                let function = module
                    .load_function(entry)
                    .map_err(|e| driver_error(&format!("kernel `{entry}` of `{}`", ptx.name), e))?;
                functions.insert((ptx.name, entry), function);
            }
            modules.insert(ptx.name, module);
        }
        let device = Arc::new(CudaDevice {
            ordinal,
            stream,
            modules,
            functions,
            reductions: Mutex::default(),
        });
        devices.insert(ordinal, Arc::clone(&device));
        Ok(device)
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The stream gradwire's copies and kernels run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The kernel module `name` of gradwire-kernels (loaded when the device
    /// was opened).
    pub fn module(&self, name: &str) -> Result<Arc<CudaModule>> {
        self.modules
            .get(name)
            .cloned()
            .ok_or_else(|| Error::InvalidArgument(format!("no kernel module `{name}`")))
    }

    /// The kernel `kernel` of module `module` (a signature's
    /// [`module`](gradwire_kernels::Kernel::module) and
    /// [`name`](gradwire_kernels::Kernel::name)), loaded when the device was
    /// opened.
    pub fn function(&self, module: &str, kernel: &str) -> Result<CudaFunction> {
        self.functions
            .get(&(module, kernel))
            .cloned()
            .ok_or_else(|| Error::InvalidArgument(format!("no kernel `{kernel}` in `{module}`")))
    }

    /// Waits until all work queued on the device's stream is done.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_error("cuStreamSynchronize", e))
    }
}

/// A CUDA storage's device buffer, typed by dtype: f16 and bf16 are stored
/// as their bits (`u16`), which is what the kernels of gradwire-kernels take
/// (`gw_f16` / `gw_bf16` are one `u16` each).
#[derive(Debug)]
pub enum DeviceBuffer {
    /// `f32` elements.
    F32(CudaSlice<f32>),
    /// `f16` elements, as bits.
    F16(CudaSlice<u16>),
    /// `bf16` elements, as bits.
    BF16(CudaSlice<u16>),
}

impl DeviceBuffer {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            DeviceBuffer::F32(_) => DType::F32,
            DeviceBuffer::F16(_) => DType::F16,
            DeviceBuffer::BF16(_) => DType::BF16,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            DeviceBuffer::F32(s) => s.len(),
            DeviceBuffer::F16(s) | DeviceBuffer::BF16(s) => s.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `elements` elements as bytes (f32 as its 4 little-endian
    /// bytes, the half types as their 2); an error if the buffer is shorter.
    fn prefix_bytes(&self, elements: usize) -> Result<CudaView<'_, u8>> {
        let bytes = elements * self.dtype().size_in_bytes();
        let view = match self {
            #[allow(unsafe_code)]
            // SAFETY: a u8 is valid for every bit pattern and has alignment
            // 1; cudarc returns `None` unless `bytes` fits in the buffer, so
            // the view covers a prefix of the same memory.
            DeviceBuffer::F32(s) => unsafe { s.transmute::<u8>(bytes) },
            #[allow(unsafe_code)]
            // SAFETY: as for f32, over u16 elements.
            DeviceBuffer::F16(s) | DeviceBuffer::BF16(s) => unsafe { s.transmute::<u8>(bytes) },
        };
        view.ok_or_else(|| Error::Cuda("a byte view larger than its buffer".into()))
    }

    /// The first `elements` elements as writable bytes: any bytes written
    /// are valid f32 / f16 / bf16 values.
    fn prefix_bytes_mut(&mut self, elements: usize) -> Result<CudaViewMut<'_, u8>> {
        let bytes = elements * self.dtype().size_in_bytes();
        let view = match self {
            #[allow(unsafe_code)]
            // SAFETY: every bit pattern is a valid u8 and a valid f32, so
            // writes through the view cannot create invalid values; cudarc
            // returns `None` unless `bytes` fits, so the view is a prefix.
            DeviceBuffer::F32(s) => unsafe { s.transmute_mut::<u8>(bytes) },
            #[allow(unsafe_code)]
            // SAFETY: as for f32, over u16 elements.
            DeviceBuffer::F16(s) | DeviceBuffer::BF16(s) => unsafe { s.transmute_mut::<u8>(bytes) },
        };
        view.ok_or_else(|| Error::Cuda("a byte view larger than its buffer".into()))
    }

    /// A copy on the same device, made on `stream` (fallible, unlike
    /// cudarc's `Clone`, which panics when the copy fails).
    fn try_clone_on(&self, stream: &Arc<CudaStream>) -> Result<DeviceBuffer> {
        let copy = |e| driver_error("cuMemAlloc / cuMemcpyDtoD", e);
        let copied = match self {
            DeviceBuffer::F32(s) => DeviceBuffer::F32(stream.clone_dtod(s).map_err(copy)?),
            DeviceBuffer::F16(s) => DeviceBuffer::F16(stream.clone_dtod(s).map_err(copy)?),
            DeviceBuffer::BF16(s) => DeviceBuffer::BF16(stream.clone_dtod(s).map_err(copy)?),
        };
        note_device_allocation(copied.byte_len());
        Ok(copied)
    }

    /// The buffer's size in bytes.
    fn byte_len(&self) -> usize {
        match self {
            DeviceBuffer::F32(s) => s.len() * 4,
            DeviceBuffer::F16(s) | DeviceBuffer::BF16(s) => s.len() * 2,
        }
    }
}

/// Device memory on a CUDA GPU: `len` elements of one dtype.
///
/// Cloning shares the device buffer; [`CudaStorage::buffer_mut`] copies a
/// shared buffer first (copy on write), so a clone never sees another's
/// writes.
///
/// CUDA cannot allocate zero bytes, so an empty storage holds a one-element
/// buffer: [`CudaStorage::len`] is the storage's length, the buffer has at
/// least that many elements, and [`CudaStorage::bytes`] /
/// [`CudaStorage::bytes_mut`] view exactly the storage's elements.
#[derive(Debug, Clone)]
pub struct CudaStorage {
    device: Arc<CudaDevice>,
    len: usize,
    data: Arc<DeviceBuffer>,
}

impl CudaStorage {
    /// Allocates `len` zeros of `dtype` on device `ordinal`
    /// ([`Error::CudaUnavailable`] without one).
    pub fn alloc_zeros(len: usize, dtype: DType, ordinal: usize) -> Result<Self> {
        let device = CudaDevice::get(ordinal)?;
        let stream = device.stream();
        let alloc = |e| driver_error("cuMemAlloc / cuMemsetD8", e);
        // At least one element: cuMemAlloc refuses zero bytes.
        let elements = len.max(1);
        let data = match dtype {
            DType::F32 => DeviceBuffer::F32(stream.alloc_zeros::<f32>(elements).map_err(alloc)?),
            DType::F16 => DeviceBuffer::F16(stream.alloc_zeros::<u16>(elements).map_err(alloc)?),
            DType::BF16 => DeviceBuffer::BF16(stream.alloc_zeros::<u16>(elements).map_err(alloc)?),
        };
        note_device_allocation(data.byte_len());
        Ok(CudaStorage {
            device,
            len,
            data: Arc::new(data),
        })
    }

    /// Copies host memory to device `ordinal` ([`Error::CudaUnavailable`]
    /// without one).
    pub fn from_cpu(src: &CpuStorage, ordinal: usize) -> Result<Self> {
        if src.is_empty() {
            return CudaStorage::alloc_zeros(0, src.dtype(), ordinal);
        }
        let device = CudaDevice::get(ordinal)?;
        let stream = device.stream();
        let copy = |e| driver_error("cuMemcpyHtoD", e);
        let data = match src {
            CpuStorage::F32(v) => DeviceBuffer::F32(stream.clone_htod(v.as_slice()).map_err(copy)?),
            CpuStorage::F16(v) => {
                let bits: &[u16] = bytemuck::cast_slice(v.as_slice());
                DeviceBuffer::F16(stream.clone_htod(bits).map_err(copy)?)
            }
            CpuStorage::BF16(v) => {
                let bits: &[u16] = bytemuck::cast_slice(v.as_slice());
                DeviceBuffer::BF16(stream.clone_htod(bits).map_err(copy)?)
            }
        };
        note_device_allocation(data.byte_len());
        Ok(CudaStorage {
            device,
            len: src.len(),
            data: Arc::new(data),
        })
    }

    /// Copies the device memory back to the host (waits for the stream).
    pub fn to_cpu(&self) -> Result<CpuStorage> {
        if self.len == 0 {
            return Ok(CpuStorage::zeros(self.dtype(), 0));
        }
        let stream = self.device.stream();
        let copy = |e| driver_error("cuMemcpyDtoH", e);
        Ok(match &*self.data {
            DeviceBuffer::F32(s) => CpuStorage::F32(stream.clone_dtoh(s).map_err(copy)?),
            DeviceBuffer::F16(s) => CpuStorage::F16(
                stream
                    .clone_dtoh(s)
                    .map_err(copy)?
                    .into_iter()
                    .map(f16::from_bits)
                    .collect(),
            ),
            DeviceBuffer::BF16(s) => CpuStorage::BF16(
                stream
                    .clone_dtoh(s)
                    .map_err(copy)?
                    .into_iter()
                    .map(bf16::from_bits)
                    .collect(),
            ),
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &*self.data {
            DeviceBuffer::F32(_) => DType::F32,
            DeviceBuffer::F16(_) => DType::F16,
            DeviceBuffer::BF16(_) => DType::BF16,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The storage's elements as bytes (f32 as its 4 little-endian bytes,
    /// the half types as their 2), exactly `len * dtype size` of them: what
    /// kernels take as `T*` and what a transport that moves bytes (NCCL)
    /// sends.
    pub fn bytes(&self) -> Result<CudaView<'_, u8>> {
        self.data.prefix_bytes(self.len)
    }

    /// The storage's elements as writable bytes (copy on write, see
    /// [`CudaStorage::buffer_mut`]), exactly `len * dtype size` of them.
    pub fn bytes_mut(&mut self) -> Result<CudaViewMut<'_, u8>> {
        let len = self.len;
        self.buffer_mut()?.prefix_bytes_mut(len)
    }

    /// Elements `range` of an f32 storage, copied straight to the host
    /// (waits for the copy; no device temporary). [`Error::DTypeMismatch`]
    /// for another dtype, [`Error::InvalidArgument`] for a range outside.
    pub fn read_f32(&self, range: Range<usize>) -> Result<Vec<f32>> {
        let bytes = self.f32_bytes("read_f32", &range)?;
        let mut host = vec![0f32; range.len()];
        if range.is_empty() {
            return Ok(host);
        }
        let all = self.bytes()?;
        let view = all
            .try_slice(bytes)
            .ok_or_else(|| out_of_bounds("read_f32", &range, self.len))?;
        self.device
            .stream()
            .memcpy_dtoh(&view, bytemuck::cast_slice_mut::<f32, u8>(&mut host))
            .map_err(|e| driver_error("cuMemcpyDtoH", e))?;
        Ok(host)
    }

    /// Writes host `values` into an f32 storage from element `offset` on,
    /// straight from the host (no device temporary). Errors as
    /// [`CudaStorage::read_f32`].
    pub fn write_f32(&mut self, offset: usize, values: &[f32]) -> Result<()> {
        let end = offset
            .checked_add(values.len())
            .ok_or(Error::ShapeOverflow)?;
        let range = offset..end;
        let bytes = self.f32_bytes("write_f32", &range)?;
        if range.is_empty() {
            return Ok(());
        }
        let len = self.len;
        let stream = Arc::clone(self.device.stream());
        let mut all = self.bytes_mut()?;
        let mut view = all
            .try_slice_mut(bytes)
            .ok_or_else(|| out_of_bounds("write_f32", &range, len))?;
        stream
            .memcpy_htod(bytemuck::cast_slice::<f32, u8>(values), &mut view)
            .map_err(|e| driver_error("cuMemcpyHtoD", e))
    }

    /// The byte range of elements `range` of this storage, which must hold
    /// f32 and contain the range.
    fn f32_bytes(&self, op: &'static str, range: &Range<usize>) -> Result<Range<usize>> {
        if self.dtype() != DType::F32 {
            return Err(Error::DTypeMismatch {
                op,
                expected: DType::F32,
                got: self.dtype(),
            });
        }
        if range.start > range.end || range.end > self.len {
            return Err(out_of_bounds(op, range, self.len));
        }
        Ok(range.start * 4..range.end * 4)
    }

    /// The CUDA device ordinal holding the memory.
    pub fn ordinal(&self) -> usize {
        self.device.ordinal()
    }

    /// The device holding the memory.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The device buffer, to read (kernels, copies, NCCL sends): at least
    /// [`CudaStorage::len`] elements (one for an empty storage). Work on it
    /// must be queued on [`CudaDevice::stream`] or ordered after it.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.data
    }

    /// The device buffer, to write. A buffer shared with clones of this
    /// storage is copied first (on the device's stream), so the clones keep
    /// their contents.
    pub fn buffer_mut(&mut self) -> Result<&mut DeviceBuffer> {
        if Arc::get_mut(&mut self.data).is_none() {
            let copy = self.data.try_clone_on(self.device.stream())?;
            self.data = Arc::new(copy);
        }
        Arc::get_mut(&mut self.data)
            .ok_or_else(|| Error::Cuda("a freshly copied device buffer is shared".into()))
    }

    /// Overwrites every element with zero (a memset queued on the device's
    /// stream; all-zero bits are +0.0 in every dtype).
    pub fn zero_fill(&mut self) -> Result<()> {
        let stream = Arc::clone(self.device.stream());
        let memset = |e| driver_error("cuMemsetD8", e);
        match self.buffer_mut()? {
            DeviceBuffer::F32(s) => stream.memset_zeros(s).map_err(memset),
            DeviceBuffer::F16(s) | DeviceBuffer::BF16(s) => stream.memset_zeros(s).map_err(memset),
        }
    }

    /// Wraps a device buffer allocated on `device` (by a kernel launcher or a
    /// communicator) as storage.
    pub fn from_buffer(device: Arc<CudaDevice>, buffer: DeviceBuffer) -> CudaStorage {
        CudaStorage {
            device,
            len: buffer.len(),
            data: Arc::new(buffer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::driver_too_old;

    #[test]
    fn a_driver_older_than_cuda_12_2_is_named_as_too_old() {
        let why = driver_too_old(12010).expect("12.1 is too old");
        assert!(why.contains("CUDA 12.1") && why.contains("12.2"), "{why}");
        assert!(driver_too_old(11080).is_some_and(|w| w.contains("CUDA 11.8")));
        assert_eq!(driver_too_old(12020), None);
        assert_eq!(driver_too_old(13000), None);
    }
}
