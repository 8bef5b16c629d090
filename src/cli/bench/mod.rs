//! Measurements of gpumem itself behind `gpumem bench`: the allocator's hot paths on any device
//! ([`alloc`]), the randn kernel's throughput on a CUDA device ([`randn`]) and the speed of
//! `gpumem replay` on a synthetic snapshot of any length ([`replay`]) and how `--tune` scales
//! with threads ([`tune`]).

pub mod alloc;
pub mod randn;
pub mod replay;
pub mod tune;

pub use alloc::time_patterns;
