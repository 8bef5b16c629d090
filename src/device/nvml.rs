//! The driver's own view of device memory through NVML (nvml-wrapper): what nvidia-smi calls
//! used, what the driver reserves, and what each process uses — including this one, whose
//! figure minus the allocator's reserved bytes is the CUDA context and loaded modules.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

use super::{DeviceError, DriverMemory, ProcessMemory};

/// NVML opened on one device, with the device's used memory from before this process created
/// its context (the baseline of the `device-delta` method).
pub struct DriverView {
    nvml: Nvml,
    uuid: String,
    index: u32,
    /// NVML's v1 used bytes when the view was opened (no context yet).
    baseline_used: u64,
}

fn nvml_error(call: &'static str, error: impl std::fmt::Display) -> DeviceError {
    DeviceError::Nvml {
        call,
        message: error.to_string(),
    }
}

impl DriverView {
    /// Opens NVML and finds the device by `uuid` (CUDA ordinals and NVML indices differ under
    /// `CUDA_VISIBLE_DEVICES`), falling back to NVML index `ordinal`. Call before the CUDA
    /// context exists.
    pub fn open(uuid: &str, ordinal: usize) -> Result<DriverView, DeviceError> {
        let nvml = Nvml::init()
            .map_err(|error| DeviceError::Unavailable(format!("cannot load NVML: {error}")))?;
        let index = match nvml.device_by_uuid(uuid) {
            Ok(device) => device
                .index()
                .map_err(|error| nvml_error("nvmlDeviceGetIndex", error))?,
            Err(_) => u32::try_from(ordinal).unwrap_or(u32::MAX),
        };
        let mut view = DriverView {
            nvml,
            uuid: uuid.to_string(),
            index,
            baseline_used: 0,
        };
        let (total, free, _) = view.memory()?;
        view.baseline_used = total.saturating_sub(free);
        Ok(view)
    }

    /// `(total, free, reserved)` from `nvmlDeviceGetMemoryInfo_v2`.
    fn memory(&self) -> Result<(u64, u64, u64), DeviceError> {
        let device = self.device()?;
        let info = device
            .memory_info()
            .map_err(|error| nvml_error("nvmlDeviceGetMemoryInfo_v2", error))?;
        Ok((info.total, info.free, info.reserved))
    }

    fn device(&self) -> Result<nvml_wrapper::Device<'_>, DeviceError> {
        self.nvml
            .device_by_uuid(self.uuid.as_str())
            .or_else(|_| self.nvml.device_by_index(self.index))
            .map_err(|error| nvml_error("nvmlDeviceGetHandleByUUID", error))
    }

    /// Every compute process on the device with its usage, this one marked.
    pub fn processes(&self) -> Result<Vec<ProcessMemory>, DeviceError> {
        let device = self.device()?;
        let me = std::process::id();
        let processes = device
            .running_compute_processes()
            .map_err(|error| nvml_error("nvmlDeviceGetComputeRunningProcesses", error))?;
        Ok(processes
            .into_iter()
            .map(|process| ProcessMemory {
                pid: process.pid,
                is_current: process.pid == me,
                used_bytes: match process.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => bytes,
                    UsedGpuMemory::Unavailable => 0,
                },
            })
            .collect())
    }

    /// The whole account. NVML's v1 "used" is total − free (it counts the driver's
    /// reservation); v2 "used" leaves the reservation out.
    pub fn read(&self) -> Result<DriverMemory, DeviceError> {
        let (total, free, reserved) = self.memory()?;
        let used = total.saturating_sub(free);
        let processes = self.processes()?;
        let mine = processes.iter().find(|process| process.is_current);
        let (method, process_bytes, other) = match mine {
            Some(mine) => (
                "nvml-pid",
                mine.used_bytes,
                processes
                    .iter()
                    .filter(|process| !process.is_current)
                    .map(|process| process.used_bytes)
                    .sum(),
            ),
            // NVML does not list our pid (PID namespaces): our usage is the rise since the
            // baseline, and the rest of "used" beyond the reservation belongs to others.
            None => {
                let mine = used.saturating_sub(self.baseline_used);
                (
                    "device-delta",
                    mine,
                    used.saturating_sub(reserved).saturating_sub(mine),
                )
            }
        };
        Ok(DriverMemory {
            method,
            total_bytes: total,
            used_bytes: used,
            used_v2_bytes: used.saturating_sub(reserved),
            free_bytes: free,
            driver_reserved_bytes: reserved,
            process_bytes,
            other_processes_bytes: other,
        })
    }
}
