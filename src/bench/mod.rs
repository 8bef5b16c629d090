//! Measurements of gpumem itself behind `gpumem bench`: the allocator's hot paths on any device
//! ([`alloc`]), the randn kernel's throughput on a CUDA device ([`randn`]) and the speed of
//! `gpumem replay` on a synthetic snapshot of any length ([`replay`]).

pub mod alloc;
pub mod randn;
pub mod replay;

pub use alloc::{
    cached_pair, mixed_round, mixed_sizes, time_patterns, AllocTimings, CACHED_PAIR_BYTES,
};
