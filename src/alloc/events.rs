//! The allocator's one event stream: every memory event it makes — a block handed out, a free
//! requested and completed, a segment allocated or freed, pages mapped or unmapped, an
//! expandable range reserved or released, an out-of-memory error, `empty_cache()`, a snapshot —
//! is emitted once, as one [`MemoryEvent`], where PyTorch 2.11 calls `record_trace` (and, for
//! gpumem's own kinds, at the matching point of the same code path).
//!
//! Everything that shows or compares memory over time subscribes to this stream: the history
//! PyTorch's `_record_memory_history` keeps ([`super::trace::TraceRecorder`]), the timeline and
//! report, the replay's comparison of segment events, tests. Nothing infers events by diffing
//! allocator state.
//!
//! While nothing listens, emitting costs one predictable branch
//! (`CachingAllocator::emit`, crate-private).

use super::block::{Pool, StreamId};
use super::pools::MemPoolId;

/// What happened. The first nine are PyTorch's `TraceEntry::Action`s, the ones a snapshot file
/// holds ([`EventKind::PYTORCH`], named by [`EventKind::name`]); the rest are gpumem's own and
/// never written to a PyTorch file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A block was handed to a user.
    Alloc,
    /// A user freed a block: it no longer counts as allocated. Without `record_stream` its
    /// [`EventKind::FreeCompleted`] follows at once.
    FreeRequested,
    /// The freed block went back to the cache (its streams' work done): it is no longer
    /// active.
    FreeCompleted,
    /// A segment came from the device (`cudaMalloc`).
    SegmentAlloc,
    /// A segment went back to the device (`cudaFree`).
    SegmentFree,
    /// Pages of an expandable segment were mapped.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// An out-of-memory error was raised.
    Oom,
    /// A snapshot was taken.
    Snapshot,
    /// gpumem's own: `empty_cache()` was called, before what it releases.
    EmptyCache,
    /// gpumem's own: an expandable segment's virtual range was reserved (`cuMemAddressReserve`),
    /// before any page of it is mapped.
    RangeReserve,
    /// gpumem's own: an expandable segment's virtual range was given back
    /// (`cuMemAddressFree`), after its last page was unmapped.
    RangeRelease,
    /// gpumem's own: `set_per_process_memory_fraction` set (or lifted) the cap on reserved
    /// bytes, the limit an over-fraction OOM runs into.
    SetMemoryFraction,
}

impl EventKind {
    /// The kinds PyTorch records, the only ones a snapshot file holds.
    pub const PYTORCH: [EventKind; 9] = [
        EventKind::Alloc,
        EventKind::FreeRequested,
        EventKind::FreeCompleted,
        EventKind::SegmentAlloc,
        EventKind::SegmentFree,
        EventKind::SegmentMap,
        EventKind::SegmentUnmap,
        EventKind::Oom,
        EventKind::Snapshot,
    ];

    /// Every kind, in the order of their numeric codes ([`EventKind::code`]).
    pub const ALL: [EventKind; 13] = [
        EventKind::Alloc,
        EventKind::FreeRequested,
        EventKind::FreeCompleted,
        EventKind::SegmentAlloc,
        EventKind::SegmentFree,
        EventKind::SegmentMap,
        EventKind::SegmentUnmap,
        EventKind::Oom,
        EventKind::Snapshot,
        EventKind::EmptyCache,
        EventKind::RangeReserve,
        EventKind::RangeRelease,
        EventKind::SetMemoryFraction,
    ];

    /// The kind's name: PyTorch's action name (`"alloc"`, `"free_requested"`, ...) for its nine,
    /// gpumem's (`"empty_cache"`, `"range_reserve"`, `"range_release"`,
    /// `"set_memory_fraction"`) for the rest.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::FreeRequested => "free_requested",
            EventKind::FreeCompleted => "free_completed",
            EventKind::SegmentAlloc => "segment_alloc",
            EventKind::SegmentFree => "segment_free",
            EventKind::SegmentMap => "segment_map",
            EventKind::SegmentUnmap => "segment_unmap",
            EventKind::Oom => "oom",
            EventKind::Snapshot => "snapshot",
            EventKind::EmptyCache => "empty_cache",
            EventKind::RangeReserve => "range_reserve",
            EventKind::RangeRelease => "range_release",
            EventKind::SetMemoryFraction => "set_memory_fraction",
        }
    }

    /// The kind's index in [`EventKind::ALL`], as compact encodings (the report's data) use it.
    pub fn code(self) -> u8 {
        // `ALL` lists every variant in declaration order, so the discriminant is the index.
        self as u8
    }

    /// Whether PyTorch records this kind (one of [`EventKind::PYTORCH`]).
    pub fn is_pytorchs(self) -> bool {
        (self as u8) < EventKind::PYTORCH.len() as u8
    }

    /// The PyTorch action named `name`, if any (gpumem's own kinds are never read from a file).
    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::from_bytes(name.as_bytes())
    }

    /// [`EventKind::from_name`] of a name as bytes, as a pickle holds it.
    /// A `match` on the bytes (a replay reads one name per event); a unit test checks it
    /// against [`EventKind::name`].
    #[inline]
    pub fn from_bytes(name: &[u8]) -> Option<EventKind> {
        Some(match name {
            b"alloc" => EventKind::Alloc,
            b"free_requested" => EventKind::FreeRequested,
            b"free_completed" => EventKind::FreeCompleted,
            b"segment_alloc" => EventKind::SegmentAlloc,
            b"segment_free" => EventKind::SegmentFree,
            b"segment_map" => EventKind::SegmentMap,
            b"segment_unmap" => EventKind::SegmentUnmap,
            b"oom" => EventKind::Oom,
            b"snapshot" => EventKind::Snapshot,
            _ => return None,
        })
    }

    /// Whether the kind is a device-level segment event (`segment_*`), the ones a replay
    /// compares with the recording.
    #[inline]
    pub fn is_segment_event(self) -> bool {
        matches!(
            self,
            EventKind::SegmentAlloc
                | EventKind::SegmentFree
                | EventKind::SegmentMap
                | EventKind::SegmentUnmap
        )
    }

    /// Whether charts mark it (OOMs and `empty_cache()` calls).
    pub fn is_marked(self) -> bool {
        matches!(self, EventKind::Oom | EventKind::EmptyCache)
    }
}

/// One memory event.
///
/// `addr` and `size` mean what PyTorch's trace entry means by them, so the history can record
/// the event as PyTorch would; `bytes` is what the event moves, so an observer can follow
/// allocated and reserved memory without reading the allocator:
///
/// | kind | `addr` | `size` | `bytes` |
/// |---|---|---|---|
/// | alloc, free_requested, free_completed | block address | bytes asked for | the block's (rounded) size: allocated rises at alloc and falls at free_requested; active falls at free_completed |
/// | segment_alloc, segment_free | segment base | segment bytes | segment bytes (reserved rises / falls) |
/// | segment_map, segment_unmap | first page's address | bytes (un)mapped | the same (reserved rises / falls) |
/// | oom | the device's free bytes | the rounded request | the segment that could not be had |
/// | snapshot | 0 | bytes of active blocks | 0 |
/// | empty_cache | 0 | 0 | 0 |
/// | range_reserve, range_release | range base | bytes of the range | bytes per page |
/// | set_memory_fraction | 0 | the cap on reserved bytes (0: no cap) | 0 |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryEvent {
    /// What happened.
    pub kind: EventKind,
    /// An address, or for [`EventKind::Oom`] the device's free bytes (see the table above).
    pub addr: u64,
    /// A byte count as PyTorch's trace gives it (see the table above).
    pub size: u64,
    /// The bytes the event moves (see the table above).
    pub bytes: u64,
    /// The stream of the block or segment concerned (0 for snapshots and `empty_cache`).
    pub stream: StreamId,
    /// The kind of pool (small or large) of the block or segment concerned.
    pub pool: Pool,
    /// The memory pool of the block or segment concerned: (0, 0) for the default pools, else
    /// a private pool's id (a CUDA graph's, a `MemPool`'s).
    pub pool_id: MemPoolId,
    /// The caller-supplied context in force ([`super::CachingAllocator::set_trace_context`]):
    /// the script layer maps it to a source location.
    pub context: u32,
}

/// Told about every event of an allocator it subscribed to
/// ([`super::CachingAllocator::subscribe`]), in order, right when it happens.
///
/// An observer sees events only: it cannot reach the allocator (so it can neither change its
/// decisions nor drop a tensor into it while it works).
pub trait MemoryObserver {
    /// Called once for each event (at least every segment event, for an observer whose
    /// [`MemoryObserver::segment_events_only`] is true).
    fn on_event(&mut self, event: &MemoryEvent);

    /// Whether the observer wants only the segment events ([`EventKind::is_segment_event`]).
    /// While every observer says so and no history is recorded, the allocator builds no event
    /// for a malloc or a free at all (a replay, whose engine compares only segment events,
    /// spent about 4% of its time telling it the others). It may still be told of others.
    fn segment_events_only(&self) -> bool {
        false
    }
}

impl<T: MemoryObserver + ?Sized> MemoryObserver for std::rc::Rc<std::cell::RefCell<T>> {
    /// Shared observers (one the caller reads afterwards) are told through their cell; if the
    /// caller holds it borrowed at that moment the event is lost to it, never a panic.
    fn on_event(&mut self, event: &MemoryEvent) {
        if let Ok(mut observer) = self.try_borrow_mut() {
            observer.on_event(event);
        }
    }

    /// Asked when it subscribes; a cell borrowed then counts as wanting every event.
    fn segment_events_only(&self) -> bool {
        self.try_borrow()
            .is_ok_and(|observer| observer.segment_events_only())
    }
}

/// A handle naming one subscription, to end it with
/// [`super::CachingAllocator::unsubscribe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Subscription(u64);

/// The observers of one allocator, told in the order they subscribed.
#[derive(Default)]
pub(super) struct Observers {
    next: u64,
    list: Vec<(Subscription, Box<dyn MemoryObserver>)>,
}

impl Observers {
    /// Adds an observer; returns its handle.
    pub(super) fn add(&mut self, observer: Box<dyn MemoryObserver>) -> Subscription {
        let id = Subscription(self.next);
        self.next += 1;
        self.list.push((id, observer));
        id
    }

    /// Removes the observer `id`, handing it back.
    pub(super) fn remove(&mut self, id: Subscription) -> Option<Box<dyn MemoryObserver>> {
        let index = self.list.iter().position(|(known, _)| *known == id)?;
        Some(self.list.remove(index).1)
    }

    /// Whether any observer is subscribed.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether some observer wants more than the segment events.
    pub(super) fn want_every_event(&self) -> bool {
        self.list
            .iter()
            .any(|(_, observer)| !observer.segment_events_only())
    }

    /// Tells every observer about `event`.
    pub(super) fn tell(&mut self, event: &MemoryEvent) {
        for (_, observer) in &mut self.list {
            observer.on_event(event);
        }
    }
}

/// An observer that keeps every event it is told, for callers that read them back in batches
/// (a replay compares the segment events of each operation with the recording).
#[derive(Debug, Default, Clone)]
pub struct EventLog {
    events: Vec<MemoryEvent>,
}

impl EventLog {
    /// The events kept since the last [`EventLog::take`].
    pub fn events(&self) -> &[MemoryEvent] {
        &self.events
    }

    /// Hands over the events kept so far and starts afresh.
    pub fn take(&mut self) -> Vec<MemoryEvent> {
        std::mem::take(&mut self.events)
    }
}

impl MemoryObserver for EventLog {
    fn on_event(&mut self, event: &MemoryEvent) {
        self.events.push(*event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_codes_and_pytorchs_subset() {
        let names: Vec<&str> = EventKind::PYTORCH.iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "alloc",
                "free_requested",
                "free_completed",
                "segment_alloc",
                "segment_free",
                "segment_map",
                "segment_unmap",
                "oom",
                "snapshot",
            ]
        );
        for (index, kind) in EventKind::ALL.iter().enumerate() {
            assert_eq!(kind.code() as usize, index);
            assert_eq!(kind.is_pytorchs(), EventKind::PYTORCH.contains(kind));
            let read_back = EventKind::from_name(kind.name());
            assert_eq!(read_back, kind.is_pytorchs().then_some(*kind));
        }
        assert_eq!(EventKind::from_name("free"), None);
        assert!(EventKind::SegmentMap.is_segment_event());
        assert!(!EventKind::Oom.is_segment_event());
        assert!(EventKind::EmptyCache.is_marked());
    }

    #[test]
    fn observers_are_told_in_order_and_can_leave() {
        let log = std::rc::Rc::new(std::cell::RefCell::new(EventLog::default()));
        let mut observers = Observers::default();
        let id = observers.add(Box::new(std::rc::Rc::clone(&log)));
        let event = MemoryEvent {
            kind: EventKind::Alloc,
            addr: 1,
            size: 2,
            bytes: 512,
            stream: 0,
            pool: Pool::Small,
            pool_id: MemPoolId::DEFAULT,
            context: 0,
        };
        observers.tell(&event);
        assert!(observers.remove(id).is_some());
        assert!(observers.is_empty());
        observers.tell(&event);
        assert_eq!(log.borrow().events(), [event]);
    }
}
