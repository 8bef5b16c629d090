//! Where bytes live: the [`DeviceMemory`] trait the caching allocator draws segments from, and
//! its implementations — a simulated GPU ([`sim`]) and a real CUDA device through cudarc
//! ([`cuda`]) — plus the driver's own view of memory ([`nvml`]).
//!
//! The allocator knows devices only through this trait: it asks for whole segments on a cache
//! miss (`cudaMalloc`), returns them on `empty_cache` (`cudaFree`) and reads the driver's free and
//! total figures for its OOM message (`cudaMemGetInfo`).

pub mod cuda;
pub mod kernels;
pub mod nvml;
pub mod sim;
pub mod spec;

pub use spec::DeviceSpec;

use thiserror::Error;

/// Why a device refused or failed a request.
///
/// The allocator answers [`DeviceError::OutOfMemory`] by freeing cached segments and retrying;
/// every other variant it passes on unchanged, with the message its `Display` gives.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeviceError {
    /// The device has no room for the segment (`cudaErrorMemoryAllocation`). The allocator
    /// answers this by freeing cached segments and retrying, then by raising its OOM error.
    #[error("out of device memory")]
    OutOfMemory,
    /// A CUDA driver call failed.
    #[error("{call} failed: {code} ({description})")]
    Driver {
        /// The driver entry point, e.g. `cuMemAlloc`.
        call: &'static str,
        /// The driver's name for the error, e.g. `CUDA_ERROR_INVALID_VALUE`.
        code: String,
        /// The driver's sentence for it (`cuGetErrorString`).
        description: String,
    },
    /// A driver call about one kernel (looking it up, launching it) failed.
    #[error("kernel {kernel}: {error}")]
    Kernel {
        /// The kernel's name in its CUDA source.
        kernel: String,
        /// What failed.
        error: Box<DeviceError>,
    },
    /// The primary CUDA context could not be created. Never an out-of-memory the allocator could
    /// free its cache for, even when the driver ran out of memory creating it.
    #[error("cannot create the CUDA context: {0}")]
    Context(Box<DeviceError>),
    /// Something gpumem needs is missing or too old: the driver library or one of its symbols,
    /// NVRTC, NVML, a driver new enough.
    #[error("{0}")]
    Unavailable(String),
    /// No device with this ordinal.
    #[error("{}", no_such_device(*.ordinal, *.count))]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// The device cannot do this at all (e.g. a [`DeviceMemory`] call it does not implement).
    #[error("{0}")]
    Unsupported(String),
    /// The request itself is invalid: zero bytes, an address that is not a segment, a misaligned
    /// or oversized argument.
    #[error("{0}")]
    InvalidArgument(String),
    /// NVRTC rejected a kernel source (a bug in gpumem's CUDA code).
    #[error("compiling {source_name} with NVRTC failed: {log}")]
    Compile {
        /// The source's name (`values.cu`).
        source_name: String,
        /// NVRTC's message and log.
        log: String,
    },
    /// An NVML call failed.
    #[error("NVML {call} failed: {message}")]
    Nvml {
        /// The NVML function, e.g. `nvmlDeviceGetMemoryInfo_v2`.
        call: &'static str,
        /// nvml-wrapper's message.
        message: String,
    },
}

/// The sentence for [`DeviceError::NoSuchDevice`].
fn no_such_device(ordinal: usize, count: usize) -> String {
    match count {
        0 => "the driver reports no CUDA device".to_string(),
        1 => format!("device index {ordinal} is out of range: 1 CUDA device found (cuda:0)"),
        _ => format!(
            "device index {ordinal} is out of range: {count} CUDA devices found (cuda:0 .. cuda:{})",
            count - 1
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_sentences() {
        let driver = DeviceError::Driver {
            call: "cuMemFree",
            code: "CUDA_ERROR_INVALID_VALUE".into(),
            description: "invalid argument".into(),
        };
        assert_eq!(
            driver.to_string(),
            "cuMemFree failed: CUDA_ERROR_INVALID_VALUE (invalid argument)"
        );
        let context = DeviceError::Context(Box::new(DeviceError::Driver {
            call: "cuDevicePrimaryCtxRetain",
            code: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            description: "out of memory".into(),
        }));
        assert_eq!(
            context.to_string(),
            "cannot create the CUDA context: cuDevicePrimaryCtxRetain failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
        );
        assert_ne!(context, DeviceError::OutOfMemory);
        let kernel = DeviceError::Kernel {
            kernel: "randn_f32".into(),
            error: Box::new(driver),
        };
        assert!(kernel
            .to_string()
            .starts_with("kernel randn_f32: cuMemFree failed"));
        let none = |ordinal, count| DeviceError::NoSuchDevice { ordinal, count }.to_string();
        assert_eq!(none(0, 0), "the driver reports no CUDA device");
        assert_eq!(
            none(3, 1),
            "device index 3 is out of range: 1 CUDA device found (cuda:0)"
        );
        assert_eq!(
            none(9, 8),
            "device index 9 is out of range: 8 CUDA devices found (cuda:0 .. cuda:7)"
        );
        assert_eq!(
            DeviceError::Nvml {
                call: "nvmlDeviceGetMemoryInfo_v2",
                message: "Uninitialized".into()
            }
            .to_string(),
            "NVML nvmlDeviceGetMemoryInfo_v2 failed: Uninitialized"
        );
    }
}

/// One process's use of the device as the driver reports it (NVML's per-process figure).
/// PyTorch lists these in its OOM message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessMemory {
    /// Operating-system process id.
    pub pid: u32,
    /// Whether this is the process gpumem runs in.
    pub is_current: bool,
    /// Bytes of device memory the driver attributes to the process (context, modules and
    /// everything it allocated).
    pub used_bytes: u64,
}

/// The driver's account of device memory: the figures `device_memory()` shows, explaining
/// where memory went before any tensor exists (driver reservation, CUDA context).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverMemory {
    /// How `process_bytes` was found: `"nvml-pid"` (NVML lists this process), `"device-delta"`
    /// (the rise in the device's used memory since before the context was created, when NVML
    /// does not list this pid, as inside some containers) or `"sim-model"`.
    pub method: &'static str,
    /// Installed memory.
    pub total_bytes: u64,
    /// NVML's version-1 "used" (total − free), the figure nvidia-smi shows.
    pub used_bytes: u64,
    /// NVML's version-2 "used", which leaves out what the driver reserves.
    pub used_v2_bytes: u64,
    /// Free memory.
    pub free_bytes: u64,
    /// Memory the driver keeps for itself before any process runs.
    pub driver_reserved_bytes: u64,
    /// This process's usage: its context, loaded modules and allocated segments.
    pub process_bytes: u64,
    /// Every other process's usage.
    pub other_processes_bytes: u64,
}

/// A device the caching allocator can draw whole segments from.
///
/// The calls mirror the CUDA runtime calls PyTorch's allocator makes: `cudaMalloc`,
/// `cudaFree`, `cudaMemGetInfo` and `totalGlobalMem`.
pub trait DeviceMemory {
    /// Reserves a segment of exactly `bytes` bytes and returns its device address.
    /// Fails with [`DeviceError::OutOfMemory`] when the device cannot fit it.
    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError>;
    /// Returns a segment obtained from [`DeviceMemory::malloc`].
    fn free(&mut self, address: u64) -> Result<(), DeviceError>;
    /// `(free, total)` bytes as `cudaMemGetInfo` reports them.
    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError>;
    /// The device's total memory (`cudaDeviceProp::totalGlobalMem`); the base of
    /// `set_per_process_memory_fraction`.
    fn total_memory(&self) -> u64;
    /// The device ordinal PyTorch prints as "GPU N" / "device ID N".
    fn index(&self) -> usize;
    /// Per-process usage as the driver sees it, for the OOM message's "this process has ... in
    /// use" clause. Empty when the driver's view is unavailable (PyTorch then omits the clause).
    fn process_memory(&self) -> Vec<ProcessMemory>;
    /// A short label such as `sim` or `cuda:0`, used in tensor displays.
    fn label(&self) -> String;
    /// The driver's view of the whole device (NVML on a GPU, the model on sim).
    fn driver_memory(&self) -> Result<DriverMemory, DeviceError> {
        Err(DeviceError::Unsupported(
            "this device has no driver view of memory".into(),
        ))
    }
}
