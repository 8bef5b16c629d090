//! A real CUDA GPU through cudarc's driver API: the primary context of one device (created
//! lazily, on the first call that needs it), segments from plain `cuMemAlloc`/`cuMemFree`
//! exactly as PyTorch's allocator gets them from `cudaMalloc`/`cudaFree`, and the driver's
//! free/total figures.
//!
//! cudarc loads libcuda at run time and panics when the library or a symbol is missing, so
//! [`CudaGpu::open`] checks the library and every symbol gpumem calls before the first call.
//! Stream-ordered pools, managed memory and `CudaSlice` are deliberately not used: they would
//! hide segments in the driver's own pool, out of the allocator's (and NVML's) sight.

use std::cell::OnceCell;
use std::rc::Rc;

use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;

use super::kernels::Kernels;
use super::nvml::DriverView;
use super::{DeviceError, DeviceMemory, DriverMemory, ProcessMemory};

/// The oldest driver the bindings work with: gpumem is built against CUDA 13.0's driver API
/// (`cuda-13000`), whose versioned entry points (e.g. `cuEventElapsedTime_v2`) older drivers
/// lack.
pub const MIN_DRIVER_VERSION: i32 = 13_000;

/// Driver entry points gpumem calls; each is checked before the first call.
const DRIVER_SYMBOLS: [&str; 28] = [
    "cuInit",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
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
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleGetGlobal_v2",
    "cuLaunchKernel",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventElapsedTime_v2",
    "cuEventDestroy_v2",
];

/// `NAME (description)` for a driver error.
pub fn describe(error: DriverError) -> String {
    let name = error
        .error_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", error.0));
    match error.error_string() {
        Ok(text) => format!("{name} ({})", text.to_string_lossy()),
        Err(_) => name,
    }
}

/// A driver error as a [`DeviceError`], naming the call that failed.
pub fn driver_error(call: &str, error: DriverError) -> DeviceError {
    if error.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        DeviceError::OutOfMemory
    } else {
        DeviceError::Driver(format!("{call} failed: {}", describe(error)))
    }
}

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
                unsafe { library.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err()
            })
            .collect::<Vec<&str>>()
    }};
}
pub(crate) use missing_symbols;

/// One CUDA device and, once something needed it, its primary context and compiled kernels.
/// Shared (`Rc`) by the [`CudaDevice`] the allocator owns and the tensor layer's CUDA
/// backend, so both use the same context.
pub struct CudaGpu {
    ordinal: usize,
    device: sys::CUdevice,
    name: String,
    uuid: String,
    total: u64,
    compute_capability: (i32, i32),
    /// Streaming multiprocessors (sizes grid-stride launches).
    multiprocessors: u32,
    context: OnceCell<sys::CUcontext>,
    kernels: OnceCell<Kernels>,
    /// NVML's view of the device, opened before the context existed so its baseline excludes
    /// it; the reason when NVML is unavailable.
    driver_view: Result<DriverView, String>,
}

impl CudaGpu {
    /// The handle of device `ordinal`, shared by every session of this thread so that the
    /// process has one primary context, one compiled kernel module and one NVML baseline per
    /// device (as PyTorch has). The first call finds the device without creating a context;
    /// it fails with a sentence saying why when the driver library or one of its symbols is
    /// missing, the driver is older than [`MIN_DRIVER_VERSION`], there is no device, or the
    /// ordinal is out of range.
    pub fn open(ordinal: usize) -> Result<Rc<CudaGpu>, String> {
        thread_local! {
            static OPENED: std::cell::RefCell<Vec<Rc<CudaGpu>>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        if let Some(gpu) = OPENED.with(|opened| {
            opened
                .borrow()
                .iter()
                .find(|gpu| gpu.ordinal == ordinal)
                .map(Rc::clone)
        }) {
            return Ok(gpu);
        }
        let gpu = Rc::new(Self::find(ordinal)?);
        OPENED.with(|opened| opened.borrow_mut().push(Rc::clone(&gpu)));
        Ok(gpu)
    }

    /// Looks device `ordinal` up and opens NVML's view of it (before any context exists, so
    /// the view's baseline leaves the context out).
    fn find(ordinal: usize) -> Result<CudaGpu, String> {
        // SAFETY: only tries to load the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(
                "the CUDA driver library (libcuda.so) was not found; is an NVIDIA driver installed?"
                    .into(),
            );
        }
        let missing = missing_symbols!(sys::culib, DRIVER_SYMBOLS);
        if !missing.is_empty() {
            return Err(format!(
                "the CUDA driver library lacks {} (driver too old for CUDA 13.0)",
                missing.join(", ")
            ));
        }
        cu::init().map_err(|error| format!("cuInit failed: {}", describe(error)))?;
        let mut version = 0;
        // SAFETY: writes one int; the symbol was checked above.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(|error| format!("cuDriverGetVersion failed: {}", describe(error)))?;
        if version < MIN_DRIVER_VERSION {
            return Err(format!(
                "the driver supports CUDA {}.{}, gpumem needs CUDA 13.0 or newer",
                version / 1000,
                version % 1000 / 10
            ));
        }
        let count = cu::device::get_count()
            .map_err(|error| format!("cuDeviceGetCount failed: {}", describe(error)))?;
        let count = usize::try_from(count).unwrap_or(0);
        if count == 0 {
            return Err("the driver reports no CUDA device".into());
        }
        if ordinal >= count {
            return Err(format!(
                "device index {ordinal} is out of range: {count} CUDA device{} found (cuda:0{})",
                if count == 1 { "" } else { "s" },
                if count > 1 {
                    format!(" .. cuda:{}", count - 1)
                } else {
                    String::new()
                }
            ));
        }
        fn fail(call: &'static str) -> impl Fn(DriverError) -> String {
            move |error| format!("{call} failed: {}", describe(error))
        }
        let device = cu::device::get(ordinal as i32).map_err(fail("cuDeviceGet"))?;
        let name = cu::device::get_name(device).map_err(fail("cuDeviceGetName"))?;
        let uuid = format_uuid(&cu::device::get_uuid(device).map_err(fail("cuDeviceGetUuid"))?);
        // SAFETY: `device` came from cuDeviceGet.
        let total = unsafe { cu::device::total_mem(device) }.map_err(fail("cuDeviceTotalMem"))?;
        let attribute = |which| {
            // SAFETY: `device` came from cuDeviceGet.
            unsafe { cu::device::get_attribute(device, which) }
                .map_err(fail("cuDeviceGetAttribute"))
        };
        let major =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let multiprocessors =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let driver_view = DriverView::open(&uuid, ordinal);
        Ok(CudaGpu {
            ordinal,
            device,
            name,
            uuid,
            total: total as u64,
            compute_capability: (major, minor),
            multiprocessors: multiprocessors.max(1) as u32,
            context: OnceCell::new(),
            kernels: OnceCell::new(),
            driver_view,
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The marketing name (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, the form NVML uses.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// `(major, minor)` compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Makes the device's primary context current, creating it on first use. Every call that
    /// touches device memory goes through here.
    pub fn activate(&self) -> Result<(), DeviceError> {
        if self.context.get().is_some() {
            return Ok(());
        }
        // SAFETY: `self.device` came from cuDeviceGet; the context is retained for the rest of
        // the process (the driver releases it at exit), and made current on this thread, the
        // only one gpumem uses.
        // Not `driver_error`: a context that cannot be created is no segment the allocator
        // could free its cache for, so even an out-of-memory here is reported as it is.
        let context = unsafe { cu::primary_ctx::retain(self.device) }.map_err(|error| {
            DeviceError::Driver(format!(
                "cannot create the CUDA context: cuDevicePrimaryCtxRetain failed: {}",
                describe(error)
            ))
        })?;
        // SAFETY: `context` was just retained.
        unsafe { cu::ctx::set_current(context) }
            .map_err(|error| driver_error("cuCtxSetCurrent", error))?;
        let _ = self.context.set(context);
        Ok(())
    }

    /// Waits until every kernel launched on the device has finished (`cuCtxSynchronize`);
    /// kernel launches return before the kernel runs.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        if self.context.get().is_none() {
            return Ok(());
        }
        cu::ctx::synchronize().map_err(|error| driver_error("cuCtxSynchronize", error))
    }

    /// The value kernels, compiled with NVRTC for this device on first use (once per process,
    /// since sessions share the handle).
    pub fn kernels(&self) -> Result<&Kernels, DeviceError> {
        if let Some(kernels) = self.kernels.get() {
            return Ok(kernels);
        }
        self.activate()?;
        let kernels = Kernels::load(self.compute_capability, self.multiprocessors)?;
        Ok(self.kernels.get_or_init(|| kernels))
    }
}

/// Formats a CUDA UUID as NVML prints it.
fn format_uuid(uuid: &sys::CUuuid) -> String {
    let hex: Vec<String> = uuid
        .bytes
        .iter()
        .map(|&byte| format!("{:02x}", byte as u8))
        .collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

/// The [`DeviceMemory`] of a CUDA GPU: what the caching allocator draws segments from.
pub struct CudaDevice {
    gpu: Rc<CudaGpu>,
}

impl CudaDevice {
    /// The device of `gpu`.
    pub fn new(gpu: Rc<CudaGpu>) -> CudaDevice {
        CudaDevice { gpu }
    }

    /// The shared device handle (for the value backend).
    pub fn gpu(&self) -> &Rc<CudaGpu> {
        &self.gpu
    }
}

impl DeviceMemory for CudaDevice {
    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        self.gpu.activate()?;
        let size = usize::try_from(bytes)
            .map_err(|_| DeviceError::Driver(format!("cannot allocate {bytes} bytes")))?;
        // SAFETY: the context is current; the segment is freed only through `free`.
        unsafe { cu::malloc_sync(size) }.map_err(|error| driver_error("cuMemAlloc", error))
    }

    fn free(&mut self, address: u64) -> Result<(), DeviceError> {
        self.gpu.activate()?;
        // SAFETY: the allocator frees only addresses `malloc` returned, once.
        unsafe { cu::free_sync(address) }.map_err(|error| driver_error("cuMemFree", error))
    }

    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.gpu.activate()?;
        cu::mem_get_info()
            .map(|(free, total)| (free as u64, total as u64))
            .map_err(|error| driver_error("cuMemGetInfo", error))
    }

    fn total_memory(&self) -> u64 {
        self.gpu.total
    }

    fn index(&self) -> usize {
        self.gpu.ordinal
    }

    fn process_memory(&self) -> Vec<ProcessMemory> {
        match &self.gpu.driver_view {
            Ok(view) => view.processes().unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    fn label(&self) -> String {
        format!("cuda:{}", self.gpu.ordinal)
    }

    fn driver_memory(&self) -> Result<DriverMemory, DeviceError> {
        match &self.gpu.driver_view {
            Ok(view) => view.read(),
            Err(reason) => Err(DeviceError::Driver(format!(
                "NVML is unavailable: {reason}"
            ))),
        }
    }
}
