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
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeviceError {
    /// The device has no room for the segment (`cudaErrorMemoryAllocation`). The allocator
    /// answers this by freeing cached segments and retrying, then by raising its OOM error.
    #[error("out of device memory")]
    OutOfMemory,
    /// Any other driver failure; the allocator passes it on unchanged.
    #[error("{0}")]
    Driver(String),
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
        Err(DeviceError::Driver(
            "this device has no driver view of memory".into(),
        ))
    }
}
