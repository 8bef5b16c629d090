//! The allocator's event trace: PyTorch's `record_trace` / `TraceEntry`
//! (`c10/core/CachingDeviceAllocator.h`, `DeviceCachingAllocator::record_trace`) and the
//! `RingBuffer` that keeps the last `max_entries` of them.
//!
//! The allocator calls [`TraceRecorder::record`] exactly where PyTorch 2.11 calls
//! `record_trace`, in the same order; `record_memory_history`, `gpumem replay` and the timeline
//! read [`TraceRecorder::entries`]. While recording is off, `record` costs one predictable
//! branch: everything else sits behind it in a function kept out of line.

use std::time::{SystemTime, UNIX_EPOCH};

/// What happened, with PyTorch's action names ([`TraceAction::name`]). The first nine are
/// PyTorch's `TraceEntry::Action`s, the ones a snapshot file holds ([`TraceAction::PYTORCH`]);
/// [`TraceAction::EmptyCache`] is gpumem's own, for the timeline, and never written to one.
/// The snapshot layer names this type `snapshot::Action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceAction {
    /// A block was handed to a user: (block address, bytes asked for).
    Alloc,
    /// A user freed a block: (block address, bytes it was asked for).
    FreeRequested,
    /// The freed block went back to the cache: (block address, bytes it was asked for). On one
    /// stream without `record_stream` it follows `FreeRequested` at once.
    FreeCompleted,
    /// A segment came from the device (`cudaMalloc`): (segment base, segment size).
    SegmentAlloc,
    /// A segment went back to the device (`cudaFree`): (segment base, segment size).
    SegmentFree,
    /// Pages of an expandable segment were mapped: (first mapped byte, bytes mapped).
    SegmentMap,
    /// Pages of an expandable segment were unmapped: (first unmapped byte, bytes unmapped).
    SegmentUnmap,
    /// An out-of-memory error was raised: (the device's free bytes, the rounded request).
    Oom,
    /// A snapshot was taken: (0, bytes of active blocks).
    Snapshot,
    /// gpumem's own: `empty_cache()` was called: (0, 0), before what it releases.
    EmptyCache,
}

impl TraceAction {
    /// The actions PyTorch records, the only ones a snapshot file holds.
    pub const PYTORCH: [TraceAction; 9] = [
        TraceAction::Alloc,
        TraceAction::FreeRequested,
        TraceAction::FreeCompleted,
        TraceAction::SegmentAlloc,
        TraceAction::SegmentFree,
        TraceAction::SegmentMap,
        TraceAction::SegmentUnmap,
        TraceAction::Oom,
        TraceAction::Snapshot,
    ];

    /// The action's name in PyTorch's snapshot (`"alloc"`, `"free_requested"`, ...);
    /// `"empty_cache"` is gpumem's addition.
    pub fn name(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Oom => "oom",
            TraceAction::Snapshot => "snapshot",
            TraceAction::EmptyCache => "empty_cache",
        }
    }

    /// Whether PyTorch records this action (everything but [`TraceAction::EmptyCache`]).
    pub fn is_pytorchs(self) -> bool {
        self != TraceAction::EmptyCache
    }

    /// The action PyTorch names `name`, if any (`"empty_cache"` is not one).
    pub fn from_name(name: &str) -> Option<TraceAction> {
        TraceAction::from_bytes(name.as_bytes())
    }

    /// [`TraceAction::from_name`] of a name as bytes, as a pickle holds it.
    pub fn from_bytes(name: &[u8]) -> Option<TraceAction> {
        TraceAction::PYTORCH
            .into_iter()
            .find(|action| action.name().as_bytes() == name)
    }

    /// Whether the action is a device-level segment event (`segment_*`).
    pub fn is_segment_event(self) -> bool {
        matches!(
            self,
            TraceAction::SegmentAlloc
                | TraceAction::SegmentFree
                | TraceAction::SegmentMap
                | TraceAction::SegmentUnmap
        )
    }
}

/// One recorded event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// An address, or for [`TraceAction::Oom`] the device's free bytes (see [`TraceAction`]).
    pub addr: u64,
    /// A byte count (see [`TraceAction`]).
    pub size: u64,
    /// The stream of the block or segment concerned (0 for snapshots and `empty_cache`).
    pub stream: u64,
    /// Microseconds since the Unix epoch, as PyTorch's `time_us`.
    pub time_us: i64,
    /// The caller-supplied context current when the event happened
    /// ([`TraceRecorder::set_context`]); the script layer maps it to a source location.
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

/// The trace recorder: on/off, a context stamp, and PyTorch's ring buffer of at most
/// `max_entries` entries, where the oldest entry is overwritten once it is full.
#[derive(Debug, Clone)]
pub struct TraceRecorder {
    enabled: bool,
    context: u32,
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
            context: 0,
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

    /// Sets the context stamped on every entry from now on.
    #[inline]
    pub fn set_context(&mut self, context: u32) {
        self.context = context;
    }

    /// The context stamped on new entries.
    pub fn context(&self) -> u32 {
        self.context
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

    /// Records one event if recording is on.
    #[inline(always)]
    pub fn record(&mut self, action: TraceAction, addr: u64, size: u64, stream: u64) {
        if self.enabled {
            self.push(action, addr, size, stream);
        }
    }

    #[cold]
    #[inline(never)]
    fn push(&mut self, action: TraceAction, addr: u64, size: u64, stream: u64) {
        let entry = TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us: (self.clock)(),
            context: self.context,
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

    #[test]
    fn names_are_pytorchs() {
        let names: Vec<&str> = TraceAction::PYTORCH.iter().map(|a| a.name()).collect();
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
        for action in TraceAction::PYTORCH {
            assert_eq!(TraceAction::from_name(action.name()), Some(action));
            assert!(action.is_pytorchs());
        }
        assert_eq!(TraceAction::from_name("free"), None);
        // gpumem's own marker has a name but is never read from a PyTorch file.
        assert_eq!(TraceAction::EmptyCache.name(), "empty_cache");
        assert!(!TraceAction::EmptyCache.is_pytorchs());
        assert_eq!(TraceAction::from_name("empty_cache"), None);
        assert!(TraceAction::SegmentMap.is_segment_event());
        assert!(!TraceAction::Oom.is_segment_event());
    }

    #[test]
    fn off_records_nothing() {
        let mut recorder = TraceRecorder::new(fixed_clock);
        recorder.set_max_entries(10);
        recorder.record(TraceAction::Alloc, 1, 2, 0);
        assert!(recorder.is_empty());
    }

    #[test]
    fn keeps_the_last_max_entries_oldest_first() {
        let mut recorder = recorder(3);
        for size in 1..=7 {
            recorder.record(TraceAction::Alloc, 0, size, 0);
        }
        assert_eq!(recorder.len(), 3);
        assert_eq!(sizes(&recorder), [5, 6, 7]);
        recorder.record(TraceAction::Alloc, 0, 8, 0);
        assert_eq!(sizes(&recorder), [6, 7, 8]);
    }

    #[test]
    fn entries_carry_time_stream_and_context() {
        let mut recorder = recorder(4);
        recorder.set_context(9);
        recorder.record(TraceAction::SegmentMap, 0x1000, 2 << 20, 7);
        let entry = recorder.entries()[0];
        assert_eq!(
            entry,
            TraceEntry {
                action: TraceAction::SegmentMap,
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
        recorder.record(TraceAction::Alloc, 0, 1, 0);
        recorder.record(TraceAction::Alloc, 0, 2, 0);
        assert_eq!(sizes(&recorder), [2]);
        recorder.clear();
        assert!(recorder.is_empty());
        recorder.set_max_entries(2);
        recorder.record(TraceAction::Alloc, 0, 3, 0);
        assert_eq!(sizes(&recorder), [3]);
    }

    #[test]
    fn turning_off_clears() {
        let mut recorder = recorder(4);
        recorder.record(TraceAction::Alloc, 0, 1, 0);
        recorder.set_enabled(false);
        assert!(recorder.is_empty());
    }

    #[test]
    fn shrinking_keeps_pytorchs_quirk() {
        // PyTorch keeps a longer buffer's extra entries and overwrites from `next` onwards,
        // wrapping at the new limit.
        let mut recorder = recorder(4);
        for size in 1..=4 {
            recorder.record(TraceAction::Alloc, 0, size, 0);
        }
        recorder.set_max_entries(2);
        recorder.record(TraceAction::Alloc, 0, 5, 0);
        assert_eq!(sizes(&recorder), [2, 3, 4, 5]);
        recorder.record(TraceAction::Alloc, 0, 6, 0);
        recorder.record(TraceAction::Alloc, 0, 7, 0);
        assert_eq!(sizes(&recorder), [6, 3, 4, 7]);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(system_clock() > 1_577_836_800_000_000);
    }
}
