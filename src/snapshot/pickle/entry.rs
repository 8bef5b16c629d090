//! A trace entry as the reader hands it out: an allocator event a replay acts on
//! ([`RawEvent`]), or a marker that changes no memory ([`Marker`]: `user_defined`, `annotate`),
//! and which trace it came from ([`Trace`]).

use super::frames::{StackId, StackSigns};
use crate::snapshot::model::Action;

/// The fields of one allocator event of a trace (`alloc`, `free_requested`, `free_completed`,
/// `segment_*`, `oom`, `snapshot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent {
    /// What happened.
    pub action: Action,
    /// `addr` (for `oom`: `device_free`), as the 64 bits of an unsigned address: an XPU
    /// address at or above 2^63 reads as a negative `i64`, and `as u64` gives it back.
    pub addr: i64,
    /// `size`.
    pub size: i64,
    /// `stream` (0 when absent).
    pub stream: i64,
    /// `time_us` (0 when absent, before PyTorch 2.2).
    pub time_us: i64,
    /// What its frames tell of calls the trace does not record: `empty_cache` named (a
    /// release by `torch.cuda.empty_cache()`), a CUDA-graph capture underway.
    pub signs: StackSigns,
    /// Its frames, innermost first ([`StackId::EMPTY`] when recorded without), resolved by
    /// the reader's [`Stacks`](super::frames::Stacks).
    pub stack: StackId,
    /// `pool_id` (PyTorch 2.12 and later), `(0, 0)` when absent: the memory pool.
    pub pool: (i64, i64),
}

impl RawEvent {
    /// An event of `action` with every other field zero or empty.
    pub fn new(action: Action) -> RawEvent {
        RawEvent {
            action,
            addr: 0,
            size: 0,
            stream: 0,
            time_us: 0,
            signs: StackSigns::default(),
            stack: StackId::EMPTY,
            pool: (0, 0),
        }
    }

    /// [`RawEvent::addr`] as the unsigned address it is.
    pub fn address(&self) -> u64 {
        self.addr as u64
    }
}

/// The kinds of trace entries that mark a moment without changing memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkerKind {
    /// `user_defined` (nightlies of mid-2024): a `record_function` range's start or end; its
    /// one frame is named `START` or `END` and its file name is the range's name.
    UserDefined,
    /// `annotate` (PyTorch 2.13): metadata attached to the live allocation at `addr`.
    Annotate,
}

impl MarkerKind {
    /// PyTorch's action name.
    pub fn name(self) -> &'static str {
        match self {
            MarkerKind::UserDefined => "user_defined",
            MarkerKind::Annotate => "annotate",
        }
    }

    /// The marker PyTorch names `name`, if any.
    pub fn from_bytes(name: &[u8]) -> Option<MarkerKind> {
        [MarkerKind::UserDefined, MarkerKind::Annotate]
            .into_iter()
            .find(|kind| kind.name().as_bytes() == name)
    }
}

/// A trace entry that changes no memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    /// Which.
    pub kind: MarkerKind,
    /// `addr` (the annotated allocation's address; 0 for `user_defined`).
    pub addr: i64,
    /// `size`.
    pub size: i64,
    /// `time_us` (0 when absent).
    pub time_us: i64,
    /// Its frames (for `user_defined`, the range's name and stage).
    pub stack: StackId,
}

/// One entry of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// An allocator event.
    Memory(RawEvent),
    /// A marker.
    Marker(Marker),
}

impl Entry {
    /// PyTorch's action name.
    pub fn action_name(&self) -> &'static str {
        match self {
            Entry::Memory(event) => event.action.name(),
            Entry::Marker(marker) => marker.kind.name(),
        }
    }

    /// Its frames.
    pub fn stack(&self) -> StackId {
        match self {
            Entry::Memory(event) => event.stack,
            Entry::Marker(marker) => marker.stack,
        }
    }
}

/// Which trace of the file an entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Trace {
    /// `device_traces[n]`: device `n`'s caching allocator.
    Device(u32),
    /// `host_traces` (PyTorch 2.13, `record_pinned_host_memory=True`): the pinned host memory
    /// allocator, list `n` of it.
    Host(u32),
    /// A list of events elsewhere in the file (not a form PyTorch writes).
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_known_by_name() {
        assert_eq!(
            MarkerKind::from_bytes(b"user_defined"),
            Some(MarkerKind::UserDefined)
        );
        assert_eq!(
            MarkerKind::from_bytes(b"annotate"),
            Some(MarkerKind::Annotate)
        );
        assert_eq!(MarkerKind::from_bytes(b"alloc"), None);
        let entry = Entry::Marker(Marker {
            kind: MarkerKind::Annotate,
            addr: 0,
            size: 0,
            time_us: 0,
            stack: StackId::EMPTY,
        });
        assert_eq!(entry.action_name(), "annotate");
    }

    #[test]
    fn an_address_past_2_63_comes_back_unsigned() {
        let mut event = RawEvent::new(Action::Alloc);
        event.addr = 0xFFFF_8000_0000_0000_u64 as i64;
        assert!(event.addr < 0);
        assert_eq!(event.address(), 0xFFFF_8000_0000_0000);
    }
}
