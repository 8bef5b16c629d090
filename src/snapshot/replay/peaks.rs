//! Memory at the peaks, by stack: which stacks hold how many bytes at the moment reserved
//! memory peaks and at the moment allocated memory peaks, followed as a replay streams.
//!
//! [`PeakTracker`] subscribes to the replay allocator's event stream (blocks handed out and
//! freed, segments and pages acquired and released: the bytes each event moves) and is told
//! before each trace event which stack that event has ([`PeakTracker::begin`]). It keeps the
//! live blocks' stacks and the bytes per stack; peaks are read after each trace event, the
//! state a user sees between two events.
//!
//! Memory stays in proportion to the live blocks and the distinct stacks, never to the events:
//! at a new peak nothing is copied; the changes after it are logged, and once the log is as
//! long as the per-stack table, the peak's totals are rebuilt from the current ones with the
//! log undone (so each logged change is paid for once).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::path::Path;
use std::rc::Rc;

use serde::Serialize;

use super::addresses::AddressHasher;
use super::{replay_tapped, ReplayError, ReplayReport};
use crate::alloc::{EventKind, MemoryEvent, MemoryObserver};
use crate::snapshot::model::Frame;
use crate::snapshot::sites::{self, Held, SiteBytes};
use crate::snapshot::stacks::{SeenStacks, StackKey};

/// Logged changes past which a peak's totals are rebuilt, at least.
const LOG_MIN: usize = 4096;

/// One peak, watched: its value, the event after which it was reached, and either its
/// per-stack totals (once rebuilt) or the changes since it.
#[derive(Debug, Default)]
struct Watch {
    value: u64,
    event: Option<u64>,
    allocated: u64,
    frozen: Option<Vec<(StackKey, Held)>>,
    /// (stack, bytes added, blocks added) since the peak, oldest first.
    log: Vec<(StackKey, i64, i64)>,
}

/// Per-stack bytes at the peaks of reserved and of allocated memory, followed from the
/// allocator's events (see the module documentation).
#[derive(Debug, Default)]
pub struct PeakTracker {
    live: HashMap<u64, (StackKey, u64), BuildHasherDefault<AddressHasher>>,
    totals: Vec<Held>,
    allocated: u64,
    reserved: u64,
    stack: StackKey,
    event: Option<u64>,
    reserved_peak: Watch,
    allocated_peak: Watch,
}

/// What [`PeakTracker::finish`] found: the per-stack totals at one peak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeakStacks {
    /// The peak's value in bytes.
    pub value: u64,
    /// The trace event after which it was reached (`None`: nothing was ever held).
    pub event: Option<u64>,
    /// Bytes of live blocks then.
    pub allocated: u64,
    /// Bytes and blocks per stack then (stacks holding nothing left out).
    pub stacks: Vec<(StackKey, Held)>,
}

impl PeakTracker {
    /// A tracker with nothing live.
    pub fn new() -> PeakTracker {
        PeakTracker::default()
    }

    /// Trace event `index`, whose stack is `stack`, is about to be replayed: the previous
    /// event's end is a moment the peaks are read at.
    pub fn begin(&mut self, index: u64, stack: StackKey) {
        self.end_event();
        self.event = Some(index);
        self.stack = stack;
    }

    /// Reads the peaks after the last event and hands over both peaks' per-stack totals:
    /// (reserved, allocated).
    pub fn finish(mut self) -> (PeakStacks, PeakStacks) {
        self.end_event();
        let totals = &self.totals;
        let take = |mut watch: Watch| -> PeakStacks {
            let stacks = match watch.frozen.take() {
                Some(stacks) => stacks,
                None => rebuild(totals, &watch.log),
            };
            PeakStacks {
                value: watch.value,
                event: watch.event,
                allocated: watch.allocated,
                stacks,
            }
        };
        let reserved = take(std::mem::take(&mut self.reserved_peak));
        let allocated = take(std::mem::take(&mut self.allocated_peak));
        (reserved, allocated)
    }

    fn end_event(&mut self) {
        let Some(event) = self.event else {
            return;
        };
        let allocated = self.allocated;
        for (watch, value) in [
            (&mut self.reserved_peak, self.reserved),
            (&mut self.allocated_peak, self.allocated),
        ] {
            // The first event starts the watch even at zero, so that changes are logged.
            if value > watch.value || watch.event.is_none() {
                watch.value = value;
                watch.event = Some(event);
                watch.allocated = allocated;
                watch.frozen = None;
                watch.log.clear();
            }
        }
    }

    fn change(&mut self, stack: StackKey, bytes: i64, blocks: i64) {
        let index = stack.index();
        if index >= self.totals.len() {
            self.totals.resize(index + 1, Held::default());
        }
        let held = &mut self.totals[index];
        held.bytes = held.bytes.saturating_add_signed(bytes);
        held.blocks = held.blocks.saturating_add_signed(blocks);
        let limit = LOG_MIN.max(self.totals.len());
        for watch in [&mut self.reserved_peak, &mut self.allocated_peak] {
            if watch.frozen.is_some() || watch.event.is_none() {
                continue;
            }
            watch.log.push((stack, bytes, blocks));
            if watch.log.len() > limit {
                watch.frozen = Some(rebuild(&self.totals, &watch.log));
                watch.log = Vec::new();
            }
        }
    }
}

/// The per-stack totals before the changes in `log`: `totals` with the log undone.
fn rebuild(totals: &[Held], log: &[(StackKey, i64, i64)]) -> Vec<(StackKey, Held)> {
    let mut then = totals.to_vec();
    for &(stack, bytes, blocks) in log.iter().rev() {
        if let Some(held) = then.get_mut(stack.index()) {
            held.bytes = held.bytes.saturating_add_signed(-bytes);
            held.blocks = held.blocks.saturating_add_signed(-blocks);
        }
    }
    then.into_iter()
        .enumerate()
        .filter(|(_, held)| held.bytes > 0 || held.blocks > 0)
        .map(|(index, held)| (StackKey(index as u32), held))
        .collect()
}

impl MemoryObserver for PeakTracker {
    fn on_event(&mut self, event: &MemoryEvent) {
        match event.kind {
            EventKind::Alloc => {
                self.allocated += event.bytes;
                let stack = self.stack;
                if let Some((old, bytes)) = self.live.insert(event.addr, (stack, event.bytes)) {
                    // A block handed out twice without a free in between cannot happen in the
                    // allocator; undo the stale entry rather than count it twice.
                    self.change(old, -(bytes as i64), -1);
                }
                self.change(stack, event.bytes as i64, 1);
            }
            EventKind::FreeRequested => {
                self.allocated = self.allocated.saturating_sub(event.bytes);
                if let Some((stack, bytes)) = self.live.remove(&event.addr) {
                    self.change(stack, -(bytes as i64), -1);
                }
            }
            EventKind::SegmentAlloc | EventKind::SegmentMap => self.reserved += event.bytes,
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                self.reserved = self.reserved.saturating_sub(event.bytes);
            }
            _ => {}
        }
    }
}

/// Memory at one peak by allocation site: what `gpumem replay` prints and writes to JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeakSites {
    /// The peak's value in bytes (reserved or allocated).
    pub bytes: u64,
    /// The trace event after which it was reached (`None`: nothing was ever held).
    pub event: Option<u64>,
    /// Bytes of live blocks then (the sites' total).
    pub allocated: u64,
    /// The sites holding memory then, largest first.
    pub sites: Vec<SiteBytes>,
}

impl PeakSites {
    /// Groups a peak's per-stack totals into sites, `frames` giving each stack's frames.
    pub fn of(peak: &PeakStacks, frames: impl Fn(StackKey) -> Vec<Frame>) -> PeakSites {
        PeakSites {
            bytes: peak.value,
            event: peak.event,
            allocated: peak.allocated,
            sites: sites::group(peak.stacks.iter().copied(), frames),
        }
    }
}

/// Memory at both peaks by allocation site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SitesAtPeaks {
    /// At the peak of reserved memory.
    pub reserved: PeakSites,
    /// At the peak of allocated memory.
    pub allocated: PeakSites,
    /// Whether the events' frames were known (when not, every block is "no frames
    /// recorded").
    pub frames_known: bool,
    /// Why frames were not known, when they were not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames_note: Option<String>,
}

impl SitesAtPeaks {
    /// No sites: the frames are not known, for the reason `note` gives.
    pub fn unknown(note: impl Into<String>) -> SitesAtPeaks {
        let nothing = PeakSites {
            bytes: 0,
            event: None,
            allocated: 0,
            sites: Vec::new(),
        };
        SitesAtPeaks {
            reserved: nothing.clone(),
            allocated: nothing,
            frames_known: false,
            frames_note: Some(note.into()),
        }
    }
}

/// Memory at the peaks of the replay `report` made of `path`, by allocation site: the file is
/// replayed once more (same config, device and placement) with a [`PeakTracker`], each event's
/// stack from the streaming reader (`SeenStacks`). A file that records no frames gets no
/// sites and a note that says how to record them.
pub fn sites_at_peaks(path: &Path, report: &ReplayReport) -> Result<SitesAtPeaks, ReplayError> {
    let tracker = Rc::new(RefCell::new(PeakTracker::new()));
    let observer: Box<dyn MemoryObserver> = Box::new(Rc::clone(&tracker));
    let mut stacks = SeenStacks::new();
    replay_tapped(path, report, vec![observer], &mut |emitted| {
        let stack = stacks.key(emitted);
        tracker.borrow_mut().begin(emitted.index, stack);
    })?;
    if stacks.is_empty() {
        return Ok(SitesAtPeaks::unknown(NO_FRAMES_NOTE));
    }
    let (reserved, allocated) = tracker.replace(PeakTracker::new()).finish();
    let frames = |key| stacks.frames(key);
    Ok(SitesAtPeaks {
        reserved: PeakSites::of(&reserved, frames),
        allocated: PeakSites::of(&allocated, frames),
        frames_known: true,
        frames_note: None,
    })
}

/// What [`sites_at_peaks`] says of a file without frames.
pub const NO_FRAMES_NOTE: &str = "the file records no frames: record the history with Python stacks (torch.cuda.memory._record_memory_history(stacks=\"python\") or \"all\")";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::block::Pool;

    fn event(kind: EventKind, addr: u64, bytes: u64) -> MemoryEvent {
        MemoryEvent {
            kind,
            addr,
            size: bytes,
            bytes,
            stream: 0,
            pool: Pool::Large,
            pool_id: crate::alloc::MemPoolId::DEFAULT,
            context: 0,
        }
    }

    fn held(peak: &PeakStacks) -> Vec<(u32, u64, u64)> {
        peak.stacks
            .iter()
            .map(|(key, held)| (key.0, held.bytes, held.blocks))
            .collect()
    }

    #[test]
    fn both_peaks_are_read_between_events() {
        let mut tracker = PeakTracker::new();
        tracker.begin(0, StackKey(1));
        tracker.on_event(&event(EventKind::SegmentAlloc, 0, 100));
        tracker.on_event(&event(EventKind::Alloc, 10, 60));
        tracker.begin(1, StackKey(2));
        tracker.on_event(&event(EventKind::Alloc, 20, 40));
        tracker.begin(2, StackKey(0));
        tracker.on_event(&event(EventKind::FreeRequested, 10, 60));
        tracker.begin(3, StackKey(3));
        tracker.on_event(&event(EventKind::SegmentAlloc, 200, 300));
        tracker.on_event(&event(EventKind::Alloc, 30, 30));
        tracker.begin(4, StackKey(0));
        tracker.on_event(&event(EventKind::FreeRequested, 30, 30));
        tracker.on_event(&event(EventKind::SegmentFree, 200, 300));
        let (reserved, allocated) = tracker.finish();
        assert_eq!((reserved.value, reserved.event), (400, Some(3)));
        assert_eq!(held(&reserved), [(2, 40, 1), (3, 30, 1)]);
        assert_eq!(reserved.allocated, 70);
        assert_eq!((allocated.value, allocated.event), (100, Some(1)));
        assert_eq!(held(&allocated), [(1, 60, 1), (2, 40, 1)]);
    }

    #[test]
    fn a_long_run_after_the_peak_freezes_it_exactly() {
        let mut tracker = PeakTracker::new();
        let mut index = 0;
        for block in 0..10_u64 {
            tracker.begin(index, StackKey(block as u32 % 3));
            tracker.on_event(&event(EventKind::Alloc, block, 1000 + block));
            index += 1;
        }
        let peak = 10 * 1000 + 45;
        // Churn far past the log's limit without a new peak.
        for round in 0..5_000_u64 {
            tracker.begin(index, StackKey(7));
            tracker.on_event(&event(
                EventKind::FreeRequested,
                round % 10,
                1000 + round % 10,
            ));
            index += 1;
            tracker.begin(index, StackKey((round % 10) as u32 % 3));
            tracker.on_event(&event(EventKind::Alloc, round % 10, 1000 + round % 10));
            index += 1;
        }
        let (_, allocated) = tracker.finish();
        assert_eq!((allocated.value, allocated.event), (peak, Some(9)));
        assert_eq!(
            held(&allocated),
            [
                (0, 1000 + 1003 + 1006 + 1009, 4),
                (1, 1001 + 1004 + 1007, 3),
                (2, 1002 + 1005 + 1008, 3)
            ]
        );
    }
}
