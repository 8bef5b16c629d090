//! Opening a session: choose the device (`--device`, or a CUDA GPU when one is found, else the
//! simulated H200), parse the allocator config (`--alloc-conf`, else
//! `PYTORCH_CUDA_ALLOC_CONF`), and build the runtime scripts run on.

use std::rc::Rc;
use std::sync::Arc;

use thiserror::Error;

use crate::alloc::{AllocConf, AllocError, CachingAllocator, ConfigError};
use crate::device::cuda::{CudaDevice, CudaGpu};
use crate::device::sim::SimDevice;
use crate::device::{DeviceMemory, DeviceSpec};
use crate::tensor::backend::{Backend, SimBackend};
use crate::tensor::cuda_backend::CudaBackend;
use crate::tensor::Runtime;

/// Environment variables PyTorch reads the allocator config from, first present wins.
pub const ALLOC_CONF_VARIABLES: [&str; 2] = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"];

/// Why a session could not be opened.
#[derive(Debug, Error)]
pub enum SessionError {
    /// The allocator config was rejected.
    #[error("invalid allocator config '{text}': {error}")]
    Config {
        /// The text given.
        text: String,
        /// PyTorch's reason.
        error: ConfigError,
    },
    /// The CUDA device asked for cannot be used.
    #[error("cannot use {device}: {reason}")]
    Cuda {
        /// The device asked for.
        device: DeviceSpec,
        /// Why not.
        reason: String,
    },
    /// The allocator could not start (e.g. a bad fraction in the config).
    #[error("{0}")]
    Alloc(#[from] AllocError),
}

/// How to open a session.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// The device asked for; `None` picks CUDA when available, else the simulated H200.
    pub device: Option<DeviceSpec>,
    /// The allocator config; `None` reads the environment.
    pub alloc_conf: Option<String>,
}

/// An open session: the runtime and, when the device was chosen automatically, a line saying
/// which and why.
pub struct Session {
    /// Allocator and generator state shared by every tensor.
    pub runtime: Rc<Runtime>,
    /// The device actually used.
    pub device: DeviceSpec,
    /// Explanation printed once when the default device fell back to the simulator.
    pub notice: Option<String>,
}

/// The allocator config text in force: the flag, else the environment, else empty.
pub fn alloc_conf_text(flag: Option<&str>) -> String {
    if let Some(text) = flag {
        return text.to_string();
    }
    ALLOC_CONF_VARIABLES
        .iter()
        .find_map(|name| std::env::var(name).ok())
        .unwrap_or_default()
}

/// Opens a session as the options say.
pub fn open(options: &SessionOptions) -> Result<Session, SessionError> {
    let text = alloc_conf_text(options.alloc_conf.as_deref());
    let conf = AllocConf::parse(&text).map_err(|error| SessionError::Config { text, error })?;
    let (device, backend, spec, notice) = match options.device {
        Some(spec @ DeviceSpec::Sim(size)) => sim_parts(sim_device(size), spec, None),
        Some(spec @ DeviceSpec::Cuda(index)) => match CudaGpu::open(index) {
            Ok(gpu) => cuda_parts(gpu, spec),
            Err(reason) => {
                return Err(SessionError::Cuda {
                    device: spec,
                    reason: reason.to_string(),
                })
            }
        },
        None => match CudaGpu::open(0) {
            Ok(gpu) => cuda_parts(gpu, DeviceSpec::Cuda(0)),
            Err(reason) => sim_parts(
                SimDevice::h200(),
                DeviceSpec::Sim(None),
                Some(format!(
                    "gpumem: no usable CUDA device ({reason}); using the simulated H200 (sim)"
                )),
            ),
        },
    };
    let allocator = CachingAllocator::new(device, conf)?;
    Ok(Session {
        runtime: Runtime::with_backend(allocator, backend),
        device: spec,
        notice,
    })
}

/// The pieces a session is built from: the allocator's device, the value backend, the device
/// actually used and the fallback notice.
type Parts = (
    Box<dyn DeviceMemory>,
    Box<dyn Backend>,
    DeviceSpec,
    Option<String>,
);

fn sim_parts(device: SimDevice, spec: DeviceSpec, notice: Option<String>) -> Parts {
    (Box::new(device), Box::new(SimBackend), spec, notice)
}

/// A CUDA device and a backend sharing one GPU handle (and so one context). Creating them
/// makes no context yet: NVML's baseline is read first.
fn cuda_parts(gpu: Arc<CudaGpu>, spec: DeviceSpec) -> Parts {
    let device = CudaDevice::new(Arc::clone(&gpu));
    (
        Box::new(device),
        Box::new(CudaBackend::new(gpu)),
        spec,
        None,
    )
}

fn sim_device(size: Option<u64>) -> SimDevice {
    match size {
        Some(bytes) => SimDevice::new(bytes),
        None => SimDevice::h200(),
    }
}
