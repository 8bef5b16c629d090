//! Stretches of a run kept event by event: around each OOM and both peaks, so a report can
//! zoom there to single events and show the segment map before and after each, while the
//! rest of a long run is kept only as an envelope ([`super::envelope`]).
//!
//! A [`Keeper`] holds the last [`RADIUS`] × 2 + 1 events in a ring and the layout before the
//! ring's first event ([`LiveLayout`]). A stretch asked for around event `k` is copied out
//! when event `k + RADIUS` arrives (or at the end), with the layout at its start when it is
//! one of the few that keep one. A peak's stretch is asked for again whenever the peak moves;
//! it is copied at most once per [`RADIUS`] events, so the work stays linear in the run.

use std::collections::VecDeque;

use super::event::Event;
use super::layout::MemoryLayout;
use super::live::LiveLayout;

/// Events kept on each side of an OOM or a peak whose stretch keeps a segment map.
pub const RADIUS: u64 = 1024;
/// Events kept on each side of the OOMs past the first [`MAPPED_OOMS`] (no map).
pub const SMALL_RADIUS: u64 = 8;
/// OOMs whose stretch keeps the segment map (the first ones of the run).
pub const MAPPED_OOMS: u64 = 32;
/// OOMs that get a stretch at all; later ones show only in the envelope and the marks.
pub const KEPT_OOMS: u64 = 16_384;

/// A stretch of consecutive events of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// The run's index (0-based, in the order the recorder saw them) of the first event.
    pub first: u64,
    /// Allocated and reserved bytes before the first event.
    pub before: (u64, u64),
    /// The layout before the first event, for the stretches that keep one.
    pub layout: Option<MemoryLayout>,
    /// The events.
    pub events: Vec<Event>,
}

impl Window {
    /// The run's index after the last event.
    pub fn end(&self) -> u64 {
        self.first + self.events.len() as u64
    }
}

/// Which stretch a request is for: a peak's is replaced when the peak moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Around the `n`-th OOM (0-based).
    Oom(u64),
    /// Around the peak of allocated bytes.
    PeakAllocated,
    /// Around the peak of reserved bytes.
    PeakReserved,
}

#[derive(Debug, Clone, Copy)]
struct Request {
    purpose: Purpose,
    center: u64,
    radius: u64,
    mapped: bool,
}

/// Keeps the stretches asked for, streaming.
#[derive(Debug, Clone)]
pub struct Keeper {
    ring: VecDeque<Event>,
    /// The run's index of `ring[0]`.
    ring_first: u64,
    /// The layout and figures before `ring[0]`.
    before_ring: LiveLayout,
    figures_before_ring: (u64, u64),
    pending: Vec<Request>,
    kept: Vec<(Purpose, Window)>,
}

impl Keeper {
    /// A keeper for a run whose layout before its first event is `start`, with `figures`
    /// (allocated, reserved) then.
    pub fn new(start: LiveLayout, figures: (u64, u64)) -> Keeper {
        Keeper {
            ring: VecDeque::with_capacity((2 * RADIUS + 1) as usize),
            ring_first: 0,
            before_ring: start,
            figures_before_ring: figures,
            pending: Vec::new(),
            kept: Vec::new(),
        }
    }

    /// The layout model before the ring, for expandable ranges learnt during the run.
    pub fn layout_mut(&mut self) -> &mut LiveLayout {
        &mut self.before_ring
    }

    /// The run's index of the next event.
    fn next_index(&self) -> u64 {
        self.ring_first + self.ring.len() as u64
    }

    /// Asks for the stretch around the event just pushed: `RADIUS` events each side with the
    /// map for peaks and the first OOMs, a few without it for later OOMs, nothing past
    /// [`KEPT_OOMS`]. A peak's request replaces the pending one of the same peak.
    pub fn ask(&mut self, purpose: Purpose) {
        let (radius, mapped) = match purpose {
            Purpose::Oom(n) if n >= KEPT_OOMS => return,
            Purpose::Oom(n) if n >= MAPPED_OOMS => (SMALL_RADIUS, false),
            _ => (RADIUS, true),
        };
        let center = self.next_index().saturating_sub(1);
        self.pending.retain(|request| request.purpose != purpose);
        self.pending.push(Request {
            purpose,
            center,
            radius,
            mapped,
        });
    }

    /// Takes the next event.
    pub fn push(&mut self, event: Event) {
        if self.ring.len() as u64 == 2 * RADIUS + 1 {
            if let Some(old) = self.ring.pop_front() {
                self.before_ring
                    .apply(old.kind, old.address, old.size, old.pool);
                self.figures_before_ring = (old.allocated, old.reserved);
                self.ring_first += 1;
            }
        }
        self.ring.push_back(event);
        let last = self.next_index() - 1;
        if self
            .pending
            .iter()
            .any(|request| request.center + request.radius == last)
        {
            self.capture(|request| request.center + request.radius == last);
        }
    }

    /// Copies out the pending stretches `due` picks.
    fn capture(&mut self, due: impl Fn(&Request) -> bool) {
        let (now, later): (Vec<Request>, Vec<Request>) =
            self.pending.iter().partition(|request| due(request));
        self.pending = later;
        for request in now {
            let first = request
                .center
                .saturating_sub(request.radius)
                .max(self.ring_first);
            let mut skip = (first - self.ring_first) as usize;
            // The stretch starts before the first event with its centre's number, as far as
            // the ring reaches, so that number is kept whole: in a replay, one file event can
            // cause many allocator events (a retry frees every cached segment before its OOM).
            let centre = (request.center - self.ring_first) as usize;
            if let Some(number) = self.ring.get(centre).map(|event| event.position) {
                while skip > 0 && self.ring[skip].position >= number {
                    skip -= 1;
                }
            }
            let first = self.ring_first + skip as u64;
            let end = (request.center + request.radius + 1).min(self.next_index());
            let take = (end.saturating_sub(first)) as usize;
            let (before, layout) = if skip == 0 {
                let layout = request.mapped.then(|| self.before_ring.layout());
                (self.figures_before_ring, layout)
            } else {
                let previous = self.ring[skip - 1];
                let layout = request.mapped.then(|| {
                    let mut live = self.before_ring.clone();
                    for event in self.ring.iter().take(skip) {
                        live.apply(event.kind, event.address, event.size, event.pool);
                    }
                    live.layout()
                });
                ((previous.allocated, previous.reserved), layout)
            };
            let window = Window {
                first,
                before,
                layout,
                events: self.ring.iter().skip(skip).take(take).copied().collect(),
            };
            self.kept.retain(|(purpose, _)| *purpose != request.purpose);
            self.kept.push((request.purpose, window));
        }
    }

    /// Ends the run: the stretches still pending are copied with what arrived, and the kept
    /// stretches are returned in order, overlapping ones merged (a merged stretch keeps the
    /// map of its first part; a stretch without a map ends where one with a map begins).
    pub fn finish(mut self) -> Vec<Window> {
        self.capture(|_| true);
        let mut windows: Vec<Window> = self.kept.into_iter().map(|(_, window)| window).collect();
        windows.sort_by_key(|window| window.first);
        let mut merged: Vec<Window> = Vec::with_capacity(windows.len());
        for window in windows {
            let Some(last) = merged.last_mut() else {
                merged.push(window);
                continue;
            };
            if window.first > last.end() {
                merged.push(window);
                continue;
            }
            if last.layout.is_none() && window.layout.is_some() {
                // Keep the map: the earlier stretch stops where this one starts.
                last.events.truncate((window.first - last.first) as usize);
                if last.events.is_empty() {
                    merged.pop();
                }
                merged.push(window);
                continue;
            }
            let overlap = (last.end() - window.first) as usize;
            last.events.extend(window.events.into_iter().skip(overlap));
        }
        merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{EventKind, Pool};
    use crate::viz::layout::Region;

    fn event(index: u64) -> Event {
        Event {
            position: index + 1,
            kind: EventKind::Alloc,
            address: 0x1000 + index * 512,
            size: 512,
            pool: Pool::Small,
            allocated: (index + 1) * 512,
            reserved: 2 << 20,
            context: 0,
        }
    }

    fn keeper() -> Keeper {
        let mut live = LiveLayout::default();
        live.apply(EventKind::SegmentAlloc, 0x1000, 1 << 30, Pool::Small);
        Keeper::new(live, (0, 2 << 20))
    }

    #[test]
    fn a_stretch_is_the_events_around_its_center_with_the_layout_before_it() {
        let mut keeper = keeper();
        for index in 0..10_000 {
            keeper.push(event(index));
            if index == 5000 {
                keeper.ask(Purpose::Oom(0));
            }
        }
        let windows = keeper.finish();
        assert_eq!(windows.len(), 1);
        let window = &windows[0];
        assert_eq!(window.first, 5000 - RADIUS);
        assert_eq!(window.events.len() as u64, 2 * RADIUS + 1);
        assert_eq!(window.events[0], event(5000 - RADIUS));
        assert_eq!(window.before, ((5000 - RADIUS) * 512, 2 << 20));
        let layout = window.layout.as_ref().expect("a map");
        assert_eq!(layout.bytes(Region::Allocated), (5000 - RADIUS) * 512);
    }

    #[test]
    fn a_moving_peak_keeps_only_its_last_stretch_and_near_stretches_merge() {
        let mut keeper = keeper();
        for index in 0..20_000 {
            keeper.push(event(index));
            if index % 100 == 0 && index <= 15_000 {
                keeper.ask(Purpose::PeakAllocated);
            }
            if index == 15_500 || index == 15_600 {
                keeper.ask(Purpose::Oom(index / 15_600));
            }
            if index == 19_990 {
                keeper.ask(Purpose::Oom(40));
            }
        }
        let windows = keeper.finish();
        let spans: Vec<(u64, u64, bool)> = windows
            .iter()
            .map(|w| (w.first, w.end(), w.layout.is_some()))
            .collect();
        assert_eq!(
            spans,
            [
                (15_000 - RADIUS, 15_600 + RADIUS + 1, true),
                (19_990 - SMALL_RADIUS, 19_990 + SMALL_RADIUS + 1, false)
            ]
        );
        for window in &windows {
            for (offset, event_kept) in window.events.iter().enumerate() {
                assert_eq!(*event_kept, event(window.first + offset as u64));
            }
        }
    }

    #[test]
    fn a_stretch_keeps_every_event_of_its_centres_number() {
        // Thirty events share number 500 (a retry's frees, then the OOM): the stretch of an
        // OOM without a map reaches back past all of them.
        let mut keeper = keeper();
        for index in 0..600 {
            let mut kept = event(index);
            kept.position = if (470..500).contains(&index) {
                500
            } else {
                index + 1
            };
            keeper.push(kept);
            if index == 499 {
                keeper.ask(Purpose::Oom(MAPPED_OOMS));
            }
        }
        let windows = keeper.finish();
        assert_eq!(windows.len(), 1);
        assert_eq!(windows[0].first, 469, "one event before number 500");
        assert_eq!(windows[0].events[0].position, 470);
        assert_eq!(windows[0].end(), 500 + SMALL_RADIUS);
    }

    #[test]
    fn a_stretch_near_the_start_begins_at_the_first_event() {
        let mut keeper = keeper();
        for index in 0..50 {
            keeper.push(event(index));
            if index == 3 {
                keeper.ask(Purpose::Oom(0));
            }
        }
        let windows = keeper.finish();
        assert_eq!(windows.len(), 1);
        assert_eq!((windows[0].first, windows[0].events.len()), (0, 50));
        assert_eq!(windows[0].before, (0, 2 << 20));
    }
}
