//! What gpumem's allocator did to device memory during one replayed operation: its
//! `segment_alloc`/`segment_free` events, and for expandable segments its
//! `segment_map`/`segment_unmap` events, releases before acquisitions as PyTorch orders them.

use std::collections::BTreeMap;

use crate::alloc::CachingAllocator;
use crate::snapshot::model::Action;

/// One device-level event: (action, address, bytes).
pub type DeviceEvent = (Action, u64, u64);

/// Watches the allocator's segments between operations. The counters `num_device_alloc` and
/// `num_device_free` (which also count page maps and unmaps) say cheaply whether anything
/// changed; only then are the segments and mapped ranges compared with the last known ones.
/// Two maps of adjacent pages in one operation read as one event.
#[derive(Debug, Default)]
pub struct SegmentWatch {
    known: BTreeMap<u64, u64>,
    /// Mapped ranges of expandable segments, sorted, as (start, end).
    mapped: Vec<(u64, u64)>,
    device_allocs: i64,
    device_frees: i64,
}

impl SegmentWatch {
    /// Appends to `out` what changed since the last call.
    pub fn collect(&mut self, allocator: &CachingAllocator, out: &mut Vec<DeviceEvent>) {
        let stats = allocator.stats();
        if stats.num_device_alloc == self.device_allocs
            && stats.num_device_free == self.device_frees
        {
            return;
        }
        self.device_allocs = stats.num_device_alloc;
        self.device_frees = stats.num_device_free;
        let now: BTreeMap<u64, u64> = allocator
            .segments()
            .map(|(address, size, _)| (address, size))
            .collect();
        let mapped = if allocator.config().expandable_segments {
            mapped_ranges(allocator)
        } else {
            Vec::new()
        };
        for (start, end) in subtract(&self.mapped, &mapped) {
            out.push((Action::SegmentUnmap, start, end - start));
        }
        for (&address, &size) in &self.known {
            if now.get(&address) != Some(&size) {
                out.push((Action::SegmentFree, address, size));
            }
        }
        for (&address, &size) in &now {
            if self.known.get(&address) != Some(&size) {
                out.push((Action::SegmentAlloc, address, size));
            }
        }
        for (start, end) in subtract(&mapped, &self.mapped) {
            out.push((Action::SegmentMap, start, end - start));
        }
        self.known = now;
        self.mapped = mapped;
    }
}

/// The mapped ranges of every expandable segment, sorted and merged.
fn mapped_ranges(allocator: &CachingAllocator) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = allocator
        .segment_snapshots()
        .iter()
        .filter(|segment| segment.is_expandable)
        .map(|segment| (segment.address, segment.address + segment.total_size))
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if last.1 == start => last.1 = end,
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// The parts of the sorted, disjoint ranges `a` not covered by those of `b`.
fn subtract(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(start, end) in a {
        let mut cursor = start;
        while j < b.len() && b[j].1 <= cursor {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].0 < end {
            if b[k].0 > cursor {
                out.push((cursor, b[k].0));
            }
            cursor = cursor.max(b[k].1);
            k += 1;
        }
        if cursor < end {
            out.push((cursor, end));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::subtract;

    #[test]
    fn range_subtraction() {
        assert_eq!(subtract(&[(0, 10)], &[]), [(0, 10)]);
        assert_eq!(subtract(&[(0, 10)], &[(0, 4)]), [(4, 10)]);
        assert_eq!(
            subtract(&[(0, 10), (20, 30)], &[(2, 4), (8, 22)]),
            [(0, 2), (4, 8), (22, 30)]
        );
        assert!(subtract(&[(0, 10)], &[(0, 10)]).is_empty());
    }
}
