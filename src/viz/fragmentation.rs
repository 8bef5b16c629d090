//! `fragmentation()`: how the cache's free bytes are spread, per pool and in total.
//!
//! External fragmentation is `1 − largest_free / cached_free`: 0 when the free bytes form
//! one block (or there are none — nothing free is nothing scattered), approaching 1 as they
//! scatter into many small blocks. A request larger than the largest free block needs new
//! device memory however many bytes are free in total.

use super::layout::{MemoryLayout, Region};
use crate::alloc::Pool;

/// The free blocks of one pool (or of both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FreeSpace {
    /// Bytes in cached free blocks (split free and wholly free segments).
    pub cached_free: u64,
    /// The largest cached free block.
    pub largest_free: u64,
    /// Number of cached free blocks.
    pub free_blocks: u64,
    /// Of `cached_free`, the bytes in wholly free segments: what `empty_cache()` returns.
    pub releasable: u64,
}

impl FreeSpace {
    /// `1 − largest_free / cached_free`, and 0 when nothing is free.
    pub fn external(&self) -> f64 {
        if self.cached_free == 0 {
            0.0
        } else {
            1.0 - self.largest_free as f64 / self.cached_free as f64
        }
    }

    fn add_block(&mut self, size: u64, region: Region) {
        self.cached_free += size;
        self.largest_free = self.largest_free.max(size);
        self.free_blocks += 1;
        if region == Region::CachedFree {
            self.releasable += size;
        }
    }
}

/// Free space per pool and in total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fragmentation {
    /// Both pools.
    pub all: FreeSpace,
    /// The small pool (blocks of at most 1 MiB, in 2 MiB segments).
    pub small: FreeSpace,
    /// The large pool.
    pub large: FreeSpace,
}

impl Fragmentation {
    /// The free space of `layout`. Adjacent free spans count as one block, as the allocator
    /// merges them.
    pub fn of(layout: &MemoryLayout) -> Fragmentation {
        let mut result = Fragmentation::default();
        for segment in &layout.segments {
            let mut run: Option<(u64, Region)> = None;
            let mut close = |run: &mut Option<(u64, Region)>| {
                if let Some((size, region)) = run.take() {
                    result.all.add_block(size, region);
                    match segment.pool {
                        Pool::Small => result.small.add_block(size, region),
                        Pool::Large => result.large.add_block(size, region),
                    }
                }
            };
            for span in &segment.spans {
                if span.region.is_free() {
                    run = Some(match run {
                        Some((size, region)) => (size + span.size, region.min(span.region)),
                        None => (span.size, span.region),
                    });
                } else {
                    close(&mut run);
                }
            }
            close(&mut run);
        }
        result
    }

    /// The figures of one pool.
    pub fn pool(&self, pool: Pool) -> &FreeSpace {
        match pool {
            Pool::Small => &self.small,
            Pool::Large => &self.large,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::viz::layout::SegmentLayout;

    #[test]
    fn scattered_free_blocks_fragment_and_none_free_is_zero() {
        let mib = 1 << 20;
        let split = SegmentLayout::from_blocks(
            0,
            20 * mib,
            Pool::Large,
            [
                (0, 4 * mib, false),
                (4 * mib, 4 * mib, true),
                (8 * mib, 12 * mib, false),
            ],
        );
        let whole =
            SegmentLayout::from_blocks(1 << 30, 2 * mib, Pool::Small, [(1 << 30, 2 * mib, false)]);
        let layout = MemoryLayout {
            segments: vec![split, whole],
        };
        let fragmentation = Fragmentation::of(&layout);
        assert_eq!(fragmentation.large.cached_free, 16 * mib);
        assert_eq!(fragmentation.large.largest_free, 12 * mib);
        assert_eq!(fragmentation.large.free_blocks, 2);
        assert_eq!(fragmentation.large.releasable, 0);
        assert!((fragmentation.large.external() - 0.25).abs() < 1e-12);
        assert_eq!(fragmentation.small.releasable, 2 * mib);
        assert_eq!(fragmentation.small.external(), 0.0);
        assert_eq!(fragmentation.all.cached_free, 18 * mib);
        assert_eq!(fragmentation.all.free_blocks, 3);
        assert_eq!(Fragmentation::default().all.external(), 0.0);
    }
}
