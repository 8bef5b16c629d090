//! What a malloc would do, found without doing it: whether it would be served from the cache,
//! by new memory, or only after releasing cached memory. A replay uses it to tell which
//! releases in a trace belong to the malloc that follows them and which to an `empty_cache()`
//! called just before it (a trace without frames does not say).

use super::block::{Block, Pool, StreamId, DEFAULT_OWNER};
use super::{Allocation, CachingAllocator, Request, MIB};

/// `cudaMalloc` hands out physical memory in pages of this size on current NVIDIA GPUs (the
/// H200 and the simulated device), so a segment needs its size rounded up to it.
const DEVICE_PAGE: u64 = 2 * MIB;

/// How a malloc would get its block on the allocator's state now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MallocOutlook {
    /// A cached block fits (PyTorch's `get_free_block` succeeds): nothing is released.
    Cached,
    /// New memory (a segment or pages) fits under the device and the memory fraction, and
    /// garbage collection would release nothing first.
    NewMemory,
    /// The malloc would release cached memory first: garbage collection would free a segment,
    /// or new memory is refused (by the fraction or the device) so the OOM path runs.
    Release,
}

impl CachingAllocator {
    /// PyTorch's `process_events`, as a malloc runs it first: frees held back by
    /// `record_stream` whose events completed go back to their pools (nothing while a private
    /// pool is active). A replay runs it before asking [`CachingAllocator::malloc_outlook`].
    pub fn complete_finished_frees(&mut self) -> Result<(), super::AllocError> {
        if self.capture_underway() {
            return Ok(());
        }
        self.process_events()
    }

    /// How `malloc_on(stream, size)` would get its block now, routed as it would be, without
    /// changing anything. Assumes frees whose events completed were already taken back
    /// ([`CachingAllocator::complete_finished_frees`]). The device is asked for its free
    /// memory; a request is taken to fit when that many bytes, in the device's 2 MiB pages,
    /// are free (the simulated device's rule).
    pub fn malloc_outlook(&self, stream: StreamId, size: u64) -> MallocOutlook {
        if size == 0 || size >= super::ONE_EXABYTE {
            return MallocOutlook::Cached;
        }
        let rounded = self.round_size(size);
        let request = Request {
            stream,
            size: rounded,
            pool: Self::pool_for(rounded),
            owner: self.pools.route(stream),
            alloc_size: self.allocation_size(rounded),
            expandable: self.expandable_active(),
        };
        if self.find_free_block(request).is_some() {
            return MallocOutlook::Cached;
        }
        // get_free_block ticks the clock of the request's pool before the collector reads
        // the default large pool's.
        let tick = u64::from(request.owner == DEFAULT_OWNER && request.pool == Pool::Large);
        if self.garbage_collection_enabled() && self.collection_would_release(tick) {
            return MallocOutlook::Release;
        }
        if let Some(allowed) = self.allowed_memory_maximum {
            if self.total_allocated_memory + request.alloc_size > allowed {
                return MallocOutlook::Release;
            }
        }
        let needed = if request.expandable {
            self.bytes_to_map(request)
        } else {
            request.alloc_size.div_ceil(DEVICE_PAGE) * DEVICE_PAGE
        };
        let free = self.device.mem_get_info().map_or(0, |(free, _)| free);
        if needed > free {
            MallocOutlook::Release
        } else {
            MallocOutlook::NewMemory
        }
    }

    /// Whether the block of `allocation` — freed, its free waiting for its streams — would
    /// serve `malloc_on(stream, size)` from the cache once the free completed: the same stream
    /// and pool, at least the rounded size once merged with its free neighbours, and allowed by
    /// the `max_split_size_mb` rules. `false` for anything but such a pending block.
    pub fn pending_block_would_serve(
        &self,
        allocation: Allocation,
        stream: StreamId,
        size: u64,
    ) -> bool {
        let Some(block) = self
            .blocks
            .get(allocation.id)
            .filter(|block| block.pending_free && block.ptr == allocation.ptr)
        else {
            return false;
        };
        let rounded = self.round_size(size);
        if block.stream != stream
            || block.pool != Self::pool_for(rounded)
            || block.owner != self.pools.route(stream)
        {
            return false;
        }
        let neighbour = |id| {
            self.blocks
                .get(id)
                .filter(|other| other.is_free() && other.mapped == block.mapped)
                .map_or(0, |other| other.size)
        };
        let merged = block.size + neighbour(block.prev) + neighbour(block.next);
        let max_split_size = self.config.max_split_size;
        merged >= rounded
            && !(rounded < max_split_size && merged >= max_split_size)
            && !(rounded >= max_split_size
                && merged >= rounded.wrapping_add(self.config.max_non_split_rounding_size))
    }

    /// Whether `garbage_collect_cached_blocks` would release a segment now, with the default
    /// large pool's clock `tick` lookups ahead: its first pass frees every unsplit,
    /// non-expandable cached large block at least as old as the average.
    fn collection_would_release(&self, tick: u64) -> bool {
        let Some(allowed) = self.allowed_memory_maximum else {
            return false;
        };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return false;
        }
        let clock = self.large.get_free_blocks_call_count + tick;
        let age = |block: &Block| clock.saturating_sub(block.gc_count_base) as f64;
        let unsplit: Vec<&Block> = self
            .large
            .iter()
            .map(|key| self.blocks.at(key.3))
            .filter(|block| !block.is_split())
            .collect();
        if unsplit.is_empty() {
            return false;
        }
        let average = unsplit.iter().map(|block| age(block)).sum::<f64>() / unsplit.len() as f64;
        unsplit
            .iter()
            .any(|block| !block.is_expandable() && age(block) >= average)
    }

    /// Bytes of pages an expandable allocation would map: from the lowest place with room
    /// (as `find_expandable_block` finds it), the request less the free mapped bytes it starts
    /// with, in whole pages; a whole new segment's pages when no place has room.
    fn bytes_to_map(&self, request: Request) -> u64 {
        let page = self.page_size(request.pool);
        let pool = self.pool_ref(request.owner, request.pool);
        for unmapped in pool.unmapped_of(request.stream) {
            let mut start = unmapped;
            let prev = self.blocks.at(unmapped).prev;
            if self.blocks.get(prev).is_some_and(Block::is_free) {
                start = prev;
            }
            let mut bytes = 0;
            let mut mapped_free = 0;
            let mut cursor = start;
            while bytes < request.size {
                let Some(block) = self.blocks.get(cursor).filter(|block| block.is_free()) else {
                    break;
                };
                bytes += block.size;
                if block.mapped {
                    mapped_free += block.size;
                }
                cursor = block.next;
            }
            if bytes >= request.size {
                return request.size.saturating_sub(mapped_free).div_ceil(page) * page;
            }
        }
        request.size.div_ceil(page) * page
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocConf, MIB};
    use crate::device::sim::SimDevice;

    fn allocator(conf: &str, total: u64) -> CachingAllocator {
        let conf = AllocConf::parse(conf).expect("valid config");
        CachingAllocator::new(Box::new(SimDevice::new(total)), conf).expect("allocator")
    }

    #[test]
    fn cached_new_memory_or_release() {
        let mut a = allocator("", 1 << 30);
        let x = a.malloc(30 * MIB).expect("alloc");
        a.free(x).expect("free");
        assert_eq!(a.malloc_outlook(0, 20 * MIB), MallocOutlook::Cached);
        assert_eq!(a.malloc_outlook(0, 40 * MIB), MallocOutlook::NewMemory);
        assert_eq!(a.malloc_outlook(0, 900 * MIB), MallocOutlook::Release);
        assert_eq!(
            a.malloc_outlook(7, 20 * MIB),
            MallocOutlook::NewMemory,
            "another stream"
        );
        let total = a.device().total_memory() as f64;
        a.set_memory_fraction(60.0 * MIB as f64 / total)
            .expect("fraction");
        assert_eq!(a.malloc_outlook(0, 32 * MIB), MallocOutlook::Release);
        // The outlook changes nothing: the malloc then does what it said.
        let stats = a.stats().clone();
        let _ = a.malloc_outlook(0, 32 * MIB);
        assert_eq!(a.stats(), &stats);
        let _ = a
            .malloc(32 * MIB)
            .expect("after releasing the cached 30 MiB");
        assert_eq!(a.stats().num_alloc_retries, 1);
    }

    #[test]
    fn garbage_collection_counts_as_release() {
        let mut a = allocator("garbage_collection_threshold:0.5", 1 << 30);
        let total = a.device().total_memory() as f64;
        a.set_memory_fraction(100.0 * MIB as f64 / total)
            .expect("fraction");
        let x = a.malloc(60 * MIB).expect("alloc");
        a.free(x).expect("free");
        assert_eq!(
            a.malloc_outlook(0, 4 * MIB),
            MallocOutlook::Cached,
            "a fit, no collection"
        );
        assert_eq!(a.malloc_outlook(0, 62 * MIB), MallocOutlook::Release);
        let _ = a.malloc(62 * MIB).expect("alloc");
        assert_eq!(
            a.stats().num_device_free,
            1,
            "the collector freed the 60 MiB"
        );
    }

    #[test]
    fn expandable_growth_counts_only_the_pages_to_map() {
        let mut a = allocator("expandable_segments:True", 1 << 30);
        let x = a.malloc(30 * MIB).expect("two pages");
        let _ = a.malloc(5 * MIB).expect("in the second page");
        a.free(x).expect("free");
        let request = |a: &CachingAllocator, size: u64| Request {
            stream: 0,
            size,
            pool: Pool::Large,
            owner: DEFAULT_OWNER,
            alloc_size: a.allocation_size(size),
            expandable: true,
        };
        // The free 5 MiB at the end plus the unmapped rest: 40 MiB needs two more pages.
        assert_eq!(a.bytes_to_map(request(&a, 40 * MIB)), 40 * MIB);
        assert_eq!(a.malloc_outlook(0, 40 * MIB), MallocOutlook::NewMemory);
    }
}
