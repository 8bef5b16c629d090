//! Opening a session decides two things only: the device (`--device`, else a CUDA GPU when one
//! is found, else the simulated H200) and the allocator config (from a [`ConfigSource`]). The
//! runtime that pairs the device with its value backend is built by
//! [`Runtime::sim`]/[`Runtime::cuda`].
//!
//! ```
//! use gpumem::session::{self, ConfigSource, SessionOptions};
//! use gpumem::device::DeviceSpec;
//!
//! let options = SessionOptions {
//!     device: Some(DeviceSpec::Sim(Some(8 << 30))),
//!     config: ConfigSource::Flag("max_split_size_mb:64".into()),
//! };
//! let session = session::open(&options)?;
//! assert_eq!(session.runtime.device_label(), "sim");
//! # Ok::<(), gpumem::session::SessionError>(())
//! ```

use std::fmt;
use std::path::PathBuf;
use std::rc::Rc;

use thiserror::Error;

use crate::alloc::{AllocConf, AllocError, ConfigError};
use crate::device::cuda::CudaGpu;
use crate::device::sim::SimDevice;
use crate::device::{DeviceError, DeviceSpec};
use crate::tensor::Runtime;

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
}

/// How to open a session.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// The device asked for; `None` picks CUDA when available, else the simulated H200.
    pub device: Option<DeviceSpec>,
    /// The allocator config and where it came from.
    pub config: ConfigSource,
}

/// An open session: the runtime and, when the device was chosen automatically, a line saying
/// which and why.
pub struct Session {
    /// Allocator, value backend and generator state shared by every tensor.
    pub runtime: Rc<Runtime>,
    /// The device actually used.
    pub device: DeviceSpec,
    /// Explanation printed once when the default device fell back to the simulator.
    pub notice: Option<String>,
}

/// Opens a session as the options say.
pub fn open(options: &SessionOptions) -> Result<Session, SessionError> {
    let conf = options.config.parse()?;
    let (runtime, device, notice) = match options.device {
        Some(spec @ DeviceSpec::Sim(size)) => (Runtime::sim(sim_device(size), conf)?, spec, None),
        Some(spec @ DeviceSpec::Cuda(index)) => match CudaGpu::open(index) {
            Ok(gpu) => (Runtime::cuda(gpu, conf)?, spec, None),
            Err(reason) => {
                return Err(SessionError::Cuda {
                    device: spec,
                    reason,
                })
            }
        },
        None => match CudaGpu::open(0) {
            Ok(gpu) => (Runtime::cuda(gpu, conf)?, DeviceSpec::Cuda(0), None),
            Err(reason) => (
                Runtime::sim(SimDevice::h200(), conf)?,
                DeviceSpec::Sim(None),
                Some(format!(
                    "gpumem: no usable CUDA device ({reason}); using the simulated H200 (sim)"
                )),
            ),
        },
    };
    Ok(Session {
        runtime,
        device,
        notice,
    })
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
            config: ConfigSource::Default,
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
    fn defaults_parse_to_pytorchs_defaults() {
        assert_eq!(
            ConfigSource::Default.parse().expect("defaults"),
            AllocConf::default()
        );
    }
}
