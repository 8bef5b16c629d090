//! Scoped measurement: the peaks and device calls of one stretch of work, without resetting
//! the peaks `max_memory_allocated()` reports (the counters' own scope tracking, see
//! [`DeviceStats::begin_scope`](super::DeviceStats::begin_scope)).

use super::stats::{ScopeMark, ScopeReport};
use super::CachingAllocator;

impl CachingAllocator {
    /// Starts measuring; pass the mark to [`CachingAllocator::end_measure`]. Measurements
    /// nest.
    pub fn begin_measure(&mut self) -> ScopeMark {
        self.stats.begin_scope()
    }

    /// Stops the measurement `mark` started and returns the counters at its start and end,
    /// with the peaks inside it.
    pub fn end_measure(&mut self, mark: ScopeMark) -> ScopeReport {
        self.stats.end_scope(mark)
    }
}
