//! Where bytes live: the [`DeviceMemory`] trait the caching allocator draws segments from, and
//! its implementations — a simulated GPU ([`sim`]) and a real CUDA device through cudarc
//! ([`cuda`]) — plus the driver's own view of memory (NVML, [`DriverMemory`]).
//!
//! Device memory is named by [`DevicePtr`]s, which only a device makes, and kernels write only
//! into [`DeviceSpan`]s borrowed from the memory's owner. The driver wrappers, NVRTC, NVML and
//! the kernels themselves are crate-private; the `bench-internals` feature (on by default, for
//! the binary's `gpumem bench randn`) exposes what the benchmark needs in `device::bench`.
//!
//! The allocator knows devices only through this trait: it asks for whole segments on a cache
//! miss (`cudaMalloc`), returns them on `empty_cache` (`cudaFree`) and reads the driver's free and
//! total figures for its OOM message (`cudaMemGetInfo`). With `expandable_segments:True` it
//! uses the driver's virtual memory management instead (`cuMemAddressReserve`, `cuMemCreate` +
//! `cuMemMap` + `cuMemSetAccess`, `cuMemUnmap` + `cuMemRelease`, `cuMemAddressFree`).

mod address;
pub(crate) mod address_space;
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod bench;
pub mod cuda;
mod forward;
pub(crate) mod nvml;
pub mod sim;
mod span;
pub mod spec;
pub(crate) mod streams;

pub use address::{DevicePtr, MemorySpace};
pub(crate) use forward::forward_device_memory;
pub use span::DeviceSpan;
pub use spec::DeviceSpec;
pub use streams::StreamEvent;

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

/// The error the virtual-memory calls return on a device without them.
pub fn vmm_unsupported() -> DeviceError {
    DeviceError::Unsupported(
        "this device does not support virtual memory management (needed by expandable_segments:True)"
            .into(),
    )
}

/// A device the caching allocator can draw whole segments from.
///
/// The calls mirror the CUDA runtime calls PyTorch's allocator makes: `cudaMalloc`,
/// `cudaFree`, `cudaMemGetInfo` and `totalGlobalMem`, and for expandable segments the CUDA
/// driver's virtual memory management calls. The virtual-memory calls have default bodies that
/// refuse with [`vmm_unsupported`], so a device without them still works in every other mode.
///
/// Addresses are [`DevicePtr`]s, which only the device layer makes: an implementation outside
/// it wraps [`sim::SimDevice`] or [`cuda::CudaDevice`] and passes their addresses on.
///
/// # The virtual-memory contract (expandable segments)
///
/// The allocator reserves one virtual range per expandable segment, maps whole pages into it
/// and unmaps whole pages from it; it never touches a range it did not reserve.
/// - A *page* is `page` bytes, a multiple of [`DeviceMemory::allocation_granularity`] (the
///   allocator uses PyTorch's 2 MiB and 20 MiB). Each page is its own physical allocation (one
///   `cuMemCreate` handle of `page` bytes), as in PyTorch, so unmapping a page returns exactly
///   that page's memory.
/// - Mapped pages cost device memory: `mem_get_info`'s free figure drops by the bytes mapped
///   and rises again by the bytes unmapped. Reserved but unmapped address space costs none.
/// - Every address and size passed to `map_pages`/`unmap_pages` lies inside one range returned
///   by `reserve_address_range`, and is a multiple of `page` from that range's base.
pub trait DeviceMemory {
    /// Reserves a segment of exactly `bytes` bytes and returns its device address.
    /// Fails with [`DeviceError::OutOfMemory`] when the device cannot fit it.
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError>;
    /// Returns a segment obtained from this device's [`DeviceMemory::malloc`]; an address that
    /// is not one of its live segments is refused ([`DeviceError::InvalidArgument`]).
    fn free(&mut self, segment: DevicePtr) -> Result<(), DeviceError>;
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

    /// The smallest size and alignment of a physical allocation, in bytes
    /// (`cuMemGetAllocationGranularity` with `CU_MEM_ALLOC_GRANULARITY_MINIMUM` for pinned
    /// device memory on this device; 2 MiB on current NVIDIA GPUs). Pages passed to
    /// [`DeviceMemory::map_pages`] are multiples of it.
    fn allocation_granularity(&self) -> Result<u64, DeviceError> {
        Err(vmm_unsupported())
    }

    /// Reserves `bytes` of virtual address space and returns its base
    /// (`cuMemAddressReserve(&ptr, bytes, 0, 0, 0)`: default alignment, no address hint).
    /// `bytes` is a multiple of the page size the allocator will map, hence of the
    /// granularity; the base must be aligned to at least the granularity. No device memory is
    /// used. Fails with [`DeviceError::Driver`] when no such range is available (PyTorch raises
    /// a driver error then, not an out-of-memory error).
    fn reserve_address_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let _ = bytes;
        Err(vmm_unsupported())
    }

    /// Frees a range returned by [`DeviceMemory::reserve_address_range`]
    /// (`cuMemAddressFree(base, bytes)`): `base` and `bytes` are exactly the reservation's. The
    /// allocator unmaps every page of the range first. Freeing a range that is not reserved is
    /// an error ([`DeviceError::InvalidArgument`]), never a silent success.
    fn free_address_range(&mut self, base: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _ = (base, bytes);
        Err(vmm_unsupported())
    }

    /// Backs `[address, address + bytes)` with device memory, one physical allocation per page
    /// of `page` bytes: for each page `cuMemCreate(&handle, page, &prop, 0)` (pinned device
    /// memory on this device), then `cuMemMap(page_address, page, 0, handle, 0)`, then
    /// `cuMemSetAccess` for read-write access from this device over the whole range.
    ///
    /// `address` and `bytes` are multiples of `page` from the reservation's base, the range
    /// lies inside one reservation and none of its pages is mapped. All or nothing: when a
    /// page cannot be created for lack of memory (`CUDA_ERROR_OUT_OF_MEMORY`), release the
    /// handles this call already created, map nothing and return
    /// [`DeviceError::OutOfMemory`] — the allocator then frees cached memory and retries, as
    /// PyTorch does. Any other failure is [`DeviceError::Driver`].
    fn map_pages(&mut self, address: DevicePtr, bytes: u64, page: u64) -> Result<(), DeviceError> {
        let _ = (address, bytes, page);
        Err(vmm_unsupported())
    }

    /// Returns the pages of `[address, address + bytes)` to the device: for each page of `page`
    /// bytes `cuMemUnmap(page_address, page)` then `cuMemRelease(handle)`. Every page in the
    /// range was mapped by [`DeviceMemory::map_pages`] (possibly over several calls) and is
    /// unmapped exactly once; unmapping a page that is not mapped is an error
    /// ([`DeviceError::InvalidArgument`]). The memory may still be in use by queued work: as PyTorch
    /// does (`cudaStreamSynchronize`, or `cudaDeviceSynchronize` without a stream), wait for
    /// the device before unmapping.
    fn unmap_pages(
        &mut self,
        address: DevicePtr,
        bytes: u64,
        page: u64,
    ) -> Result<(), DeviceError> {
        let _ = (address, bytes, page);
        Err(vmm_unsupported())
    }

    // Streams and events (see [`streams`]). The allocator records an event on every stream a
    // freed block was used on (`record_stream`) and reuses the block once they completed.
    // The default bodies describe a device whose work is done by the time each call returns:
    // every event is complete once recorded and synchronising has nothing to wait for. The
    // simulated device queues work ([`streams::StreamWork`]); a CUDA device records real
    // driver events on real streams ([`cuda::CudaDevice`]). Stream ids are the allocator's
    // (0 = the default stream).

    /// Records an event on `stream` after the work queued on it so far (`cudaEventRecord` of
    /// an event from PyTorch's event pool).
    fn record_event(&mut self, stream: u64) -> Result<StreamEvent, DeviceError> {
        Ok(StreamEvent { stream, ticket: 0 })
    }

    /// Whether the work `event` follows has completed (`cudaEventQuery`: `cudaSuccess` or
    /// `cudaErrorNotReady`). Never waits.
    fn query_event(&self, event: StreamEvent) -> Result<bool, DeviceError> {
        let _ = event;
        Ok(true)
    }

    /// Waits until `event` has completed (`cudaEventSynchronize`).
    fn synchronize_event(&mut self, event: StreamEvent) -> Result<(), DeviceError> {
        let _ = event;
        Ok(())
    }

    /// Waits until everything queued on `stream` has completed (`cudaStreamSynchronize`).
    fn synchronize_stream(&mut self, stream: u64) -> Result<(), DeviceError> {
        let _ = stream;
        Ok(())
    }

    /// Waits until everything queued on every stream has completed (`cudaDeviceSynchronize`).
    fn synchronize_device(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// Makes work queued on `stream` from now on wait for the work queued on `other` so far
    /// (`torch.cuda.Stream.wait_stream`: an event recorded on `other`, waited for by `stream`).
    fn wait_stream(&mut self, stream: u64, other: u64) -> Result<(), DeviceError> {
        let _ = (stream, other);
        Ok(())
    }

    /// Queues work that keeps `stream` busy for about `millis` milliseconds (`gpu_sleep`'s
    /// kernel). The simulated device keeps the stream busy until the next synchronisation
    /// point instead (it has no clock). Refused by default.
    fn sleep(&mut self, stream: u64, millis: u64) -> Result<(), DeviceError> {
        let _ = (stream, millis);
        Err(DeviceError::Unsupported(
            "this device cannot queue work on a stream".into(),
        ))
    }
}
