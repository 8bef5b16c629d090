//! The first pass over a snapshot, before anything is replayed: what each action's count
//! says about how the trace was recorded (an empty history, `skip_actions`), what the trace
//! shows of the state it starts from, and the reserved bytes and OOMs a limit is inferred
//! from ([`super::limit`]).
//!
//! PyTorch keeps only the last `max_entries` events, so a long job's trace starts mid-run.
//! What was live at its first event is what the trace touches first by freeing it — a block
//! freed, a segment released, pages unmapped, none of which it allocated — and what is live
//! at the end without the trace having made it. This pass records the first kind as it goes
//! (memory in proportion to the live state); [`super::start`] adds the second from the
//! file's end-state `segments`. It is the walk backwards from the end state that PyTorch's
//! memory_viz does, run forwards.

use super::addresses::{AddressMap, AddressSet};
use super::limit::Pressure;
use super::mapped::MappedSince;
use super::ranges::Ranges;
use super::sequence::DeviceCall;
use crate::snapshot::model::Action;
use crate::snapshot::pickle::{Emitted, Entry, Trace};
use std::collections::BTreeMap;

/// A block the trace frees without having allocated it: live when the trace starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstFree {
    /// The event that freed it.
    pub index: u64,
    /// Its address.
    pub addr: u64,
    /// The bytes it was asked for (the free event's `size`).
    pub requested: u64,
    /// Its stream.
    pub stream: u64,
    /// Whether its free was already requested when the trace starts (the trace's first event
    /// about it is `free_completed`).
    pub free_requested: bool,
    /// The event that completed its free, giving the block back to the cache: this one when
    /// it is a `free_completed`, else the `free_completed` that followed (a free deferred by
    /// `record_stream` completes later); `None` while the trace shows no completion.
    pub completed_at: Option<u64>,
}

/// A segment event the scan keeps: a segment or pages the trace gives back without having
/// acquired them (held when the trace starts), or pages it maps or unmaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentEventAt {
    /// The event.
    pub index: u64,
    /// Its address.
    pub addr: u64,
    /// Its bytes.
    pub size: u64,
    /// Its stream.
    pub stream: u64,
}

/// An allocation of the trace, as [`super::start`] reads it: PyTorch serves a request from
/// the best-fitting cached free block of its stream and pool, and makes a segment only where
/// none would serve it, so each allocation says which free blocks were too small at that
/// moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocAt {
    /// The `alloc` event.
    pub index: u64,
    /// The block's address.
    pub addr: u64,
    /// The bytes asked for.
    pub requested: u64,
    /// Its stream.
    pub stream: u64,
    /// The `segment_alloc` event right before it that made a `cudaMalloc` segment at its
    /// address, if one did: the request found no cached block to serve it.
    pub made_segment_at: Option<u64>,
}

/// Appends `event` to `list` while it holds fewer than [`MAX_KEPT_CALLS`] (a list that
/// reached it is known to be cut short).
fn keep_at_most(list: &mut Vec<SegmentEventAt>, event: SegmentEventAt) {
    if list.len() < MAX_KEPT_CALLS {
        list.push(event);
    }
}

/// Where a live block the trace named stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Allocated, its free not requested.
    Allocated,
    /// Its free requested (at this event), not completed.
    Requested(u64),
}

/// What the first pass learned.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// The device whose trace is replayed (`--device-index`); `None`: the first with events.
    wanted: Option<u32>,
    /// The device of the trace replayed, once an event of it was seen.
    device: Option<u32>,
    /// The trace list replayed: the first that has events (as the replay picks it).
    list: Option<u32>,
    /// Events of that list.
    pub events: u64,
    /// Events of other lists (other devices).
    pub other_device_events: u64,
    /// The number ([`super::event_number`]) of the replayed trace's last event so far.
    pub last: u64,
    /// Events of each kind, by [`Action::code`].
    actions: [u64; Action::ALL.len()],
    /// The blocks the trace allocated (or freed first) that are live or awaiting their free's
    /// completion: memory in proportion to the live blocks.
    blocks: AddressMap<Held>,
    /// Addresses of [`Scan::first_frees`]: a second free of one of them without an allocation
    /// between is a free the trace cannot explain.
    first_freed: AddressSet,
    /// Blocks freed before the trace allocated them.
    pub first_frees: Vec<FirstFree>,
    /// Of those, the ones whose free the trace requested and has not completed yet, by
    /// address: their position in [`Scan::first_frees`].
    first_frees_pending: AddressMap<usize>,
    /// The trace's allocations, in order (the first [`MAX_KEPT_CALLS`]).
    pub allocs: Vec<AllocAt>,
    /// The address and number of the `segment_alloc` that was the previous event, if it was
    /// one.
    segment_just_made: Option<(u64, u64)>,
    /// The number of the first `alloc` at each address the trace allocated (at most
    /// [`MAX_KEPT_CALLS`] addresses; later new ones are not kept): where a block boundary
    /// lay while blocks live at the trace's start were still held ([`Scan::first_alloc_from`]).
    first_allocs: BTreeMap<u64, u64>,
    /// `cudaMalloc` segments the trace made and has not freed.
    segments: AddressMap<u64>,
    /// The number of the last `segment_alloc` at each address (for the private pools' routes,
    /// [`super::engine::PoolRoutes`]).
    made_at: AddressMap<u64>,
    /// Segments freed before the trace made them.
    pub first_segment_frees: Vec<SegmentEventAt>,
    /// Expandable-segment pages the trace has mapped or unmapped.
    pub touched_pages: Ranges,
    /// The pages mapped now, and where each mapped range began (a private pool's expandable
    /// segment is routed from there).
    mapped: MappedSince,
    /// Pages unmapped before the trace mapped them.
    pub first_unmaps: Vec<SegmentEventAt>,
    /// The trace's `segment_map` events, in order (the first [`MAX_KEPT_CALLS`]): which
    /// segment pages mapped while one held at the start still had pages mapped went into
    /// (`super::start`).
    pub maps: Vec<SegmentEventAt>,
    /// The trace's `segment_unmap` events, in order (the first [`MAX_KEPT_CALLS`]): with
    /// [`Scan::maps`], until when a segment held at the start still had pages mapped
    /// (`super::start`).
    pub unmaps: Vec<SegmentEventAt>,
    /// Frees of blocks the trace already freed and did not allocate again (the trace
    /// misses allocations: `skip_actions`).
    pub unmatched_frees: u64,
    /// Allocations at an address the trace allocated and never freed since (the trace misses
    /// frees: `skip_actions`).
    pub double_allocs: u64,
    /// Allocations at an address whose free was requested and never recorded as completed:
    /// the trace misses `free_completed` events (`skip_actions`), rather than frees deferred
    /// by `record_stream` still pending.
    pub allocs_after_request: u64,
    /// Reserved bytes and OOMs over the trace.
    pub pressure: Pressure,
    /// The trace's `cudaMalloc`/`cudaFree` calls in order, for a replay to follow
    /// ([`super::sequence`]); `None` once there were more than [`MAX_KEPT_CALLS`].
    device_calls: Option<Vec<DeviceCall>>,
}

/// The most device calls a scan keeps (16 bytes each: 4 MiB): a trace with more (a job
/// releasing and re-making segments on every step under a tight limit, millions of times) is
/// replayed without following its sequence, in memory that does not grow with the trace.
pub const MAX_KEPT_CALLS: usize = 1 << 18;

impl Scan {
    /// A scan of the trace of device `wanted` (`None`: the first device with events).
    pub fn new(wanted: Option<u32>) -> Scan {
        Scan {
            wanted,
            device_calls: Some(Vec::new()),
            ..Scan::default()
        }
    }

    /// The trace's `cudaMalloc`/`cudaFree` calls in order (`None`: too many were recorded to
    /// keep, [`MAX_KEPT_CALLS`]).
    pub fn device_calls(&self) -> Option<&[DeviceCall]> {
        self.device_calls.as_deref()
    }

    fn keep_call(&mut self, call: DeviceCall) {
        if let Some(calls) = &mut self.device_calls {
            if calls.len() < MAX_KEPT_CALLS {
                calls.push(call);
            } else {
                self.device_calls = None;
            }
        }
    }

    /// The lowest address in `from..to` the trace allocated before event `before`, if any
    /// (as far as [`Scan::first_allocs`] kept them).
    pub fn first_alloc_from(&self, from: u64, to: u64, before: u64) -> Option<u64> {
        self.first_alloc_from_counted(from, to, before).0
    }

    /// [`Scan::first_alloc_from`], and how many addresses it looked at (its cost).
    pub fn first_alloc_from_counted(&self, from: u64, to: u64, before: u64) -> (Option<u64>, u64) {
        let mut looked = 0;
        let found = self
            .first_allocs
            .range(from..to)
            .inspect(|_| looked += 1)
            .find(|&(_, &index)| index < before)
            .map(|(&addr, _)| addr);
        (found, looked)
    }

    /// Whether `emitted` belongs to the trace replayed (pinned host memory's never does);
    /// counts another device's events.
    pub fn replays(&mut self, emitted: &Emitted) -> bool {
        let Trace::Device(device) = emitted.trace else {
            return false;
        };
        if self.wanted.is_some_and(|wanted| wanted != device) {
            self.other_device_events += 1;
            return false;
        }
        if !matches!(emitted.entry, Entry::Memory(_)) {
            return false;
        }
        if *self.list.get_or_insert(emitted.list) != emitted.list {
            self.other_device_events += 1;
            return false;
        }
        self.device.get_or_insert(device);
        true
    }

    /// Takes in one event.
    pub fn see(&mut self, emitted: &Emitted) {
        if !self.replays(emitted) {
            return;
        }
        let Entry::Memory(event) = &emitted.entry else {
            return;
        };
        self.events += 1;
        self.last = super::event_number(emitted);
        let kind = usize::from(event.action.code());
        if let Some(count) = self.actions.get_mut(kind) {
            *count += 1;
        }
        let index = super::event_number(emitted);
        let addr = event.addr as u64;
        let size = event.size.max(0) as u64;
        let stream = event.stream as u64;
        let event_at = SegmentEventAt {
            index,
            addr,
            size,
            stream,
        };
        let segment_just_made = self.segment_just_made.take();
        match event.action {
            Action::Alloc => {
                if self.allocs.len() < MAX_KEPT_CALLS {
                    self.allocs.push(AllocAt {
                        index,
                        addr,
                        requested: size,
                        stream,
                        made_segment_at: segment_just_made
                            .filter(|&(made, _)| made == addr)
                            .map(|(_, at)| at),
                    });
                }
                if self.first_allocs.len() < MAX_KEPT_CALLS {
                    self.first_allocs.entry(addr).or_insert(index);
                }
                // A block allocated again before its first free completed (a trace that
                // contradicts itself): that free's completion is not shown.
                self.first_frees_pending.remove(&addr);
                match self.blocks.insert(addr, Held::Allocated) {
                    Some(Held::Allocated) => self.double_allocs += 1,
                    Some(Held::Requested(_)) => self.allocs_after_request += 1,
                    None => {}
                }
            }
            Action::FreeRequested | Action::FreeCompleted => {
                let requested_only = event.action == Action::FreeRequested;
                let before = if requested_only {
                    self.blocks.insert(addr, Held::Requested(index))
                } else {
                    self.blocks.remove(&addr)
                };
                if !requested_only && matches!(before, Some(Held::Requested(_))) {
                    if let Some(position) = self.first_frees_pending.remove(&addr) {
                        if let Some(first) = self.first_frees.get_mut(position) {
                            first.completed_at = Some(index);
                        }
                    }
                }
                if before.is_none() {
                    if self.first_freed.insert(addr) {
                        if requested_only {
                            self.first_frees_pending
                                .insert(addr, self.first_frees.len());
                        }
                        self.first_frees.push(FirstFree {
                            index,
                            addr,
                            requested: size,
                            stream,
                            free_requested: !requested_only,
                            completed_at: (!requested_only).then_some(index),
                        });
                    } else {
                        self.unmatched_frees += 1;
                        if requested_only {
                            self.blocks.remove(&addr);
                        }
                    }
                }
            }
            Action::SegmentAlloc => {
                self.keep_call(DeviceCall::Malloc {
                    address: addr,
                    size,
                });
                self.segments.insert(addr, size);
                self.made_at.insert(addr, index);
                self.segment_just_made = Some((addr, index));
                self.pressure.acquired(index, size);
            }
            Action::SegmentFree => {
                self.keep_call(DeviceCall::Free { address: addr });
                if self.segments.remove(&addr).is_none() {
                    self.first_segment_frees.push(SegmentEventAt {
                        index,
                        addr,
                        size,
                        stream,
                    });
                }
                self.pressure.released(size);
            }
            Action::SegmentMap => {
                keep_at_most(&mut self.maps, event_at);
                self.touched_pages.insert(addr, addr.saturating_add(size));
                self.mapped.map(addr, addr.saturating_add(size), index);
                self.pressure.acquired(index, size);
            }
            Action::SegmentUnmap => {
                keep_at_most(&mut self.unmaps, event_at);
                let end = addr.saturating_add(size);
                for (start, end) in self.touched_pages.gaps(addr, end) {
                    self.first_unmaps.push(SegmentEventAt {
                        index,
                        addr: start,
                        size: end - start,
                        stream,
                    });
                }
                self.touched_pages.insert(addr, end);
                self.mapped.unmap(addr, end);
                self.pressure.released(size);
            }
            Action::Oom => self.pressure.oom(index, size, addr),
            Action::Snapshot
            | Action::EmptyCache
            | Action::RangeReserve
            | Action::RangeRelease
            | Action::SetMemoryFraction => {}
        }
    }

    /// Whether the trace has shown it starts mid-run: it freed a block, a segment or pages it
    /// had not made.
    pub fn starts_mid_run(&self) -> bool {
        !self.first_frees.is_empty()
            || !self.first_segment_frees.is_empty()
            || !self.first_unmaps.is_empty()
    }

    /// The device of the trace replayed, once an event of it was seen.
    pub fn device(&self) -> Option<u32> {
        self.device
    }

    /// The number of the last `segment_alloc` recorded at `addr`, if any.
    pub fn made_at(&self, addr: u64) -> Option<u64> {
        self.made_at.get(&addr).copied()
    }

    /// The number of the `segment_map` that began the mapped range holding `addr`, if the
    /// trace mapped it and it is still mapped (an expandable segment made in the trace).
    pub fn mapped_since(&self, addr: u64) -> Option<u64> {
        self.mapped.began(addr)
    }

    /// The trace list replayed, once an event was seen.
    pub fn list(&self) -> Option<u32> {
        self.list
    }

    /// Events of `action` in the replayed trace.
    pub fn count(&self, action: Action) -> u64 {
        self.actions
            .get(usize::from(action.code()))
            .copied()
            .unwrap_or(0)
    }

    /// Whether the address was allocated by the trace and is live (or awaiting its free's
    /// completion) at the end.
    pub fn live_at_end(&self, addr: u64) -> bool {
        matches!(
            self.blocks.get(&addr),
            Some(Held::Allocated | Held::Requested(_))
        )
    }

    /// Every block whose free is still pending at the end, with the event that requested it.
    pub fn pending_at_end(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.blocks.iter().filter_map(|(&addr, held)| match held {
            Held::Requested(index) => Some((addr, *index)),
            Held::Allocated => None,
        })
    }

    /// The event that requested the free of the block at `addr` when that free is still
    /// pending at the end (never completed in the trace), if it is.
    pub fn pending_at_end_since(&self, addr: u64) -> Option<u64> {
        match self.blocks.get(&addr) {
            Some(Held::Requested(index)) => Some(*index),
            _ => None,
        }
    }

    /// Whether the trace made the `cudaMalloc` segment at `addr` and did not free it.
    pub fn made_segment(&self, addr: u64) -> bool {
        self.segments.contains_key(&addr)
    }
}
