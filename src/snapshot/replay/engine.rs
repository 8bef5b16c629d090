//! Replaying one trace event at a time through gpumem's allocator: `alloc` allocates,
//! `free_completed` frees, device-level events are compared, recorded OOMs are retried, and
//! `empty_cache()` is called where the trace shows PyTorch's did.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

use serde::Serialize;

use super::compare::{DeviceEvent, SegmentComparison};
use super::device::Hints;
use crate::alloc::{
    AllocError, Allocation, CachingAllocator, EventLog, MemoryObserver, Subscription,
};
use crate::snapshot::model::Action;
use crate::snapshot::pickle::{Emitted, RawEvent, SnapshotError};

/// A hasher for device addresses: one multiplication, enough for keys that are already
/// spread out (the standard hasher costs more than the allocator's own work here).
#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (value ^ (value >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type AddressMap<V> = HashMap<u64, V, BuildHasherDefault<AddressHasher>>;
type AddressSet = HashSet<u64, BuildHasherDefault<AddressHasher>>;

/// The state when the replay first ran out of memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FirstOom {
    /// Index of the `alloc` event that failed.
    pub index: u64,
    /// Bytes it asked for.
    pub size: u64,
    /// Bytes allocated then.
    pub allocated: i64,
    /// Bytes reserved then.
    pub reserved: i64,
    /// The device's free bytes then.
    pub device_free: u64,
    /// gpumem's (PyTorch's) OOM message.
    pub message: String,
}

/// Counts of what was replayed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Events read from the replayed device's trace.
    pub events: u64,
    /// `alloc` events.
    pub allocs: u64,
    /// `free_completed` events.
    pub frees: u64,
    /// `free_requested` events never completed by the end: blocks kept alive (`record_stream`).
    pub pending_frees: u64,
    /// Allocations that failed in the replay (each skipped along with its free).
    pub ooms: u64,
    /// `oom` events in the file.
    pub recorded_ooms: u64,
    /// Recorded OOMs that gpumem's allocator also refused.
    pub recorded_ooms_reproduced: u64,
    /// `snapshot` events.
    pub snapshots: u64,
    /// `empty_cache()` calls inferred from the trace.
    pub empty_cache_calls: u64,
    /// Events of other devices' traces (not replayed).
    pub other_device_events: u64,
}

/// A live allocation: gpumem's block for a recorded address.
#[derive(Debug, Clone, Copy)]
struct Live {
    allocation: Allocation,
    free_requested: bool,
}

/// The replay of one trace.
pub struct Engine {
    allocator: CachingAllocator,
    live: AddressMap<Live>,
    /// Recorded addresses whose allocation failed in the replay; their frees are skipped.
    skipped: AddressSet,
    /// The trace list replayed (the first that has events).
    trace: Option<u32>,
    /// The allocator's own events since the last recorded event was replayed: its segment
    /// events are what the comparison checks.
    log: Rc<RefCell<EventLog>>,
    /// Where recorded segments go, for the device to place gpumem's alike (`None`: the
    /// simulator's placement model).
    hints: Option<Hints>,
    /// Recorded segment releases seen since the last other event, not yet explained.
    release_pending: bool,
    /// Whether `empty_cache()` was already called for the current run of releases.
    released: bool,
    /// What was replayed.
    pub counts: Counts,
    /// The first OOM of the replay.
    pub first_oom: Option<FirstOom>,
    /// Device events compared.
    pub segments: SegmentComparison,
}

impl Engine {
    /// A replay into `allocator` (fresh, on the device and config to replay under), telling
    /// recorded segment placements to `hints` when given.
    pub fn new(mut allocator: CachingAllocator, hints: Option<Hints>) -> Engine {
        let log = Rc::new(RefCell::new(EventLog::default()));
        allocator.subscribe(Box::new(Rc::clone(&log)));
        Engine {
            allocator,
            hints,
            live: AddressMap::default(),
            skipped: AddressSet::default(),
            trace: None,
            log,
            release_pending: false,
            released: false,
            counts: Counts::default(),
            first_oom: None,
            segments: SegmentComparison::default(),
        }
    }

    /// Subscribes `observer` to the replay allocator's event stream (a timeline being
    /// recorded, say); see [`CachingAllocator::subscribe`].
    pub fn subscribe(&mut self, observer: Box<dyn MemoryObserver>) -> Subscription {
        self.allocator.subscribe(observer)
    }

    /// The allocator replayed into.
    pub fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }

    /// The trace list replayed, once known.
    pub fn trace(&self) -> Option<u32> {
        self.trace
    }

    /// Replays one event from the reader.
    pub fn handle(&mut self, emitted: Emitted) -> Result<(), SnapshotError> {
        if *self.trace.get_or_insert(emitted.list) != emitted.list {
            self.counts.other_device_events += 1;
            return Ok(());
        }
        self.counts.events += 1;
        let index = emitted.index;
        // Every allocator event this file event causes carries its index (low 32 bits; the
        // timeline restores the rest), so pictures number events as the text does.
        self.allocator.set_trace_context(index as u32);
        let event = emitted.event;
        let fail = |message: String| SnapshotError::Event { index, message };
        if !is_release(event.action) {
            self.explain_releases(event.action, index)?;
        }
        match event.action {
            Action::Alloc => self.alloc(index, &event).map_err(fail)?,
            Action::FreeRequested => self.free_requested(&event).map_err(fail)?,
            Action::FreeCompleted => self.free_completed(&event).map_err(fail)?,
            Action::SegmentAlloc | Action::SegmentMap => {
                self.segments.recorded(index, device_event(&event));
                if let Some(hints) = &self.hints {
                    hints.push(event.addr as u64, event.size.max(0) as u64);
                }
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                self.segments.recorded(index, device_event(&event));
                if event.empty_cache_frame && !self.released {
                    self.empty_cache(index).map_err(fail)?;
                } else if !self.released {
                    self.release_pending = true;
                }
            }
            Action::Oom => self.recorded_oom(index, &event).map_err(fail)?,
            Action::Snapshot => self.counts.snapshots += 1,
            // gpumem's own kinds: a file's reader accepts only PyTorch's names (a recorded
            // `empty_cache()` shows in its segment_free events, which the arm above replays).
            Action::EmptyCache
            | Action::RangeReserve
            | Action::RangeRelease
            | Action::SetMemoryFraction => {}
        }
        if matches!(event.action, Action::Alloc | Action::Oom) {
            if let Some(hints) = &self.hints {
                hints.clear();
            }
        }
        self.observe(index);
        Ok(())
    }

    /// Ends the replay: a release run at the very end was `empty_cache()`.
    pub fn finish(&mut self, last_index: u64) -> Result<(), SnapshotError> {
        if self.release_pending {
            self.allocator.set_trace_context(last_index as u32);
            self.empty_cache(last_index)
                .map_err(|message| SnapshotError::Event {
                    index: last_index,
                    message,
                })?;
            self.observe(last_index);
        }
        self.counts.pending_frees = self.live.values().filter(|l| l.free_requested).count() as u64;
        self.segments.finish();
        Ok(())
    }

    /// Before an event that is not a segment release: a run of recorded releases that no
    /// malloc follows was an `empty_cache()` (a malloc's own releases come right before its
    /// `segment_alloc`/`alloc`/`oom`).
    fn explain_releases(&mut self, next: Action, index: u64) -> Result<(), SnapshotError> {
        if self.release_pending
            && !matches!(
                next,
                Action::Alloc | Action::Oom | Action::SegmentAlloc | Action::SegmentMap
            )
        {
            self.empty_cache(index)
                .map_err(|message| SnapshotError::Event { index, message })?;
            self.observe(index);
        }
        self.release_pending = false;
        self.released = false;
        Ok(())
    }

    fn empty_cache(&mut self, _index: u64) -> Result<(), String> {
        self.allocator
            .empty_cache()
            .map_err(|error| format!("empty_cache failed: {error}"))?;
        self.counts.empty_cache_calls += 1;
        self.release_pending = false;
        self.released = true;
        Ok(())
    }

    /// Hands the allocator's segment events since the last call to the comparison, as
    /// replayed at event `index`.
    fn observe(&mut self, index: u64) {
        let events = self.log.borrow_mut().take();
        for event in events {
            if event.kind.is_segment_event() {
                self.segments
                    .replayed(index, (event.kind, event.addr, event.size));
            }
        }
    }

    /// The event's request (its size, on its stream) through the allocator; the size and the
    /// allocator's answer.
    fn malloc(
        &mut self,
        event: &RawEvent,
    ) -> Result<(u64, Result<Allocation, AllocError>), String> {
        let size = non_negative(event.size, "size")?;
        let result = self.allocator.malloc_on(event.stream as u64, size);
        Ok((size, result))
    }

    fn alloc(&mut self, index: u64, event: &RawEvent) -> Result<(), String> {
        self.counts.allocs += 1;
        let addr = event.addr as u64;
        if self.live.contains_key(&addr) {
            return Err(format!(
                "alloc at {addr:#x}, which is already allocated (no free_completed since)"
            ));
        }
        let (size, result) = self.malloc(event)?;
        match result {
            Ok(allocation) => {
                self.live.insert(
                    addr,
                    Live {
                        allocation,
                        free_requested: false,
                    },
                );
                Ok(())
            }
            Err(AllocError::OutOfMemory(oom)) => {
                self.counts.ooms += 1;
                self.skipped.insert(addr);
                if self.first_oom.is_none() {
                    let stats = self.allocator.stats();
                    let device_free = self
                        .allocator
                        .device()
                        .mem_get_info()
                        .map_or(0, |(free, _)| free);
                    self.first_oom = Some(FirstOom {
                        index,
                        size,
                        allocated: stats.allocated_bytes.all.current,
                        reserved: stats.reserved_bytes.all.current,
                        device_free,
                        message: oom.message,
                    });
                }
                Ok(())
            }
            Err(other) => Err(format!("the allocator failed: {other}")),
        }
    }

    fn free_requested(&mut self, event: &RawEvent) -> Result<(), String> {
        let addr = event.addr as u64;
        if let Some(live) = self.live.get_mut(&addr) {
            live.free_requested = true;
            return Ok(());
        }
        if self.skipped.contains(&addr) {
            return Ok(());
        }
        Err(never_allocated("free_requested", addr))
    }

    fn free_completed(&mut self, event: &RawEvent) -> Result<(), String> {
        self.counts.frees += 1;
        let addr = event.addr as u64;
        if let Some(live) = self.live.remove(&addr) {
            return self
                .allocator
                .free(live.allocation)
                .map_err(|error| format!("the allocator failed: {error}"));
        }
        if self.skipped.remove(&addr) {
            return Ok(());
        }
        Err(never_allocated("free_completed", addr))
    }

    /// PyTorch ran out of memory here: try the same request (a failed malloc also flushes
    /// the cache in PyTorch), and give the block back at once if gpumem succeeds.
    fn recorded_oom(&mut self, _index: u64, event: &RawEvent) -> Result<(), String> {
        self.counts.recorded_ooms += 1;
        match self.malloc(event)?.1 {
            Ok(allocation) => self
                .allocator
                .free(allocation)
                .map_err(|error| format!("the allocator failed: {error}")),
            Err(AllocError::OutOfMemory(_)) => {
                self.counts.recorded_ooms_reproduced += 1;
                Ok(())
            }
            Err(other) => Err(format!("the allocator failed: {other}")),
        }
    }
}

fn is_release(action: Action) -> bool {
    matches!(action, Action::SegmentFree | Action::SegmentUnmap)
}

fn device_event(event: &RawEvent) -> DeviceEvent {
    (event.action, event.addr as u64, event.size.max(0) as u64)
}

fn non_negative(value: i64, what: &str) -> Result<u64, String> {
    u64::try_from(value).map_err(|_| format!("negative {what} {value}"))
}

fn never_allocated(action: &str, addr: u64) -> String {
    format!(
        "{action} of address {addr:#x}, which was never allocated in this trace (or already freed)"
    )
}
