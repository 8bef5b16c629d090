//! The CUDA driver API as gpumem uses it, shaped like cudarc's own safe layer: the only module
//! that calls `cudarc::driver::{sys, result}`. Each wrapper returns a typed [`DeviceError`];
//! handles are typed ([`Device`], [`DevicePtr`], [`Stream`]) and owned ones release themselves on
//! drop ([`PrimaryContext`], [`Module`], [`Event`], [`Marker`]).
//!
//! cudarc loads libcuda at run time and panics when the library or a symbol is missing, so
//! [`init`] checks the library and every symbol called here before the first call.
//!
//! Calls that need a context take a [`Current`]: proof that this thread has made the primary
//! context current, obtained from [`PrimaryContext::current`]. Each wrapper makes the context
//! current again if something else was made current on the thread since (a thread-local
//! compare, no driver call), so a `Current` can never act on the wrong context. A `Current` also
//! names the stream its kernel launches and copies go to ([`Current::on`]; the legacy default
//! stream unless told otherwise).

use std::cell::Cell;
use std::ffi::{c_void, CString};
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;

use crate::device::{DeviceError, DevicePtr, DeviceSpan, MemorySpace};

/// The oldest driver the bindings work with: gpumem is built against CUDA 13.0's driver API
/// (`cuda-13000`), whose versioned entry points (e.g. `cuEventElapsedTime_v2`) older drivers
/// lack.
pub const MIN_DRIVER_VERSION: i32 = 13_000;

/// Driver entry points gpumem calls; [`init`] checks each before the first call.
const DRIVER_SYMBOLS: [&str; 47] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetUuid_v2",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyPeer",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuModuleGetFunction",
    "cuModuleGetGlobal_v2",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuLaunchKernel",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
    "cuEventQuery",
    "cuStreamCreate",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemUnmap",
];

/// The entries of `$names` that the library `$culib()` returns does not export. (A macro
/// because cudarc's library type is libloading's, which gpumem does not name.)
macro_rules! missing_symbols {
    ($culib:path, $names:expr) => {{
        // SAFETY: the caller checked that the library loads (`is_culib_present`); symbols are
        // only looked up here, nothing is called through them.
        let library = unsafe { $culib() };
        $names
            .iter()
            .copied()
            .filter(|name: &&str| {
                // SAFETY: as above, a lookup only.
                unsafe { library.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err()
            })
            .collect::<Vec<&str>>()
    }};
}
pub(crate) use missing_symbols;

/// `(name, description)` of a driver error, e.g. `("CUDA_ERROR_INVALID_VALUE", "invalid
/// argument")`.
fn describe(error: DriverError) -> (String, String) {
    let name = error
        .error_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", error.0));
    let description = error
        .error_string()
        .map(|text| text.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "no description".to_string());
    (name, description)
}

/// A failed driver call as [`DeviceError::Driver`].
fn failed(call: &'static str) -> impl Fn(DriverError) -> DeviceError {
    move |error| {
        let (code, description) = describe(error);
        DeviceError::Driver {
            call,
            code,
            description,
        }
    }
}

/// A failed call that allocates device memory: [`DeviceError::OutOfMemory`] when the driver
/// ran out, else [`DeviceError::Driver`].
fn failed_allocating(call: &'static str) -> impl Fn(DriverError) -> DeviceError {
    move |error| {
        if error.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            DeviceError::OutOfMemory
        } else {
            failed(call)(error)
        }
    }
}

/// A failed call about one kernel as [`DeviceError::Kernel`].
fn failed_for<'a>(kernel: &'a str, call: &'static str) -> impl Fn(DriverError) -> DeviceError + 'a {
    move |error| DeviceError::Kernel {
        kernel: kernel.to_string(),
        error: Box::new(failed(call)(error)),
    }
}

/// Loads the driver library, checks every symbol gpumem calls, initialises the driver
/// (`cuInit`) and checks its version. Safe to call more than once.
pub fn init() -> Result<(), DeviceError> {
    // SAFETY: only tries to load the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(DeviceError::Unavailable(
            "the CUDA driver library (libcuda.so) was not found; is an NVIDIA driver installed?"
                .into(),
        ));
    }
    let missing = missing_symbols!(sys::culib, DRIVER_SYMBOLS);
    if !missing.is_empty() {
        return Err(DeviceError::Unavailable(format!(
            "the CUDA driver library lacks {} (driver too old for CUDA 13.0)",
            missing.join(", ")
        )));
    }
    cu::init().map_err(failed("cuInit"))?;
    let mut version = 0;
    // SAFETY: writes one int; the symbol was checked above.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(failed("cuDriverGetVersion"))?;
    if version < MIN_DRIVER_VERSION {
        return Err(DeviceError::Unavailable(format!(
            "the driver supports CUDA {}.{}, gpumem needs CUDA 13.0 or newer",
            version / 1000,
            version % 1000 / 10
        )));
    }
    Ok(())
}

/// How many CUDA devices the driver reports (after [`init`]).
pub fn device_count() -> Result<usize, DeviceError> {
    let count = cu::device::get_count().map_err(failed("cuDeviceGetCount"))?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// The device attributes gpumem reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribute {
    /// Compute capability, major part.
    ComputeCapabilityMajor,
    /// Compute capability, minor part.
    ComputeCapabilityMinor,
    /// Streaming multiprocessors.
    MultiprocessorCount,
}

/// A CUDA device (`CUdevice`): an ordinal the driver validated. Creates no context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    raw: sys::CUdevice,
    ordinal: usize,
}

impl Device {
    /// Device `ordinal` (after [`init`]); [`DeviceError::NoSuchDevice`] when out of range.
    pub fn get(ordinal: usize) -> Result<Device, DeviceError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(DeviceError::NoSuchDevice { ordinal, count });
        }
        let index =
            i32::try_from(ordinal).map_err(|_| DeviceError::NoSuchDevice { ordinal, count })?;
        let raw = cu::device::get(index).map_err(failed("cuDeviceGet"))?;
        Ok(Device { raw, ordinal })
    }

    /// The ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The marketing name (`NVIDIA H200`).
    pub fn name(&self) -> Result<String, DeviceError> {
        cu::device::get_name(self.raw).map_err(failed("cuDeviceGetName"))
    }

    /// The UUID as NVML prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub fn uuid(&self) -> Result<String, DeviceError> {
        let uuid = cu::device::get_uuid(self.raw).map_err(failed("cuDeviceGetUuid"))?;
        let hex: Vec<String> = uuid
            .bytes
            .iter()
            .map(|&byte| format!("{:02x}", byte as u8))
            .collect();
        Ok(format!(
            "GPU-{}-{}-{}-{}-{}",
            hex[0..4].concat(),
            hex[4..6].concat(),
            hex[6..8].concat(),
            hex[8..10].concat(),
            hex[10..16].concat()
        ))
    }

    /// Installed memory in bytes (`cuDeviceTotalMem`).
    pub fn total_memory(&self) -> Result<u64, DeviceError> {
        // SAFETY: `raw` came from cuDeviceGet.
        let total =
            unsafe { cu::device::total_mem(self.raw) }.map_err(failed("cuDeviceTotalMem"))?;
        Ok(total as u64)
    }

    /// One attribute (`cuDeviceGetAttribute`).
    pub fn attribute(&self, which: Attribute) -> Result<i32, DeviceError> {
        use sys::CUdevice_attribute as A;
        let attribute = match which {
            Attribute::ComputeCapabilityMajor => A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            Attribute::ComputeCapabilityMinor => A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            Attribute::MultiprocessorCount => A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        };
        // SAFETY: `raw` came from cuDeviceGet.
        unsafe { cu::device::get_attribute(self.raw, attribute) }
            .map_err(failed("cuDeviceGetAttribute"))
    }
}

thread_local! {
    /// The context this thread last made current through [`PrimaryContext::current`] (its
    /// address; 0 for none). The driver keeps the current context per thread, so each thread
    /// sets it once.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// A device's primary context, retained for as long as this value lives (the context PyTorch
/// and the CUDA runtime use, shared by every thread of the process).
#[derive(Debug)]
pub struct PrimaryContext {
    raw: sys::CUcontext,
    device: Device,
}

// SAFETY: a CUcontext is an opaque driver handle that gpumem never dereferences. The driver API
// is thread-safe, and a primary context may be current on any number of threads at once
// (`cuCtxSetCurrent`); every call that needs it goes through `current()`, which makes it current
// on the calling thread first. Releasing it (Drop) is a driver call on the device, valid from any
// thread.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; `&PrimaryContext` only offers `current()` and `device()`.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retains `device`'s primary context, creating it if no one holds it (this is when the
    /// driver takes the context's memory). Failures are [`DeviceError::Context`], never
    /// [`DeviceError::OutOfMemory`]: there is no cache to free for a context.
    pub fn retain(device: Device) -> Result<PrimaryContext, DeviceError> {
        // SAFETY: `device.raw` came from cuDeviceGet; the context is released in Drop.
        let raw = unsafe { cu::primary_ctx::retain(device.raw) }.map_err(|error| {
            DeviceError::Context(Box::new(failed("cuDevicePrimaryCtxRetain")(error)))
        })?;
        Ok(PrimaryContext { raw, device })
    }

    /// Makes the context current on this thread, unless this thread already did, and returns
    /// the proof calls that need it take.
    pub fn current(&self) -> Result<Current<'_>, DeviceError> {
        self.ensure_current()?;
        Ok(Current {
            context: self,
            stream: Stream::LEGACY_DEFAULT,
            _thread_bound: PhantomData,
        })
    }

    fn ensure_current(&self) -> Result<(), DeviceError> {
        let key = self.raw as usize;
        if CURRENT.with(Cell::get) == key {
            return Ok(());
        }
        // SAFETY: `raw` is retained for the life of `self`.
        unsafe { cu::ctx::set_current(self.raw) }.map_err(failed("cuCtxSetCurrent"))?;
        CURRENT.with(|current| current.set(key));
        Ok(())
    }

    /// Runs `f` with this context current on this thread and then restores whatever was current
    /// (`cuCtxPushCurrent`/`cuCtxPopCurrent`): for releasing handles from drop, on any thread.
    fn with_pushed<T>(&self, f: impl FnOnce() -> T) -> Result<T, DeviceError> {
        // SAFETY: `raw` is retained for the life of `self`.
        unsafe { sys::cuCtxPushCurrent_v2(self.raw) }
            .result()
            .map_err(failed("cuCtxPushCurrent"))?;
        let value = f();
        let mut popped = std::ptr::null_mut();
        // SAFETY: pops the context pushed above; writes one pointer.
        unsafe { sys::cuCtxPopCurrent_v2(&mut popped) }
            .result()
            .map_err(failed("cuCtxPopCurrent"))?;
        Ok(value)
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        let key = self.raw as usize;
        CURRENT.with(|current| {
            if current.get() == key {
                current.set(0);
            }
        });
        // SAFETY: releases the reference `retain` took; nothing of this context is used after.
        let _ = unsafe { cu::primary_ctx::release(self.device.raw) };
    }
}

/// Proof that a `PrimaryContext` is current on this thread; calls that need a context take
/// one. Not `Send`: it speaks for the thread that made it. It also names the stream that kernel
/// launches ([`Function::launch`]) and copies go to: the legacy default stream, or the one
/// [`Current::on`] chose.
#[derive(Debug, Clone, Copy)]
pub struct Current<'a> {
    context: &'a PrimaryContext,
    stream: Stream,
    _thread_bound: PhantomData<*const ()>,
}

impl<'a> Current<'a> {
    /// The same proof, with launches and copies going to `stream` (a stream of this context,
    /// from [`Current::create_stream`], or [`Stream::LEGACY_DEFAULT`]).
    pub fn on(self, stream: Stream) -> Current<'a> {
        Current { stream, ..self }
    }

    /// The stream launches and copies go to.
    pub fn stream(&self) -> Stream {
        self.stream
    }
}

impl Current<'_> {
    /// Makes sure the context is still the current one (another may have been made current on
    /// this thread since); a thread-local compare when nothing changed.
    fn check(&self) -> Result<(), DeviceError> {
        self.context.ensure_current()
    }

    /// Whose memory this context's kernels and copies may touch: its device's.
    pub fn space(&self) -> MemorySpace {
        MemorySpace::cuda(self.context.device.ordinal)
    }

    /// Waits until all work launched in the context has finished (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        self.check()?;
        cu::ctx::synchronize().map_err(failed("cuCtxSynchronize"))
    }

    /// `(free, total)` bytes of the device (`cuMemGetInfo`).
    pub fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.check()?;
        cu::mem_get_info()
            .map(|(free, total)| (free as u64, total as u64))
            .map_err(failed("cuMemGetInfo"))
    }

    /// A segment of exactly `bytes` bytes (`cuMemAlloc`); [`DeviceError::OutOfMemory`] when the
    /// device has no room.
    pub fn mem_alloc(&self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.check()?;
        let size = usize::try_from(bytes)
            .map_err(|_| DeviceError::InvalidArgument(format!("cannot allocate {bytes} bytes")))?;
        let ordinal = self.context.device.ordinal;
        // SAFETY: the context is current; the caller owns the segment and frees it with
        // `mem_free`.
        unsafe { cu::malloc_sync(size) }
            .map(|raw| DevicePtr::cuda(raw, ordinal))
            .map_err(failed_allocating("cuMemAlloc"))
    }

    /// Frees a segment (`cuMemFree`).
    ///
    /// # Safety
    /// `ptr` must come from [`Current::mem_alloc`] in this context, be freed once, and no
    /// queued work may still use it.
    pub unsafe fn mem_free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.check()?;
        // SAFETY: as the caller promises.
        unsafe { cu::free_sync(ptr.addr()) }.map_err(failed("cuMemFree"))
    }

    /// Copies the first `dst.len()` bytes of `src` to the host, after all work launched
    /// before on this `Current`'s stream, and returns once the bytes are there (`cuMemcpyDtoH`
    /// on the legacy default stream; on another stream `cuMemcpyDtoHAsync` on it, then
    /// `cuStreamSynchronize`, as a read on a side stream is in PyTorch). Refused when `src` is
    /// shorter or is not this device's memory.
    pub fn copy_to_host(&self, dst: &mut [u8], src: DeviceSpan<'_>) -> Result<(), DeviceError> {
        if dst.is_empty() {
            return Ok(());
        }
        let from = src.address_in(self.space(), "cuMemcpyDtoH")?;
        if (dst.len() as u64) > src.bytes() {
            return Err(DeviceError::InvalidArgument(format!(
                "cuMemcpyDtoH: {} bytes asked of a span of {}",
                dst.len(),
                src.bytes()
            )));
        }
        self.check()?;
        if self.stream.is_legacy_default() {
            // SAFETY: `src` is live memory of this device for the borrow it carries, at least
            // `dst.len()` bytes long (both checked above); the copy is synchronous, so it ends
            // within that borrow, and writes only `dst`.
            return unsafe { cu::memcpy_dtoh_sync(dst, from) }.map_err(failed("cuMemcpyDtoH"));
        }
        // SAFETY: as above; the stream synchronisation below waits for the copy before
        // returning, so it too ends within both borrows.
        unsafe { cu::memcpy_dtoh_async(dst, from, self.stream.raw) }
            .map_err(failed("cuMemcpyDtoHAsync"))?;
        self.synchronize_stream(self.stream)
    }

    /// Copies all of `src` to the front of `dst`, ordered on this `Current`'s stream
    /// (`cuMemcpyDtoD` on the legacy default stream, `cuMemcpyDtoDAsync` on another). Refused
    /// when `dst` is shorter or either is not this device's memory.
    pub fn copy_device(&self, dst: DeviceSpan<'_>, src: DeviceSpan<'_>) -> Result<(), DeviceError> {
        let bytes = src.bytes();
        if bytes == 0 {
            return Ok(());
        }
        let to = dst.address_in(self.space(), "cuMemcpyDtoD")?;
        let from = src.address_in(self.space(), "cuMemcpyDtoD")?;
        if dst.bytes() < bytes {
            return Err(DeviceError::InvalidArgument(format!(
                "cuMemcpyDtoD: {bytes} bytes do not fit a span of {}",
                dst.bytes()
            )));
        }
        self.check()?;
        let size = usize::try_from(bytes)
            .map_err(|_| DeviceError::InvalidArgument(format!("cannot copy {bytes} bytes")))?;
        if self.stream.is_legacy_default() {
            // SAFETY: both spans are live memory of this device for the borrows they carry,
            // and `dst` holds at least the `bytes` bytes of `src` (checked above).
            return unsafe { cu::memcpy_dtod_sync(to, from, size) }.map_err(failed("cuMemcpyDtoD"));
        }
        // SAFETY: as above; the copy is ordered on the stream like a kernel launch, and the
        // allocator reuses the blocks only in that stream's order or after the events of the
        // other streams that used them.
        unsafe { cu::memcpy_dtod_async(to, from, size, self.stream.raw) }
            .map_err(failed("cuMemcpyDtoDAsync"))
    }
}

impl Current<'_> {
    /// Copies all of `src`, memory of the device whose primary context is `source`, to the
    /// front of `dst` in this context (`cuMemcpyPeer`): the copy between two GPUs behind
    /// `t.to(i)`. It is ordered after the work queued in both contexts, and work queued after
    /// it in either context sees the copied bytes. Refused when `dst` is shorter, `dst` is not
    /// this device's memory or `src` not `source`'s device's.
    pub fn copy_from_peer(
        &self,
        dst: DeviceSpan<'_>,
        source: &PrimaryContext,
        src: DeviceSpan<'_>,
    ) -> Result<(), DeviceError> {
        let bytes = src.bytes();
        if bytes == 0 {
            return Ok(());
        }
        let to = dst.address_in(self.space(), "cuMemcpyPeer")?;
        let from = src.address_in(MemorySpace::cuda(source.device.ordinal), "cuMemcpyPeer")?;
        if dst.bytes() < bytes {
            return Err(DeviceError::InvalidArgument(format!(
                "cuMemcpyPeer: {bytes} bytes do not fit a span of {}",
                dst.bytes()
            )));
        }
        self.check()?;
        let size = usize::try_from(bytes)
            .map_err(|_| DeviceError::InvalidArgument(format!("cannot copy {bytes} bytes")))?;
        // SAFETY: both contexts are retained for the call's duration (`self` borrows this
        // one, `source` the other); `dst` is live memory of this context's device and `src`
        // of `source`'s for the borrows they carry, and `dst` holds all `bytes` bytes of `src`
        // (checked above).
        unsafe { sys::cuMemcpyPeer(to, self.context.raw, from, source.raw, size) }
            .result()
            .map_err(failed("cuMemcpyPeer"))
    }
}

/// The allocation properties of plain device memory on `device`: pinned (not migratable),
/// located on the device, no shareable handle type. What PyTorch's expandable segments use.
fn device_memory_properties(device: Device) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device.ordinal as i32,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// A byte count as the driver's `size_t`.
fn driver_size(bytes: u64, what: &str) -> Result<usize, DeviceError> {
    usize::try_from(bytes)
        .map_err(|_| DeviceError::InvalidArgument(format!("{what} of {bytes} bytes is too large")))
}

/// One physical allocation of device memory (`cuMemCreate`), released on drop
/// (`cuMemRelease`). Mapping it into a reserved range keeps the memory alive until it is also
/// unmapped, as the driver counts both references.
#[derive(Debug)]
pub struct PhysicalMemory {
    handle: sys::CUmemGenericAllocationHandle,
    bytes: u64,
}

impl PhysicalMemory {
    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for PhysicalMemory {
    fn drop(&mut self) {
        // SAFETY: `handle` came from cuMemCreate and is released once, here. A failure leaves
        // the memory to the driver, which reclaims it at process exit; nothing can be reported
        // from a destructor.
        let _ = unsafe { sys::cuMemRelease(self.handle) };
    }
}

impl Current<'_> {
    /// The granularity of physical allocations for device memory on this device
    /// (`cuMemGetAllocationGranularity`, `CU_MEM_ALLOC_GRANULARITY_MINIMUM`): sizes passed to
    /// [`Current::mem_create`] and mapping offsets must be multiples of it.
    pub fn allocation_granularity(&self) -> Result<u64, DeviceError> {
        self.check()?;
        let properties = device_memory_properties(self.context.device);
        let mut granularity = 0usize;
        // SAFETY: writes one size_t; `properties` lives across the call.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &properties,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .result()
        .map_err(failed("cuMemGetAllocationGranularity"))?;
        Ok(granularity as u64)
    }

    /// Reserves `bytes` of virtual address space, no memory behind it
    /// (`cuMemAddressReserve(&ptr, bytes, 0, 0, 0)`: default alignment, no address hint, as
    /// PyTorch's expandable segments do).
    pub fn address_reserve(&self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.check()?;
        let size = driver_size(bytes, "an address reservation")?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: writes one CUdeviceptr.
        unsafe { sys::cuMemAddressReserve(&mut base, size, 0, 0, 0) }
            .result()
            .map_err(failed("cuMemAddressReserve"))?;
        Ok(DevicePtr::cuda(base, self.context.device.ordinal))
    }

    /// Frees a reservation made by [`Current::address_reserve`] (`cuMemAddressFree`).
    ///
    /// # Safety
    /// `base` and `bytes` must be exactly one reservation's, with nothing mapped in it.
    pub unsafe fn address_free(&self, base: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.check()?;
        let size = driver_size(bytes, "an address reservation")?;
        // SAFETY: as the caller promises.
        unsafe { sys::cuMemAddressFree(base.addr(), size) }
            .result()
            .map_err(failed("cuMemAddressFree"))
    }

    /// A physical allocation of `bytes` of device memory (`cuMemCreate`);
    /// [`DeviceError::OutOfMemory`] when the device has no room.
    pub fn mem_create(&self, bytes: u64) -> Result<PhysicalMemory, DeviceError> {
        self.check()?;
        let size = driver_size(bytes, "a physical allocation")?;
        let properties = device_memory_properties(self.context.device);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: writes one handle; `properties` lives across the call.
        unsafe { sys::cuMemCreate(&mut handle, size, &properties, 0) }
            .result()
            .map_err(failed_allocating("cuMemCreate"))?;
        Ok(PhysicalMemory { handle, bytes })
    }

    /// Maps all of `memory` at `address` (`cuMemMap`, offset 0).
    ///
    /// # Safety
    /// `address .. address + memory.bytes()` must lie inside a reservation of this context and
    /// be unmapped.
    pub unsafe fn map(
        &self,
        address: DevicePtr,
        memory: &PhysicalMemory,
    ) -> Result<(), DeviceError> {
        self.check()?;
        let size = driver_size(memory.bytes, "a mapping")?;
        // SAFETY: as the caller promises.
        unsafe { sys::cuMemMap(address.addr(), size, 0, memory.handle, 0) }
            .result()
            .map_err(failed_allocating("cuMemMap"))
    }

    /// Grants this device read-write access to `[address, address + bytes)`
    /// (`cuMemSetAccess`); mapped memory is inaccessible until then.
    ///
    /// # Safety
    /// The range must be mapped.
    pub unsafe fn set_access(&self, address: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.check()?;
        let size = driver_size(bytes, "an access range")?;
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.context.device.ordinal as i32,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one descriptor, living across the call; the range is mapped as promised.
        unsafe { sys::cuMemSetAccess(address.addr(), size, &access, 1) }
            .result()
            .map_err(failed_allocating("cuMemSetAccess"))
    }

    /// Unmaps `[address, address + bytes)` (`cuMemUnmap`); the physical memory is freed when
    /// its [`PhysicalMemory`] is dropped too.
    ///
    /// # Safety
    /// The range must be mapped, and no queued work may still use it.
    pub unsafe fn unmap(&self, address: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.check()?;
        let size = driver_size(bytes, "an unmapping")?;
        // SAFETY: as the caller promises.
        unsafe { sys::cuMemUnmap(address.addr(), size) }
            .result()
            .map_err(failed("cuMemUnmap"))
    }
}

/// A module loaded into a primary context (`CUmodule`), unloaded on drop. Kept alive by every
/// [`Function`] taken from it.
#[derive(Debug)]
pub struct Module {
    raw: sys::CUmodule,
    context: Arc<PrimaryContext>,
}

// SAFETY: a CUmodule is an opaque driver handle, valid on any thread where its context is
// current; every use below makes `context` current first, and Drop unloads it with the context
// pushed.
unsafe impl Send for Module {}
// SAFETY: as above; shared access only looks functions and globals up.
unsafe impl Sync for Module {}

impl Module {
    /// Loads PTX text into `context` (`cuModuleLoadData`); the driver compiles it to machine
    /// code for the device (its JIT cache keeps that on disk between runs).
    pub fn load_ptx(context: &Arc<PrimaryContext>, ptx: &str) -> Result<Arc<Module>, DeviceError> {
        let image = CString::new(ptx)
            .map_err(|_| DeviceError::InvalidArgument("PTX text contains NUL".into()))?;
        context.ensure_current()?;
        // SAFETY: `image` is NUL-terminated PTX text and the context is current. The module is
        // unloaded in Drop.
        let raw = unsafe { cu::module::load_data(image.as_ptr().cast()) }
            .map_err(failed("cuModuleLoadData"))?;
        Ok(Arc::new(Module {
            raw,
            context: Arc::clone(context),
        }))
    }

    /// The kernel `name` (declared `extern "C" __global__` in the source).
    pub fn function(self: &Arc<Self>, name: &str) -> Result<Function, DeviceError> {
        let c_name = CString::new(name)
            .map_err(|_| DeviceError::InvalidArgument(format!("bad kernel name {name:?}")))?;
        self.context.ensure_current()?;
        // SAFETY: `raw` is a loaded module; the context is current.
        let raw = unsafe { cu::module::get_function(self.raw, c_name) }
            .map_err(failed_for(name, "cuModuleGetFunction"))?;
        Ok(Function {
            raw,
            name: name.to_string(),
            module: Arc::clone(self),
        })
    }

    /// The address and size of the module's global variable `name` (a `__device__` array).
    pub fn global(&self, name: &str) -> Result<(DevicePtr, usize), DeviceError> {
        let c_name = CString::new(name)
            .map_err(|_| DeviceError::InvalidArgument(format!("bad symbol name {name:?}")))?;
        self.context.ensure_current()?;
        // SAFETY: `raw` is a loaded module; the context is current.
        let (ptr, bytes) = unsafe { cu::module::get_global(self.raw, c_name) }
            .map_err(failed("cuModuleGetGlobal"))?;
        Ok((DevicePtr::cuda(ptr, self.context.device.ordinal), bytes))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let raw = self.raw;
        // SAFETY: no Function of this module is left (each holds an Arc of it), so nothing uses
        // the module after this; the context is pushed around the call, whatever thread drops.
        let _ = self
            .context
            .with_pushed(|| unsafe { cu::module::unload(raw) });
    }
}

/// A kernel of a loaded [`Module`] (`CUfunction`), which it keeps loaded.
#[derive(Debug, Clone)]
pub struct Function {
    raw: sys::CUfunction,
    name: String,
    module: Arc<Module>,
}

// SAFETY: a CUfunction is an opaque driver handle, valid on any thread where its module's
// context is current; launches take a `Current` of that thread, and `module` keeps it loaded.
unsafe impl Send for Function {}
// SAFETY: as above; launching from several threads at once is allowed by the driver.
unsafe impl Sync for Function {}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Thread blocks of `threads` threads one multiprocessor can hold at once
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`, no dynamic shared memory); at least 1.
    pub fn resident_blocks_per_multiprocessor(&self, threads: u32) -> Result<u32, DeviceError> {
        self.module.context.ensure_current()?;
        let threads = i32::try_from(threads)
            .map_err(|_| DeviceError::InvalidArgument(format!("{threads} threads per block")))?;
        // SAFETY: `raw` is a function of a loaded module; the context is current.
        let blocks =
            unsafe { cu::occupancy::max_active_block_per_multiprocessor(self.raw, threads, 0) }
                .map_err(failed_for(
                    &self.name,
                    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                ))?;
        Ok(u32::try_from(blocks).unwrap_or(0).max(1))
    }

    /// Launches the kernel on `current`'s stream ([`Current::on`]; the legacy default stream
    /// unless chosen) with `grid` blocks of `threads` threads.
    ///
    /// # Safety
    /// `params` must point at live values of exactly the kernel's parameter types, in order, and
    /// every device address among them must be valid memory of the sizes the kernel touches.
    pub unsafe fn launch(
        &self,
        current: &Current<'_>,
        grid: u32,
        threads: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), DeviceError> {
        current.check()?;
        // SAFETY: as the caller promises; the module is loaded (held by `self.module`) in the
        // current context.
        unsafe {
            cu::launch_kernel(
                self.raw,
                (grid, 1, 1),
                (threads, 1, 1),
                0,
                current.stream.raw,
                params,
            )
        }
        .map_err(failed_for(&self.name, "cuLaunchKernel"))
    }
}

/// A pointer to `value` as a kernel parameter (for [`Function::launch`]).
pub fn param<T>(value: &mut T) -> *mut c_void {
    (value as *mut T).cast()
}

/// A CUDA event (`CUevent`) for timing work on the legacy default stream; destroyed on drop.
/// Only `gpumem bench randn` times kernels, so only the `bench-internals` feature has it.
#[cfg(feature = "bench-internals")]
#[derive(Debug)]
pub struct Event<'a> {
    raw: sys::CUevent,
    context: &'a PrimaryContext,
}

#[cfg(feature = "bench-internals")]
impl<'a> Event<'a> {
    /// A new event with timing enabled (`cuEventCreate`, default flags).
    pub fn new(current: &Current<'a>) -> Result<Event<'a>, DeviceError> {
        current.check()?;
        let raw = cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(failed("cuEventCreate"))?;
        Ok(Event {
            raw,
            context: current.context,
        })
    }

    /// Records the event after all work launched so far (`cuEventRecord`).
    pub fn record(&self) -> Result<(), DeviceError> {
        self.context.ensure_current()?;
        // SAFETY: `raw` is a live event of the current context.
        unsafe { cu::event::record(self.raw, cu::stream::null()) }.map_err(failed("cuEventRecord"))
    }

    /// Waits until the recorded work has finished (`cuEventSynchronize`).
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        // SAFETY: `raw` is a live event.
        unsafe { cu::event::synchronize(self.raw) }.map_err(failed("cuEventSynchronize"))
    }

    /// Milliseconds from `start`'s recording to this one's (`cuEventElapsedTime`); both must have
    /// completed.
    pub fn elapsed_since(&self, start: &Event<'_>) -> Result<f32, DeviceError> {
        // SAFETY: both are live events.
        unsafe { cu::event::elapsed(start.raw, self.raw) }.map_err(failed("cuEventElapsedTime"))
    }
}

#[cfg(feature = "bench-internals")]
impl Drop for Event<'_> {
    fn drop(&mut self) {
        let raw = self.raw;
        // SAFETY: the event is not used after this; destroying it does not wait for it.
        let _ = self
            .context
            .with_pushed(|| unsafe { cu::event::destroy(raw) });
    }
}

/// A stream of a primary context (`CUstream`), or the legacy default stream (the null handle).
/// A plain handle: streams made by [`Current::create_stream`] are never destroyed, as PyTorch
/// never destroys the streams of its pools; the driver reclaims them with the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream {
    raw: sys::CUstream,
}

// SAFETY: a CUstream is an opaque driver handle that gpumem never dereferences; the driver
// accepts it from any thread on which its context is current.
unsafe impl Send for Stream {}
// SAFETY: as above; a `Stream` offers no interior mutability.
unsafe impl Sync for Stream {}

impl Stream {
    /// The legacy default stream (the null `CUstream`): the allocator's stream 0, which every
    /// thread of the process shares, as PyTorch's default stream. Streams made by
    /// [`Current::create_stream`] do not synchronise with it implicitly.
    pub const LEGACY_DEFAULT: Stream = Stream {
        raw: std::ptr::null_mut(),
    };

    /// Whether this is the legacy default stream.
    pub fn is_legacy_default(self) -> bool {
        self.raw.is_null()
    }
}

impl Current<'_> {
    /// A new stream of this context that runs concurrently with the legacy default stream
    /// (`cuStreamCreate` with `CU_STREAM_NON_BLOCKING`, as PyTorch creates the streams of its
    /// pools). Never destroyed (see [`Stream`]).
    pub fn create_stream(&self) -> Result<Stream, DeviceError> {
        self.check()?;
        let raw = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(failed("cuStreamCreate"))?;
        Ok(Stream { raw })
    }

    /// Waits until everything queued on `stream` has finished (`cuStreamSynchronize`).
    pub fn synchronize_stream(&self, stream: Stream) -> Result<(), DeviceError> {
        self.check()?;
        // SAFETY: `stream` is the legacy default stream or a stream of this context, never
        // destroyed.
        unsafe { cu::stream::synchronize(stream.raw) }.map_err(failed("cuStreamSynchronize"))
    }

    /// Makes work queued on `waiter` from now on wait for the work queued on `other` so far
    /// (`cuEventRecord` of a new event on `other`, `cuStreamWaitEvent` on `waiter`, the event
    /// destroyed at once: the driver keeps the wait, and frees the event once it completes).
    pub fn wait_stream(&self, waiter: Stream, other: Stream) -> Result<(), DeviceError> {
        self.check()?;
        let event = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(failed("cuEventCreate"))?;
        // SAFETY: `event` is a live event of this context and both streams are of this context
        // (or the legacy default one); the event is destroyed once, after its last use.
        let waited = unsafe {
            cu::event::record(event, other.raw)
                .map_err(failed("cuEventRecord"))
                .and_then(|()| {
                    cu::stream::wait_event(
                        waiter.raw,
                        event,
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    )
                    .map_err(failed("cuStreamWaitEvent"))
                })
        };
        // SAFETY: as above; not used after this.
        let _ = unsafe { cu::event::destroy(event) };
        waited
    }
}

impl PrimaryContext {
    /// Records a [`Marker`] on `stream` (a stream of this context, or the legacy default
    /// one) after the work queued on it so far.
    pub fn record_marker(self: &Arc<Self>, stream: Stream) -> Result<Marker, DeviceError> {
        self.ensure_current()?;
        // Timing disabled, as PyTorch's allocator creates its events: cheaper to record and
        // query.
        let raw = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(failed("cuEventCreate"))?;
        let marker = Marker {
            raw,
            context: Arc::clone(self),
        };
        // SAFETY: `raw` is a live event of this context; `stream` is of this context.
        unsafe { cu::event::record(marker.raw, stream.raw) }.map_err(failed("cuEventRecord"))?;
        Ok(marker)
    }
}

/// An event recorded on a stream (`cuEventRecord` of an event without timing): what the
/// caching allocator waits for before it reuses a block used on another stream
/// (`record_stream`). Destroyed on drop, in its device's primary context, which the driver
/// allows before the event completes.
#[derive(Debug)]
pub struct Marker {
    raw: sys::CUevent,
    /// The context that made the event, retained until it is destroyed.
    context: Arc<PrimaryContext>,
}

// SAFETY: a CUevent is an opaque driver handle that gpumem never dereferences; the driver
// accepts it from any thread on which its context is current, and Drop makes it current.
unsafe impl Send for Marker {}
// SAFETY: as above; `&Marker` offers nothing but its handle to this module's calls.
unsafe impl Sync for Marker {}

impl Marker {
    /// Whether the work the marker follows has finished (`cuEventQuery`: `CUDA_SUCCESS` or
    /// `CUDA_ERROR_NOT_READY`; anything else is an error). Never waits.
    pub fn is_done(&self) -> Result<bool, DeviceError> {
        self.context.ensure_current()?;
        // SAFETY: `raw` is a live, recorded event of the current context.
        match unsafe { cu::event::query(self.raw) } {
            Ok(()) => Ok(true),
            Err(error) if error.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(error) => Err(failed("cuEventQuery")(error)),
        }
    }

    /// Waits until the work the marker follows has finished (`cuEventSynchronize`).
    pub fn wait(&self) -> Result<(), DeviceError> {
        self.context.ensure_current()?;
        // SAFETY: `raw` is a live, recorded event of the current context.
        unsafe { cu::event::synchronize(self.raw) }.map_err(failed("cuEventSynchronize"))
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        let raw = self.raw;
        // SAFETY: the event is not used after this; destroying it does not wait for it.
        let _ = self
            .context
            .with_pushed(|| unsafe { cu::event::destroy(raw) });
    }
}
