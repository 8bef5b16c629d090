//! A run's memory over its allocator events: what the `--timeline` chart and the HTML report
//! draw. A [`Recorder`] subscribes to an allocator's event stream
//! ([`crate::alloc::events`]) and produces a [`Timeline`]: the layout when recording began,
//! then every event with the allocated and reserved bytes right after it and the context
//! (script line) it came from, enough to rebuild the segment map at any event. It follows
//! the figures from what each event moves; it never reads or diffs allocator state.

use super::layout::MemoryLayout;
use crate::alloc::{CachingAllocator, EventKind, MemoryEvent, MemoryObserver, Pool};

/// One event and the memory right after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
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
    /// The caller's context id when it happened (an index into [`Timeline::labels`] + 1; 0
    /// for none).
    pub context: u32,
}

/// A recorded run: the layout at the start, then every event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// What the run was (a script's path), for titles.
    pub title: String,
    /// The segments when recording began.
    pub initial: MemoryLayout,
    /// Allocated bytes when recording began.
    pub initial_allocated: u64,
    /// Reserved bytes when recording began.
    pub initial_reserved: u64,
    /// The events, in order.
    pub events: Vec<Event>,
    /// What each context id means (`file:line`): entry `i` is id `i + 1`.
    pub labels: Vec<String>,
    /// The device's total memory, for scale.
    pub device_total: u64,
    /// Every expandable segment's reserved virtual range seen during the run, by base.
    pub expandable: Vec<ExpandableRange>,
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

impl Timeline {
    /// The label of context `id` (`""` for 0 or an unknown id).
    pub fn label(&self, id: u32) -> &str {
        (id as usize)
            .checked_sub(1)
            .and_then(|index| self.labels.get(index))
            .map_or("", String::as_str)
    }

    /// The highest allocated and reserved bytes over the run, the start included.
    pub fn peaks(&self) -> (u64, u64) {
        self.events.iter().fold(
            (self.initial_allocated, self.initial_reserved),
            |(allocated, reserved), event| {
                (allocated.max(event.allocated), reserved.max(event.reserved))
            },
        )
    }
}

/// Builds a [`Timeline`] from an allocator's event stream: subscribe it (shared, as
/// `Rc<RefCell<Recorder>>`, to read it afterwards) with [`CachingAllocator::subscribe`] or
/// `Runtime::subscribe`.
#[derive(Debug)]
pub struct Recorder {
    timeline: Timeline,
    /// Allocated and reserved bytes after the last event.
    allocated: u64,
    reserved: u64,
}

impl Recorder {
    /// A recorder starting from `allocator`'s state now (subscribe it to the same allocator
    /// before its next operation).
    pub fn new(allocator: &CachingAllocator, title: impl Into<String>) -> Recorder {
        let stats = allocator.stats();
        let allocated = stats.allocated_bytes.all.current.max(0) as u64;
        let reserved = stats.reserved_bytes.all.current.max(0) as u64;
        let expandable = allocator
            .expandable_segments()
            .into_iter()
            .map(|info| ExpandableRange {
                base: info.base,
                size: info.reserved,
                page: info.page,
                pool: info.pool,
            })
            .collect();
        Recorder {
            timeline: Timeline {
                title: title.into(),
                initial: MemoryLayout::of(allocator),
                initial_allocated: allocated,
                initial_reserved: reserved,
                events: Vec::new(),
                labels: Vec::new(),
                device_total: allocator.device().total_memory(),
                expandable,
            },
            allocated,
            reserved,
        }
    }

    /// A recorder for an allocator that holds nothing yet (a replay's fresh one), on a device
    /// of `device_total` bytes.
    pub fn empty(title: impl Into<String>, device_total: u64) -> Recorder {
        Recorder {
            timeline: Timeline {
                title: title.into(),
                device_total,
                ..Timeline::default()
            },
            allocated: 0,
            reserved: 0,
        }
    }

    /// The events so far.
    pub fn events(&self) -> &[Event] {
        &self.timeline.events
    }

    /// A copy of the timeline so far, with `labels` naming its context ids.
    pub fn timeline(&self, labels: Vec<String>) -> Timeline {
        Timeline {
            labels,
            ..self.timeline.clone()
        }
    }

    /// The timeline, with `labels` naming its context ids.
    pub fn finish(self, labels: Vec<String>) -> Timeline {
        Timeline {
            labels,
            ..self.timeline
        }
    }

    /// Notes an expandable range reserved during the run (kept sorted by base).
    fn note_range(&mut self, event: &MemoryEvent) {
        let known = &mut self.timeline.expandable;
        if let Err(index) = known.binary_search_by_key(&event.addr, |range| range.base) {
            known.insert(
                index,
                ExpandableRange {
                    base: event.addr,
                    size: event.size,
                    page: event.bytes,
                    pool: event.pool,
                },
            );
        }
    }
}

impl MemoryObserver for Recorder {
    fn on_event(&mut self, event: &MemoryEvent) {
        let bytes = event.bytes;
        match event.kind {
            EventKind::Alloc => self.allocated += bytes,
            EventKind::FreeRequested => self.allocated = self.allocated.saturating_sub(bytes),
            EventKind::SegmentAlloc | EventKind::SegmentMap => self.reserved += bytes,
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                self.reserved = self.reserved.saturating_sub(bytes)
            }
            EventKind::RangeReserve => {
                self.note_range(event);
                return;
            }
            // A released range stays listed: the map still draws its earlier pages.
            EventKind::RangeRelease | EventKind::Snapshot => return,
            EventKind::FreeCompleted | EventKind::Oom | EventKind::EmptyCache => {}
        }
        let address = match event.kind {
            // PyTorch's `oom` carries the device's free bytes where an address would be.
            EventKind::Oom | EventKind::EmptyCache => 0,
            _ => event.addr,
        };
        self.timeline.events.push(Event {
            kind: event.kind,
            address,
            size: bytes,
            pool: event.pool,
            allocated: self.allocated,
            reserved: self.reserved,
            context: event.context,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::alloc::AllocConf;
    use crate::device::sim::SimDevice;

    fn allocator(conf: &str) -> CachingAllocator {
        let conf = AllocConf::parse(conf).expect("config");
        CachingAllocator::new(Box::new(SimDevice::new(1 << 30)), conf).expect("allocator")
    }

    fn record(
        allocator: &mut CachingAllocator,
        run: impl FnOnce(&mut CachingAllocator),
    ) -> Timeline {
        let recorder = Rc::new(RefCell::new(Recorder::new(allocator, "test")));
        let id = allocator.subscribe(Box::new(Rc::clone(&recorder)));
        run(allocator);
        allocator.unsubscribe(id);
        let timeline = recorder.borrow().timeline(Vec::new());
        timeline
    }

    #[test]
    fn records_segments_blocks_ooms_and_empty_cache_with_exact_figures() {
        let mut allocator = allocator("");
        allocator.set_trace_context(7);
        let timeline = record(&mut allocator, |allocator| {
            let a = allocator.malloc(30 << 20).expect("fits");
            allocator.free(a).expect("frees");
            assert!(allocator.malloc(2 << 30).is_err());
            allocator.empty_cache().expect("empties");
        });
        let kinds: Vec<&str> = timeline.events.iter().map(|e| e.kind.name()).collect();
        // The OOM's flush already returned the cached segment.
        assert_eq!(
            kinds,
            [
                "segment_alloc",
                "alloc",
                "free_requested",
                "free_completed",
                "segment_free",
                "oom",
                "empty_cache"
            ]
        );
        let figures: Vec<(u64, u64)> = timeline
            .events
            .iter()
            .map(|e| (e.allocated >> 20, e.reserved >> 20))
            .collect();
        assert_eq!(
            figures,
            [(0, 30), (30, 30), (0, 30), (0, 30), (0, 0), (0, 0), (0, 0)]
        );
        assert!(timeline.events.iter().all(|e| e.context == 7));
        assert_eq!(timeline.label(7), "");
        assert_eq!(timeline.peaks(), (30 << 20, 30 << 20));
        let stats = allocator.stats();
        let last = timeline.events.last().map(|e| (e.allocated, e.reserved));
        assert_eq!(
            last,
            Some((
                stats.allocated_bytes.all.current as u64,
                stats.reserved_bytes.all.current as u64
            ))
        );
    }

    #[test]
    fn expandable_segments_map_and_unmap_pages() {
        let mut allocator = allocator("expandable_segments:True");
        let timeline = record(&mut allocator, |allocator| {
            let a = allocator.malloc(30 << 20).expect("fits");
            allocator.free(a).expect("frees");
            allocator.empty_cache().expect("empties");
        });
        let kinds: Vec<&str> = timeline.events.iter().map(|e| e.kind.name()).collect();
        assert_eq!(
            kinds,
            [
                "segment_map",
                "alloc",
                "free_requested",
                "free_completed",
                "empty_cache",
                "segment_unmap"
            ]
        );
        assert_eq!(timeline.events[0].size, 40 << 20, "two 20 MiB pages");
        assert_eq!(timeline.events[5].size, 40 << 20);
        assert_eq!(
            timeline.expandable.len(),
            1,
            "the range reserved on the way"
        );
        assert_eq!(timeline.expandable[0].page, 20 << 20);
        let last = timeline.events.last().map(|e| (e.allocated, e.reserved));
        assert_eq!(last, Some((0, 0)));
    }

    #[test]
    fn a_recorder_started_late_begins_from_the_allocators_state() {
        let mut allocator = allocator("");
        let kept = allocator.malloc(3 << 20).expect("fits");
        let timeline = record(&mut allocator, |allocator| {
            allocator.free(kept).expect("frees");
        });
        assert_eq!(timeline.initial_allocated, 3 << 20);
        assert_eq!(timeline.initial_reserved, 20 << 20);
        let last = timeline.events.last().map(|e| (e.allocated, e.reserved));
        assert_eq!(last, Some((0, 20 << 20)));
    }
}
