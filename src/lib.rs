//! gpumem: see and script how GPU memory behaves.
//!
//! Data flows one way: script text ([`script`]) creates tensors ([`tensor`]) whose storage comes
//! from the caching allocator ([`alloc`]), which draws whole segments from a device
//! ([`device`]): a real CUDA GPU or a simulated one.

#![warn(missing_docs)]

pub mod alloc;
pub mod device;
pub mod script;
pub mod session;
pub mod snapshot;
pub mod tensor;
pub mod viz;
