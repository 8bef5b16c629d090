//! The memory history: PyTorch's `record_trace` / `TraceEntry`
//! (`c10/core/CachingDeviceAllocator.h`, `DeviceCachingAllocator::record_trace`) and the
//! `RingBuffer` that keeps the last `max_entries` of them.
//!
//! [`TraceRecorder`] is the allocator's built-in observer of its event stream
//! ([`super::events`]): while recording is on it keeps every event of PyTorch's kinds, stamped
//! with the time, exactly as PyTorch's history would hold them; `record_memory_history` and
//! `dump_snapshot` read [`TraceRecorder::entries`]. gpumem's own event kinds (`empty_cache`,
//! range reservations) are not PyTorch's and never take a slot of the ring.

use std::time::{SystemTime, UNIX_EPOCH};

pub use super::events::EventKind;
use super::events::MemoryEvent;

/// One recorded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened (one of PyTorch's kinds).
    pub action: EventKind,
    /// An address, or for [`EventKind::Oom`] the device's free bytes (see
    /// [`MemoryEvent`]).
    pub addr: u64,
    /// A byte count (see [`MemoryEvent`]).
    pub size: u64,
    /// The stream of the block or segment concerned (0 for snapshots).
    pub stream: u64,
    /// Microseconds since the Unix epoch, as PyTorch's `time_us`.
    pub time_us: i64,
    /// The caller-supplied context current when the event happened; the script layer maps it
    /// to a source location.
    pub context: u32,
}

/// Where timestamps come from: microseconds since the Unix epoch.
pub type Clock = fn() -> i64;

/// The wall clock: microseconds since the Unix epoch (0 if the system clock is before it).
pub fn system_clock() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_micros()).unwrap_or(i64::MAX)
        })
}

/// The trace recorder: on/off and PyTorch's ring buffer of at most
/// `max_entries` entries, where the oldest entry is overwritten once it is full.
#[derive(Debug, Clone)]
pub struct TraceRecorder {
    enabled: bool,
    clock: Clock,
    /// At least 1 (PyTorch's `setMaxEntries` takes `max(1, n)`).
    max_entries: usize,
    entries: Vec<TraceEntry>,
    /// Where the next entry goes once the buffer is full; also where the oldest entry sits.
    next: usize,
}

impl Default for TraceRecorder {
    fn default() -> Self {
        TraceRecorder::new(system_clock)
    }
}

impl TraceRecorder {
    /// A recorder that is off, keeps at most one entry (PyTorch's initial `max_entries`) and
    /// stamps entries with `clock`.
    pub fn new(clock: Clock) -> TraceRecorder {
        TraceRecorder {
            enabled: false,
            clock,
            max_entries: 1,
            entries: Vec::new(),
            next: 0,
        }
    }

    /// Whether entries are being recorded.
    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Turns recording on or off. Turning it off clears what was recorded, as PyTorch's
    /// `recordHistory(enabled=False)` does.
    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        if !enabled {
            self.clear();
        }
    }

    /// The most entries kept.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Sets how many entries are kept, at least 1 (PyTorch's `setMaxEntries`). Entries already
    /// recorded stay; as in PyTorch, a buffer already longer than the new limit keeps its extra
    /// entries and overwrites from the current position onwards.
    pub fn set_max_entries(&mut self, max_entries: usize) {
        self.max_entries = max_entries.max(1);
    }

    /// Replaces the clock (tests use a fixed one).
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    /// Forgets every entry (PyTorch's `RingBuffer::clear`).
    pub fn clear(&mut self) {
        self.entries = Vec::new();
        self.next = 0;
    }

    /// Records `event` if recording is on and it is one of PyTorch's kinds.
    #[inline(always)]
    pub fn record(&mut self, event: &MemoryEvent) {
        if self.enabled && event.kind.is_pytorchs() {
            self.push(event);
        }
    }

    #[cold]
    #[inline(never)]
    fn push(&mut self, event: &MemoryEvent) {
        let entry = TraceEntry {
            action: event.kind,
            addr: event.addr,
            size: event.size,
            stream: event.stream,
            time_us: (self.clock)(),
            context: event.context,
        };
        if self.entries.len() < self.max_entries {
            self.entries.push(entry);
        } else {
            // `next` is below the length here: it only grows while below `max_entries`, which
            // is at most the length.
            if let Some(slot) = self.entries.get_mut(self.next) {
                *slot = entry;
            }
            self.next += 1;
            if self.next == self.max_entries {
                self.next = 0;
            }
        }
    }

    /// The recorded entries, oldest first (PyTorch's `getEntries`: the buffer rotated so the
    /// oldest entry comes first).
    pub fn entries(&self) -> Vec<TraceEntry> {
        let split = self.next.min(self.entries.len());
        let mut ordered = Vec::with_capacity(self.entries.len());
        ordered.extend_from_slice(&self.entries[split..]);
        ordered.extend_from_slice(&self.entries[..split]);
        ordered
    }

    /// Number of entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed_clock() -> i64 {
        42
    }

    fn recorder(max_entries: usize) -> TraceRecorder {
        let mut recorder = TraceRecorder::new(fixed_clock);
        recorder.set_max_entries(max_entries);
        recorder.set_enabled(true);
        recorder
    }

    fn sizes(recorder: &TraceRecorder) -> Vec<u64> {
        recorder.entries().iter().map(|entry| entry.size).collect()
    }

    fn event(kind: EventKind, addr: u64, size: u64, stream: u64, context: u32) -> MemoryEvent {
        MemoryEvent {
            kind,
            addr,
            size,
            bytes: size,
            stream,
            pool: crate::alloc::Pool::Large,
            pool_id: crate::alloc::MemPoolId::DEFAULT,
            context,
        }
    }

    fn alloc(size: u64) -> MemoryEvent {
        event(EventKind::Alloc, 0, size, 0, 0)
    }

    #[test]
    fn gpumems_own_kinds_take_no_slot() {
        let mut recorder = recorder(2);
        recorder.record(&event(EventKind::EmptyCache, 0, 0, 0, 0));
        recorder.record(&event(EventKind::RangeReserve, 1 << 30, 1 << 40, 0, 0));
        assert!(recorder.is_empty());
    }

    #[test]
    fn off_records_nothing() {
        let mut recorder = TraceRecorder::new(fixed_clock);
        recorder.set_max_entries(10);
        recorder.record(&event(EventKind::Alloc, 1, 2, 0, 0));
        assert!(recorder.is_empty());
    }

    #[test]
    fn keeps_the_last_max_entries_oldest_first() {
        let mut recorder = recorder(3);
        for size in 1..=7 {
            recorder.record(&alloc(size));
        }
        assert_eq!(recorder.len(), 3);
        assert_eq!(sizes(&recorder), [5, 6, 7]);
        recorder.record(&alloc(8));
        assert_eq!(sizes(&recorder), [6, 7, 8]);
    }

    #[test]
    fn entries_carry_time_stream_and_context() {
        let mut recorder = recorder(4);
        recorder.record(&event(EventKind::SegmentMap, 0x1000, 2 << 20, 7, 9));
        let entry = recorder.entries()[0];
        assert_eq!(
            entry,
            TraceEntry {
                action: EventKind::SegmentMap,
                addr: 0x1000,
                size: 2 << 20,
                stream: 7,
                time_us: 42,
                context: 9
            }
        );
    }

    #[test]
    fn max_entries_is_at_least_one_and_clear_restarts() {
        let mut recorder = recorder(0);
        assert_eq!(recorder.max_entries(), 1);
        recorder.record(&alloc(1));
        recorder.record(&alloc(2));
        assert_eq!(sizes(&recorder), [2]);
        recorder.clear();
        assert!(recorder.is_empty());
        recorder.set_max_entries(2);
        recorder.record(&alloc(3));
        assert_eq!(sizes(&recorder), [3]);
    }

    #[test]
    fn turning_off_clears() {
        let mut recorder = recorder(4);
        recorder.record(&alloc(1));
        recorder.set_enabled(false);
        assert!(recorder.is_empty());
    }

    #[test]
    fn shrinking_keeps_pytorchs_quirk() {
        // PyTorch keeps a longer buffer's extra entries and overwrites from `next` onwards,
        // wrapping at the new limit.
        let mut recorder = recorder(4);
        for size in 1..=4 {
            recorder.record(&alloc(size));
        }
        recorder.set_max_entries(2);
        recorder.record(&alloc(5));
        assert_eq!(sizes(&recorder), [2, 3, 4, 5]);
        recorder.record(&alloc(6));
        recorder.record(&alloc(7));
        assert_eq!(sizes(&recorder), [6, 3, 4, 7]);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(system_clock() > 1_577_836_800_000_000);
    }
}
