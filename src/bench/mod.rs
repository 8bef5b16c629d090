//! Measurements of gpumem itself behind `gpumem bench`: the allocator's hot paths on any device
//! ([`alloc`]) and the randn kernel's throughput on a CUDA device ([`randn`]).

pub mod alloc;
pub mod randn;

pub use alloc::{
    cached_pair, mixed_round, mixed_sizes, time_patterns, AllocTimings, CACHED_PAIR_BYTES,
};
