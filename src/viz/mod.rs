//! Seeing memory: the segment map, fragmentation figures, the timeline of a run and the HTML
//! report. Everything here reads the allocator from outside (its snapshot and counters, and
//! the events a [`timeline::Recorder`] is told about); the allocator knows nothing of it.

pub mod chart;
pub(crate) mod envelope;
pub(crate) mod event;
pub(crate) mod fragmentation;
pub(crate) mod layout;
pub(crate) mod live;
pub mod map;
pub mod report;
pub(crate) mod timeline;
pub(crate) mod units;
pub(crate) mod window;

pub use fragmentation::{Fragmentation, FreeSpace};
pub use layout::{MemoryLayout, Region, SegmentLayout, Span};
pub use map::MapOptions;
pub use timeline::{
    Event, ExpandableRange, Mark, MarkKind, Numbering, OomLimits, Peak, Recorder, Site, Timeline,
};
pub use window::Window;
