//! What gpumem's allocator did to device memory during one replayed operation: its
//! `segment_alloc`/`segment_free` events, in the order it made them.

use std::collections::BTreeMap;

use crate::alloc::CachingAllocator;
use crate::snapshot::model::Action;

/// One device-level event: (action, address, bytes).
pub type DeviceEvent = (Action, u64, u64);

/// Watches the allocator's segments between operations. The counters `num_device_alloc` and
/// `num_device_free` say cheaply whether anything changed; only then are the segments
/// compared with the last known set (frees first, then allocations, as PyTorch orders them
/// within one malloc).
#[derive(Debug, Default)]
pub struct SegmentWatch {
    known: BTreeMap<u64, u64>,
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
        self.known = now;
    }
}
