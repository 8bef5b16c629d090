//! Watching a runtime's allocator: an observer is told about every allocation, free and
//! `empty_cache()` the runtime makes, right after the allocator made it, with the allocator in
//! hand to read its counters and segments. The timeline recorder
//! ([`crate::viz::timeline::Recorder`]) is one; the allocator itself knows nothing of them.

use crate::alloc::{AllocError, Allocation, CachingAllocator};

/// What the runtime just asked of the allocator.
#[derive(Debug, Clone, Copy)]
pub enum MemoryEvent<'a> {
    /// A tensor asked for `requested` bytes; `result` is what the allocator answered.
    Malloc {
        /// Bytes asked for.
        requested: u64,
        /// The block handed out, or why not.
        result: &'a Result<Allocation, AllocError>,
    },
    /// A tensor's block went back to the cache.
    Free(Allocation),
    /// `empty_cache()` ran.
    EmptyCache,
}

/// Told about every allocator operation of a runtime ([`super::Runtime::set_observer`]).
pub trait MemoryObserver {
    /// Called after the allocator handled `event`. `context` is the caller-supplied id in
    /// force ([`super::Runtime::set_context`], e.g. a script line).
    fn observe(&mut self, event: MemoryEvent<'_>, context: u32, allocator: &CachingAllocator);
}
