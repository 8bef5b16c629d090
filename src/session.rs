//! Opening a session decides two things only: the devices (`--device`, else the CUDA GPUs
//! when one is found, else the simulated H200) and the allocator config (from a
//! [`ConfigSource`]). Each device's runtime, pairing it with its value backend, is built by
//! [`Runtime::sim`]/[`Runtime::cuda`]; [`Devices`] holds them and which one is current.
//!
//! `--device cuda` and `--device cuda:N` make the same GPUs available: every one the process
//! sees (`CUDA_VISIBLE_DEVICES` chooses which), with GPU N current at the start. No context is
//! created until a script needs one.
//!
//! ```
//! use gpumem::session::{self, ConfigSource, SessionOptions};
//! use gpumem::device::DeviceSpec;
//!
//! let options = SessionOptions {
//!     device: Some(DeviceSpec::Sim(vec![Some(8 << 30), Some(8 << 30)])),
//!     config: ConfigSource::Flag("max_split_size_mb:64".into()),
//!     devices: None,
//! };
//! let session = session::open(&options)?;
//! assert_eq!(session.devices.count(), 2);
//! assert_eq!(session.devices.current().device_label(), "sim:0");
//! # Ok::<(), gpumem::session::SessionError>(())
//! ```

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use crate::alloc::{AllocConf, AllocError, ConfigError};
use crate::device::cuda::CudaGpu;
use crate::device::sim::SimDevice;
use crate::device::{DeviceError, DeviceSpec};
use crate::tensor::{Devices, NoSuchDevice, Runtime};

/// Environment variables PyTorch reads the allocator config from, first present wins.
pub const ALLOC_CONF_VARIABLES: [&str; 2] = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"];

/// Where an allocator config came from. Every config error names it, so a user whose shell
/// sets `PYTORCH_CUDA_ALLOC_CONF` learns that the variable is what gpumem refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ConfigSource {
    /// No config anywhere: PyTorch's defaults.
    #[default]
    Default,
    /// The `--alloc-conf` flag.
    Flag(String),
    /// An environment variable (one of [`ALLOC_CONF_VARIABLES`]).
    Environment {
        /// The variable's name.
        variable: &'static str,
        /// Its value.
        text: String,
    },
    /// A golden script's `//! alloc-conf:` directive.
    Directive {
        /// The script that carries it.
        script: PathBuf,
        /// The directive's value.
        text: String,
    },
}

impl ConfigSource {
    /// The flag when given, else the first of [`ALLOC_CONF_VARIABLES`] that is set, else the
    /// defaults: the order PyTorch (and so a user's shell) expects.
    pub fn flag_or_environment(flag: Option<String>) -> ConfigSource {
        if let Some(text) = flag {
            return ConfigSource::Flag(text);
        }
        ALLOC_CONF_VARIABLES
            .iter()
            .find_map(|&variable| {
                std::env::var(variable)
                    .ok()
                    .map(|text| ConfigSource::Environment { variable, text })
            })
            .unwrap_or_default()
    }

    /// The config text (empty for the defaults).
    pub fn text(&self) -> &str {
        match self {
            ConfigSource::Default => "",
            ConfigSource::Flag(text)
            | ConfigSource::Environment { text, .. }
            | ConfigSource::Directive { text, .. } => text,
        }
    }

    /// Parses the text, naming this source in the error.
    pub fn parse(&self) -> Result<AllocConf, SessionError> {
        AllocConf::parse(self.text()).map_err(|error| SessionError::Config {
            source_of_config: self.clone(),
            error,
        })
    }
}

impl fmt::Display for ConfigSource {
    /// Where the config came from, as an error message says it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigSource::Default => write!(f, "the defaults"),
            ConfigSource::Flag(_) => write!(f, "--alloc-conf"),
            ConfigSource::Environment { variable, .. } => {
                write!(f, "the environment variable {variable}")
            }
            ConfigSource::Directive { script, .. } => {
                write!(f, "the `//! alloc-conf:` directive of {}", script.display())
            }
        }
    }
}

/// Why a session could not be opened.
#[derive(Debug, Error)]
pub enum SessionError {
    /// The allocator config was rejected.
    #[error("invalid allocator config '{}' (from {source_of_config}): {error}", source_of_config.text())]
    Config {
        /// Where the text came from.
        source_of_config: ConfigSource,
        /// PyTorch's reason.
        error: ConfigError,
    },
    /// The CUDA device asked for cannot be used.
    #[error("cannot use {device}: {reason}")]
    Cuda {
        /// The device asked for.
        device: DeviceSpec,
        /// Why not: the driver's error, as the device layer reported it.
        #[source]
        reason: DeviceError,
    },
    /// The allocator could not start (e.g. a bad fraction in the config).
    #[error("{0}")]
    Alloc(#[from] AllocError),
    /// A session without devices (an empty list).
    #[error("{0}")]
    NoDevices(#[from] NoSuchDevice),
    /// A script asks for more devices (`//! devices: N`) than the machine has.
    #[error("{device} has {available} device{}; the script needs {needed} (`//! devices: {needed}`)", if *.available == 1 { "" } else { "s" })]
    TooFewDevices {
        /// The devices asked for.
        device: DeviceSpec,
        /// How many it has.
        available: usize,
        /// How many the script needs.
        needed: usize,
    },
}

/// How to open a session.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// The device asked for; `None` picks CUDA when available, else the simulated H200.
    pub device: Option<DeviceSpec>,
    /// The allocator config and where it came from.
    pub config: ConfigSource,
    /// Exactly this many devices, as a script's `//! devices: N` asks (`None`: as many as
    /// `device` gives). The simulator makes as many as asked; CUDA uses the first N GPUs.
    pub devices: Option<usize>,
}

/// An open session: its devices and, when the device was chosen automatically, a line saying
/// which and why.
pub struct Session {
    /// The devices (each an allocator, value backend and generator) and which is current.
    pub devices: Devices,
    /// The devices actually used.
    pub device: DeviceSpec,
    /// Explanation printed once when the default device fell back to the simulator.
    pub notice: Option<String>,
}

/// Opens a session as the options say.
pub fn open(options: &SessionOptions) -> Result<Session, SessionError> {
    let conf = options.config.parse()?;
    let wanted = options.devices;
    let device = options
        .device
        .as_ref()
        .map(|spec| wanted.map_or_else(|| spec.clone(), |count| spec.with_count(count)));
    let (devices, device, notice) = match device {
        Some(DeviceSpec::Sim(sizes)) => {
            let notice = scaled_context_notice(&sizes);
            (open_sim(&sizes, &conf)?, DeviceSpec::Sim(sizes), notice)
        }
        Some(spec @ DeviceSpec::Cuda(start)) => match open_cuda(start, wanted, &conf, &spec)? {
            Ok(devices) => (devices, spec, None),
            Err(reason) => {
                return Err(SessionError::Cuda {
                    device: spec,
                    reason,
                })
            }
        },
        None => {
            let spec = DeviceSpec::Cuda(0);
            match open_cuda(0, wanted, &conf, &spec)? {
                Ok(devices) => (devices, spec, None),
                Err(reason) => {
                    let sizes = vec![None; wanted.unwrap_or(1).max(1)];
                    let sim = DeviceSpec::Sim(sizes.clone());
                    let notice = format!(
                        "gpumem: no usable CUDA device ({reason}); using the simulated H200 ({sim})"
                    );
                    (open_sim(&sizes, &conf)?, sim, Some(notice))
                }
            }
        }
    };
    Ok(Session {
        devices,
        device,
        notice,
    })
}

/// The line saying that small simulated devices' CUDA contexts are scaled down, if any is: the
/// figures a script prints there differ from the H200's 527 MiB for that reason only.
fn scaled_context_notice(sizes: &[Option<u64>]) -> Option<String> {
    use crate::alloc::format::format_size;
    use crate::device::DeviceMemory;
    let mut lines: Vec<String> = Vec::new();
    for device in sizes.iter().flatten().map(|&bytes| SimDevice::new(bytes)) {
        if !device.context_is_scaled() {
            continue;
        }
        let line = format!(
            "gpumem: simulated device of {}: its CUDA context is modelled as {}, an eighth of the \
             device (the H200's is {}; smaller devices get an eighth so they stay usable; see \
             docs/memory-figures.md)",
            format_size(device.total_memory()),
            format_size(device.context_bytes()),
            format_size(crate::device::sim::H200_CONTEXT_BYTES)
        );
        if !lines.contains(&line) {
            lines.push(line);
        }
    }
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// Simulated devices of the given capacities (the H200 where `None`): one device keeps the
/// label `sim`, several are `sim:0`, `sim:1`, ...
fn open_sim(sizes: &[Option<u64>], conf: &AllocConf) -> Result<Devices, SessionError> {
    let numbered = sizes.len() > 1;
    let runtimes = sizes
        .iter()
        .enumerate()
        .map(|(index, &size)| {
            let device = sim_device(size);
            let device = if numbered {
                device.numbered(index)
            } else {
                device
            };
            Runtime::sim(device, conf.clone())
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Devices::new(runtimes, 0)?)
}

/// Every visible GPU (or the first `wanted`), with GPU `start` current; the inner error says
/// why CUDA cannot be used (no driver, no such GPU), for the caller to word.
fn open_cuda(
    start: usize,
    wanted: Option<usize>,
    conf: &AllocConf,
    spec: &DeviceSpec,
) -> Result<Result<Devices, DeviceError>, SessionError> {
    let visible = match CudaGpu::count() {
        Ok(count) => count,
        Err(reason) => return Ok(Err(reason)),
    };
    let count = match wanted {
        Some(needed) if needed > visible => {
            return Err(SessionError::TooFewDevices {
                device: spec.clone(),
                available: visible,
                needed,
            })
        }
        Some(needed) => needed,
        None => visible,
    };
    if start >= count {
        let missing = DeviceError::NoSuchDevice {
            ordinal: start,
            count,
        };
        return Ok(Err(missing));
    }
    let mut runtimes = Vec::with_capacity(count);
    for ordinal in 0..count {
        match CudaGpu::open(ordinal) {
            Ok(gpu) => runtimes.push(Runtime::cuda(gpu, conf.clone())?),
            Err(reason) => return Ok(Err(reason)),
        }
    }
    Ok(Ok(Devices::new(runtimes, start)?))
}

/// The simulated device of `size` bytes, or the H200 when no size is given.
fn sim_device(size: Option<u64>) -> SimDevice {
    match size {
        Some(bytes) => SimDevice::new(bytes),
        None => SimDevice::h200(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_error_names_the_environment_variable_it_came_from() {
        let source = ConfigSource::Environment {
            variable: "PYTORCH_CUDA_ALLOC_CONF",
            text: "bogus_key:1".into(),
        };
        let error = source.parse().expect_err("unknown key");
        let message = error.to_string();
        assert!(
            message.contains("(from the environment variable PYTORCH_CUDA_ALLOC_CONF)"),
            "{message}"
        );
        assert!(
            message.contains("Unrecognized key 'bogus_key'"),
            "{message}"
        );
    }

    #[test]
    fn a_directive_error_names_the_script() {
        let source = ConfigSource::Directive {
            script: PathBuf::from("tests/golden/x.rhai"),
            text: "max_split_size_mb:1".into(),
        };
        let message = source.parse().expect_err("too small").to_string();
        assert!(
            message.contains("`//! alloc-conf:` directive of tests/golden/x.rhai"),
            "{message}"
        );
    }

    #[test]
    fn an_unusable_cuda_device_keeps_the_drivers_error_typed() {
        // No GPU here (CI): the driver library is missing. On a GPU machine there is no
        // device 4096. Either way the reason is the device layer's error, not its text.
        let options = SessionOptions {
            device: Some(DeviceSpec::Cuda(4096)),
            ..SessionOptions::default()
        };
        let Err(error) = open(&options) else {
            panic!("cuda:4096 cannot be opened");
        };
        let SessionError::Cuda { device, reason } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(*device, DeviceSpec::Cuda(4096));
        assert!(
            matches!(
                reason,
                DeviceError::Unavailable(_) | DeviceError::NoSuchDevice { ordinal: 4096, .. }
            ),
            "{reason:?}"
        );
        assert_eq!(error.to_string(), format!("cannot use cuda:4096: {reason}"));
        let source = std::error::Error::source(&error).map(ToString::to_string);
        assert_eq!(source, Some(reason.to_string()));
    }

    #[test]
    fn a_small_simulated_device_says_its_context_is_scaled() {
        let open_sim = |size: Option<u64>| {
            open(&SessionOptions {
                device: Some(DeviceSpec::Sim(vec![size])),
                ..SessionOptions::default()
            })
            .expect("opens")
            .notice
        };
        let notice = open_sim(Some(1 << 30)).expect("a notice for 1 GiB");
        assert!(
            notice.contains("its CUDA context is modelled as 128.00 MiB, an eighth of the device"),
            "{notice}"
        );
        assert_eq!(open_sim(None), None, "the H200 has its measured context");
        assert_eq!(open_sim(Some(80 << 30)), None);
    }

    #[test]
    fn defaults_parse_to_pytorchs_defaults() {
        assert_eq!(
            ConfigSource::Default.parse().expect("defaults"),
            AllocConf::default()
        );
    }
}
