//! A run's memory over its allocator events: what the `--timeline` chart and the HTML report
//! draw. A [`Recorder`] subscribes to an allocator's event stream ([`crate::alloc::events`])
//! and produces a [`Timeline`], following allocated and reserved bytes from what each event
//! moves (it never reads or diffs allocator state).
//!
//! Memory stays bounded however long the run: the recorder streams every event into
//!
//! - an [`Envelope`]: the lowest and highest allocated and reserved bytes per bucket of event
//!   numbers, at most [`Envelope::MAX_BUCKETS`] buckets, so peaks are exact at any length;
//! - [`Window`]s: every event, with the segment layout before the first, around each OOM (the
//!   first [`super::window::KEPT_OOMS`]) and both peaks, for single-event zoom and the segment map;
//! - [`Mark`]s: OOMs, `empty_cache()` calls and the script's `mark(text)` phases;
//!
//! and a run of at most [`Recorder::FULL_RUN`] events keeps every event in one window.
//!
//! Events are numbered by [`Numbering`]: a script's by the allocator's order (1, 2, ...), a
//! replay's by the index of the file event that caused them (the replay sets it as the
//! allocator's context), so a picture names the event the text names.

pub use super::event::{Event, ExpandableRange};

use super::envelope::Envelope;
use super::layout::MemoryLayout;
use super::live::LiveLayout;
use super::window::{Keeper, Purpose, Window};
use crate::alloc::{CachingAllocator, EventKind, MemoryEvent, MemoryObserver};

/// How a timeline numbers its events (its x axis).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Numbering {
    /// The allocator's own order: the first event is 1, the state before it 0 (scripts).
    #[default]
    Sequence,
    /// The number of the replayed file's event each allocator event belongs to (from 1), as
    /// `gpumem replay`'s text numbers them: the replay sets it as the allocator's context.
    TraceIndex,
}

/// What a marker on the timeline stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkKind {
    /// An out-of-memory error.
    Oom(OomLimits),
    /// An `empty_cache()` call.
    EmptyCache,
    /// A phase the script named with `mark(text)`.
    Phase(String),
}

/// The figures that explain an OOM: what was held, what was asked for, and the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomLimits {
    /// Bytes reserved when it happened.
    pub reserved: u64,
    /// The segment that could not be had.
    pub segment: u64,
    /// The device's free bytes then.
    pub device_free: u64,
    /// The cap of `set_per_process_memory_fraction` in force (None: no cap).
    pub cap: Option<u64>,
}

impl OomLimits {
    /// The most the allocator could have reserved from the device: what it held plus what
    /// the device had free (the device total less the CUDA context and other processes).
    pub fn device_reachable(&self) -> u64 {
        self.reserved + self.device_free
    }

    /// Whether the cap, not the device, refused the segment.
    pub fn over_cap(&self) -> bool {
        self.cap
            .is_some_and(|cap| self.reserved + self.segment > cap)
            && self.segment <= self.device_free
    }
}

/// A marker: an OOM, an `empty_cache()` call or a named phase, at an event number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// Where it is on the x axis: the event's number (a phase: the number of the next event).
    pub position: u64,
    /// What it is.
    pub kind: MarkKind,
    /// The caller's context when it happened (see [`Event::context`]).
    pub context: u32,
}

/// Where on the x axis a figure peaked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peak {
    /// The highest value.
    pub bytes: u64,
    /// The number of the first event that reached it (the start, if nothing exceeded it).
    pub position: u64,
}

/// A script location an event context stands for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Site {
    /// The script's own `file:line`.
    pub label: String,
    /// The stdlib helper the event happened in (`mem::require_fresh`), if any: the line is
    /// where the script called it.
    pub helper: Option<String>,
}

impl Site {
    /// `file:line`, with the helper after it (`walkthrough.rhai:12 (mem::fill_until_oom)`).
    pub fn text(&self) -> String {
        match &self.helper {
            Some(helper) => format!("{} ({helper})", self.label),
            None => self.label.clone(),
        }
    }
}

/// How many of each thing the run had (exact, even where the lists are capped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Events recorded (every kind the chart follows).
    pub events: u64,
    /// OOM errors.
    pub ooms: u64,
    /// `empty_cache()` calls.
    pub empty_cache: u64,
    /// Marks not kept in [`Timeline::marks`] (past [`Recorder::MAX_MARKS`]).
    pub marks_dropped: u64,
    /// The highest context id seen.
    pub last_context: u32,
}

/// A recorded run, in bounded memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// What the run was (a script's path, a snapshot file), for titles.
    pub title: String,
    /// How events are numbered.
    pub numbering: Numbering,
    /// The device's total memory.
    pub device_total: u64,
    /// The last event's number + 1: the x axis runs from `envelope.origin` to here.
    pub end: u64,
    /// Allocated and reserved bytes before the first event.
    pub initial: (u64, u64),
    /// Allocated and reserved bytes over the run, per bucket of event numbers.
    pub envelope: Envelope,
    /// The stretches kept event by event, in order (one covering the whole run when it had
    /// at most [`Recorder::FULL_RUN`] events).
    pub windows: Vec<Window>,
    /// OOMs, `empty_cache()` calls and phases, in order.
    pub marks: Vec<Mark>,
    /// Counts of what happened.
    pub counts: Counts,
    /// Where allocated bytes peaked.
    pub peak_allocated: Peak,
    /// Where reserved bytes peaked.
    pub peak_reserved: Peak,
    /// The fraction cap from each event number on (None: no cap), first entry at the start.
    pub caps: Vec<(u64, Option<u64>)>,
    /// What each context id means: entry `i` is id `i + 1`.
    pub labels: Vec<Site>,
    /// Every expandable segment's reserved virtual range seen during the run, by base.
    pub expandable: Vec<ExpandableRange>,
}

impl Default for Timeline {
    fn default() -> Timeline {
        Recorder::empty("", 0).finish(Vec::new())
    }
}

impl Timeline {
    /// The site of context `id` (None for 0, an unknown id, or a replay's numbering).
    pub fn site(&self, id: u32) -> Option<&Site> {
        if self.numbering != Numbering::Sequence {
            return None;
        }
        (id as usize)
            .checked_sub(1)
            .and_then(|index| self.labels.get(index))
    }

    /// The label of context `id` (`""` when it has none).
    pub fn label(&self, id: u32) -> String {
        self.site(id).map_or_else(String::new, Site::text)
    }

    /// The highest allocated and reserved bytes over the run, the start included.
    pub fn peaks(&self) -> (u64, u64) {
        (self.peak_allocated.bytes, self.peak_reserved.bytes)
    }

    /// Whether every event is kept (one window from the start).
    pub fn is_complete(&self) -> bool {
        matches!(self.windows.as_slice(), [only] if only.first == 0 && only.events.len() as u64 == self.counts.events)
    }

    /// The number of events of the calls the script made itself: `empty_cache()` calls not
    /// made inside a stdlib helper.
    pub fn own_empty_cache_calls(&self) -> u64 {
        let helpers = self
            .marks
            .iter()
            .filter(|mark| {
                mark.kind == MarkKind::EmptyCache
                    && self.site(mark.context).is_some_and(|s| s.helper.is_some())
            })
            .count() as u64;
        self.counts.empty_cache.saturating_sub(helpers)
    }
}

/// Builds a [`Timeline`] from an allocator's event stream: subscribe it (shared, as
/// `Rc<RefCell<Recorder>>`, to read it afterwards) with [`CachingAllocator::subscribe`] or
/// `Runtime::subscribe`.
#[derive(Debug)]
pub struct Recorder {
    title: String,
    numbering: Numbering,
    device_total: u64,
    initial_layout: MemoryLayout,
    initial: (u64, u64),
    allocated: u64,
    reserved: u64,
    /// The last event's number.
    position: u64,
    envelope: Envelope,
    keeper: Keeper,
    /// Every event, while the run has at most [`Recorder::FULL_RUN`].
    all: Option<Vec<Event>>,
    marks: Vec<Mark>,
    counts: Counts,
    peak_allocated: Peak,
    peak_reserved: Peak,
    cap: Option<u64>,
    caps: Vec<(u64, Option<u64>)>,
    expandable: Vec<ExpandableRange>,
    /// The x axis's least end ([`Recorder::extend_to`]).
    end_at_least: u64,
}

impl Recorder {
    /// Runs of at most this many events keep every event.
    pub const FULL_RUN: usize = 1 << 17;
    /// At most this many marks are kept (their counts stay exact).
    pub const MAX_MARKS: usize = 20_000;

    /// A recorder starting from `allocator`'s state now (subscribe it to the same allocator
    /// before its next operation); numbered [`Numbering::Sequence`].
    pub fn new(allocator: &CachingAllocator, title: impl Into<String>) -> Recorder {
        let stats = allocator.stats();
        let allocated = stats.allocated_bytes.all.current.max(0) as u64;
        let reserved = stats.reserved_bytes.all.current.max(0) as u64;
        let expandable: Vec<ExpandableRange> = allocator
            .expandable_segments()
            .into_iter()
            .map(|info| ExpandableRange {
                base: info.base,
                size: info.reserved,
                page: info.page,
                pool: info.pool,
            })
            .collect();
        Recorder::start(
            title.into(),
            Numbering::Sequence,
            allocator.device().total_memory(),
            MemoryLayout::of(allocator),
            (allocated, reserved),
            allocator.allowed_memory_maximum(),
            expandable,
        )
    }

    /// A recorder for an allocator that holds nothing yet (a replay's fresh one, numbered by
    /// [`Numbering::TraceIndex`]), on a device of `device_total` bytes.
    pub fn empty(title: impl Into<String>, device_total: u64) -> Recorder {
        Recorder::start(
            title.into(),
            Numbering::TraceIndex,
            device_total,
            MemoryLayout::default(),
            (0, 0),
            None,
            Vec::new(),
        )
    }

    fn start(
        title: String,
        numbering: Numbering,
        device_total: u64,
        initial_layout: MemoryLayout,
        initial: (u64, u64),
        cap: Option<u64>,
        expandable: Vec<ExpandableRange>,
    ) -> Recorder {
        let live = LiveLayout::new(&initial_layout, &expandable);
        let (allocated, reserved) = initial;
        Recorder {
            title,
            numbering,
            device_total,
            initial_layout,
            initial,
            allocated,
            reserved,
            position: 0,
            envelope: Envelope::new(0, allocated, reserved, Envelope::MAX_BUCKETS),
            keeper: Keeper::new(live, initial),
            all: Some(Vec::new()),
            marks: Vec::new(),
            counts: Counts::default(),
            peak_allocated: Peak {
                bytes: allocated,
                position: 0,
            },
            peak_reserved: Peak {
                bytes: reserved,
                position: 0,
            },
            cap,
            caps: vec![(0, cap)],
            expandable,
            end_at_least: 0,
        }
    }

    /// How many envelope buckets to keep at most (default `Envelope::MAX_BUCKETS`; tests
    /// use fewer to make short runs behave as long ones).
    pub fn with_max_buckets(mut self, max_buckets: usize) -> Recorder {
        let (allocated, reserved) = self.initial;
        self.envelope = Envelope::new(0, allocated, reserved, max_buckets);
        self
    }

    /// Events recorded so far.
    pub fn event_count(&self) -> u64 {
        self.counts.events
    }

    /// Marks a phase named `text` at the next event (`mark(text)` in a script), with the
    /// caller's context.
    pub fn mark(&mut self, text: impl Into<String>, context: u32) {
        let position = match self.numbering {
            Numbering::Sequence => self.counts.events + 1,
            Numbering::TraceIndex => self.position + u64::from(self.counts.events > 0),
        };
        self.push_mark(Mark {
            position,
            kind: MarkKind::Phase(text.into()),
            context,
        });
    }

    /// Makes the x axis run at least to `end` (exclusive): a replay's file may end in events
    /// that move no memory (its axis still ends where the file does).
    pub fn extend_to(&mut self, end: u64) {
        self.end_at_least = self.end_at_least.max(end);
    }

    /// A copy of the timeline so far, with `labels` naming its context ids.
    pub fn timeline(&self, labels: Vec<Site>) -> Timeline {
        Recorder {
            title: self.title.clone(),
            numbering: self.numbering,
            device_total: self.device_total,
            initial_layout: self.initial_layout.clone(),
            initial: self.initial,
            allocated: self.allocated,
            reserved: self.reserved,
            position: self.position,
            envelope: self.envelope.clone(),
            keeper: self.keeper.clone(),
            all: self.all.clone(),
            marks: self.marks.clone(),
            counts: self.counts,
            peak_allocated: self.peak_allocated,
            peak_reserved: self.peak_reserved,
            cap: self.cap,
            caps: self.caps.clone(),
            expandable: self.expandable.clone(),
            end_at_least: self.end_at_least,
        }
        .finish(labels)
    }

    /// The timeline, with `labels` naming its context ids.
    pub fn finish(mut self, labels: Vec<Site>) -> Timeline {
        let end = match (self.numbering, self.counts.events) {
            (Numbering::Sequence, events) => events + 1,
            (Numbering::TraceIndex, 0) => 0,
            (Numbering::TraceIndex, _) => self.position + 1,
        }
        .max(self.end_at_least);
        self.envelope.close(end);
        let windows = match self.all.take() {
            Some(events) => vec![Window {
                first: 0,
                before: self.initial,
                layout: Some(self.initial_layout),
                events,
            }],
            None => self.keeper.finish(),
        };
        Timeline {
            title: self.title,
            numbering: self.numbering,
            device_total: self.device_total,
            end,
            initial: self.initial,
            envelope: self.envelope,
            windows,
            marks: self.marks,
            counts: self.counts,
            peak_allocated: self.peak_allocated,
            peak_reserved: self.peak_reserved,
            caps: self.caps,
            labels,
            expandable: self.expandable,
        }
    }

    fn push_mark(&mut self, mark: Mark) {
        if self.marks.len() < Recorder::MAX_MARKS {
            self.marks.push(mark);
        } else {
            self.counts.marks_dropped += 1;
        }
    }

    /// The number of the event `event` (see [`Numbering`]).
    fn number(&self, event: &MemoryEvent) -> u64 {
        match self.numbering {
            Numbering::Sequence => self.counts.events + 1,
            Numbering::TraceIndex => {
                // The context holds the index's low 32 bits; indices never go back, so a
                // smaller value means the index passed a multiple of 2^32.
                let low = u64::from(event.context);
                let candidate = (self.position & !0xFFFF_FFFF) | low;
                if candidate < self.position {
                    candidate + (1 << 32)
                } else {
                    candidate
                }
            }
        }
    }

    /// Notes an expandable range reserved during the run (kept sorted by base).
    fn note_range(&mut self, event: &MemoryEvent) {
        let range = ExpandableRange {
            base: event.addr,
            size: event.size,
            page: event.bytes,
            pool: event.pool,
        };
        self.keeper.layout_mut().note_range(range);
        let known = &mut self.expandable;
        if let Err(index) = known.binary_search_by_key(&event.addr, |range| range.base) {
            known.insert(index, range);
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
            EventKind::SetMemoryFraction => {
                self.cap = (event.size > 0).then_some(event.size);
                let at = match self.numbering {
                    Numbering::Sequence => self.counts.events + 1,
                    Numbering::TraceIndex => self.number(event),
                };
                self.caps.push((at, self.cap));
                return;
            }
            // A released range stays listed: the map still draws its earlier pages.
            EventKind::RangeRelease | EventKind::Snapshot => return,
            EventKind::FreeCompleted | EventKind::Oom | EventKind::EmptyCache => {}
        }
        let position = self.number(event);
        self.position = position;
        let address = match event.kind {
            // PyTorch's `oom` carries the device's free bytes where an address would be.
            EventKind::Oom | EventKind::EmptyCache => 0,
            _ => event.addr,
        };
        let recorded = Event {
            position,
            kind: event.kind,
            address,
            size: bytes,
            pool: event.pool,
            allocated: self.allocated,
            reserved: self.reserved,
            context: event.context,
        };
        self.counts.events += 1;
        if self.numbering == Numbering::Sequence {
            self.counts.last_context = self.counts.last_context.max(event.context);
        }
        self.envelope
            .record(position, self.allocated, self.reserved);
        self.keeper.push(recorded);
        if let Some(all) = &mut self.all {
            if all.len() < Recorder::FULL_RUN {
                all.push(recorded);
            } else {
                self.all = None;
            }
        }
        if self.allocated > self.peak_allocated.bytes {
            self.peak_allocated = Peak {
                bytes: self.allocated,
                position,
            };
            self.keeper.ask(Purpose::PeakAllocated);
        }
        if self.reserved > self.peak_reserved.bytes {
            self.peak_reserved = Peak {
                bytes: self.reserved,
                position,
            };
            self.keeper.ask(Purpose::PeakReserved);
        }
        match event.kind {
            EventKind::Oom => {
                self.keeper.ask(Purpose::Oom(self.counts.ooms));
                self.counts.ooms += 1;
                let limits = OomLimits {
                    reserved: self.reserved,
                    segment: bytes,
                    device_free: event.addr,
                    cap: self.cap,
                };
                self.push_mark(Mark {
                    position,
                    kind: MarkKind::Oom(limits),
                    context: event.context,
                });
            }
            EventKind::EmptyCache => {
                self.counts.empty_cache += 1;
                self.push_mark(Mark {
                    position,
                    kind: MarkKind::EmptyCache,
                    context: event.context,
                });
            }
            _ => {}
        }
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

    fn events(timeline: &Timeline) -> &[Event] {
        assert!(timeline.is_complete(), "a short run keeps every event");
        &timeline.windows[0].events
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
        let kinds: Vec<&str> = events(&timeline).iter().map(|e| e.kind.name()).collect();
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
        let figures: Vec<(u64, u64, u64)> = events(&timeline)
            .iter()
            .map(|e| (e.position, e.allocated >> 20, e.reserved >> 20))
            .collect();
        assert_eq!(
            figures,
            [
                (1, 0, 30),
                (2, 30, 30),
                (3, 0, 30),
                (4, 0, 30),
                (5, 0, 0),
                (6, 0, 0),
                (7, 0, 0)
            ]
        );
        assert!(events(&timeline).iter().all(|e| e.context == 7));
        assert_eq!(timeline.label(7), "");
        assert_eq!(timeline.peaks(), (30 << 20, 30 << 20));
        assert_eq!(timeline.peak_allocated.position, 2);
        assert_eq!(timeline.end, 8);
        assert_eq!((timeline.counts.ooms, timeline.counts.empty_cache), (1, 1));
        let marks: Vec<u64> = timeline.marks.iter().map(|m| m.position).collect();
        assert_eq!(marks, [6, 7]);
        let MarkKind::Oom(limits) = timeline.marks[0].kind else {
            panic!("an OOM mark first: {:?}", timeline.marks);
        };
        assert_eq!(limits.segment, 2 << 30);
        assert_eq!(limits.cap, None);
        assert!(!limits.over_cap());
        let stats = allocator.stats();
        assert_eq!(
            timeline.envelope.last(),
            (
                stats.allocated_bytes.all.current as u64,
                stats.reserved_bytes.all.current as u64
            )
        );
    }

    #[test]
    fn the_fraction_cap_is_followed_and_explains_an_oom() {
        let mut allocator = allocator("");
        let timeline = record(&mut allocator, |allocator| {
            allocator.set_memory_fraction(0.25).expect("a fraction");
            let kept = allocator.malloc(200 << 20).expect("fits under the cap");
            assert!(allocator.malloc(100 << 20).is_err());
            allocator.free(kept).expect("frees");
            allocator.set_memory_fraction(1.0).expect("lifted");
        });
        assert_eq!(
            timeline.caps,
            [(0, None), (1, Some(256 << 20)), (timeline.end, None)]
        );
        let oom = timeline
            .marks
            .iter()
            .find_map(|mark| match mark.kind {
                MarkKind::Oom(limits) => Some(limits),
                _ => None,
            })
            .expect("an OOM");
        assert_eq!(oom.cap, Some(256 << 20));
        assert!(oom.over_cap(), "{oom:?}");
        assert_eq!(oom.reserved, 200 << 20);
    }

    #[test]
    fn expandable_segments_map_and_unmap_pages() {
        let mut allocator = allocator("expandable_segments:True");
        let timeline = record(&mut allocator, |allocator| {
            let a = allocator.malloc(30 << 20).expect("fits");
            allocator.free(a).expect("frees");
            allocator.empty_cache().expect("empties");
        });
        let kinds: Vec<&str> = events(&timeline).iter().map(|e| e.kind.name()).collect();
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
        assert_eq!(events(&timeline)[0].size, 40 << 20, "two 20 MiB pages");
        assert_eq!(events(&timeline)[5].size, 40 << 20);
        assert_eq!(
            timeline.expandable.len(),
            1,
            "the range reserved on the way"
        );
        assert_eq!(timeline.expandable[0].page, 20 << 20);
        assert_eq!(timeline.envelope.last(), (0, 0));
    }

    #[test]
    fn a_recorder_started_late_begins_from_the_allocators_state() {
        let mut allocator = allocator("");
        let kept = allocator.malloc(3 << 20).expect("fits");
        let timeline = record(&mut allocator, |allocator| {
            allocator.free(kept).expect("frees");
        });
        assert_eq!(timeline.initial, (3 << 20, 20 << 20));
        assert_eq!(
            timeline.peak_allocated,
            Peak {
                bytes: 3 << 20,
                position: 0
            }
        );
        assert_eq!(timeline.envelope.last(), (0, 20 << 20));
    }

    #[test]
    fn a_replay_numbers_events_by_the_context_it_sets_even_past_2_to_the_32() {
        let mut allocator = allocator("");
        let recorder = Rc::new(RefCell::new(Recorder::empty("replay", 1 << 30)));
        allocator.subscribe(Box::new(Rc::clone(&recorder)));
        let mut live = Vec::new();
        for index in [5_u64, 9, (1 << 32) - 1, (1 << 32) + 3] {
            allocator.set_trace_context(index as u32);
            live.push(allocator.malloc(1 << 20).expect("fits"));
        }
        allocator.set_trace_context(((1_u64 << 32) + 4) as u32);
        recorder.borrow_mut().mark("phase two", 0);
        allocator.free(live.remove(0)).expect("frees");
        let timeline = recorder.borrow().timeline(Vec::new());
        let positions: Vec<u64> = events(&timeline).iter().map(|e| e.position).collect();
        assert_eq!(
            positions,
            [
                5,
                5,
                9,
                (1 << 32) - 1,
                (1 << 32) - 1,
                (1 << 32) + 3,
                (1 << 32) + 4,
                (1 << 32) + 4
            ]
        );
        assert_eq!(timeline.end, (1 << 32) + 5);
        assert_eq!(timeline.marks[0].position, (1 << 32) + 4);
        assert_eq!(timeline.peak_allocated.position, (1 << 32) + 3);
        assert_eq!(timeline.label(1), "", "a replay's contexts are not sites");
    }

    #[test]
    fn a_long_run_keeps_envelopes_and_windows_in_bounded_memory() {
        let mut allocator = allocator("");
        allocator.set_memory_fraction(0.5).expect("a cap");
        let recorder = Rc::new(RefCell::new(
            Recorder::new(&allocator, "long").with_max_buckets(512),
        ));
        allocator.subscribe(Box::new(Rc::clone(&recorder)));
        let mut live = std::collections::VecDeque::new();
        let mut oom_at = Vec::new();
        for step in 0..(Recorder::FULL_RUN as u64 / 2 + 1000) {
            let size = if step == 20_000 || step == 60_000 {
                1 << 30
            } else {
                (step % 17 + 1) << 16
            };
            match allocator.malloc(size) {
                Ok(block) => live.push_back(block),
                Err(_) => oom_at.push(recorder.borrow().event_count()),
            }
            if live.len() as u64 > 40 + (step / 1000) % 30 {
                if let Some(block) = live.pop_front() {
                    allocator.free(block).expect("frees");
                }
            }
        }
        let timeline = recorder.borrow().timeline(Vec::new());
        let peak = allocator.stats().allocated_bytes.all.peak as u64;
        assert!(!timeline.is_complete(), "more than FULL_RUN events");
        assert!(timeline.envelope.buckets.len() <= 512);
        assert_eq!(timeline.peak_allocated.bytes, peak);
        assert_eq!(
            timeline.envelope.peaks().0 .0,
            peak,
            "the envelope holds the peak"
        );
        assert_eq!(timeline.counts.ooms, 2);
        // Each OOM and each peak lies inside a window that keeps its map.
        let inside = |position: u64| {
            timeline.windows.iter().any(|window| {
                window.layout.is_some()
                    && window.events.first().is_some_and(|e| e.position < position)
                    && window.events.last().is_some_and(|e| e.position > position)
            })
        };
        for mark in &timeline.marks {
            assert!(inside(mark.position), "OOM at {}", mark.position);
        }
        assert!(inside(timeline.peak_allocated.position));
        assert!(inside(timeline.peak_reserved.position));
        let kept: usize = timeline.windows.iter().map(|w| w.events.len()).sum();
        assert!(
            kept <= 4 * (2 * crate::viz::window::RADIUS as usize + 1),
            "{kept} events kept"
        );
        assert_eq!(oom_at.len(), 2);
    }
}
