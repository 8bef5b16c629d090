//! Compiling CUDA C++ to PTX with NVRTC (cudarc's `nvrtc`), loaded at run time: the only module
//! that calls `cudarc::nvrtc`.

use cudarc::nvrtc::{self, CompileError, CompileOptions};

use super::driver::missing_symbols;
use crate::device::DeviceError;

/// NVRTC entry points gpumem calls; checked before the first call.
const NVRTC_SYMBOLS: [&str; 7] = [
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
];

/// Whether NVRTC (libnvrtc.so) can be loaded and has every function gpumem calls; the reason
/// when not.
pub fn available() -> Result<(), DeviceError> {
    // SAFETY: only tries to load the library.
    if !unsafe { nvrtc::sys::is_culib_present() } {
        return Err(DeviceError::Unavailable(
            "NVRTC (libnvrtc.so) was not found; it ships with the CUDA toolkit: add its lib64 folder to LD_LIBRARY_PATH"
                .into(),
        ));
    }
    let missing = missing_symbols!(nvrtc::sys::culib, NVRTC_SYMBOLS);
    if !missing.is_empty() {
        return Err(DeviceError::Unavailable(format!(
            "the NVRTC library lacks {}",
            missing.join(", ")
        )));
    }
    Ok(())
}

/// Compiles `source` (named `name` in messages) to PTX for compute capability
/// `(major, minor)`.
pub fn compile(
    source: &str,
    name: &str,
    compute_capability: (i32, i32),
) -> Result<String, DeviceError> {
    available()?;
    if source.contains('\0') {
        return Err(DeviceError::InvalidArgument(format!("{name} contains NUL")));
    }
    let (major, minor) = compute_capability;
    let options = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        name: Some(name.to_string()),
        ..Default::default()
    };
    let ptx =
        nvrtc::compile_ptx_with_opts(source, options).map_err(|error| DeviceError::Compile {
            source_name: name.to_string(),
            log: match error {
                CompileError::CompileError { nvrtc, log, .. } => {
                    format!("{nvrtc:?}\n{}", log.to_string_lossy())
                }
                other => format!("{other:?}"),
            },
        })?;
    Ok(ptx.to_src())
}
