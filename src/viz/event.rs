//! What the recorder keeps of each allocator event, and of each expandable range, in a module
//! of its own so that the recorder (`timeline.rs`), its kept stretches (`window.rs`) and the
//! layout it follows (`live.rs`) all use them without importing one another in a loop.

use crate::alloc::{EventKind, Pool};

/// One event and the memory right after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Its number on the x axis (as the timeline's `Numbering` says).
    pub position: u64,
    /// What happened.
    pub kind: EventKind,
    /// Address of the block or segment concerned (0 for OOM and `empty_cache`).
    pub address: u64,
    /// Bytes concerned: the block's (rounded) size for `alloc` and the frees, the segment's or
    /// the pages' bytes for segment events, the segment that could not be had for an OOM.
    pub size: u64,
    /// The pool of the block or segment.
    pub pool: Pool,
    /// Bytes allocated after the event (`memory_allocated()`).
    pub allocated: u64,
    /// Bytes reserved after the event (`memory_reserved()`).
    pub reserved: u64,
    /// The caller's context id when it happened: for a script's numbering (`Sequence`) an
    /// index into the timeline's `labels` + 1 (0 for none).
    pub context: u32,
}

/// An expandable segment's virtual range: pages are mapped into it and unmapped again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandableRange {
    /// First byte.
    pub base: u64,
    /// Bytes reserved.
    pub size: u64,
    /// Bytes per page.
    pub page: u64,
    /// The pool it serves.
    pub pool: Pool,
}
