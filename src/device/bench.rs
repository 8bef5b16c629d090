//! What `gpumem bench randn` (the binary's benchmark) needs from the driver level, and nothing
//! else uses: compiling its own candidate kernels, launching them into a tensor's memory and
//! timing them with CUDA events. Not part of the library's face: it exists only with the
//! `bench-internals` cargo feature (on by default so that `cargo build` makes the whole
//! binary; a library user turns it off with `default-features = false`) and is left out of the
//! documentation.
//!
//! Every launch here goes through the same checked [`RandnKernel::launch`] as the tensor
//! layer's: memory as a borrowed [`DeviceSpan`](crate::device::DeviceSpan) of the GPU's own.

use std::sync::Arc;

use super::cuda::CudaGpu;
use super::DeviceError;

pub use super::cuda::driver::{Current, Event, Function, Module};
pub use super::cuda::kernels::{
    production_source, RandnFormat, RandnKernel, RandnLayout, RANDN_LAYOUT, RANDN_SOURCE,
    SOURCE_NAME,
};

/// NVRTC as the benchmark's host check uses it: whether it loads, and compiling a source to
/// PTX for a compute capability.
pub mod nvrtc {
    pub use crate::device::cuda::nvrtc::{available, compile};
}

/// Makes `gpu`'s primary context current on this thread (creating it on first use) and returns
/// the proof launches and events take.
pub fn activate(gpu: &CudaGpu) -> Result<Current<'_>, DeviceError> {
    gpu.activate()
}

/// Compiles `source` (named `name` in messages and logs) with NVRTC for `gpu` and loads it
/// into its primary context; counted in [`compiles`].
pub fn compile_module(gpu: &CudaGpu, source: &str, name: &str) -> Result<Arc<Module>, DeviceError> {
    gpu.compile_module(source, name)
}

/// NVRTC compilations made so far through `gpu`'s handle (the production kernels once, plus
/// one per benchmark run).
pub fn compiles(gpu: &CudaGpu) -> usize {
    gpu.compiles()
}

/// The production float32 randn kernel (the one `randn` tensors use), compiled on first use.
pub fn production_randn(gpu: &CudaGpu) -> Result<&RandnKernel, DeviceError> {
    Ok(gpu.kernels()?.randn_kernel(RandnFormat::F32))
}
