//! The segments and live blocks of a run, followed from its events alone: what a
//! [`super::Recorder`] keeps so that it can hand out the layout at the start of any stretch of
//! events it keeps (a report rebuilds the segment map from there), without holding the events
//! before it. The report's page applies events the same way.
//!
//! A block counts as allocated from its `alloc` to its `free_completed` (a block freed on one
//! stream while another still uses it stays in the map until its streams' work is done).

use std::collections::{BTreeMap, HashMap};

use super::event::ExpandableRange;
use super::layout::{MemoryLayout, Region, SegmentLayout, Span};
use crate::alloc::{EventKind, MemPoolId, Pool};

/// One segment: its size, pool and, for an expandable segment, its mapped runs.
#[derive(Debug, Clone)]
struct Segment {
    size: u64,
    pool: Pool,
    /// For an expandable segment: (page bytes, mapped `[start, end)` runs sorted and merged).
    mapped: Option<(u64, Vec<(u64, u64)>)>,
}

/// The layout of a run as its events leave it.
#[derive(Debug, Clone, Default)]
pub struct LiveLayout {
    segments: BTreeMap<u64, Segment>,
    blocks: BTreeMap<u64, u64>,
    /// Expandable ranges by base (their segments are keyed by the range's base).
    ranges: BTreeMap<u64, ExpandableRange>,
    /// Allocated bytes by block address, for lookups by the frees.
    sizes: HashMap<u64, u64>,
}

impl LiveLayout {
    /// The layout `initial`, with the expandable ranges `ranges` known.
    pub fn new(initial: &MemoryLayout, ranges: &[ExpandableRange]) -> LiveLayout {
        let mut live = LiveLayout::default();
        for range in ranges {
            live.ranges.insert(range.base, *range);
        }
        for segment in &initial.segments {
            let mapped = live.ranges.get(&segment.address).map(|range| {
                let runs = segment
                    .spans
                    .iter()
                    .filter(|span| span.region != Region::Unmapped)
                    .map(|span| (span.address, span.address + span.size))
                    .collect();
                (range.page, merge_runs(runs))
            });
            live.segments.insert(
                segment.address,
                Segment {
                    size: segment.size,
                    pool: segment.pool,
                    mapped,
                },
            );
            for span in &segment.spans {
                if span.region == Region::Allocated {
                    live.blocks.insert(span.address, span.size);
                    live.sizes.insert(span.address, span.size);
                }
            }
        }
        live
    }

    /// Notes an expandable range reserved during the run.
    pub fn note_range(&mut self, range: ExpandableRange) {
        self.ranges.entry(range.base).or_insert(range);
    }

    /// Applies one event: `kind` at `address` moving `size` bytes in `pool` (the recorder's
    /// [`super::Event`] fields).
    pub fn apply(&mut self, kind: EventKind, address: u64, size: u64, pool: Pool) {
        match kind {
            EventKind::SegmentAlloc => {
                self.segments.insert(
                    address,
                    Segment {
                        size,
                        pool,
                        mapped: None,
                    },
                );
            }
            EventKind::SegmentFree => {
                self.segments.remove(&address);
            }
            EventKind::SegmentMap | EventKind::SegmentUnmap => {
                let Some((&base, range)) = self.ranges.range(..=address).next_back() else {
                    return;
                };
                if address >= base + range.size {
                    return;
                }
                let page = range.page;
                let segment = self.segments.entry(base).or_insert(Segment {
                    size: 0,
                    pool: range.pool,
                    mapped: Some((page, Vec::new())),
                });
                let (_, runs) = segment.mapped.get_or_insert((page, Vec::new()));
                if kind == EventKind::SegmentMap {
                    runs.push((address, address + size));
                    *runs = merge_runs(std::mem::take(runs));
                } else {
                    *runs = cut_runs(runs, address, address + size);
                }
                segment.size = runs.last().map_or(0, |run| run.1 - base);
                if segment.size == 0 {
                    self.segments.remove(&base);
                }
            }
            EventKind::Alloc => {
                self.blocks.insert(address, size);
                self.sizes.insert(address, size);
            }
            EventKind::FreeCompleted => {
                self.blocks.remove(&address);
                self.sizes.remove(&address);
            }
            _ => {}
        }
    }

    /// The layout now, as [`MemoryLayout::of`] would show it: allocated blocks, the free bytes
    /// between them (split-free in a segment that holds something, cached-free in one that
    /// holds nothing; in an expandable segment whole free pages are cached-free and unmapped
    /// stretches unmapped).
    pub fn layout(&self) -> MemoryLayout {
        let segments = self
            .segments
            .iter()
            .map(|(&base, segment)| {
                let end = base + segment.size;
                let blocks: Vec<(u64, u64)> = self
                    .blocks
                    .range(base..end)
                    .map(|(&address, &size)| (address, size))
                    .collect();
                let mut spans = Vec::new();
                let mut at = base;
                for &(address, size) in &blocks {
                    self.free_spans(segment, base, at, address, !blocks.is_empty(), &mut spans);
                    spans.push(Span {
                        address,
                        size,
                        region: Region::Allocated,
                    });
                    at = at.max(address + size);
                }
                self.free_spans(segment, base, at, end, !blocks.is_empty(), &mut spans);
                SegmentLayout {
                    address: base,
                    size: segment.size,
                    pool: segment.pool,
                    // Events do not say which private pool made a segment: the default.
                    pool_id: MemPoolId::DEFAULT,
                    spans,
                }
            })
            .collect();
        MemoryLayout { segments }
    }

    /// The free spans of `from..to` in `segment` (based at `base`).
    fn free_spans(
        &self,
        segment: &Segment,
        base: u64,
        from: u64,
        to: u64,
        holds_blocks: bool,
        spans: &mut Vec<Span>,
    ) {
        if to <= from {
            return;
        }
        let Some((page, runs)) = &segment.mapped else {
            spans.push(Span {
                address: from,
                size: to - from,
                region: if holds_blocks {
                    Region::SplitFree
                } else {
                    Region::CachedFree
                },
            });
            return;
        };
        let mut at = from;
        for &(start, end) in runs {
            if end <= at || start >= to {
                continue;
            }
            if start > at {
                push(spans, at, start, Region::Unmapped);
            }
            let (a, b) = (start.max(at), end.min(to));
            let page = (*page).max(1);
            let first = base + (a - base).div_ceil(page) * page;
            let last = base + (b - base) / page * page;
            if first >= last {
                push(spans, a, b, Region::SplitFree);
            } else {
                push(spans, a, first, Region::SplitFree);
                push(spans, first, last, Region::CachedFree);
                push(spans, last, b, Region::SplitFree);
            }
            at = b;
        }
        if at < to {
            push(spans, at, to, Region::Unmapped);
        }
    }
}

fn push(spans: &mut Vec<Span>, from: u64, to: u64, region: Region) {
    if to > from {
        spans.push(Span {
            address: from,
            size: to - from,
            region,
        });
    }
}

/// Runs sorted and merged where they touch or overlap.
fn merge_runs(mut runs: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    runs.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for (start, end) in runs {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// `runs` without `from..to`.
fn cut_runs(runs: &[(u64, u64)], from: u64, to: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(runs.len() + 1);
    for &(start, end) in runs {
        if end <= from || start >= to {
            out.push((start, end));
            continue;
        }
        if start < from {
            out.push((start, from));
        }
        if end > to {
            out.push((to, end));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::alloc::{AllocConf, CachingAllocator, MemoryEvent, MemoryObserver};
    use crate::device::sim::SimDevice;

    /// Follows an allocator's events into a [`LiveLayout`].
    struct Follow(LiveLayout);

    impl MemoryObserver for Follow {
        fn on_event(&mut self, event: &MemoryEvent) {
            if event.kind == EventKind::RangeReserve {
                self.0.note_range(ExpandableRange {
                    base: event.addr,
                    size: event.size,
                    page: event.bytes,
                    pool: event.pool,
                });
            }
            self.0
                .apply(event.kind, event.addr, event.bytes, event.pool);
        }
    }

    /// Runs a mixed workload, checking after every step that the layout followed from the
    /// events is the allocator's own.
    fn follows_the_allocator(conf: &str) {
        let conf = AllocConf::parse(conf).expect("config");
        let mut allocator =
            CachingAllocator::new(Box::new(SimDevice::new(4 << 30)), conf).expect("allocator");
        let kept = allocator.malloc(3 << 20).expect("fits");
        let ranges: Vec<ExpandableRange> = allocator
            .expandable_segments()
            .into_iter()
            .map(|info| ExpandableRange {
                base: info.base,
                size: info.reserved,
                page: info.page,
                pool: info.pool,
            })
            .collect();
        let follow = Rc::new(RefCell::new(Follow(LiveLayout::new(
            &MemoryLayout::of(&allocator),
            &ranges,
        ))));
        allocator.subscribe(Box::new(Rc::clone(&follow)));
        let mut live = vec![kept];
        let sizes = [
            512_u64,
            700_000,
            3 << 20,
            13 << 20,
            30 << 20,
            200 << 20,
            1 << 10,
        ];
        for step in 0..400_usize {
            if step % 3 == 2 && !live.is_empty() {
                let block = live.remove((step * 7) % live.len());
                allocator.free(block).expect("frees");
            } else if let Ok(block) = allocator.malloc(sizes[step % sizes.len()]) {
                live.push(block);
            }
            if step % 97 == 96 {
                allocator.empty_cache().expect("empties");
            }
            assert_eq!(
                follow.borrow().0.layout(),
                MemoryLayout::of(&allocator),
                "step {step}"
            );
        }
    }

    #[test]
    fn follows_segments_and_blocks() {
        follows_the_allocator("");
    }

    #[test]
    fn follows_expandable_segments_page_by_page() {
        follows_the_allocator("expandable_segments:True");
    }
}
