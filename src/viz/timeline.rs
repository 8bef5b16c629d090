//! A run's memory over its allocator events: what the `--timeline` chart and the HTML report
//! draw. A [`Recorder`] watches a runtime (or any code driving an allocator, such as a replay)
//! and produces a [`Timeline`]: the layout when recording began, then every event with the
//! allocated and reserved bytes right after it and the context (script line) it came from,
//! enough to rebuild the segment map at any event.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use super::layout::MemoryLayout;
use crate::alloc::{AllocError, CachingAllocator, Pool};
use crate::tensor::observe::{MemoryEvent, MemoryObserver};

/// What happened, named as PyTorch's memory history names it where it has a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A block was handed out: (block address, block size).
    Alloc,
    /// A block went back to the cache: (block address, block size).
    Free,
    /// A segment came from the device: (base, size).
    SegmentAlloc,
    /// A segment went back to the device: (base, size).
    SegmentFree,
    /// Pages of an expandable segment were mapped: (first byte, bytes).
    SegmentMap,
    /// Pages of an expandable segment were unmapped: (first byte, bytes).
    SegmentUnmap,
    /// An out-of-memory error: (0, the segment that could not be had).
    Oom,
    /// `empty_cache()` was called: (0, 0), before the segments it released.
    EmptyCache,
}

impl EventKind {
    /// Every kind, in the order of their numeric codes ([`EventKind::code`]).
    pub const ALL: [EventKind; 8] = [
        EventKind::Alloc,
        EventKind::Free,
        EventKind::SegmentAlloc,
        EventKind::SegmentFree,
        EventKind::SegmentMap,
        EventKind::SegmentUnmap,
        EventKind::Oom,
        EventKind::EmptyCache,
    ];

    /// The name PyTorch's trace uses (`alloc`, `free_completed`, `segment_alloc`, ...;
    /// `empty_cache` is gpumem's).
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Alloc => "alloc",
            EventKind::Free => "free_completed",
            EventKind::SegmentAlloc => "segment_alloc",
            EventKind::SegmentFree => "segment_free",
            EventKind::SegmentMap => "segment_map",
            EventKind::SegmentUnmap => "segment_unmap",
            EventKind::Oom => "oom",
            EventKind::EmptyCache => "empty_cache",
        }
    }

    /// The kind's index in [`EventKind::ALL`], as the report's data encodes it.
    pub fn code(self) -> u8 {
        EventKind::ALL
            .iter()
            .position(|kind| *kind == self)
            .unwrap_or(0) as u8
    }

    /// Whether charts mark it (OOMs and `empty_cache()` calls).
    pub fn is_marked(self) -> bool {
        matches!(self, EventKind::Oom | EventKind::EmptyCache)
    }
}

/// One event and the memory right after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// Address of the block or segment concerned (0 for OOM and `empty_cache`).
    pub address: u64,
    /// Bytes concerned (see [`EventKind`]).
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

/// Builds a [`Timeline`] from what it is told. Install it on a runtime with
/// [`Recorder::install`], or call [`MemoryObserver::observe`] after each allocator operation
/// of your own (a replay) — always with the allocator as it is right after the operation.
#[derive(Debug)]
pub struct Recorder {
    timeline: Timeline,
    /// Segments as last seen: base → (size, pool).
    segments: BTreeMap<u64, (u64, Pool)>,
    /// `num_device_alloc` and `num_device_free` when segments were last compared.
    device_calls: (i64, i64),
    /// Mapped runs of expandable segments as last seen: start → end.
    mapped: BTreeMap<u64, u64>,
    /// Bytes mapped in expandable segments when last compared.
    mapped_bytes: u64,
}

/// The mapped runs of every expandable segment (start → end), from the allocator's blocks.
fn mapped_runs(allocator: &CachingAllocator) -> BTreeMap<u64, u64> {
    let mut blocks: Vec<(u64, u64)> = allocator
        .blocks()
        .filter(|block| block.mapped && block.is_expandable())
        .map(|block| (block.ptr, block.ptr + block.size))
        .collect();
    blocks.sort_unstable();
    let mut runs: BTreeMap<u64, u64> = BTreeMap::new();
    let mut current: Option<(u64, u64)> = None;
    for (start, end) in blocks {
        current = match current {
            Some((run_start, run_end)) if run_end == start => Some((run_start, end)),
            Some((run_start, run_end)) => {
                runs.insert(run_start, run_end);
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    if let Some((start, end)) = current {
        runs.insert(start, end);
    }
    runs
}

/// The parts of `a`'s runs that `b`'s do not cover, as (start, end).
fn uncovered(a: &BTreeMap<u64, u64>, b: &BTreeMap<u64, u64>) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for (&start, &end) in a {
        let mut at = start;
        // Runs of `b` that overlap [start, end), in order.
        let first = b.range(..=start).next_back().map_or(start, |(&s, _)| s);
        for (&b_start, &b_end) in b.range(first..end) {
            if b_end <= at {
                continue;
            }
            if b_start > at {
                out.push((at, b_start.min(end)));
            }
            at = at.max(b_end);
            if at >= end {
                break;
            }
        }
        if at < end {
            out.push((at, end));
        }
    }
    out
}

impl Recorder {
    /// A recorder starting from `allocator`'s state now.
    pub fn new(allocator: &CachingAllocator, title: impl Into<String>) -> Recorder {
        let stats = allocator.stats();
        let mut recorder = Recorder {
            timeline: Timeline {
                title: title.into(),
                initial: MemoryLayout::of(allocator),
                initial_allocated: stats.allocated_bytes.all.current.max(0) as u64,
                initial_reserved: stats.reserved_bytes.all.current.max(0) as u64,
                events: Vec::new(),
                labels: Vec::new(),
                device_total: allocator.device().total_memory(),
                expandable: Vec::new(),
            },
            segments: allocator
                .segments()
                .map(|(base, size, pool)| (base, (size, pool)))
                .collect(),
            device_calls: (stats.num_device_alloc, stats.num_device_free),
            mapped: BTreeMap::new(),
            mapped_bytes: 0,
        };
        recorder.note_expandable(allocator);
        recorder.mapped = mapped_runs(allocator);
        recorder.mapped_bytes = recorder.mapped.iter().map(|(s, e)| e - s).sum();
        recorder
    }

    /// Starts the timeline from an empty allocator (nothing reserved), whatever the allocator
    /// this recorder was made from held: for a recorder made right after the first operation
    /// of a fresh allocator, as a replay's is.
    pub fn start_empty(&mut self) {
        self.timeline.initial = MemoryLayout::default();
        self.timeline.initial_allocated = 0;
        self.timeline.initial_reserved = 0;
        self.timeline.expandable.clear();
        self.segments.clear();
        self.device_calls = (0, 0);
        self.mapped.clear();
        self.mapped_bytes = 0;
    }

    /// Adds the expandable segments not seen before to the timeline's list; returns the bytes
    /// they map now.
    fn note_expandable(&mut self, allocator: &CachingAllocator) -> u64 {
        let mut mapped = 0;
        for info in allocator.expandable_segments() {
            mapped += info.mapped;
            let known = &mut self.timeline.expandable;
            if let Err(index) = known.binary_search_by_key(&info.base, |range| range.base) {
                known.insert(
                    index,
                    ExpandableRange {
                        base: info.base,
                        size: info.reserved,
                        page: info.page,
                        pool: info.pool,
                    },
                );
            }
        }
        mapped
    }

    /// Records the pages of expandable segments mapped and unmapped since last time (unmaps
    /// first), when the mapped byte count says some were.
    fn mapping_changes(&mut self, allocator: &CachingAllocator, context: u32) {
        if !allocator.config().expandable_segments {
            return;
        }
        let mapped_bytes = self.note_expandable(allocator);
        if mapped_bytes == self.mapped_bytes {
            return;
        }
        self.mapped_bytes = mapped_bytes;
        let now = mapped_runs(allocator);
        let pool_of = |recorder: &Recorder, address: u64| {
            recorder
                .timeline
                .expandable
                .iter()
                .find(|range| address >= range.base && address < range.base + range.size)
                .map_or(Pool::Large, |range| range.pool)
        };
        for (start, end) in uncovered(&self.mapped, &now) {
            let pool = pool_of(self, start);
            self.push(EventKind::SegmentUnmap, start, end - start, pool, context);
        }
        for (start, end) in uncovered(&now, &self.mapped) {
            let pool = pool_of(self, start);
            self.push(EventKind::SegmentMap, start, end - start, pool, context);
        }
        self.mapped = now;
    }

    /// Starts recording `runtime`'s allocator; returns the shared recorder to read the
    /// timeline from afterwards ([`Recorder::finish`]).
    pub fn install(
        runtime: &crate::tensor::Runtime,
        title: impl Into<String>,
    ) -> Rc<RefCell<Recorder>> {
        let recorder = Rc::new(RefCell::new(Recorder::new(&runtime.allocator(), title)));
        runtime.set_observer(Some(Box::new(Rc::clone(&recorder))));
        recorder
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

    fn push(&mut self, kind: EventKind, address: u64, size: u64, pool: Pool, context: u32) {
        let (allocated, reserved) = self.timeline.events.last().map_or(
            (
                self.timeline.initial_allocated,
                self.timeline.initial_reserved,
            ),
            |last| (last.allocated, last.reserved),
        );
        let (allocated, reserved) = match kind {
            EventKind::Alloc => (allocated + size, reserved),
            EventKind::Free => (allocated.saturating_sub(size), reserved),
            EventKind::SegmentAlloc | EventKind::SegmentMap => (allocated, reserved + size),
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                (allocated, reserved.saturating_sub(size))
            }
            EventKind::Oom | EventKind::EmptyCache => (allocated, reserved),
        };
        self.timeline.events.push(Event {
            kind,
            address,
            size,
            pool,
            allocated,
            reserved,
            context,
        });
    }

    /// Records the segments that came and went since last time (releases first: the
    /// allocator frees cached segments before it retries), when the device call counters say
    /// some did.
    fn segment_changes(&mut self, allocator: &CachingAllocator, context: u32) {
        let stats = allocator.stats();
        let calls = (stats.num_device_alloc, stats.num_device_free);
        if calls == self.device_calls {
            return;
        }
        self.device_calls = calls;
        let now: BTreeMap<u64, (u64, Pool)> = allocator
            .segments()
            .map(|(base, size, pool)| (base, (size, pool)))
            .collect();
        let gone: Vec<(u64, (u64, Pool))> = self
            .segments
            .iter()
            .filter(|(base, segment)| now.get(base) != Some(segment))
            .map(|(&base, &segment)| (base, segment))
            .collect();
        let new: Vec<(u64, (u64, Pool))> = now
            .iter()
            .filter(|(base, segment)| self.segments.get(base) != Some(segment))
            .map(|(&base, &segment)| (base, segment))
            .collect();
        for (base, (size, pool)) in gone {
            self.push(EventKind::SegmentFree, base, size, pool, context);
        }
        for (base, (size, pool)) in new {
            self.push(EventKind::SegmentAlloc, base, size, pool, context);
        }
        self.segments = now;
    }

    /// Makes the last event's figures the allocator's own, so nothing can drift.
    fn settle(&mut self, allocator: &CachingAllocator) {
        let stats = allocator.stats();
        if let Some(last) = self.timeline.events.last_mut() {
            last.allocated = stats.allocated_bytes.all.current.max(0) as u64;
            last.reserved = stats.reserved_bytes.all.current.max(0) as u64;
        }
    }
}

impl MemoryObserver for Recorder {
    fn observe(&mut self, event: MemoryEvent<'_>, context: u32, allocator: &CachingAllocator) {
        match event {
            MemoryEvent::Malloc { result, .. } => {
                self.segment_changes(allocator, context);
                self.mapping_changes(allocator, context);
                match result {
                    Ok(allocation) if !allocation.is_null() => {
                        let pool = CachingAllocator::pool_for(allocation.size);
                        self.push(
                            EventKind::Alloc,
                            allocation.ptr.addr(),
                            allocation.size,
                            pool,
                            context,
                        );
                    }
                    Err(AllocError::OutOfMemory(oom)) => {
                        let pool = oom.diagnosis.pool;
                        self.push(EventKind::Oom, 0, oom.alloc_size, pool, context);
                    }
                    _ => {}
                }
            }
            MemoryEvent::Free(allocation) => {
                if allocation.is_null() {
                    return;
                }
                let pool = CachingAllocator::pool_for(allocation.size);
                self.push(
                    EventKind::Free,
                    allocation.ptr.addr(),
                    allocation.size,
                    pool,
                    context,
                );
            }
            MemoryEvent::EmptyCache => {
                self.push(EventKind::EmptyCache, 0, 0, Pool::Large, context);
                self.segment_changes(allocator, context);
                self.mapping_changes(allocator, context);
            }
        }
        self.settle(allocator);
    }
}

impl MemoryObserver for Rc<RefCell<Recorder>> {
    fn observe(&mut self, event: MemoryEvent<'_>, context: u32, allocator: &CachingAllocator) {
        if let Ok(mut recorder) = self.try_borrow_mut() {
            recorder.observe(event, context, allocator);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::AllocConf;
    use crate::device::sim::SimDevice;
    use crate::tensor::{DType, Runtime, Tensor};

    #[test]
    fn records_segments_blocks_ooms_and_empty_cache_with_exact_figures() {
        let runtime = Runtime::sim(SimDevice::new(1 << 30), AllocConf::default()).expect("runtime");
        let recorder = Recorder::install(&runtime, "test");
        runtime.with_allocator(|allocator| allocator.set_trace_context(7));
        let a = Tensor::empty(&runtime, &[30 << 20], DType::UInt8).expect("fits");
        drop(a);
        assert!(Tensor::empty(&runtime, &[2 << 30], DType::UInt8).is_err());
        runtime.empty_cache().expect("empties");
        runtime.set_observer(None);
        let timeline = Rc::try_unwrap(recorder)
            .expect("the runtime let go")
            .into_inner()
            .finish(vec!["x.rhai:1".into()]);
        let kinds: Vec<&str> = timeline.events.iter().map(|e| e.kind.name()).collect();
        // The OOM's flush already returned the cached segment.
        assert_eq!(
            kinds,
            [
                "segment_alloc",
                "alloc",
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
            [(0, 30), (30, 30), (0, 30), (0, 0), (0, 0), (0, 0)]
        );
        assert!(timeline.events.iter().all(|e| e.context == 7));
        assert_eq!(timeline.label(7), "");
        assert_eq!(timeline.peaks(), (30 << 20, 30 << 20));
    }

    #[test]
    fn expandable_segments_map_and_unmap_pages() {
        let conf = AllocConf::parse("expandable_segments:True").expect("config");
        let runtime = Runtime::sim(SimDevice::new(1 << 30), conf).expect("runtime");
        let recorder = Recorder::install(&runtime, "test");
        let a = Tensor::empty(&runtime, &[30 << 20], DType::UInt8).expect("fits");
        drop(a);
        runtime.empty_cache().expect("empties");
        runtime.set_observer(None);
        let timeline = recorder.borrow().timeline(Vec::new());
        let kinds: Vec<&str> = timeline.events.iter().map(|e| e.kind.name()).collect();
        assert_eq!(
            kinds,
            [
                "segment_map",
                "alloc",
                "free_completed",
                "empty_cache",
                "segment_unmap"
            ]
        );
        assert_eq!(timeline.events[0].size, 40 << 20, "two 20 MiB pages");
        assert_eq!(timeline.events[4].size, 40 << 20);
        assert_eq!(timeline.expandable.len(), 1);
        let last = timeline.events.last().map(|e| (e.allocated, e.reserved));
        assert_eq!(last, Some((0, 0)));
    }

    #[test]
    fn uncovered_parts_of_runs() {
        let runs = |list: &[(u64, u64)]| list.iter().copied().collect::<BTreeMap<u64, u64>>();
        assert_eq!(
            uncovered(&runs(&[(0, 10), (20, 30)]), &runs(&[(2, 4), (25, 40)])),
            [(0, 2), (4, 10), (20, 25)]
        );
        assert_eq!(uncovered(&runs(&[(0, 10)]), &runs(&[])), [(0, 10)]);
        assert!(uncovered(&runs(&[(5, 6)]), &runs(&[(0, 10)])).is_empty());
    }
}
