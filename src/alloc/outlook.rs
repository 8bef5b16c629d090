//! What a malloc would do, found without doing it: whether it would be served from the cache,
//! by new memory, or only after releasing cached memory. A replay uses it to tell which
//! releases in a trace belong to the malloc that follows them and which to an `empty_cache()`
//! called just before it (a trace without frames does not say).

use super::block::{Block, BlockId, FreeKey, Pool, PoolOwner, StreamId, DEFAULT_OWNER, NIL};
use super::pools::MemPoolId;
use super::{Allocation, CachingAllocator, Request, MIB};

/// `cudaMalloc` hands out physical memory in pages of this size on current NVIDIA GPUs (the
/// H200 and the simulated device), so a segment needs its size rounded up to it.
const DEVICE_PAGE: u64 = 2 * MIB;

/// A segment a malloc would release: the pool it belongs to and its size. A replay compares
/// these with the trace's `segment_free` events, whose pools it knows from the recorded
/// segments; by size alone, a private pool's cached segment would pass for a default-pool
/// segment of the same size that an `empty_cache()` released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleasedSegment {
    /// The segment's pool ([`MemPoolId::DEFAULT`] for the default pools).
    pub pool: MemPoolId,
    /// Its bytes.
    pub size: u64,
}

/// How a malloc would get its block on the allocator's state now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MallocOutlook {
    /// A cached block fits (PyTorch's `get_free_block` succeeds): nothing is released.
    Cached,
    /// New memory (a segment or pages) fits under the device and the memory fraction, and
    /// garbage collection would release nothing first.
    NewMemory,
    /// Garbage collection would release these cached segments, in this order, after which new
    /// memory fits.
    Collect(Vec<ReleasedSegment>),
    /// New memory is refused (by the fraction or the device), even after garbage collection:
    /// the malloc's OOM path runs and releases cached memory.
    Release {
        /// The segments released, in order (garbage collection's,
        /// `release_available_cached_blocks`', then `release_cached_blocks`'); `None` where
        /// gpumem does not predict them (expandable segments, whose pages are unmapped).
        released: Option<Vec<ReleasedSegment>>,
        /// Whether the path reaches `release_cached_blocks`, which completes every pending
        /// free (`synchronize_and_free_events`).
        flush: bool,
    },
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
        self.outlook_with(stream, size, &[])
    }

    /// How `malloc_on(stream, size)` would get its block if it were asked in a private pool
    /// that holds no memory yet (a `MemPool` just entered), without creating that pool: no
    /// cached block serves it; garbage collection (which reads the default large pool
    /// whatever pool is asked) may release first; `release_available_cached_blocks` finds
    /// nothing in an empty pool, and `release_cached_blocks` is skipped while a pool is active
    /// (PyTorch's `captures_underway` is not empty). `None` with expandable segments, whose
    /// pages a new pool's first request maps in a segment of its own (not predicted here).
    /// A replay asks it to tell a malloc in a pool the trace no longer shows, whose garbage
    /// collection released cached segments, from an `empty_cache()` before a default-pool
    /// malloc: the trace reads alike.
    ///
    /// The pending frees of `completed` are taken as completed (back in their pools, as
    /// young as a block can be), as in [`CachingAllocator::malloc_outlook_if_completed`].
    pub fn malloc_outlook_in_empty_pool(
        &self,
        stream: StreamId,
        size: u64,
        completed: &[Allocation],
    ) -> Option<MallocOutlook> {
        if self.expandable_active() || size == 0 || size >= super::ONE_EXABYTE {
            return None;
        }
        let rounded = self.round_size(size);
        let request = Request {
            stream,
            size: rounded,
            pool: Self::pool_for(rounded),
            // Read by nothing below but the fit of new memory, which no pool's state changes
            // without expandable segments.
            owner: DEFAULT_OWNER,
            alloc_size: self.allocation_size(rounded),
            expandable: false,
        };
        // Whole default-pool segments the completions give back, for the collector to read.
        let young: Vec<FreeKey> = completed
            .iter()
            .filter_map(|&allocation| self.whole_segment_once_completed(allocation))
            .filter(|&(owner, _)| owner == DEFAULT_OWNER)
            .map(|(_, key)| key)
            .collect();
        // The request's pool is not the default large pool: its get_free_block ticks no clock
        // the collector reads.
        let released = if self.garbage_collection_enabled() {
            self.collection_plan(0, &young)
        } else {
            Vec::new()
        };
        let sizes: Vec<ReleasedSegment> = released
            .iter()
            .map(|&(id, size)| ReleasedSegment {
                pool: self.pool_id(self.blocks.at(id).owner),
                size,
            })
            .collect();
        Some(if self.new_memory_fits(request, &released) {
            if sizes.is_empty() {
                MallocOutlook::NewMemory
            } else {
                MallocOutlook::Collect(sizes)
            }
        } else {
            MallocOutlook::Release {
                released: Some(sizes),
                flush: false,
            }
        })
    }

    /// The base addresses of the segments garbage collection would release now for a
    /// `malloc_on(stream, size)` asked in the default pools, in its order (empty where it
    /// would not run or release nothing). A replay asks it where the trace shows a malloc
    /// that released nothing: segments the collector would have taken were not the default
    /// large pool's (a private pool's, which it never reads).
    pub fn collection_outlook(&self, stream: StreamId, size: u64) -> Vec<u64> {
        if !self.garbage_collection_enabled() || size == 0 || size >= super::ONE_EXABYTE {
            return Vec::new();
        }
        let rounded = self.round_size(size);
        let large = Self::pool_for(rounded) == Pool::Large;
        // As `outlook_with`: a default large-pool request's get_free_block ticks the clock the
        // collector reads.
        let tick = u64::from(large && self.pools.route(stream) == DEFAULT_OWNER);
        self.collection_plan(tick, &[])
            .into_iter()
            .map(|(id, _)| self.blocks.at(id).ptr)
            .collect()
    }

    /// The base address of the `cudaMalloc` segment whose cached block `malloc_on(stream,
    /// size)` asked in the default pools would take now (`None`: no cached block serves it,
    /// or the block lies in an expandable segment). A replay asks it where the trace shows a
    /// default-pool malloc that made new memory instead: that segment was not the default
    /// pools' (a private pool's, which the replay had not told).
    pub fn default_cached_block_segment(&self, stream: StreamId, size: u64) -> Option<u64> {
        if size == 0 || size >= super::ONE_EXABYTE {
            return None;
        }
        let request = Request {
            owner: DEFAULT_OWNER,
            ..self.request_as_routed(stream, size)
        };
        let (_, _, _, id) = self.find_free_block(request)?;
        let block = self.blocks.at(id);
        (!block.is_expandable()).then(|| block.segment_base.addr())
    }

    /// The request `malloc_on(stream, size)` makes, in the pool `stream` is routed to.
    pub(super) fn request_as_routed(&self, stream: StreamId, size: u64) -> Request {
        let rounded = self.round_size(size);
        Request {
            stream,
            size: rounded,
            pool: Self::pool_for(rounded),
            owner: self.pools.route(stream),
            alloc_size: self.allocation_size(rounded),
            expandable: self.expandable_active(),
        }
    }

    /// [`CachingAllocator::malloc_outlook`] had the pending frees of `completed` completed
    /// just now (their blocks back in the cache, merged, as young as a block can be). A replay
    /// asks it to tell a free made just before a malloc from a deferred free that the malloc
    /// completed itself (the trace reads the same; the retry and synchronisation counts, and
    /// the order of completions, differ).
    pub fn malloc_outlook_if_completed(
        &self,
        stream: StreamId,
        size: u64,
        completed: &[Allocation],
    ) -> MallocOutlook {
        if completed.iter().any(|&allocation| {
            self.completed_block_would_serve(allocation, stream, size, completed)
        }) {
            return MallocOutlook::Cached;
        }
        self.outlook_with(stream, size, completed)
    }

    /// The outlook, with the pending frees of `completed` taken as completed.
    fn outlook_with(&self, stream: StreamId, size: u64, completed: &[Allocation]) -> MallocOutlook {
        if size == 0 || size >= super::ONE_EXABYTE {
            return MallocOutlook::Cached;
        }
        let request = self.request_as_routed(stream, size);
        if self.find_free_block(request).is_some() {
            return MallocOutlook::Cached;
        }
        // Whole segments the completions give back, by the pool they go back to.
        let returned: Vec<(PoolOwner, FreeKey)> = completed
            .iter()
            .filter_map(|&allocation| self.whole_segment_once_completed(allocation))
            .collect();
        let young_in = |owner: PoolOwner| -> Vec<FreeKey> {
            returned
                .iter()
                .filter(|&&(of, _)| of == owner)
                .map(|&(_, key)| key)
                .collect()
        };
        // Garbage collection reads the default large pool; `release_available_cached_blocks`
        // the request's pool.
        let young = young_in(DEFAULT_OWNER);
        let young_of_request = if request.pool == Pool::Large {
            young_in(request.owner)
        } else {
            Vec::new()
        };
        // get_free_block ticks the clock of the request's pool before the collector reads
        // the default large pool's.
        let tick = u64::from(request.owner == DEFAULT_OWNER && request.pool == Pool::Large);
        let mut released: Vec<(BlockId, u64)> = if self.garbage_collection_enabled() {
            self.collection_plan(tick, &young)
        } else {
            Vec::new()
        };
        let sizes = |released: &[(BlockId, u64)]| {
            released
                .iter()
                .map(|&(id, size)| ReleasedSegment {
                    pool: self.pool_id(self.blocks.at(id).owner),
                    size,
                })
                .collect()
        };
        if self.new_memory_fits(request, &released) {
            return if released.is_empty() {
                MallocOutlook::NewMemory
            } else {
                MallocOutlook::Collect(sizes(&released))
            };
        }
        if request.expandable {
            let flush = !self.capture_underway();
            // Pages unmapped by `release_cached_blocks` are not predicted; without it (a
            // private pool is being allocated to) nothing else is released:
            // `release_available_cached_blocks` passes over expandable blocks, and garbage
            // collection's releases are known.
            return MallocOutlook::Release {
                released: (!flush).then(|| sizes(&released)),
                flush,
            };
        }
        if self.available_release_plan(request, &young_of_request, &mut released)
            && self.new_memory_fits(request, &released)
        {
            return MallocOutlook::Release {
                released: Some(sizes(&released)),
                flush: false,
            };
        }
        let flush = !self.capture_underway();
        if flush {
            self.flush_plan(&mut released);
        }
        MallocOutlook::Release {
            released: Some(sizes(&released)),
            flush,
        }
    }

    /// Whether new memory for `request` fits once the segments `released` are gone: under
    /// the memory fraction, and in the device's free memory (in its 2 MiB pages).
    fn new_memory_fits(&self, request: Request, released: &[(BlockId, u64)]) -> bool {
        let gone: u64 = released.iter().map(|&(_, size)| size).sum();
        let held = self.total_allocated_memory.saturating_sub(gone);
        if let Some(allowed) = self.allowed_memory_maximum {
            if held + request.alloc_size > allowed {
                return false;
            }
        }
        let needed = if request.expandable {
            self.bytes_to_map(request)
        } else {
            request.alloc_size.div_ceil(DEVICE_PAGE) * DEVICE_PAGE
        };
        let free = self.device.mem_get_info().map_or(0, |(free, _)| free) + gone;
        needed <= free
    }

    /// What `release_available_cached_blocks` would release (added to `released`), and
    /// whether it reports success: with `max_split_size_mb` set, the smallest cached oversize
    /// block of the request's stream covering the request, else the largest ones in turn.
    /// `young` are whole large-pool segments of the request's pool taken to be cached too
    /// (pending frees read as completed).
    fn available_release_plan(
        &self,
        request: Request,
        young: &[FreeKey],
        released: &mut Vec<(BlockId, u64)>,
    ) -> bool {
        if !self.config.has_split_limit() {
            return false;
        }
        let max_split_size = self.config.max_split_size;
        let target = request.size.max(max_split_size);
        let key: FreeKey = (request.stream, target, 0, 0);
        let gone = |id: BlockId, released: &[(BlockId, u64)]| {
            released.iter().any(|&(other, _)| other == id)
        };
        // The pool's free blocks in its (stream, size, address) order, the young ones among
        // them, less those released already.
        let mut keys: Vec<FreeKey> = self
            .pool_ref(request.owner, request.pool)
            .iter()
            .chain(young.iter().copied())
            .filter(|&(_, _, _, id)| !gone(id, released))
            .collect();
        keys.sort_unstable();
        let first_at_or_above = keys.partition_point(|&other| other < key);
        if let Some(&(stream, size, _, id)) = keys.get(first_at_or_above) {
            if stream == request.stream && !self.blocks.at(id).is_expandable() {
                released.push((id, size));
                return true;
            }
        }
        let mut total = 0;
        for &(stream, size, _, id) in keys[..first_at_or_above].iter().rev() {
            if total >= target || size < max_split_size || stream != request.stream {
                break;
            }
            if !self.blocks.at(id).is_expandable() {
                total += size;
                released.push((id, size));
            }
        }
        total >= target
    }

    /// The segments `empty_cache()` would release now, as (address, bytes), in its order:
    /// every whole `cudaMalloc` segment once the pending frees complete (see
    /// [`CachingAllocator::malloc_outlook`]'s last resort). A replay compares them with a run
    /// of releases the trace shows without a malloc after it.
    pub fn empty_cache_outlook(&self) -> Vec<(u64, u64)> {
        let mut released = Vec::new();
        self.flush_plan(&mut released);
        released
            .into_iter()
            .map(|(id, size)| (self.blocks.at(id).ptr, size))
            .collect()
    }

    /// Whether `empty_cache()` would unmap pages of the default pools' expandable segments
    /// now: a free, mapped block of one that spans a whole page (PyTorch's `release_blocks`
    /// unmaps every whole page of each). [`CachingAllocator::empty_cache_outlook`] lists
    /// `cudaMalloc` segments only; a replay asks both before it reads a run as that call.
    pub fn empty_cache_unmaps_pages(&self) -> bool {
        !self.empty_cache_unmap_outlook().is_empty()
    }

    /// Whether the default pools' `release_cached_blocks` (an OOM path's last remedy, or
    /// `empty_cache()`) would unmap pages of their expandable segments: it first completes
    /// every pending free (`synchronize_and_free_events`), each merging with its free
    /// neighbours, then unmaps the whole pages of every free mapped block. Unlike
    /// [`CachingAllocator::empty_cache_unmaps_pages`], a free still pending counts as done:
    /// two free blocks on either side of a page boundary, one of them still pending, make a
    /// whole free page once it completes.
    pub fn flush_unmaps_pages(&self) -> bool {
        // Free or pending (neither is allocated), with memory behind it.
        let freeable = |block: &Block| {
            block.is_expandable()
                && block.owner == DEFAULT_OWNER
                && !block.allocated
                && block.mapped
        };
        self.blocks.iter().any(|(_, block)| {
            // The first block of each run of such neighbours, which the completions merge.
            if !freeable(block) || self.blocks.get(block.prev).is_some_and(freeable) {
                return false;
            }
            let mut end = block.ptr + block.size;
            let mut cursor = block.next;
            while let Some(next) = self.blocks.get(cursor).filter(|next| freeable(next)) {
                end = next.ptr + next.size;
                cursor = next.next;
            }
            self.expandable
                .get(block.segment)
                .is_some_and(|segment| !segment.pages_inside(block.ptr, end - block.ptr).is_empty())
        })
    }

    /// The page ranges `empty_cache()` would unmap now from the default pools' expandable
    /// segments, as (address, bytes), one per free mapped block (PyTorch's `unmap_block`
    /// records one `segment_unmap` per block: its whole pages), ordered by address. Frees
    /// still pending are not completed first: a replay rules the call out by those itself.
    pub fn empty_cache_unmap_outlook(&self) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = self
            .blocks
            .iter()
            .filter(|(_, block)| {
                block.is_expandable()
                    && block.owner == DEFAULT_OWNER
                    && !block.allocated
                    && block.mapped
            })
            .filter_map(|(_, block)| {
                let segment = self.expandable.get(block.segment)?;
                let pages = segment.pages_inside(block.ptr, block.size);
                (!pages.is_empty()).then(|| {
                    (
                        segment.page_address(pages.begin),
                        pages.len() * segment.page,
                    )
                })
            })
            .collect();
        ranges.sort_unstable();
        ranges
    }

    /// What `release_cached_blocks` would release (added to `released`): after the pending
    /// frees complete, every `cudaMalloc` segment of the default pools with nothing allocated
    /// (large pool first, each in (stream, size, address) order), then those of the freeable
    /// private pools (small pool first).
    fn flush_plan(&self, released: &mut Vec<(BlockId, u64)>) {
        // Whole segments once the pending frees complete: no block allocated. Keyed by the
        // head block (the merged block would take its place).
        let mut whole: Vec<(PoolOwner, Pool, StreamId, u64, u64, BlockId)> = Vec::new();
        for (id, block) in self.blocks.iter() {
            if block.prev != NIL || block.is_expandable() {
                continue;
            }
            let (mut cursor, mut size, mut in_use) = (id, 0, false);
            while let Some(piece) = self.blocks.get(cursor) {
                size += piece.size;
                in_use |= piece.allocated;
                cursor = piece.next;
            }
            if !in_use && !released.iter().any(|&(other, _)| other == id) {
                whole.push((block.owner, block.pool, block.stream, size, block.ptr, id));
            }
        }
        let mut order = |owner: PoolOwner, pool: Pool| {
            let mut mine: Vec<_> = whole
                .iter()
                .filter(|w| w.0 == owner && w.1 == pool)
                .map(|w| (w.2, w.3, w.4, w.5))
                .collect();
            mine.sort_unstable();
            released.extend(mine.into_iter().map(|(_, size, _, id)| (id, size)));
        };
        order(DEFAULT_OWNER, Pool::Large);
        order(DEFAULT_OWNER, Pool::Small);
        for id in &self.pools.freeable {
            if let Some(owner) = self.pools.owner(*id) {
                order(owner, Pool::Small);
                order(owner, Pool::Large);
            }
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
        self.completed_block_would_serve(allocation, stream, size, &[])
    }

    /// [`CachingAllocator::pending_block_would_serve`] with the pending frees of `completed`
    /// completed too: a neighbour among them merges as a free one does, and the free space
    /// reaches on through it. Completed one by one, each block's own neighbours would still be
    /// pending, and two frees that merge into a block that serves the request would each read
    /// as too small.
    fn completed_block_would_serve(
        &self,
        allocation: Allocation,
        stream: StreamId,
        size: u64,
        completed: &[Allocation],
    ) -> bool {
        let Some(block) = self
            .blocks
            .get(allocation.id)
            .filter(|block| block.pending_free && block.ptr == allocation.ptr.addr())
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
        // A neighbour merges once free: cached already, or one of `completed`.
        let merges = |id: BlockId| {
            self.blocks.get(id).filter(|other| {
                other.mapped == block.mapped
                    && (other.is_free()
                        || (other.pending_free
                            && completed
                                .iter()
                                .any(|done| done.id == id && done.ptr.addr() == other.ptr)))
            })
        };
        let mut merged = block.size;
        for step in [|b: &Block| b.prev, |b: &Block| b.next] {
            let mut at = step(block);
            while let Some(other) = merges(at) {
                merged += other.size;
                at = step(other);
            }
        }
        let max_split_size = self.config.max_split_size;
        merged >= rounded
            && !(rounded < max_split_size && merged >= max_split_size)
            && !(rounded >= max_split_size
                && merged >= rounded.wrapping_add(self.config.max_non_split_rounding_size))
    }

    /// The pool and the key (stream, size, address, block) the block of `allocation`, a
    /// pending free in a large pool, would have in its pool once completed and merged — when
    /// that makes a whole, unsplit segment that garbage collection (in the default pools) or
    /// `release_available_cached_blocks` could release.
    fn whole_segment_once_completed(&self, allocation: Allocation) -> Option<(PoolOwner, FreeKey)> {
        let block = self
            .blocks
            .get(allocation.id)
            .filter(|block| block.pending_free && block.ptr == allocation.ptr.addr())?;
        if block.pool != Pool::Large || block.is_expandable() {
            return None;
        }
        let (mut size, mut base, mut head) = (block.size, block.ptr, allocation.id);
        for neighbour in [block.prev, block.next] {
            if neighbour == NIL {
                continue;
            }
            let other = self.blocks.get(neighbour)?;
            let outer = if neighbour == block.prev {
                other.prev
            } else {
                other.next
            };
            if !other.is_free() || !other.mapped || outer != NIL {
                return None;
            }
            size += other.size;
            if neighbour == block.prev {
                (base, head) = (other.ptr, neighbour);
            }
        }
        // Keyed by the segment's head block, as the merged block would be known.
        Some((block.owner, (block.stream, size, base, head)))
    }

    /// The sizes of the segments `garbage_collect_cached_blocks` would release now, in its
    /// order, with the default large pool's clock `tick` lookups ahead: its passes over the
    /// unsplit, non-expandable cached large blocks, each freeing those at least as old as the
    /// average, until the bytes held fall under the threshold. `young` are whole segments
    /// taken to have just come back to the cache (age `tick`), in their place in the pool's
    /// (stream, size, address) order.
    fn collection_plan(&self, tick: u64, young: &[FreeKey]) -> Vec<(BlockId, u64)> {
        let Some(target) = self.collection_target(self.collection_begun_before) else {
            return Vec::new();
        };
        let clock = self.large.get_free_blocks_call_count + tick;
        let age = |block: &Block| clock.saturating_sub(block.gc_count_base) as f64;
        // In the pool's order: (key, age, expandable); expandable blocks count towards the
        // average but are never freed.
        let mut candidates: Vec<(FreeKey, f64, bool)> = self
            .large
            .iter()
            .map(|key| (key, self.blocks.at(key.3)))
            .filter(|(_, block)| !block.is_split())
            .map(|(key, block)| (key, age(block), block.is_expandable()))
            .chain(young.iter().map(|&key| (key, tick as f64, false)))
            .collect();
        candidates.sort_unstable_by_key(|candidate| candidate.0);
        let mut total_age: f64 = candidates.iter().map(|candidate| candidate.1).sum();
        let mut freeable = candidates.len();
        let (mut released, mut reclaimed) = (Vec::new(), 0);
        let mut freed_any = true;
        while reclaimed < target && freed_any && freeable > 0 {
            let average = total_age / freeable as f64;
            freed_any = false;
            candidates.retain(|&((_, size, _, id), age, expandable)| {
                if expandable || age < average {
                    return true;
                }
                freed_any = true;
                reclaimed += size;
                total_age -= age;
                freeable -= 1;
                released.push((id, size));
                false
            });
        }
        released
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

    /// A 1 GiB device capped at 100 MiB by the memory fraction, with garbage collection from
    /// 50 MiB reserved (`garbage_collection_threshold:0.5`).
    fn collecting_allocator() -> CachingAllocator {
        let mut a = allocator("garbage_collection_threshold:0.5", 1 << 30);
        let total = a.device().total_memory() as f64;
        a.set_memory_fraction(100.0 * MIB as f64 / total)
            .expect("fraction");
        a
    }

    /// A new `MemPool`, entered for every stream (`use_mem_pool`): its id.
    fn in_new_mem_pool(a: &mut CachingAllocator) -> MemPoolId {
        let id = a.new_mem_pool_id();
        a.create_pool(id).expect("MemPool()");
        a.begin_allocate_to_pool(id, crate::alloc::PoolFilter::AllStreams)
            .expect("use_mem_pool");
        id
    }

    /// A default-pool segment of `size` bytes, as an outlook lists it.
    fn default_segment(size: u64) -> ReleasedSegment {
        ReleasedSegment {
            pool: MemPoolId::DEFAULT,
            size,
        }
    }

    #[test]
    fn empty_cache_unmaps_a_whole_free_page_only() {
        let mut a = allocator("expandable_segments:True", 1 << 30);
        let x = a.malloc(MIB + 1).expect("a 20 MiB page mapped");
        assert!(!a.empty_cache_unmaps_pages(), "its page holds a live block");
        a.free(x).expect("free");
        assert!(a.empty_cache_unmaps_pages(), "the whole page is free");
        assert!(a.empty_cache_outlook().is_empty(), "no cudaMalloc segment");
        a.empty_cache().expect("unmaps it");
        assert!(!a.empty_cache_unmaps_pages());
    }

    #[test]
    fn a_flush_unmaps_the_page_a_pending_free_completes() {
        let mut a = allocator("expandable_segments:True", 1 << 30);
        // Two blocks straddling the boundary of the second 20 MiB page; the third keeps
        // the first page's start and the segment's tail allocated.
        let head = a.malloc(11 * MIB).expect("head");
        let x = a
            .malloc(19 * MIB)
            .expect("x: 12 to 32 MiB (sizes round to 2 MiB)");
        let y = a.malloc(15 * MIB).expect("y: 32 to 48 MiB");
        let tail = a.malloc(14 * MIB).expect("tail");
        a.record_stream(x, 7).expect("record");
        a.device_mut().sleep(7, 1).expect("work");
        a.free(x).expect("deferred");
        a.free(y).expect("free");
        assert!(
            !a.empty_cache_unmaps_pages(),
            "neither block alone spans a page"
        );
        assert!(
            a.flush_unmaps_pages(),
            "once x completes, 12..48 MiB holds the page 20..40 MiB"
        );
        for block in [head, tail] {
            a.free(block).expect("free");
        }
    }

    #[test]
    fn a_pools_unmaps_leave_the_other_free_pages_mapped() {
        let mut a = allocator("expandable_segments:True", 1 << 30);
        let x = a.malloc(MIB + 1).expect("a 20 MiB page on stream 0");
        let y = a.malloc_on(7, MIB + 1).expect("a 20 MiB page on stream 7");
        let (x_at, y_at) = (x.ptr.addr(), y.ptr.addr());
        a.free(x).expect("free");
        a.free(y).expect("free");
        let page = 20 * MIB;
        let mut both = vec![(x_at, page), (y_at, page)];
        both.sort_unstable();
        assert_eq!(a.empty_cache_unmap_outlook(), both);
        let syncs = a.stats().num_sync_all_streams;
        assert!(
            !a.empty_cache_of_unmapped_ranges(&[(y_at, MIB)])
                .expect("no error"),
            "no free block's pages span just that"
        );
        assert_eq!(a.empty_cache_unmap_outlook(), both, "nothing changed");
        assert!(a
            .empty_cache_of_unmapped_ranges(&[(y_at, page)])
            .expect("unmaps"));
        assert_eq!(a.empty_cache_unmap_outlook(), [(x_at, page)]);
        assert_eq!(a.stats().num_sync_all_streams, syncs + 1);
        assert_eq!(a.stats().num_device_free, 1, "stream 7's segment went");
    }

    #[test]
    fn one_pools_release_order_walks_its_small_pool_then_its_large_pool_by_size() {
        let mut a = allocator("", 1 << 30);
        let blocks = [30 * MIB, 12 * MIB, 1000].map(|size| a.malloc(size).expect("alloc"));
        let [large, middle, small] = blocks.map(|block| block.ptr.addr());
        for block in blocks {
            a.free(block).expect("free");
        }
        assert_eq!(
            a.one_pool_release_order(&[large, middle, small]),
            Some(vec![small, middle, large])
        );
        let again = a.malloc(30 * MIB).expect("the cached 30 MiB segment");
        assert_eq!(again.ptr.addr(), large);
        assert_eq!(a.one_pool_release_order(&[large]), None, "allocated again");
    }

    #[test]
    fn the_default_block_a_malloc_would_take_names_its_segment() {
        let mut a = allocator("", 1 << 30);
        let x = a.malloc(30 * MIB).expect("alloc");
        let base = x.ptr.addr();
        a.free(x).expect("free");
        assert_eq!(a.default_cached_block_segment(0, 20 * MIB), Some(base));
        assert_eq!(a.default_cached_block_segment(0, 40 * MIB), None, "too big");
        assert_eq!(
            a.default_cached_block_segment(7, 20 * MIB),
            None,
            "another stream"
        );
        assert_eq!(
            a.default_cached_block_segment(0, 0),
            None,
            "no block for nothing"
        );
        // A `MemPool`'s cached block serves no default-pool request, even while the stream
        // allocates in the pool.
        in_new_mem_pool(&mut a);
        let y = a.malloc(60 * MIB).expect("in the pool");
        a.free(y).expect("free");
        assert_eq!(a.default_cached_block_segment(0, 50 * MIB), None);
        assert_eq!(a.default_cached_block_segment(0, 20 * MIB), Some(base));
    }

    #[test]
    fn cached_new_memory_or_release() {
        let mut a = allocator("", 1 << 30);
        let x = a.malloc(30 * MIB).expect("alloc");
        a.free(x).expect("free");
        assert_eq!(a.malloc_outlook(0, 20 * MIB), MallocOutlook::Cached);
        assert_eq!(a.malloc_outlook(0, 40 * MIB), MallocOutlook::NewMemory);
        assert_eq!(
            a.malloc_outlook(0, 900 * MIB),
            MallocOutlook::Release {
                released: Some(vec![default_segment(30 * MIB)]),
                flush: true
            }
        );
        assert_eq!(
            a.malloc_outlook(7, 20 * MIB),
            MallocOutlook::NewMemory,
            "another stream"
        );
        let total = a.device().total_memory() as f64;
        a.set_memory_fraction(60.0 * MIB as f64 / total)
            .expect("fraction");
        assert_eq!(
            a.malloc_outlook(0, 32 * MIB),
            MallocOutlook::Release {
                released: Some(vec![default_segment(30 * MIB)]),
                flush: true
            }
        );
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
        let mut a = collecting_allocator();
        let x = a.malloc(60 * MIB).expect("alloc");
        a.free(x).expect("free");
        assert_eq!(
            a.malloc_outlook(0, 4 * MIB),
            MallocOutlook::Cached,
            "a fit, no collection"
        );
        // 60 MiB held is over the threshold (50 MiB): the collector frees the cached 60 MiB,
        // then up to 100 MiB fit; more needs the OOM path.
        assert_eq!(
            a.malloc_outlook(0, 62 * MIB),
            MallocOutlook::Collect(vec![default_segment(60 * MIB)])
        );
        assert_eq!(
            a.malloc_outlook(0, 110 * MIB),
            MallocOutlook::Release {
                released: Some(vec![default_segment(60 * MIB)]),
                flush: true
            }
        );
        let _ = a.malloc(62 * MIB).expect("alloc");
        assert_eq!(
            a.stats().num_device_free,
            1,
            "the collector freed the 60 MiB"
        );
        assert_eq!(a.stats().num_alloc_retries, 0);
    }

    /// Three 20 MiB segments cached at once have one age: over the threshold, the collector
    /// takes all three. With their ages marked unseen and the one the trace shows released
    /// aged, it takes only that one.
    #[test]
    fn aged_segments_are_the_ones_the_collector_takes() {
        let mut a = collecting_allocator();
        let held: Vec<Allocation> = (0..3).map(|_| a.malloc(20 * MIB).expect("alloc")).collect();
        let bases: Vec<u64> = held.iter().map(|x| x.ptr.addr()).collect();
        for x in held {
            a.free(x).expect("free");
        }
        let all = vec![default_segment(20 * MIB); 3];
        assert_eq!(a.malloc_outlook(0, 30 * MIB), MallocOutlook::Collect(all));
        // Ages not marked unseen are not changed.
        assert!(!a.age_unseen_segments(0, 30 * MIB, &bases[1..2]));
        a.mark_cached_ages_unseen();
        // No age makes the collector take a segment other than the one the trace shows.
        assert!(!a.age_unseen_segments(0, 30 * MIB, &[bases[1] + 512]));
        assert!(a.age_unseen_segments(0, 30 * MIB, &bases[1..2]));
        assert_eq!(
            a.malloc_outlook(0, 30 * MIB),
            MallocOutlook::Collect(vec![default_segment(20 * MIB)])
        );
        let _ = a.malloc(30 * MIB).expect("alloc");
        let cached: Vec<u64> = a.segments().map(|(addr, _, _)| addr).collect();
        assert!(
            !cached.contains(&bases[1]),
            "the aged segment was collected"
        );
        assert!(cached.contains(&bases[0]) && cached.contains(&bases[2]));
    }

    #[test]
    fn a_pending_free_read_as_completed_can_be_collected_or_released() {
        let mut a = collecting_allocator();
        let x = a.malloc(60 * MIB).expect("alloc");
        a.record_stream(x, 7).expect("record");
        a.device_mut().sleep(7, 1).expect("work");
        a.free(x).expect("deferred");
        // Pending, the block is nothing the collector can take: the OOM path must flush it.
        let flushed = MallocOutlook::Release {
            released: Some(vec![default_segment(60 * MIB)]),
            flush: true,
        };
        assert_eq!(a.malloc_outlook(0, 62 * MIB), flushed);
        assert_eq!(a.malloc_outlook_if_completed(0, 62 * MIB, &[]), flushed);
        // Completed just before the malloc, the collector takes its whole segment.
        assert_eq!(
            a.malloc_outlook_if_completed(0, 62 * MIB, &[x]),
            MallocOutlook::Collect(vec![default_segment(60 * MIB)])
        );
        assert_eq!(
            a.malloc_outlook_if_completed(0, 50 * MIB, &[x]),
            MallocOutlook::Cached,
            "it would serve the malloc from the cache"
        );
        // With max_split_size_mb, release_available_cached_blocks takes it: oversize, it
        // does not serve a request below the limit, and 60 + 30 MiB pass the 80 allowed.
        let mut b = allocator("max_split_size_mb:40", 1 << 30);
        let total = b.device().total_memory() as f64;
        b.set_memory_fraction(80.0 * MIB as f64 / total)
            .expect("fraction");
        let y = b.malloc(60 * MIB).expect("alloc");
        b.record_stream(y, 7).expect("record");
        b.device_mut().sleep(7, 1).expect("work");
        b.free(y).expect("deferred");
        assert_eq!(
            b.malloc_outlook_if_completed(0, 30 * MIB, &[y]),
            MallocOutlook::Release {
                released: Some(vec![default_segment(60 * MIB)]),
                flush: false
            }
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

    #[test]
    fn releases_name_their_pool() {
        // In a MemPool under a fraction: its cached 60 MiB segment is what
        // `release_available_cached_blocks` gives up (no `release_cached_blocks` while a pool
        // is active), named with the pool's id, not taken for a default-pool segment.
        let mut a = allocator("max_split_size_mb:40", 1 << 30);
        a.set_memory_fraction(0.1).expect("fraction");
        let id = in_new_mem_pool(&mut a);
        let x = a.malloc(60 * MIB).expect("in the pool");
        a.free(x).expect("free");
        assert_eq!(
            a.malloc_outlook(0, 70 * MIB),
            MallocOutlook::Release {
                released: Some(vec![ReleasedSegment {
                    pool: id,
                    size: 60 * MIB
                }]),
                flush: false,
            }
        );
    }
}
